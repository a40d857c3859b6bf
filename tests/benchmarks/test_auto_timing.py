"""benchmarks/auto_timing.py's served workload: lengths drawn from an export's length profile
in its bands, sorted, cut into groups of 1, 2 and 4.  No engine runs here."""
import json
import os
import random
import subprocess
import sys

import pytest
from export_helpers import cls_export  # noqa: F401
from script_loader import load_script

from ppvarlen.utils.io import HOST_TAG

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def bench():
    return load_script("benchmarks/auto_timing.py")


def test_lengths_follow_the_profile_bands(bench):
    profile = {"p50": 48, "p95": 191, "p99": 256, "max": 256}
    lengths = bench.profile_lengths(profile, 256, 4000, random.Random(0))
    assert lengths == sorted(lengths) and 1 <= lengths[0] and lengths[-1] <= 256
    share = sum(n <= 48 for n in lengths) / len(lengths)
    assert 0.45 < share < 0.56  # half the mass up to p50 (plus the band edges)
    assert 0.9 < sum(n <= 191 for n in lengths) / len(lengths) < 0.98
    assert bench.profile_lengths({"p50": 500, "p95": 900}, 64, 50, random.Random(1))[-1] <= 64


def test_served_batches_are_groups_of_one_two_and_four(bench):
    class Encoder:
        vocab_size = 100

    class Predictor:
        manifest = {"length_profile": {"p50": 8, "p95": 30, "p99": 40, "max": 40},
                    "special_ids": {"pad": 0, "unk": 1}}
        encoder, max_len = Encoder(), 40

    batches = bench.served_batches(Predictor(), seed=0, texts=15)
    assert [len(b) for b in batches] == [1, 2, 4, 1, 2, 4, 1]
    widths = [max(len(r) for r in b) for b in batches]
    assert widths == sorted(widths)  # length-sorted groups
    assert all(2 <= i < 100 for b in batches for r in b for i in r)
    assert bench.served_batches(Predictor(), seed=0, texts=15) == batches  # seeded


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
    assert [r["workload"] for r in runs] == ["admission", "served"]
    for r in runs:
        assert set(r["texts_per_cpu_s"]) == {"paddle fp32", "onnx fp32"}
        assert r["vs_onnx_fp32"]["onnx fp32"] == 1.0
    assert (out / "auto_timing.png").stat().st_size > 0
    assert not dead.exists()
