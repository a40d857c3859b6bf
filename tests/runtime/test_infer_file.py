"""deploy/python/infer.py and bench_client (script and library) on a tiny export (subprocesses,
loopback)."""
import json
import os
import subprocess
import sys

import pytest
from export_helpers import TEXTS, cls_export, tag_export  # noqa: F401

from ppvarlen.runtime.predictor import Predictor

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INFER = os.path.join(REPO, "deploy", "python", "infer.py")


def run_infer(*args):
    return subprocess.run([sys.executable, INFER, "--no-progress", *args], capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("backend", ["paddle", "onnx"])
def test_infer_txt_in_order_with_bad_lines_reported(tag_export, tmp_path, backend):  # noqa: F811
    lines = [TEXTS[2], "", TEXTS[0], "   ", TEXTS[5]]
    src = tmp_path / "in.txt"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    r = run_infer("--model-dir", tag_export[0], "--backend", backend, "--input", str(src),
                  "--output", str(out))
    assert r.returncode == 1, r.stderr  # two bad lines
    assert f"{src}:2: text is empty" in r.stderr and f"{src}:4:" in r.stderr
    summary = json.loads(r.stderr.strip().splitlines()[-1])
    assert summary["texts"] == 5 and summary["failed"] == 2 and summary["texts_per_s"] > 0
    assert 0 < summary["padding_efficiency"] <= 1 and summary["tokens_per_s"] > 0
    records = [json.loads(x) for x in out.read_text(encoding="utf-8").splitlines()]
    assert [rec["line"] for rec in records] == [1, 2, 3, 4, 5]
    want = Predictor(tag_export[0], backend).predict([lines[0], lines[2], lines[4]])
    got = [records[0], records[2], records[4]]
    assert [g["tags"] for g in got] == [w["tags"] for w in want]
    assert "error" in records[1] and "error" in records[3]
    # repaired tag sequences are counted in the summary, over the answers written
    assert summary["tag_chunks_repaired"] == sum(g["repaired_chunks"] for g in got)
    assert summary["tag_sequences_repaired"] == sum(g["repaired_chunks"] > 0 for g in got)


def test_infer_jsonl_to_stdout(cls_export, tmp_path):  # noqa: F811
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join([json.dumps({"text": TEXTS[0]}), "{oops", json.dumps({"txt": "x"}),
                              json.dumps({"text": TEXTS[1], "id": 7})]) + "\n", encoding="utf-8")
    r = run_infer("--model-dir", cls_export[0], "--backend", "onnx", "--input", str(src))
    assert r.returncode == 1
    records = [json.loads(x) for x in r.stdout.splitlines()]
    want = Predictor(cls_export[0], "paddle").predict([TEXTS[0], TEXTS[1]])
    assert records[0]["label"] == want[0]["label"] and records[3]["label"] == want[1]["label"]
    assert "not valid JSON" in records[1]["error"] and f"{src}:3" in records[2]["error"]


def test_infer_refuses_bad_arguments_without_traceback(cls_export, tmp_path):  # noqa: F811
    xml = tmp_path / "in.xml"
    xml.write_text("a\n", encoding="utf-8")
    r = run_infer("--model-dir", cls_export[0], "--input", str(xml))
    assert r.returncode == 2 and ".txt" in r.stderr and "Traceback" not in r.stderr
    # a training format is read as training reads it: a bad record is its line's error record
    csv = tmp_path / "in.csv"
    csv.write_text("好,pos\n坏\n", encoding="utf-8")  # headerless: text,label by its first line
    r = run_infer("--model-dir", cls_export[0], "--input", str(csv))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    first, bad = map(json.loads, r.stdout.splitlines())
    assert first["line"] == 1 and "error" not in first
    assert bad["error"].startswith(f"{csv}:2: expected 2 comma-separated columns")
    # a header naming no column the model reads: refused before any record, with the fix
    csv.write_text("body,label\n好,pos\n", encoding="utf-8")
    r = run_infer("--model-dir", cls_export[0], "--input", str(csv))
    assert r.returncode == 2 and f"{csv} header: no column is the 'text'" in r.stderr
    assert "Data.text_field" in r.stderr and "Traceback" not in r.stderr and not r.stdout
    r = run_infer("--model-dir", str(tmp_path), "--input", str(xml))
    assert r.returncode == 2 and "manifest.json is missing" in r.stderr


@pytest.mark.parametrize("backend", ["paddle", "onnx"])
def test_the_documented_bench_client_command_serves_the_backend_asked(
        cls_export, tmp_path, backend):  # noqa: F811
    """docs/BENCHMARKS.md: ``deploy/python/bench_client.py --backend paddle``, then ``onnx``
    (small: a few requests on the tiny export); both servers run the engine named."""
    out = tmp_path / "bench"
    r = subprocess.run([sys.executable, os.path.join(REPO, "deploy", "python", "bench_client.py"),
                        "--model-dir", cls_export[0], "--backend", backend, "--concurrency", "4",
                        "--requests", "40", "--duration", "10", "--output-dir", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.load(open(out / "bench.json"))
    assert res["requested_backend"] == backend == res["backend"]
    for s in res["settings"].values():
        assert s["ok"] == s["requests"] == 40 and s["server"]["served"]["backend"] == backend


def test_bench_compares_batching_on_and_off(cls_export, tmp_path):  # noqa: F811
    from ppvarlen.serve.bench import run_benchmark

    res = run_benchmark(cls_export[0], str(tmp_path), concurrency=8, max_requests=120,
                        duration_s=20, warmup_requests=16, texts=TEXTS)
    dyn, one = res["settings"]["dynamic_batching"], res["settings"]["one_at_a_time"]
    # backend auto: the first server chose, the second served the same engine, precision and
    # threads (as named: only batching differs)
    assert res["requested_backend"] == "auto" and res["backend"] in ("paddle", "onnx")
    assert dyn["server"]["served"] == one["server"]["served"] == {
        k: res[k] for k in ("backend", "precision", "threads")}
    for s in (dyn, one):
        assert s["ok"] == s["requests"] == 120 and s["errors"] == 0
        assert s["latency_ms"]["p99"] >= s["latency_ms"]["p50"] > 0
    assert one["server"]["mean_batch_size"] == 1.0 and one["server"]["padding_efficiency"] == 1.0
    assert dyn["server"]["settings"]["max_batch_size"] > 1
    assert os.path.getsize(tmp_path / "bench.png") > 0
    assert json.load(open(tmp_path / "bench.json"))["qps_speedup"] == res["qps_speedup"]
