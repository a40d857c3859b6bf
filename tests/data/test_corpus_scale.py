"""benchmarks/corpus_scale.py: the synthetic corpus generator and the parts of a run (no timing)."""
import json
import os
import re
import sys

import numpy as np
import pytest
from script_loader import load_script

from ppvarlen.data.store import StoreSplit

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _module():
    return load_script("benchmarks/corpus_scale.py")


def test_generated_lines_join_one_to_four_reviews_of_one_label(tmp_path):
    cs = _module()
    pools = cs.review_pools()
    meta = cs.generate(str(tmp_path / "a.jsonl"), 300, seed=3, block=64)
    lines = (tmp_path / "a.jsonl").read_text(encoding="utf-8").splitlines()
    assert meta["lines"] == len(lines) == 300
    assert meta["bytes"] == os.path.getsize(tmp_path / "a.jsonl")
    rows = [json.loads(x) for x in lines]
    assert meta["chars"] == sum(len(r["text"]) for r in rows)
    assert {r["label"] for r in rows} == {"positive", "negative"}
    by_label = {k: set(v) for k, v in pools.items()}
    counts = set()
    for r in rows:  # the text splits into 1-4 reviews of its own label (greedy, longest first)
        text, parts = r["text"], 0
        while text:
            head = max((p for p in by_label[r["label"]] if text.startswith(p)), key=len)
            text, parts = text[len(head):], parts + 1
        counts.add(parts)
    assert counts <= {1, 2, 3, 4} and len(counts) > 1


def test_generation_is_seeded_and_block_independent(tmp_path):
    cs = _module()
    cs.generate(str(tmp_path / "a.jsonl"), 200, seed=1, block=64)
    cs.generate(str(tmp_path / "b.jsonl"), 200, seed=1, block=64)
    cs.generate(str(tmp_path / "c.jsonl"), 200, seed=2, block=64)
    a, b, c = ((tmp_path / f"{x}.jsonl").read_bytes() for x in "abc")
    assert a == b and a != c


def test_corpus_is_reused_only_when_it_matches(tmp_path):
    cs = _module()
    path, meta = cs.corpus(str(tmp_path), 50, 0)
    mtime = os.stat(path).st_mtime_ns
    again, _ = cs.corpus(str(tmp_path), 50, 0)
    assert again == path and os.stat(path).st_mtime_ns == mtime
    with open(path, "a", encoding="utf-8") as f:
        f.write("{}\n")  # a changed file is generated again
    cs.corpus(str(tmp_path), 50, 0)
    assert len(open(path, encoding="utf-8").read().splitlines()) == 50


@pytest.mark.parametrize("text,n", [("100k", 100_000), ("1M", 1_000_000), ("2500", 2500),
                                    ("1.5m", 1_500_000)])
def test_sizes(text, n):
    cs = _module()
    assert cs.parse_size(text) == n
    assert cs.parse_size(cs.size_name(n)) == n


def test_run_measured_stops_at_the_marker_and_sees_the_memory(tmp_path):
    cs = _module()
    script = ("import time, sys\nbuf = bytearray(64 << 20)\nfor i in range(0, len(buf), 4096): "
              "buf[i] = 1\ntime.sleep(1)\nprint('step 1  loss 0.5', flush=True)\ntime.sleep(30)\n"
              f"open({str(tmp_path / 'finished')!r}, 'w').close()\n")
    r = cs.run_measured([sys.executable, "-c", script], dict(os.environ),
                        str(tmp_path / "log"), re.compile(r"step 1 +loss"), timeout=50)
    assert r["reached"] and r["returncode"] == -9  # killed at the line, not run to its end
    assert not (tmp_path / "finished").exists()
    assert r["peak_rss_mb"] >= 64 and r["peak_pss_mb"] > 0
    assert "step 1" in (tmp_path / "log").read_text(encoding="utf-8")


def test_epoch_worker_reads_every_train_item_once(tmp_path):
    """The epoch-memory worker walks one whole epoch of the train loader over the store: every
    train item once, its tokens those of the store's lengths (counted independently here)."""
    cs = _module()
    path, _ = cs.corpus(str(tmp_path), 400, 0)
    cache = tmp_path / "cache"
    cs.epoch_worker(path, str(tmp_path / "r.json"), [f"Data.cache_dir={cache}", "Data.num_proc=1"])
    r = json.loads((tmp_path / "r.json").read_text())
    train = [os.path.join(d, "train") for d, subdirs, _ in os.walk(cache) if "train" in subdirs]
    assert len(train) == 1
    lengths = np.load(os.path.join(train[0], "lengths.npy"))
    assert r["items"] == len(StoreSplit(train[0])) == len(lengths) > 250
    assert r["tokens"] == int(lengths.sum())
    assert r["batches"] >= 1 and 0 < r["rss_anon_mb_after_store_open"] <= r["rss_anon_mb_peak"]
