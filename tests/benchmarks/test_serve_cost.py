"""benchmarks/serve_cost.py without timing: the CPU it reads from /proc, the medians and
ratios of its table.  No server, no perf_analyzer."""
import os
import sys

import pytest
from script_loader import REPO, load_script


@pytest.fixture(scope="module")
def cost():
    sys.path.insert(0, os.path.join(REPO, "benchmarks"))  # its sibling serve_vs_triton.py
    try:
        yield load_script("benchmarks/serve_cost.py")
    finally:
        sys.path.remove(os.path.join(REPO, "benchmarks"))


def test_process_cpu_counts_every_thread_and_the_main_one_apart(cost):
    whole, main = cost.process_cpu_s(os.getpid())
    sum(i * i for i in range(300_000))  # some CPU in this (the main) thread
    whole2, main2 = cost.process_cpu_s(os.getpid())
    assert 0 <= main <= whole and whole2 >= whole and main2 >= main


def test_the_table_gives_medians_and_ratios_to_the_reference_and_offline(cost):
    def m(variant, r, cpu, loop, tps):
        return {"protocol": "http", "concurrency": 64, "variant": variant, "round": r,
                "cpu_ms_per_text": cpu, "loop_cpu_ms_per_text": loop, "texts_per_s": tps,
                "mean_batch": 10.0, "p99_ms": 50.0, "cores_busy": 0.9}
    runs = [m("old", 0, 2.0, 1.0, 400), m("old", 1, 2.2, 1.2, 380), m("old", 2, 9.0, 5, 100),
            m("new", 0, 1.0, 0.5, 800), m("new", 1, 1.2, 0.6, 700), m("new", 2, 1.1, 0.4, 900)]
    offline = {"wall_ms_per_text": 0.5, "texts_per_s": 2000}
    rows = cost.summarize(runs, ["old", "new"], offline)
    old, new = rows
    assert (old["cpu_ms_per_text"], new["cpu_ms_per_text"]) == (2.2, 1.1)  # medians
    assert new["cpu_per_text_x_offline"] == 2.2 and new["texts_per_s_share_of_offline"] == 0.4
    table = cost.format_table(rows, ["old", "new"])
    assert "| http | 64 | new | 1.100 | 0.500 | 2.20 | 800 | 40% |" in table
    assert table.splitlines()[-1].endswith("| 0.50x |")
