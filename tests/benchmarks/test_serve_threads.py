"""benchmarks/serve_threads.py runs its documented command on a tiny export: servers at one
thread, at the usable cores and at ``auto``, side by side, auto's choice in the JSON."""
import json
import os
import subprocess
import sys

from export_helpers import cls_export  # noqa: F401

from ppvarlen.utils.parallel import usable_cores

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_documented_command_runs_on_a_tiny_export(cls_export, tmp_path):  # noqa: F811
    out = tmp_path / "out"
    run = subprocess.run(
        [sys.executable, os.path.join(REPO, "benchmarks", "serve_threads.py"), "--export",
         cls_export[0], "--backend", "onnx", "--precision", "fp32", "--concurrency", "2",
         "--duration-s", "1", "--warmup-s", "0.5", "--rounds", "1", "--out", str(out)],
        capture_output=True, text=True, timeout=600, cwd=REPO,
        env=dict(os.environ, PYTHONPATH=REPO))
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads((out / "serve_threads.json").read_text())
    cores = usable_cores()
    expected = ["1", str(cores), "auto"] if cores > 1 else ["1", "auto"]
    assert [p["threads"] for p in result["points"]] == expected
    assert all(p["ok"] > 0 and p["errors"] == 0 for p in result["points"])
    assert result["auto"]["threads"] in (1, cores) and result["auto"]["threads_reason"]
    fixed = [r[0] for k, r in result["x_best_fixed_per_round"].items() if "auto" not in k]
    assert max(fixed) == 1.0 and len(fixed) == len(expected) - 1  # against the better count
    assert (out / "serve_threads.png").stat().st_size > 0
