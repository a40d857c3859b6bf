"""int8 ONNX: paddle2onnx's Constant weights folded so quantize_dynamic quantizes, wired as a precision."""
import json
import re

import numpy as np
import onnx
import paddle
import pytest
from onnxruntime.quantization import quantize_dynamic

from ppvarlen.config import ConfigError
from ppvarlen.runtime.backends import OnnxEngine
from ppvarlen.runtime.manifest import load_manifest
from ppvarlen.export import parity
from ppvarlen.export.exporter import check_request, export_model
from ppvarlen.export.quantize import non_initializer_weights, quantize_onnx, quantized_node_count
from ppvarlen.runtime import threads_choice
from test_export import CFG, _encoder, _meta, _test_items
from test_export_models import TinyCRFTagger, TinyTransformer

# 2 encoder layers: Q.K^T and attn.V per layer multiply two activations (no weight to quantize)
ACTIVATION_MATMULS = 4


def eager_logits(model, items):
    """The eager model's outputs, one unpadded example at a time (independent of the exporter)."""
    model.eval()
    with paddle.no_grad():
        return np.concatenate([model(paddle.to_tensor([x["input_ids"]], dtype="int64"),
                                     paddle.to_tensor([len(x["input_ids"])], dtype="int64")
                                     ).numpy() for x in items])


def split_at_widest_gap(scores, lo=0.3, hi=0.7):
    """The threshold in the middle of the widest gap between sorted ``scores`` whose rank lies
    in [lo, hi]: splits the examples lo..hi / hi..lo with no example near the boundary."""
    d = np.sort(scores)
    a, b = int(lo * len(d)), int(hi * len(d))
    k = a + int(np.argmax(d[a + 1:b + 1] - d[a:b]))
    return (d[k] + d[k + 1]) / 2, (d[k + 1] - d[k]) / 2


def spread_transformer(items):
    """TinyTransformer whose two classes split the test items about 35/65: the head bias is
    moved so the decision boundary sits in the widest gap of the logit margins there, so the
    int8/fp16 agreement gates see both classes (a graph that always answered one class would
    disagree on a third of the items) while no item is a near-tie that rounding may flip."""
    paddle.seed(0)
    model = TinyTransformer()
    logits = eager_logits(model, items)
    threshold, _ = split_at_widest_gap(logits[:, 0] - logits[:, 1])
    bias = model.head.bias.numpy()
    model.head.bias.set_value(paddle.to_tensor(bias + np.array([-threshold, threshold]) / 2))
    return model


def assert_spread(labels, num_classes, share=0.2):
    counts = np.bincount(np.asarray(labels).ravel(), minlength=num_classes)
    assert (counts >= share * counts.sum()).all(), f"predictions per class {counts.tolist()}"


TEST_ITEMS = _test_items(60)


@pytest.fixture(scope="module")
def int8_export(tmp_path_factory):
    out = tmp_path_factory.mktemp("int8") / "export"
    model = spread_transformer(TEST_ITEMS)
    assert_spread(eager_logits(model, TEST_ITEMS).argmax(-1), 2)
    manifest = export_model(model,
                            _meta("classification", "transformer_cls", ["a", "b"]), _encoder(),
                            CFG, str(out), ["paddle", "onnx"], ["fp32", "int8"], verify=True,
                            test_examples=TEST_ITEMS)
    return out, manifest, model


def test_raw_paddle2onnx_graph_quantizes_nothing_but_folded_graph_does(int8_export, tmp_path):
    out, _, _ = int8_export
    raw = onnx.load(out / "onnx" / "model.onnx")
    matmuls = sum(n.op_type in ("MatMul", "Gemm") for n in raw.graph.node)
    assert len(non_initializer_weights(raw)) == matmuls  # every weight is a Constant node
    quantize_dynamic(str(out / "onnx" / "model.onnx"), str(tmp_path / "naive.onnx"))
    assert quantized_node_count(onnx.load(tmp_path / "naive.onnx")) == 0  # "non constant B"
    info = quantize_onnx(str(out / "onnx" / "model.onnx"), str(tmp_path / "q.onnx"))
    assert info["unquantized_matmuls"] == ACTIVATION_MATMULS
    assert info["quantized_nodes"] == quantized_node_count(onnx.load(tmp_path / "q.onnx")) > 0


def test_int8_export_is_listed_verified_and_measured(int8_export):
    out, manifest, _ = int8_export
    assert manifest["precisions"] == {"paddle": ["fp32"], "onnx": ["fp32", "int8"]}
    assert "onnx/model_int8.onnx" in manifest["files"]
    assert manifest["backends"]["onnx"]["model_int8"] == "onnx/model_int8.onnx"
    assert manifest["backends"]["onnx"]["int8"]["quantized_nodes"] > 0
    report = json.loads((out / "parity.json").read_text())
    test = report["results"]["test"]["onnx_int8"]
    assert report["precision"]["onnx_int8"] == "int8" and test["agreement"] >= 0.995
    assert 0 < test["max_prob_diff"] < 1  # int8 changes the numbers a little, reported
    measured = manifest["precision_measured"]
    assert measured["onnx"]["int8"]["verified"] and measured["onnx"]["int8"]["examples_per_s"] > 0
    assert set(measured["paddle"]) == {"fp32"} and set(measured["onnx"]) == {"fp32", "int8"}
    # timed on Deploy.threads auto's count, which every runner had
    assert measured["math_threads"] == threads_choice.count("auto")
    assert report["engines"]["onnx_int8"]["intra_op_threads"] == measured["math_threads"]


def test_onnx_engine_int8_runs_the_int8_file(int8_export):
    out, _, _ = int8_export
    manifest = load_manifest(str(out))
    ids = np.random.RandomState(1).randint(6, 40, (3, 9)).astype(np.int64)
    lens = np.array([9, 4, 1], dtype=np.int64)
    got = OnnxEngine(str(out), manifest, precision="int8").run(ids, lens)["logits"]
    int8 = parity.onnx_runner(str(out / "onnx" / "model_int8.onnx"), ["logits"])(ids, lens)["logits"]
    fp32 = OnnxEngine(str(out), manifest, precision="fp32").run(ids, lens)["logits"]
    np.testing.assert_array_equal(got, int8)
    assert np.abs(got - fp32).max() > 1e-6  # not the fp32 graph


def test_int8_request_needs_the_onnx_format():
    with pytest.raises(ConfigError, match="int8 is an ONNX Runtime variant"):
        check_request(["paddle"], ["int8"])
    assert check_request(["onnx"], ["int8"]) == (["onnx"], ["fp32", "int8"])


def test_low_int8_agreement_fails_the_gate():
    results = {"test": {"onnx_int8": {"max_abs_diff": 0.5, "agreement": 0.99, "compared": 100}},
               "grid": {"onnx_int8": {"max_abs_diff": 0.9, "agreement": 0.5, "compared": 100}}}
    failures = parity.check(results, {"onnx_int8": "int8"})
    assert failures == ["test/onnx_int8: agreement 99.0000% < 99.5%"]  # grid reported, not gated


def test_int8_predictions_spread_over_both_classes(int8_export):
    """The gate above is only informative if the int8 graph's answers vary: both classes occur."""
    out, _, _ = int8_export
    run = parity.onnx_runner(str(out / "onnx" / "model_int8.onnx"), ["logits"])
    labels = [run(np.array([x["input_ids"]], np.int64),
                  np.array([len(x["input_ids"])], np.int64))["logits"].argmax(-1)
              for x in TEST_ITEMS]
    assert_spread(labels, 2)


def zero_weight_scales(path):
    """Break a quantized graph the way a bad quantizer would, silently: every weight's scale
    (the float initializers named *_scale; activations' scales are computed at run time in
    dynamic quantization) set to 0, so each quantized MatMul outputs zeros."""
    from onnx import numpy_helper

    model = onnx.load(path)
    zeroed = 0
    for init in model.graph.initializer:
        if init.name.endswith("_scale") and init.data_type == onnx.TensorProto.FLOAT:
            init.CopyFrom(numpy_helper.from_array(np.zeros_like(numpy_helper.to_array(init)),
                                                  init.name))
            zeroed += 1
    assert zeroed > 0, "no weight scale found to break"
    onnx.save(model, path)


def test_broken_int8_graph_is_refused_by_the_agreement_gate(tmp_path, monkeypatch):
    """Unlabelled parity examples (no task metric): the agreement gate refuses the broken int8
    graph, and the export is written without it."""
    from ppvarlen.export import exporter

    real = exporter.quantize_onnx  # patched where the exporter looks it up

    def broken_quantize(src, dst, **kw):
        info = real(src, dst, **kw)
        zero_weight_scales(dst)
        return info

    monkeypatch.setattr(exporter, "quantize_onnx", broken_quantize)
    unlabelled = [{k: v for k, v in e.items() if k != "label"} for e in TEST_ITEMS]
    manifest = export_model(spread_transformer(TEST_ITEMS),
                            _meta("classification", "transformer_cls", ["a", "b"]), _encoder(),
                            CFG, str(tmp_path / "export"), ["onnx"], ["fp32", "int8"],
                            verify=True, test_examples=unlabelled)
    assert manifest["precisions"] == {"onnx": ["fp32"]}
    assert not (tmp_path / "export" / "onnx" / "model_int8.onnx").exists()
    refused = manifest["precision_measured"]["onnx"]["int8"]["refused"]
    assert re.match(r"test/onnx_int8: agreement .*% < 99\.5%", refused), refused


def viterbi(emissions, transitions):
    """Best tag path of one sentence (no start/end tags), written out for the test."""
    score, back = emissions[0].copy(), []
    for row in emissions[1:]:
        total = score[:, None] + transitions  # [previous tag, tag]
        back.append(total.argmax(0))
        score = total.max(0) + row
    path = [int(score.argmax())]
    for pointers in reversed(back):
        path.append(int(pointers[path[-1]]))
    return path[::-1]


def test_tagger_int8_reports_tag_agreement_over_real_tokens(tmp_path):
    """A BiGRU-CRF tagger: int8 quantizes the emission head (ONNX Runtime's
    quantization has no GRU kernel), and --verify compares Viterbi TAGS on real tokens.

    The tagger's tags spread over all five tags (a large embedding drives the GRU to
    token-dependent states), so near-ties exist and int8 may flip a few tokens: on some CPUs
    int8 passes the 99.5% gate, on others it is refused.  Either way the reported agreement
    must equal one computed here (numpy Viterbi over the int8 graph's emissions vs the eager
    tags) and the verdict must follow the threshold."""
    import onnxruntime as ort

    paddle.seed(4)
    tagger = TinyCRFTagger()
    tagger.emb.weight.set_value(tagger.emb.weight * 30)
    items = _test_items(30, seed=2)
    tagger.eval()
    with paddle.no_grad():
        eager = [tagger(paddle.to_tensor([x["input_ids"]], dtype="int64"),
                        paddle.to_tensor([len(x["input_ids"])], dtype="int64"))[1].numpy()[0]
                 [:len(x["input_ids"])] for x in items]
    assert_spread(np.concatenate(eager), 5, share=0.05)
    out = tmp_path / "export"
    manifest = export_model(tagger, _meta("tagging", "bigru_crf", ["O", "B", "I", "E", "S"]),
                            _encoder(), CFG, str(out), ["onnx"], ["fp32", "int8"],
                            verify=True, test_examples=items)
    report = json.loads((out / "parity.json").read_text())
    assert report["passed"]  # fp32; int8 is kept or refused on its own
    int8 = report["results"]["test"]["onnx_int8"]
    assert int8["compared"] == sum(len(x["input_ids"]) for x in items)  # tags, not padding
    agreement_refused = "test/onnx_int8: agreement" in report["refused"].get("onnx/int8", "")
    assert agreement_refused == (int8["agreement"] < 0.995), report["refused"]
    int8_path = None
    if "int8" in manifest["precisions"]["onnx"]:
        int8_path = out / "onnx" / "model_int8.onnx"
        int8_graph = onnx.load(int8_path)
        assert manifest["backends"]["onnx"]["int8"]["quantized_nodes"] == \
            quantized_node_count(int8_graph) > 0
        assert any(n.op_type == "GRU" for n in int8_graph.graph.node)  # recurrence stays float
        assert manifest["precision_measured"]["onnx"]["int8"]["verified"]
    if int8_path is not None:  # recompute the agreement from the int8 graph itself
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        session = ort.InferenceSession(str(int8_path), opts, providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        transitions = tagger.transitions.numpy()
        agree = 0
        for x, want in zip(items, eager):
            outputs = dict(zip(names, session.run(None, {
                "input_ids": np.array([x["input_ids"]], np.int64),
                "seq_len": np.array([len(x["input_ids"])], np.int64)})))
            got = viterbi(outputs["emissions"][0][:len(want)], transitions)
            agree += int((np.array(got) == want).sum())
        assert abs(agree / int8["compared"] - int8["agreement"]) <= 1 / int8["compared"]
        assert int8["max_abs_diff"] > 1e-6  # int8 emissions differ


def _int8_weight_extremes(path):
    """Largest |value| over the int8 weight initializers of a quantized graph."""
    from onnx import numpy_helper

    graph = onnx.load(path).graph
    return max(int(np.abs(numpy_helper.to_array(i).astype(np.int32)).max())
               for i in graph.initializer if i.data_type == onnx.TensorProto.INT8 and i.dims)


def test_int8_weights_use_reduce_range_by_default(int8_export, tmp_path):
    """7-bit weights: AVX2 (non-VNNI) u8s8 kernels saturate int16 pair sums with 8-bit ones."""
    out, manifest, _ = int8_export
    assert manifest["backends"]["onnx"]["int8"]["reduce_range"] is True
    assert _int8_weight_extremes(out / "onnx" / "model_int8.onnx") <= 64
    full = quantize_onnx(str(out / "onnx" / "model.onnx"), str(tmp_path / "full.onnx"),
                         reduce_range=False)
    assert full["reduce_range"] is False and _int8_weight_extremes(tmp_path / "full.onnx") == 127


def test_static_int8_activations_are_uint8(int8_export):
    """u8 activations with s8 weights: the pair ONNX Runtime's x86 QLinearMatMul kernels run
    (s8 activations left the QDQ graph at fp32 speed: docs/PRECISION.md)."""
    out, manifest, _ = int8_export
    assert manifest["backends"]["onnx"]["int8"]["activation_type"] == "quint8"
    graph = onnx.load(out / "onnx" / "model_int8.onnx").graph
    inits = {i.name: i for i in graph.initializer}
    activation_zero_points = [inits[n.input[2]].data_type for n in graph.node
                              if n.op_type == "QuantizeLinear" and n.input[0] not in inits]
    weight_zero_points = {inits[n.input[2]].data_type for n in graph.node
                          if n.op_type == "DequantizeLinear" and n.input[0] in inits}
    assert activation_zero_points and set(activation_zero_points) == {onnx.TensorProto.UINT8}
    # int8 weights (int32: Gemm biases, quantized with the product of both scales)
    assert weight_zero_points <= {onnx.TensorProto.INT8, onnx.TensorProto.INT32}
    assert onnx.TensorProto.INT8 in weight_zero_points


def _matmul_output_consumers(path):
    graph = onnx.load(path).graph
    consumers = {}
    for n in graph.node:
        for name in n.input:
            consumers.setdefault(name, []).append(n.op_type)
    return [op for n in graph.node if n.op_type in ("MatMul", "Gemm")
            for out in n.output for op in consumers.get(out, [])]


def test_static_int8_matmul_outputs_stay_float(int8_export, tmp_path):
    """No QuantizeLinear right after a MatMul/Gemm: ONNX Runtime fuses each into one
    MatMulIntegerToFloat instead of requantizing its output to uint8 and dequantizing it
    again before the bias; the requantized graph is still what ``matmul_outputs="quint8"``
    writes (the benchmark's comparison)."""
    out, manifest, _ = int8_export
    assert manifest["backends"]["onnx"]["int8"]["matmul_outputs"] == "float"
    after = _matmul_output_consumers(out / "onnx" / "model_int8.onnx")
    assert after and "QuantizeLinear" not in after
    batches = [(np.array([x["input_ids"]], dtype="int64"), np.array([len(x["input_ids"])]))
               for x in TEST_ITEMS[:4]]
    info = quantize_onnx(str(out / "onnx" / "model.onnx"), str(tmp_path / "requant.onnx"),
                         method="static", calibration_batches=batches, matmul_outputs="quint8")
    assert info["matmul_outputs"] == "quint8"
    assert "QuantizeLinear" in _matmul_output_consumers(tmp_path / "requant.onnx")
    with pytest.raises(Exception, match="matmul_outputs"):
        quantize_onnx(str(out / "onnx" / "model.onnx"), str(tmp_path / "bad.onnx"),
                      method="static", calibration_batches=batches, matmul_outputs="int4")
