"""benchmarks/auto_timing.py runs its documented command (its workloads are
precision_choice.WORKLOADS: tests/serve/test_precision_auto.py)."""
import json
import os
import subprocess
import sys

from export_helpers import cls_export  # noqa: F401

from ppvarlen.utils.io import HOST_TAG

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_documented_command_runs_on_a_tiny_export(cls_export, tmp_path):  # noqa: F811
    """docs/PRECISION.md's command, small: both workloads timed in fresh processes, each
    candidate's texts per CPU-s and its ratio to ONNX fp32 in the JSON."""
    out = tmp_path / "out"
    out.mkdir()
    dead = out / f".tmp-auto_timing.json.pid999999999.{HOST_TAG}.abc"  # a killed run's half file
    dead.write_text("{")
    run = subprocess.run(
        [sys.executable, os.path.join(REPO, "benchmarks", "auto_timing.py"), "--export",
         cls_export[0], "--rounds", "1", "--budget-s", "0.2", "--threads", "1", "--out",
         str(out)], capture_output=True, text=True, timeout=600, cwd=REPO,
        env=dict(os.environ, PYTHONPATH=REPO))
    assert run.returncode == 0, run.stderr[-3000:]
    runs = json.loads((out / "auto_timing.json").read_text())["runs"]
    assert [r["workload"] for r in runs] == ["requests", "files"]
    for r in runs:
        assert set(r["texts_per_cpu_s"]) == {"paddle fp32", "onnx fp32"}
        assert r["vs_onnx_fp32"]["onnx fp32"] == 1.0
    assert (out / "auto_timing.png").stat().st_size > 0
    assert not dead.exists()
