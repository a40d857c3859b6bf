"""int8 ONNX: paddle2onnx's Constant weights folded so quantize_dynamic quantizes, wired as a precision."""
import json

import numpy as np
import onnx
import paddle
import pytest
from onnxruntime.quantization import quantize_dynamic

from ppvarlen.config import ConfigError
from ppvarlen.deploy.engines import OnnxEngine
from ppvarlen.deploy.manifest import load_manifest
from ppvarlen.export import parity
from ppvarlen.export.exporter import check_request, export_model
from ppvarlen.export.quantize import non_initializer_weights, quantize_onnx, quantized_node_count
from test_export import CFG, _encoder, _meta, _test_items
from test_export_models import TinyCRFTagger, TinyTransformer

# 2 encoder layers: Q.K^T and attn.V per layer multiply two activations (no weight to quantize)
ACTIVATION_MATMULS = 4


def _confident_transformer():
    """TinyTransformer whose head bias dominates: every argmax is class 0, so int8 noise
    cannot flip it and the int8 export passes the 99.5% gate (the gate itself: test below)."""
    paddle.seed(0)
    model = TinyTransformer()
    model.head.bias.set_value(paddle.to_tensor([20.0, -20.0]))
    return model


@pytest.fixture(scope="module")
def int8_export(tmp_path_factory):
    out = tmp_path_factory.mktemp("int8") / "export"
    manifest = export_model(_confident_transformer(),
                            _meta("classification", "transformer_cls", ["a", "b"]), _encoder(),
                            CFG, str(out), ["paddle", "onnx"], ["fp32", "int8"], verify=True,
                            test_examples=_test_items(60))
    return out, manifest


def test_raw_paddle2onnx_graph_quantizes_nothing_but_folded_graph_does(int8_export, tmp_path):
    out, _ = int8_export
    raw = onnx.load(out / "onnx" / "model.onnx")
    matmuls = sum(n.op_type in ("MatMul", "Gemm") for n in raw.graph.node)
    assert len(non_initializer_weights(raw)) == matmuls  # every weight is a Constant node
    quantize_dynamic(str(out / "onnx" / "model.onnx"), str(tmp_path / "naive.onnx"))
    assert quantized_node_count(onnx.load(tmp_path / "naive.onnx")) == 0  # "non constant B"
    info = quantize_onnx(str(out / "onnx" / "model.onnx"), str(tmp_path / "q.onnx"))
    assert info["unquantized_matmuls"] == ACTIVATION_MATMULS
    assert info["quantized_nodes"] == quantized_node_count(onnx.load(tmp_path / "q.onnx")) > 0


def test_int8_export_is_listed_verified_and_measured(int8_export):
    out, manifest = int8_export
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


def test_onnx_engine_int8_runs_the_int8_file(int8_export):
    out, _ = int8_export
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


def test_tagger_int8_reports_tag_agreement_over_real_tokens(tmp_path):
    """A BiGRU-CRF tagger: int8 quantizes the emission head (ONNX Runtime's dynamic
    quantization has no GRU kernel), and --verify compares Viterbi TAGS on real tokens."""
    paddle.seed(3)
    tagger = TinyCRFTagger()
    tagger.head.bias.set_value(paddle.to_tensor([20.0, 0, 0, 0, 0]))  # no near-ties to flip
    items = _test_items(30, seed=2)
    out = tmp_path / "export"
    manifest = export_model(tagger, _meta("tagging", "bigru_crf", ["O", "B", "I", "E", "S"]),
                            _encoder(), CFG, str(out), ["onnx"], ["fp32", "int8"], verify=True,
                            test_examples=items)
    int8_graph = onnx.load(out / "onnx" / "model_int8.onnx")
    assert manifest["backends"]["onnx"]["int8"]["quantized_nodes"] == quantized_node_count(int8_graph) > 0
    assert any(n.op_type == "GRU" for n in int8_graph.graph.node)  # the recurrence stays float
    report = json.loads((out / "parity.json").read_text())
    int8 = report["results"]["test"]["onnx_int8"]
    assert int8["compared"] == sum(len(x["input_ids"]) for x in items)  # tags, not padding
    assert int8["agreement"] >= 0.995 and int8["max_abs_diff"] > 1e-6  # int8 emissions differ
    assert manifest["precision_measured"]["onnx"]["int8"]["verified"]


def _int8_weight_extremes(path):
    """Largest |value| over the int8 weight initializers of a quantized graph."""
    from onnx import numpy_helper

    graph = onnx.load(path).graph
    return max(int(np.abs(numpy_helper.to_array(i).astype(np.int32)).max())
               for i in graph.initializer if i.data_type == onnx.TensorProto.INT8 and i.dims)


def test_int8_weights_use_reduce_range_by_default(int8_export, tmp_path):
    """7-bit weights: AVX2 (non-VNNI) u8s8 kernels saturate int16 pair sums with 8-bit ones."""
    out, manifest = int8_export
    assert manifest["backends"]["onnx"]["int8"]["reduce_range"] is True
    assert _int8_weight_extremes(out / "onnx" / "model_int8.onnx") <= 64
    full = quantize_onnx(str(out / "onnx" / "model.onnx"), str(tmp_path / "full.onnx"),
                         reduce_range=False)
    assert full["reduce_range"] is False and _int8_weight_extremes(tmp_path / "full.onnx") == 127
