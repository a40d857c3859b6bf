"""benchmarks/serve_split.py runs its documented command on a tiny export: servers not split,
split and with two workers side by side, each one's setting, points and memory in the JSON."""
import json
import os
import subprocess
import sys

import pytest
from export_helpers import cls_export  # noqa: F401

from ppvarlen.utils.parallel import usable_cores

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.skipif(usable_cores() < 2, reason="one usable core: no threads to split")
def test_the_documented_command_runs_on_a_tiny_export(cls_export, tmp_path):  # noqa: F811
    out = tmp_path / "out"
    run = subprocess.run(
        [sys.executable, os.path.join(REPO, "benchmarks", "serve_split.py"), "--export",
         cls_export[0], "--precision", "fp32", "--concurrency", "1", "4", "--duration-s", "1",
         "--warmup-s", "0.5", "--rounds", "1", "--out", str(out)],
        capture_output=True, text=True, timeout=600, cwd=REPO,
        env=dict(os.environ, PYTHONPATH=REPO))
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads((out / "serve_split.json").read_text())
    names = ["not split", "split", "2 workers"]
    assert [p["setting"] for p in result["points"]] == names * 2
    assert all(p["ok"] > 0 and p["errors"] == 0 for p in result["points"])
    assert list(result["rss_mib"]) == names and all(v > 0 for v in result["rss_mib"].values())
    assert result["x_not_split_per_round"]["not split c=4"] == [1.0]
    assert (out / "serve_split.png").stat().st_size > 0
