"""export_model end to end on tiny models: files, manifest, parity gates, atomic re-export."""
import json
import os

import numpy as np
import onnxruntime as ort
import paddle
import pytest

from ppvarlen.config import load_config
from ppvarlen.data.vocab import SPECIAL_TOKENS, TextEncoder
from ppvarlen.export import ExportFailedError
from ppvarlen.export.exporter import export_model
from ppvarlen.utils.io import sha256_file
from ppvarlen.utils.viterbi import crf_decode
from test_export_models import VOCAB, TinyCRFTagger, TinyRNN, TinyTransformer

MAX_LEN = 24


def _encoder():
    return TextEncoder(list(SPECIAL_TOKENS) + [chr(0x4e00 + i) for i in range(VOCAB - 6)])


def _meta(task, name, labels):
    return {"task": task, "model_name": name, "label_names": labels, "num_labels": len(labels),
            "special_ids": {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "bos": 4, "eos": 5},
            "max_len": MAX_LEN, "max_position": 64, "long_text": "truncate", "buckets": [8, 16],
            "length_profile": {"p50": 7, "p95": 15, "p99": 20, "max": 24}}


def _test_items(n=40, seed=0):
    rng = np.random.RandomState(seed)
    return [{"input_ids": rng.randint(6, VOCAB, rng.randint(1, MAX_LEN + 1)).tolist(), "label": 0,
             "doc_id": i} for i in range(n)]


CFG = load_config(data={"Deploy": {"max_batch_size": 16, "max_batch_tokens": 256}})


@pytest.fixture(scope="module")
def rnn_export(tmp_path_factory):
    paddle.seed(0)
    model = TinyRNN("gru")
    out = tmp_path_factory.mktemp("rnn") / "export"
    manifest = export_model(model, _meta("classification", "rnn_cls", ["neg", "pos", "mid"]),
                            _encoder(), CFG, str(out), ["paddle", "onnx"], ["fp32", "bf16", "fp16"],
                            verify=True, test_examples=_test_items())
    return model, out, manifest


def test_export_directory_layout_and_manifest(rnn_export):
    _, out, manifest = rnn_export
    on_disk = json.loads((out / "manifest.json").read_text())
    assert on_disk == manifest
    for rel in ["vocab.txt", "encoder.json", "paddle/model.json", "paddle/model.pdiparams",
                "onnx/model.onnx", "onnx/model_fp16.onnx", "parity.json"]:
        assert manifest["files"][rel] == sha256_file(out / rel), rel
    assert manifest["format_version"] == 1 and manifest["task"] == "classification"
    assert manifest["inputs"] == [{"name": "input_ids", "dtype": "int64", "dims": [-1, -1]},
                                  {"name": "seq_len", "dtype": "int64", "dims": [-1]}]
    assert [o["name"] for o in manifest["outputs"]] == ["logits"]
    assert manifest["precisions"] == {"paddle": ["fp32", "bf16", "fp16"], "onnx": ["fp32", "fp16"]}
    assert manifest["backends"]["onnx"]["rnn_sequence_lens_wired"] == 2
    # TensorRT ranges from the length profile: opt length = p95, max = max_len.
    assert manifest["shape_ranges"]["input_ids"] == {"min": [1, 1], "opt": [16, 15],
                                                     "max": [16, MAX_LEN]}
    assert manifest["buckets"] == [8, 16] and manifest["max_position"] == 64
    assert set(manifest["versions"]) >= {"paddle", "paddle2onnx", "onnxruntime"}
    assert not [p for p in os.listdir(out.parent) if p.startswith(".tmp-")]


def test_parity_report_covers_grid_and_test_split(rnn_export):
    _, out, _ = rnn_export
    report = json.loads((out / "parity.json").read_text())
    assert report["passed"] and not report["failures"]
    assert report["grid"]["lengths"] == [1, 2, 7, 8, 9, 15, 16, 17, 24]
    assert report["grid"]["batch_sizes"] == [1, 3, 32]
    for part in ("grid", "test"):
        res = report["results"][part]
        assert set(res) == {"static", "paddle_inference", "paddle_inference_onednn",
                            "paddle_inference_onednn_bf16", "onnx", "onnx_fp16"}
        for name in ("static", "paddle_inference", "paddle_inference_onednn", "onnx"):
            assert res[name]["max_abs_diff"] <= 1e-4 and res[name]["agreement"] == 1.0
    assert report["results"]["test"]["onnx"]["compared"] == 40


def test_parity_checked_the_engines_the_predictor_serves(rnn_export):
    """Every served backend/precision was checked with exactly the engine settings the
    predictor (serve, infer) builds for the same directory and Deploy.threads (auto: the
    usable cores, the count auto tries against one): a parity runner of its own, other
    threads or another oneDNN/ONNX Runtime setting fails here."""
    from ppvarlen.runtime.predictor import Predictor
    from ppvarlen.runtime.threads_choice import count
    from ppvarlen.export.precision_speed import PARITY_BACKENDS

    threads = count(CFG.Deploy.threads)

    _, out, manifest = rnn_export
    checked = json.loads((out / "parity.json").read_text())["engines"]
    served_on_cpu = {(b, p) for b, ps in manifest["precisions"].items() for p in ps
                     if not (b == "paddle" and p == "fp16")}  # Paddle fp16 is a GPU setting
    assert {PARITY_BACKENDS[name] for name in checked} == served_on_cpu
    for name, settings in checked.items():
        backend, precision = PARITY_BACKENDS[name]
        predictor = Predictor(str(out), backend, precision=precision, threads=threads)
        assert json.loads(json.dumps(predictor.engine.settings)) == settings, name
    # the comparison can fail: another thread count is another setting
    other = Predictor(str(out), "onnx", threads=threads + 1).engine.settings
    assert other != checked["onnx"]


def test_parity_builds_its_served_backends_with_the_serving_factory(monkeypatch, tmp_path):
    from ppvarlen.runtime import backends
    from ppvarlen.export import parity

    built = []
    real = backends.build_engine

    def recording(export_dir, manifest, backend, **kw):
        built.append((export_dir, backend, kw["precision"]))
        return real(export_dir, manifest, backend, **kw)

    monkeypatch.setattr(parity, "build_engine", recording)
    paddle.seed(0)
    out = tmp_path / "export"
    export_model(TinyRNN("gru"), _meta("classification", "rnn_cls", ["neg", "pos", "mid"]),
                 _encoder(), CFG, str(out), ["paddle"], ["fp32", "bf16"], verify=True)
    assert sorted((b, p) for _, b, p in built) == [("paddle", "bf16"), ("paddle", "fp32")]
    # on the directory being written (renamed into place once parity passed)
    assert all(os.path.basename(d).startswith(".tmp-export.pid") for d, _, _ in built), built


def test_exported_onnx_matches_model_on_mixed_lengths(rnn_export):
    model, out, _ = rnn_export
    ids = np.random.RandomState(5).randint(6, VOCAB, (4, 20)).astype(np.int64)
    lens = np.array([20, 3, 11, 1], dtype=np.int64)
    for i, n in enumerate(lens):
        ids[i, n:] = 0
    with paddle.no_grad():
        want = model(paddle.to_tensor(ids), paddle.to_tensor(lens)).numpy()
    sess = ort.InferenceSession(str(out / "onnx/model.onnx"), providers=["CPUExecutionProvider"])
    got = sess.run(["logits"], {"input_ids": ids, "seq_len": lens})[0]
    assert np.abs(got - want).max() <= 1e-5


def test_tagger_exports_viterbi_in_paddle_and_numpy_decode_for_onnx(tmp_path):
    paddle.seed(3)
    model = TinyCRFTagger()
    out = tmp_path / "export"
    manifest = export_model(model, _meta("tagging", "bigru_crf", ["O", "B", "I", "E", "S"]),
                            _encoder(), CFG, str(out), ["paddle", "onnx"], ["fp32", "fp16"],
                            verify=True, test_examples=_test_items(20, seed=1))
    onnx_entry = manifest["backends"]["onnx"]
    # onnxruntime 1.32 segfaults creating a default session on the fp16 BiGRU-CRF graph.
    assert onnx_entry["session"] == {"disabled_optimizers": ["NchwcTransformer"]}
    assert onnx_entry["decode"] == "viterbi_numpy" and onnx_entry["outputs"] == ["emissions"]
    assert manifest["backends"]["paddle"]["decode"] == "in_graph"
    assert [o["name"] for o in manifest["outputs"]] == ["emissions", "tags"]
    report = json.loads((out / "parity.json").read_text())
    assert report["passed"]
    assert report["results"]["test"]["onnx"]["agreement"] == 1.0
    # The deploy side's path: ONNX emissions + crf_transitions.npy -> the in-graph tags.
    ids = np.random.RandomState(7).randint(6, VOCAB, (3, 9)).astype(np.int64)
    lens = np.array([9, 4, 1], dtype=np.int64)
    with paddle.no_grad():
        _, want_tags = model(paddle.to_tensor(ids), paddle.to_tensor(lens))
    sess = ort.InferenceSession(str(out / "onnx/model.onnx"), providers=["CPUExecutionProvider"])
    emissions = sess.run(None, {"input_ids": ids, "seq_len": lens})[0]
    matrix = np.load(out / onnx_entry["crf_transitions"])
    np.testing.assert_array_equal(crf_decode(emissions, matrix, lens), want_tags.numpy())


@pytest.fixture
def drifting_onnx(monkeypatch):
    """Make the ONNX backend drift by 1e-3, beyond the 1e-4 fp32 gate."""
    from ppvarlen.export import parity

    real = parity.served_runner

    def drifting(export_dir, manifest, backend, *args, **kw):
        run, settings = real(export_dir, manifest, backend, *args, **kw)
        if backend != "onnx":
            return run, settings

        def shifted(ids, lens):
            out = run(ids, lens)
            return {k: v + 1e-3 if v.dtype == np.float32 else v for k, v in out.items()}
        return shifted, settings

    monkeypatch.setattr(parity, "served_runner", drifting)


def test_parity_failure_fails_the_export(tmp_path, drifting_onnx):
    out = tmp_path / "export"
    with pytest.raises(ExportFailedError, match=r"grid/onnx: max \|diff\|"):
        export_model(TinyTransformer(), _meta("classification", "transformer_cls", ["a", "b"]),
                     _encoder(), CFG, str(out), ["paddle", "onnx"], ["fp32"], verify=True)
    assert not out.exists()
    assert json.loads((tmp_path / "export.parity-failed.json").read_text())["passed"] is False


def test_failed_reexport_keeps_the_old_export(rnn_export, drifting_onnx):
    model, out, _ = rnn_export
    before = {p: (out / p).read_bytes() for p in ("manifest.json", "onnx/model.onnx")}
    with pytest.raises(ExportFailedError, match="parity check failed"):
        export_model(model, _meta("classification", "rnn_cls", ["neg", "pos", "mid"]), _encoder(),
                     CFG, str(out), ["paddle", "onnx"], ["fp32"], verify=True)
    assert {p: (out / p).read_bytes() for p in before} == before
    assert not [p for p in os.listdir(out.parent) if p.startswith((".tmp-", ".old-"))]
