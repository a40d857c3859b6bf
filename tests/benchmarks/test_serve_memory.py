"""benchmarks/serve_memory.py, as docs/PRECISION.md (Memory) runs it, small: each bound runs the
engine it names (one weight copy on the grid, a weight copy per shape on the grid that fits the
budget, a capacity of 64 at each batch's own shape)."""
import json
import os
import subprocess
import sys

from export_helpers import cls_export  # noqa: F401

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_each_bound_runs_the_engine_it_names(cls_export, tmp_path):  # noqa: F811
    out = tmp_path / "out"
    run = subprocess.run(
        [sys.executable, os.path.join(REPO, "benchmarks", "serve_memory.py"), "--out", str(out),
         "--export", cls_export[0], "--shapes", "4", "--max-rows", "2", "--max-len", "16",
         "--threads", "1", "--modes", "paddle:fp32", "--bounds", "budget,shared,old"],
        capture_output=True, text=True, timeout=600, cwd=REPO,
        env=dict(os.environ, PYTHONPATH=REPO))
    assert run.returncode == 0, run.stderr[-3000:]
    results = {r["bound"]: r for r in json.loads((out / "serve_memory.json").read_text())["results"]}
    assert sorted(results) == ["budget", "old", "shared"], run.stdout
    settings = {bound: r["engine_settings"] for bound, r in results.items()}
    assert settings["shared"]["onednn_shared_weights"] is True
    assert settings["shared"]["onednn_cache_capacity"] == 0 and settings["shared"]["onednn_shape_grid"]
    assert settings["budget"]["onednn_shared_weights"] is False
    assert settings["budget"]["onednn_cache_capacity"] >= 1 and settings["budget"]["onednn_shape_grid"]
    assert settings["old"]["onednn_cache_capacity"] == 64 and not settings["old"]["onednn_shape_grid"]
    assert all(r["passes"][1]["texts"] > 0 for r in results.values())
    assert (out / "serve_memory.png").stat().st_size > 0
