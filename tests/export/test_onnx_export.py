"""ONNX export: the RNN sequence_lens fix (regression), unsupported ops, fp16."""
import os

import numpy as np
import onnx
import onnxruntime as ort
import paddle
import pytest

from ppvarlen.tasks.base import INPUTS
from ppvarlen.export import ExportFailedError
from ppvarlen.export.onnx_export import convert, export_onnx
from ppvarlen.export.onnx_fix import rnn_nodes, wire_rnn_sequence_lens
from ppvarlen.export.precision import convert_onnx_fp16
from ppvarlen.export.static import save_inference
from test_export_models import VOCAB, TinyCRFTagger, TinyRNN


def _session(model_or_path):
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    src = model_or_path.SerializeToString() if isinstance(model_or_path, onnx.ModelProto) \
        else model_or_path
    return ort.InferenceSession(src, opts, providers=["CPUExecutionProvider"])


def _mixed_batch(seed=0):
    rng = np.random.RandomState(seed)
    lens = np.array([11, 1, 4, 9, 2], dtype=np.int64)
    ids = np.zeros((len(lens), lens.max()), dtype=np.int64)
    for i, n in enumerate(lens):
        ids[i, :n] = rng.randint(1, VOCAB, n)
    return ids, lens


@pytest.fixture(scope="module", params=["lstm", "gru"])
def raw_rnn_export(request, tmp_path_factory):
    """A 2-layer bidirectional RNN returning per-step outputs and final states, converted raw."""
    paddle.seed(1)
    model = TinyRNN(request.param, raw=True)
    model.eval()
    d = tmp_path_factory.mktemp(f"rnn_{request.param}")
    prefix = str(d / "model")
    save_inference(model, prefix, INPUTS)
    raw_path = convert(prefix, str(d / "raw.onnx"), f"tiny_{request.param}")
    return model, onnx.load(raw_path), request.param


def test_rnn_sequence_lens_fix_is_needed_and_exact(raw_rnn_export):
    model, raw, cell = raw_rnn_export
    ids, lens = _mixed_batch()
    with paddle.no_grad():
        want_steps, want_final = (t.numpy() for t in model(paddle.to_tensor(ids), paddle.to_tensor(lens)))

    # What paddle2onnx 2.1.0 emits: one bidirectional node per layer, sequence_lens empty.
    nodes = rnn_nodes(raw)
    assert [n["op"] for n in nodes] == [cell.upper()] * 2
    assert all(n["direction"] == "bidirectional" and not n["sequence_lens"] for n in nodes)
    feed = {"input_ids": ids, "seq_len": lens}
    steps, final = _session(raw).run(None, feed)
    # Without the fix the pads are run through: outputs and final states come out wrong.
    assert np.abs(steps - want_steps).max() > 1e-3
    assert np.abs(final - want_final).max() > 1e-3

    fixed = onnx.ModelProto()
    fixed.CopyFrom(raw)
    assert wire_rnn_sequence_lens(fixed) == 2
    onnx.checker.check_model(fixed)
    steps, final = _session(fixed).run(None, feed)
    # With it: every position (pads included: zeros in both) and the final states match.
    assert np.abs(steps - want_steps).max() <= 1e-5
    assert np.abs(final - want_final).max() <= 1e-5
    assert np.all(steps[1, 1:] == 0)


def test_fix_is_idempotent(raw_rnn_export):
    _, raw, _ = raw_rnn_export
    fixed = onnx.ModelProto()
    fixed.CopyFrom(raw)
    assert wire_rnn_sequence_lens(fixed) == 2
    assert wire_rnn_sequence_lens(fixed) == 0  # already wired: nothing doubled
    assert sum(n.op_type == "Cast" and n.input[0] == "seq_len" for n in fixed.graph.node) == 1


def test_unsupported_op_is_a_clear_error_not_an_abort(tmp_path):
    model = TinyCRFTagger()
    prefix = str(tmp_path / "model")
    save_inference(model, prefix, INPUTS)  # keeps viterbi_decode in the program
    with pytest.raises(ExportFailedError, match=r"tiny_tagger.*viterbi_decode"):
        convert(prefix, str(tmp_path / "m.onnx"), "tiny_tagger")
    assert not os.path.exists(tmp_path / "m.onnx")


def test_export_onnx_names_outputs_and_fp16_keeps_io_types(tmp_path):
    paddle.seed(2)
    model = TinyRNN("lstm")
    model.eval()
    prefix = str(tmp_path / "model")
    save_inference(model, prefix, INPUTS)
    info = export_onnx(prefix, str(tmp_path / "m.onnx"), "tiny", ["logits"])
    assert info["opset"] >= 13 and info["rnn_sequence_lens_wired"] == 2
    half = convert_onnx_fp16(str(tmp_path / "m.onnx"), str(tmp_path / "m16.onnx"))
    ids, lens = _mixed_batch(3)
    with paddle.no_grad():
        want = model(paddle.to_tensor(ids), paddle.to_tensor(lens)).numpy()
    for path, tol in ((str(tmp_path / "m.onnx"), 1e-5), (half, 5e-2)):
        sess = _session(path)
        assert [o.name for o in sess.get_outputs()] == ["logits"]
        assert [i.type for i in sess.get_inputs()] == ["tensor(int64)"] * 2
        got = sess.run(None, {"input_ids": ids, "seq_len": lens})[0]
        assert got.dtype == np.float32
        assert np.abs(got - want).max() <= tol
    types = {n.op_type for n in onnx.load(half).graph.node}
    assert "Cast" in types  # fp16 islands are wrapped in casts; RNN cells stay fp32


def test_graph_onnxruntime_cannot_run_is_a_clear_error(tmp_path):
    """A converted graph that ONNX Runtime rejects (here: an Expand to an impossible shape,
    like paddle2onnx's expand_as) fails the export with the model's name, in a child process."""
    from onnx import TensorProto, helper

    from ppvarlen.export.onnx_export import check_loads

    shape = helper.make_node("Constant", [], ["shape"], value=helper.make_tensor(
        "v", TensorProto.INT64, [2], [-5, 3]))
    expand = helper.make_node("Expand", ["input_ids", "shape"], ["logits"])
    graph = helper.make_graph(
        [shape, expand], "bad",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["b", "l"]),
         helper.make_tensor_value_info("seq_len", TensorProto.INT64, ["b"])],
        [helper.make_tensor_value_info("logits", TensorProto.INT64, None)])
    path = str(tmp_path / "bad.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    with pytest.raises(ExportFailedError, match=r"tiny_bad: onnxruntime cannot load or run bad.onnx"):
        check_loads(path, "tiny_bad")
