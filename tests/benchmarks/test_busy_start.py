"""benchmarks/busy_start.py reads the grid times a server started planning with from its ready
line, in this checkout's wording and in the wording of checkouts before it (a variant may be
an older checkout).  No server runs here."""
import json
import os
import subprocess
import sys

import pytest
from export_helpers import cls_export  # noqa: F401
from script_loader import load_script

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def bench():
    return load_script("benchmarks/busy_start.py")


@pytest.mark.parametrize("line", [
    "[21:13:17] INFO ppvarlen.serve.repository: model m version 1 ready (classification, paddle "
    "backend, 1 worker(s)); batches run on a grid of 4 held shapes (rows [1, 4], widths [64, 256])"
    " with one weight copy for all of them, planned with each shape's fastest run so far "
    "(/metrics.json shape_grid_ms follows them; now, ms, rows x width: 1x64 37.5, 1x256 132.7, "
    "4x64 151.9, 4x256 545.3)",
    "[21:13:17] INFO ppvarlen.serve.repository: model m version 1 ready (classification, paddle "
    "backend, 1 worker(s)); batches run on a grid of 4 held shapes (rows [1, 4], widths [64, 256]),"
    " planned with each shape's fastest run so far (/metrics.json shape_grid_ms follows them; now,"
    " ms, rows x width: 1x64 37.5, 1x256 132.7, 4x64 151.9, 4x256 545.3)",
    "[21:13:17] INFO ppvarlen.serve.repository: model m version 1 ready (classification, paddle "
    "backend, 1 worker(s)); batches run on a grid of 4 held shapes (rows [1, 4], widths [64, 256]),"
    " planned with their measured times (ms, rows x width: 1x64 37.5, 1x256 132.7, 4x64 151.9, "
    "4x256 545.3)"])
def test_the_ready_line_gives_the_grid_times(bench, tmp_path, line):
    log = tmp_path / "serve.log"
    log.write_text("[21:13:00] INFO ppvarlen.serve.server: serving ...\n" + line + "\n")
    assert bench.ready_times(str(log)) == {"1x64": 37.5, "1x256": 132.7, "4x64": 151.9,
                                           "4x256": 545.3}
    log.write_text("a model without a grid: a forward pass costs as much as 16 tokens\n")
    assert bench.ready_times(str(log)) is None


def test_the_documented_command_runs_on_a_tiny_export(cls_export, tmp_path):  # noqa: F811
    """docs/PRECISION.md's command, small: a variant (this checkout) started under bursts and
    the quiet start, served, their grid times at start and after the run in the JSON."""
    out = tmp_path / "out"
    run = subprocess.run(
        [sys.executable, os.path.join(REPO, "benchmarks", "busy_start.py"), "--export",
         cls_export[0], "--variant", f"now={REPO}", "--precision", "fp32", "--threads", "1",
         "--burners", "1", "--burst-s", "0.2", "--gap-s", "0.2", "--concurrency", "2",
         "--duration-s", "1", "--warmup-s", "0.5", "--rounds", "1", "--out", str(out)],
        capture_output=True, text=True, timeout=600, cwd=REPO,
        env=dict(os.environ, PYTHONPATH=REPO))
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads((out / "busy_start.json").read_text())
    assert [p["server"] for p in result["points"]] == ["now", "quiet"]
    assert all(p["ok"] > 0 and p["errors"] == 0 for p in result["points"])
    for grid in result["grid_ms"].values():
        assert grid["at_start"] and list(grid["after_run"]) == list(grid["at_start"])
        assert all(grid["after_run"][k] <= grid["at_start"][k] for k in grid["at_start"])
    assert (out / "busy_start.png").stat().st_size > 0
