"""Length statistics and bucket boundaries: the DP is checked against brute force."""
import itertools
import os
import subprocess
import sys

import numpy as np
import pytest
from script_loader import load_script

from ppvarlen.data.lengths import (length_stats, optimal_boundaries, padded_tokens_bucketed,
                                   plot_lengths, quantile_boundaries, round_up)


def brute_force_cost(lengths, k, multiple=1):
    """Min padded tokens over EVERY choice of <= k integer boundaries covering the max."""
    top = int(round_up([max(lengths)], multiple)[0])
    candidates = [b for b in range(multiple, top, multiple)]
    best = None
    for r in range(0, k):
        for combo in itertools.combinations(candidates, r):
            cost = padded_tokens_bucketed(lengths, list(combo) + [top])
            best = cost if best is None else min(best, cost)
    return best


@pytest.mark.parametrize("seed", range(25))
def test_optimal_boundaries_match_brute_force(seed):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 16, size=rng.integers(1, 12)).tolist()
    k = int(rng.integers(1, 4))
    multiple = int(rng.choice([1, 1, 2, 3]))
    bounds = optimal_boundaries(lengths, k, multiple)
    assert len(bounds) <= k and bounds == sorted(set(bounds))
    assert bounds[-1] >= max(lengths) and all(b % multiple == 0 for b in bounds)
    assert padded_tokens_bucketed(lengths, bounds) == brute_force_cost(lengths, k, multiple)


def test_optimal_beats_or_ties_quantile_on_bimodal():
    rng = np.random.default_rng(0)
    lengths = np.concatenate([rng.integers(5, 30, 800), rng.integers(200, 260, 200)])
    q = quantile_boundaries(lengths)
    o = optimal_boundaries(lengths, len(q))
    assert padded_tokens_bucketed(lengths, o) < padded_tokens_bucketed(lengths, q)


def test_quantile_boundaries_rounded_and_cover_max():
    lengths = np.arange(1, 101)
    assert quantile_boundaries(lengths) == [80, 95, 99, 100]
    assert quantile_boundaries(lengths, pad_to_multiple_of=8) == [80, 96, 104]


def test_length_stats():
    s = length_stats([1, 2, 3, 4, 600], max_len=512)
    assert (s["count"], s["min"], s["max"], s["num_over_max_len"]) == (5, 1, 600, 1)
    assert s["mean"] == pytest.approx(122.0) and s["share_over_max_len"] == pytest.approx(0.2)
    assert s["p50"] == 3


@pytest.mark.parametrize("bad", [[], [0, 3], [1.5, 2.0], [[1, 2]]])
def test_bad_lengths_rejected(bad):
    with pytest.raises(ValueError):
        length_stats(bad)


def test_last_boundary_must_cover():
    with pytest.raises(ValueError, match="exceed the last bucket boundary"):
        padded_tokens_bucketed([3, 9], [4, 8])


def test_plot_writes_png(tmp_path):
    path = plot_lengths(np.arange(1, 300), str(tmp_path / "p" / "lengths.png"), max_len=256,
                        boundaries={"optimal": [50, 256]})
    assert open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_plotting_leaves_the_matplotlib_backend_alone(tmp_path):
    """A user's process keeps its matplotlib backend: the PNG is drawn without pyplot."""
    code = ("import sys, matplotlib\nfrom ppvarlen.data.lengths import plot_lengths\n"
            "plot_lengths([3, 5, 9], sys.argv[1])\nprint(matplotlib.get_backend())")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "l.png")], text=True,
                         capture_output=True, env=dict(os.environ, MPLBACKEND="svg"), timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "svg" and (tmp_path / "l.png").read_bytes()[:4] == b"\x89PNG"


def test_lengths_module_does_not_import_paddle():
    code = "import sys, ppvarlen.data.lengths, ppvarlen.data.order, ppvarlen.data.longtext, " \
           "ppvarlen.data.collate; " \
           "print('paddle' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         timeout=300)
    assert out.stdout.strip() == "False"


def _tool():
    return load_script("tools/analyze_lengths.py", "analyze_lengths_tool")


def test_analyze_lengths_tool_writes_json_and_png(tmp_path, capsys):
    import json

    rng = np.random.default_rng(0)
    sizes = np.concatenate([rng.integers(2, 30, 300), rng.integers(60, 100, 40), [200, 300, 400]])
    rows = [{"text": "字" * int(n), "label": int(n % 2)} for n in sizes]
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), "utf-8")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"Data:\n  corpus: jsonl\n  train_file: {data}\n  dev_file: {data}\n"
                   f"  test_file: {data}\n  max_len: 128\n  max_tokens: 512\n", "utf-8")
    out_json, out_png = tmp_path / "r.json", tmp_path / "r.png"
    rc = _tool().main(["-c", str(cfg), "--json", str(out_json), "--png", str(out_png),
                       "--pool-sizes", "2", "4"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "fairseq" in printed and "optimal_buckets" in printed
    report = json.loads(out_json.read_text("utf-8"))
    s = report["strategies"]
    assert set(s) >= {"pad_to_max_len", "random_dynamic", "group_by_length", "quantile_buckets",
                      "optimal_buckets", "token_budget_pool2", "token_budget_pool4", "fairseq"}
    eff = {k: v["padding_efficiency"] for k, v in s.items()}
    assert eff["pad_to_max_len"] < eff["random_dynamic"] < eff["group_by_length"]
    assert eff["random_dynamic"] < eff["fairseq"] <= 1.0
    assert s["optimal_buckets"]["padded_tokens_all"] <= s["quantile_buckets"]["padded_tokens_all"]
    assert all(v["max_tokens_per_batch"] <= 512 for k, v in s.items()
               if k.startswith("token_budget") or k == "fairseq")
    assert report["documents"]["num_over_max_len"] == 3 and report["long_text"]["truncated"] == 3
    assert out_png.read_bytes()[:4] == b"\x89PNG"


def test_pool_size_0_is_accepted_like_the_config_key(tmp_path, capsys):
    """Data.pool_size: 0 is valid, so --pool-sizes 0 is too: the whole split, 'fairseq'."""
    import json

    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"text": "字" * (1 + i % 37), "label": i % 2}) + "\n"
                            for i in range(120)), "utf-8")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"Data:\n  corpus: jsonl\n  train_file: {data}\n  dev_file: {data}\n"
                   f"  test_file: {data}\n  max_len: 64\n  max_tokens: 256\n", "utf-8")
    out_json = tmp_path / "r.json"
    assert _tool().main(["-c", str(cfg), "--json", str(out_json), "--pool-sizes", "0", "3"]) == 0
    s = json.loads(out_json.read_text("utf-8"))["strategies"]
    budget = {k for k in s if k.startswith("token_budget") or k == "fairseq"}
    assert budget == {"token_budget_pool3", "fairseq"}


def test_analyze_lengths_tool_bad_config_exits_2(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("Data:\n  max_tokns: 4\n", "utf-8")
    assert _tool().main(["-c", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "max_tokns" in err and "max_tokens" in err and "Traceback" not in err
