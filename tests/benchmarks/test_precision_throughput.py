"""benchmarks/precision_throughput.py's training of a random-init model (``--train-steps``),
on a toy classifier: the loss falls, the weights are kept (safetensors) and a second run
reuses them without training.  No export, no server."""
import os
import types

import numpy as np
import paddle
import pytest
from script_loader import load_script


@pytest.fixture(scope="module")
def bench():
    return load_script("benchmarks/precision_throughput.py")


class Toy(paddle.nn.Layer):
    """The classifier signature the benchmark trains: (ids, seq_len, labels) -> (loss, logits)."""

    def __init__(self):
        super().__init__()
        paddle.seed(1)
        self.embed = paddle.nn.Embedding(8, 4)
        self.head = paddle.nn.Linear(4, 2)

    def forward(self, ids, seq_len, labels):
        logits = self.head(self.embed(ids).mean(axis=1))
        return paddle.nn.functional.cross_entropy(logits, labels), logits


def toy_train(n=64):
    """Token 2 in a text means class 0, token 3 class 1."""
    rng = np.random.RandomState(0)
    labels = rng.randint(0, 2, n)
    return [{"input_ids": [1] + [2 + int(y)] * int(rng.randint(1, 5)), "label": int(y)}
            for y in labels]


def test_train_steps_lowers_the_loss_and_leaves_the_model_in_eval(bench):
    model = Toy()
    losses = bench.train_steps(model, toy_train(), 60, pad_id=0, lr=0.05, rows=16)
    assert len(losses) == 10 and max(losses) < 0.3  # from ln 2 = 0.69 at the start
    assert not model.training


def test_trained_weights_are_kept_and_reused_without_training(bench, tmp_path, monkeypatch):
    args = types.SimpleNamespace(work=str(tmp_path), train_steps=30, train_lr=0.05)
    trained = Toy()
    assert bench.trained_weights(trained, toy_train(), args, 0) is not None
    kept = list(tmp_path.glob("trained_30_steps_lr0.05.safetensors"))
    assert len(kept) == 1
    monkeypatch.setattr(bench, "train_steps", lambda *a, **k: pytest.fail("trained again"))
    fresh = Toy()
    assert bench.trained_weights(fresh, toy_train(), args, 0) is None
    for name, value in trained.state_dict().items():
        np.testing.assert_array_equal(fresh.state_dict()[name].numpy(), value.numpy())
    from ppvarlen.models.weights import read_weights

    assert sorted(read_weights(kept[0])) == sorted(trained.state_dict())  # no pickle: safetensors


def test_an_unknown_int8_variant_is_refused_before_any_export(bench):
    """--int8-variants is checked when the arguments are parsed, naming the unknown name and
    the known ones (not a KeyError after the export and the warm-up)."""
    import argparse

    with pytest.raises(argparse.ArgumentTypeError, match=r"\['int8_bogus'\].*int8_static_requant"):
        bench._variant_names("int8_static_qdq,int8_bogus")
    assert bench._variant_names("") == []
    assert bench._variant_names("int8_static_requant") == ["int8_static_requant"]


def test_every_int8_variant_the_docs_name_exists(bench):
    from test_doc_commands import documented_commands

    named = [(page, v) for page, script, args in documented_commands()
             if script == "benchmarks/precision_throughput.py"
             for flag, value in zip(args, args[1:])
             if flag == "--int8-variants" and not value.startswith("-")  # "" dropped
             for v in value.split(",") if v]
    assert named, "the docs show no --int8-variants value"
    assert [(page, v) for page, v in named if v not in bench.INT8_VARIANTS] == []


def test_an_int8_variant_file_appears_whole_or_not_at_all(bench, tmp_path, monkeypatch):
    """A variant is quantized under its process' name and renamed in: a quantization that
    fails leaves neither the variant nor its temp file (a later run would time half a file),
    and a dead run's temp file is reaped."""
    from ppvarlen.export import parity, quantize
    from ppvarlen.utils.io import owned_prefix

    bench_dir = tmp_path / "export" / "bench"
    bench_dir.mkdir(parents=True)
    dead = bench_dir / (owned_prefix(".tmp-int8_static_qdq").replace(
        f".pid{os.getpid()}.", ".pid999999999.") + "onnx")  # no such process
    dead.write_bytes(b"half")
    monkeypatch.setattr(parity, "onnx_runner", lambda path, outputs, threads: path)

    def failing(src, dst, **options):
        open(dst, "wb").write(b"half a graph")
        raise RuntimeError("killed mid-way")
    monkeypatch.setattr(quantize, "quantize_onnx", failing)
    with pytest.raises(RuntimeError, match="mid-way"):
        bench.build_runners(str(tmp_path / "export"), None, [], 1, ["int8_static_qdq"], [],
                            only={"onnx_int8_static_qdq"})
    assert list(bench_dir.iterdir()) == []

    def writing(src, dst, **options):
        assert options == {"method": "static", "calibration_batches": ["c"]}
        open(dst, "wb").write(b"graph")
    monkeypatch.setattr(quantize, "quantize_onnx", writing)
    runners = bench.build_runners(str(tmp_path / "export"), None, [], 1, ["int8_static_qdq"],
                                  ["c"], only={"onnx_int8_static_qdq"})
    assert runners == {"onnx_int8_static_qdq": str(bench_dir / "int8_static_qdq.onnx")}
    assert [p.name for p in bench_dir.iterdir()] == ["int8_static_qdq.onnx"]


def test_the_documented_serve_command_runs_on_a_tiny_checkpoint(tmp_path):
    """``--serve`` as docs/PRECISION.md runs it (``-c CONFIG --checkpoint DIR``), small: a
    2-step checkpoint of the quickstart config, exported the default way (every precision this
    host verifies), served four times side by side (the defaults, each backend's ``auto``,
    ONNX Runtime fp32), one short round.  Nothing about which is faster is asserted."""
    import json
    import subprocess
    import sys

    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=repo)
    train = subprocess.run(
        [sys.executable, os.path.join(repo, "tools", "train.py"), "-c",
         "configs/sentiment/wide_deep.yaml", "-o", f"Global.output_dir={tmp_path / 'run'}",
         "-o", "Train.max_steps=2", "-o", "Data.limit=200", "-o", "Train.progress_bar=false"],
        capture_output=True, text=True, timeout=600, cwd=repo, env=env)
    assert train.returncode == 0, train.stderr[-3000:]
    out = tmp_path / "out"
    run = subprocess.run(
        [sys.executable, os.path.join(repo, "benchmarks", "precision_throughput.py"), "-c",
         str(tmp_path / "run" / "config.yaml"), "--checkpoint", str(tmp_path / "run" / "best"),
         "--serve", "-o", "Export.parity_max_examples=20", "--calibration-examples", "16",
         "--duration-s", "1", "--warmup-s", "0.5", "--rounds", "1", "--concurrency", "2",
         "--threads", "1", "--work", str(tmp_path / "work"), "--out", str(out)],
        capture_output=True, text=True, timeout=900, cwd=repo, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads((out / "serve_precision.json").read_text())
    assert [p["server"] for p in result["points"]] == ["auto", "auto_paddle", "auto_onnx",
                                                      "onnx_fp32"]
    assert all(p["ok"] > 0 and p["errors"] == 0 for p in result["points"])
    assert result["auto_backend"]["auto"] in ("paddle", "onnx")
    assert result["auto_backend"]["auto_paddle"] == "paddle"
    assert result["auto_backend"]["auto_onnx"] == "onnx"
    assert result["auto_chose"]["auto"] in result["precisions_exported"][
        result["auto_backend"]["auto"]]
    assert (out / "serve_precision.png").stat().st_size > 0
