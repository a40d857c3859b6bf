"""Seq2seq export: Paddle Inference with the greedy loop in the graph, ONNX encoder + decoder
step with the loop in numpy, greedy-output parity, manifest, limits, early exit.

Tiny random models; the EOS logit is biased so that rows of one batch end at different steps,
some with their own EOS and some cut at their limit (asserted, or the tests would test little).
"""
import json

import numpy as np
import paddle
import pytest

from ppvarlen.config import ConfigError, load_config
from ppvarlen.data.vocab import SPECIAL_TOKENS, TextEncoder
from ppvarlen.export import ExportFailedError
from ppvarlen.export import parity
from ppvarlen.export.exporter import export_model, save_view
from ppvarlen.models.seq2seq import GreedyProgram, Seq2SeqTransformer
from ppvarlen.utils.io import sha256_file
from ppvarlen.utils.search import length_limits

VOCAB, PAD, EOS, MAX_LEN, MAX_POSITION = 14, 0, 5, 12, 40
OUTPUT_SIZE = 11  # the decoder generates ids < 11 only; sources also use 11..13 (as g2p does)
A, B = 1.5, 2
CFG = load_config(data={"Deploy": {"max_batch_size": 16, "max_batch_tokens": 256},
                        "Data": {"eval_max_tokens": 48}, "Export": {"parity_max_examples": 30}})


def tiny_model(eos_bias, seed=3):
    paddle.seed(seed)
    model = Seq2SeqTransformer(VOCAB, hidden_size=16, num_heads=2, ffn_size=32, num_layers=1,
                               num_decoder_layers=2, dropout=0.0, max_position=MAX_POSITION,
                               max_len_a=A, max_len_b=B, output_size=OUTPUT_SIZE)
    with paddle.no_grad():
        model.out_proj.bias[EOS] = eos_bias
    model.eval()
    return model


def encoder():
    return TextEncoder(list(SPECIAL_TOKENS) + [chr(0x4e00 + i) for i in range(VOCAB - 6)])


META = {"task": "seq2seq", "model_name": "seq2seq", "label_names": [], "num_labels": 0,
        "special_ids": {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "bos": 4, "eos": 5},
        "max_len": MAX_LEN, "max_position": MAX_POSITION, "long_text": "error", "buckets": [6],
        "length_profile": {"p50": 5, "p95": 10, "p99": 12, "max": 12}}


def split_items(n=40, seed=0):
    rng = np.random.RandomState(seed)
    return [{"src_ids": rng.randint(6, VOCAB, rng.randint(1, MAX_LEN + 1)).tolist(),
             "tgt_ids": [4, 5], "doc_id": i} for i in range(n)]


def batch(lengths, seed=1):
    rng = np.random.RandomState(seed)
    lengths = np.asarray(lengths, np.int64)
    ids = np.zeros((len(lengths), lengths.max()), np.int64)
    for i, n in enumerate(lengths):
        ids[i, :n] = rng.randint(6, VOCAB, n)
    return ids, lengths


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    model = tiny_model(eos_bias=1.0)
    out = tmp_path_factory.mktemp("s2s") / "export"
    # auto (the config's default) is fp32 for seq2seq, the reduced precisions recorded as left out
    manifest = export_model(model, META, encoder(), CFG, str(out), ["paddle", "onnx"], ["auto"],
                            verify=True, test_examples=split_items())
    return model, out, manifest


def test_auto_exports_fp32_and_records_why_not_the_others(exported):
    _, _, manifest = exported
    assert manifest["precisions"] == {"paddle": ["fp32"], "onnx": ["fp32"]}
    left_out = manifest["precision_measured"]
    assert {p: e["verified"] for p, e in left_out["paddle"].items()} == {"bf16": False}
    assert "seq2seq exports are fp32 only" in left_out["onnx"]["int8"]["reason"]


def runners(out, decoding):
    return {"paddle_inference_onednn": parity.greedy_paddle_runner(str(out), EOS),
            "paddle_inference": parity.greedy_paddle_runner(str(out), EOS, onednn=False),
            "onnx": parity.onnx_greedy_runner(str(out), decoding)}


def test_manifest_and_files(exported):
    _, out, manifest = exported
    assert json.loads((out / "manifest.json").read_text()) == manifest
    for rel in ["vocab.txt", "encoder.json", "paddle/model.json", "paddle/model.pdiparams",
                "onnx/encoder.onnx", "onnx/decoder_step.onnx", "parity.json"]:
        assert manifest["files"][rel] == sha256_file(out / rel), rel
    assert manifest["task"] == "seq2seq" and manifest["max_len"] == MAX_LEN
    assert manifest["inputs"] == [{"name": "src_ids", "dtype": "int64", "dims": [-1, -1]},
                                  {"name": "src_len", "dtype": "int64", "dims": [-1]}]
    assert manifest["outputs"] == [{"name": "tokens", "dtype": "int64", "dims": [-1, -1]}]
    assert manifest["decoding"] == {"strategy": "greedy", "max_len_a": A, "max_len_b": B,
                                    "max_position": MAX_POSITION, "bos_id": 4, "eos_id": EOS,
                                    "pad_id": PAD}
    assert manifest["long_text"]["policy"] == "error"
    paddle_entry, onnx_entry = manifest["backends"]["paddle"], manifest["backends"]["onnx"]
    assert paddle_entry["outputs"] == ["tokens"] and paddle_entry["decode"] == "in_graph"
    assert onnx_entry["encoder"] == "onnx/encoder.onnx" and onnx_entry["decode"] == "greedy_numpy"
    assert onnx_entry["decoder_step"] == "onnx/decoder_step.onnx" and onnx_entry["opset"] >= 13
    assert onnx_entry["cache"]["layers"] == 2 and onnx_entry["cache"]["heads"] == 2
    assert manifest["precisions"] == {"paddle": ["fp32"], "onnx": ["fp32"]}
    assert set(manifest["shape_ranges"]) == {"src_ids", "src_len"}


def test_onnx_graph_io_names(exported):
    import onnx

    _, out, _ = exported
    enc = onnx.load(str(out / "onnx" / "encoder.onnx")).graph
    step = onnx.load(str(out / "onnx" / "decoder_step.onnx")).graph
    assert [i.name for i in enc.input] == ["src_ids", "src_len"]
    assert [o.name for o in enc.output] == ["cross_k", "cross_v"]
    assert [i.name for i in step.input] == ["tokens", "src_len", "self_k", "self_v", "cross_k",
                                            "cross_v"]
    assert [o.name for o in step.output] == ["logp", "new_self_k", "new_self_v"]


def test_onnx_step_positions_exact_up_to_the_last_position(exported):
    """paddle2onnx exports ``int * python int`` (the step's position arithmetic) through float32
    Casts; exact for ints < 2**24, checked here where it matters most: the last position row."""
    model, out, _ = exported
    _, run_step = parity.onnx_step_sessions(str(out))
    rng = np.random.RandomState(0)
    layers, heads, dim = 2, model.num_heads, model.head_dim
    for cached in (1, 2, MAX_POSITION // 2, MAX_POSITION):  # position = cached - 1
        cache = [rng.randn(layers, 2, heads, n, dim).astype("float32") for n in (cached, cached)]
        cross = [rng.randn(layers, 2, heads, 5, dim).astype("float32") for _ in range(2)]
        arrays = [np.array([[7], [9]], np.int64), np.array([5, 3], np.int64)] + cache + cross
        with paddle.no_grad():
            ref = model.decode_step(*[paddle.to_tensor(a) for a in arrays])
        got = run_step(*arrays)
        for r, g in zip(ref, got):
            assert g.shape == tuple(r.shape)
            real = r.numpy() > -1e8
            np.testing.assert_allclose(g[real], r.numpy()[real], atol=1e-4)


def test_parity_report_identical_on_grid_and_test(exported):
    model, out, _ = exported
    report = json.loads((out / "parity.json").read_text())
    assert report["passed"] and not report["failures"]
    assert set(report["results"]["grid"]) == {"dygraph", "paddle_inference",
                                              "paddle_inference_onednn", "onnx"}
    assert set(report["results"]["test"]) == {"dygraph", "paddle_inference_onednn", "onnx"}
    for part, examples in (("grid", None), ("test", 30)):
        res = report["results"][part]
        for name in set(res) - {"dygraph"}:
            assert res[name]["identical_rate"] == 1.0 and not res[name]["mismatches"]
            assert res[name]["sentences_per_s"] > 0
            if examples:
                assert res[name]["examples"] == examples
    assert report["grid"]["lengths"] == [1, 2, 5, 6, 7, 12]
    step = report["step_logp"]["onnx"]
    assert step["steps"] > 3 and step["max_abs_diff"] < 1e-4
    # the test outputs are interesting: some rows end with EOS early, some at their limit
    items = split_items()[:30]
    lens = np.array([len(e["src_ids"]) for e in items])
    ids = np.zeros((len(items), lens.max()), np.int64)
    for i, e in enumerate(items):
        ids[i, :lens[i]] = e["src_ids"]
    ends = np.array([len(o) + 1 for o in model.greedy_decode(ids, lens)])
    limits = length_limits(lens, A, B, MAX_POSITION)
    assert (ends < limits).any() and (ends == limits).any() and (ends <= limits).all()


def test_alone_or_batched_same_output_through_each_backend(exported):
    model, out, manifest = exported
    ids, lens = batch([1, 12, 4, 9, 2, 7])
    want = model.greedy_decode(ids, lens)
    for name, run in runners(out, manifest["decoding"]).items():
        assert run(ids, lens) == want, name
        for i, n in enumerate(lens):
            assert run(ids[i:i + 1, :n], lens[i:i + 1]) == [want[i]], (name, i)


def test_paddle_tokens_layout_eos_then_pad(exported):
    _, out, _ = exported
    from paddle import inference

    from ppvarlen.export.precision import paddle_config

    ids, lens = batch([3, 12, 1, 8])
    pred = inference.create_predictor(paddle_config(str(out / "paddle")))
    pred.get_input_handle("src_ids").copy_from_cpu(ids)
    pred.get_input_handle("src_len").copy_from_cpu(lens)
    pred.run()
    tokens = pred.get_output_handle(pred.get_output_names()[0]).copy_to_cpu()
    assert tokens.dtype == np.int64 and tokens.shape[0] == 4
    ends = []
    for row in tokens.tolist():
        assert EOS in row
        end = row.index(EOS)
        assert all(t == PAD for t in row[end + 1:])
        ends.append(end + 1)
    assert tokens.shape[1] == max(ends)  # early exit: no column after the last EOS


def test_traced_once_for_all_shapes():
    model = tiny_model(eos_bias=1.0)
    program = GreedyProgram(model)
    static = paddle.jit.to_static(program, input_spec=program.input_spec(), full_graph=True)
    for lens in ([5], [1, 12, 3], [7, 7], [2, 11, 4, 1, 9]):
        ids, sl = batch(lens, seed=len(lens))
        tokens = static(paddle.to_tensor(ids), paddle.to_tensor(sl)).numpy()
        got = [r[:r.index(EOS)] for r in tokens.tolist()]
        assert got == model.greedy_decode(ids, sl)
    assert static.forward.get_traced_count() == 1


@pytest.fixture(scope="module")
def never_eos(tmp_path_factory):
    model = tiny_model(eos_bias=-1e4)  # EOS never wins the argmax: only the limits end rows
    out = tmp_path_factory.mktemp("s2s_never") / "export"
    manifest = export_model(model, META, encoder(), CFG, str(out), ["paddle", "onnx"], ["fp32"],
                            verify=False)
    return model, out, manifest


def test_a_model_that_never_emits_eos_stops_at_each_rows_limit(never_eos):
    model, out, manifest = never_eos
    ids, lens = batch([1, 12, 4, 9])
    limits = length_limits(lens, A, B, MAX_POSITION)
    want = model.greedy_decode(ids, lens)
    assert [len(w) + 1 for w in want] == limits.tolist()  # EOS forced, counted in the limit
    for name, run in runners(out, manifest["decoding"]).items():
        assert run(ids, lens) == want, name


def test_all_rows_done_at_once_means_one_step(tmp_path):
    model = tiny_model(eos_bias=1e4)  # EOS at the first step for every row
    static = save_view(GreedyProgram(model), str(tmp_path / "model"))
    ids, lens = batch([3, 12, 1])
    tokens = static(paddle.to_tensor(ids), paddle.to_tensor(lens)).numpy()
    assert tokens.tolist() == [[EOS]] * 3


def test_parity_failure_keeps_the_old_export(exported, monkeypatch):
    model, out, _ = exported
    before = (out / "manifest.json").read_text()
    original = parity.served_greedy_runner

    def one_token_more(export_dir, manifest, backend, threads):
        run, settings = original(export_dir, manifest, backend, threads)
        return (lambda ids, lens: [o + [6] for o in run(ids, lens)]), settings

    monkeypatch.setattr(parity, "served_greedy_runner", one_token_more)
    with pytest.raises(ExportFailedError, match="greedy outputs differ"):
        export_model(model, META, encoder(), CFG, str(out), ["paddle"], ["fp32"],
                     verify=True, test_examples=split_items(8))
    assert (out / "manifest.json").read_text() == before
    failed = json.loads((out.parent / "export.parity-failed.json").read_text())
    assert failed["results"]["grid"]["paddle_inference_onednn"]["mismatches"]


def test_low_precisions_are_refused_for_seq2seq(tmp_path):
    for precision in ("bf16", "fp16"):
        with pytest.raises(ConfigError, match=f"\\['{precision}'\\] not supported for seq2seq"):
            export_model(tiny_model(0.0), META, encoder(), CFG, str(tmp_path / "o"),
                         ["paddle", "onnx"], ["fp32", precision])
    assert not (tmp_path / "o").exists()


def test_a_corrupted_file_fails_the_sha256_check(exported, tmp_path):
    import shutil

    from ppvarlen.runtime.manifest import UnservableExportError
    from ppvarlen.runtime.manifest import load_manifest

    _, out, _ = exported
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    load_manifest(str(copy))
    with open(copy / "onnx" / "decoder_step.onnx", "ab") as f:
        f.write(b"\0")
    with pytest.raises(UnservableExportError, match="decoder_step.onnx: sha256"):
        load_manifest(str(copy))
