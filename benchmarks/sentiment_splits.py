"""Is the default sentiment model better than char TF-IDF + LR, or did one split favour it?

    python benchmarks/sentiment_splits.py [--config configs/sentiment/wide_deep.yaml]
        [--split-seeds 0 1 2 3 4] [-o Section.key=value ...] [--json output/bench/sentiment_splits.json]

For each ``Data.split_seed`` (another 80/10/10 partition of the same deduplicated reviews;
0 is the standard split) it trains the config with ``tools/train.py`` (one subprocess per
split, as a user runs it), fits the TF-IDF baseline on the same train/dev, and compares the two
on the same test reviews: accuracy of each, the paired difference, and an exact McNemar test on
the reviews only one of them gets right.  Prints a table and writes JSON.  Minutes per split:
the config's training time plus ~20 s for the baseline.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def mcnemar_exact(only_a, only_b):
    """Two-sided exact binomial p-value of ``only_a`` vs ``only_b`` discordant pairs."""
    n, k = only_a + only_b, min(only_a, only_b)
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2.0**n
    return min(1.0, 2 * tail)


def model_test_predictions(output_dir, cfg):
    """Test-split predictions (one per review, windows averaged) of ``output_dir``/best."""
    import numpy as np

    from ppvarlen.data.longtext import aggregate_classification
    from ppvarlen.engine.evaluate import checkpoint_outputs

    logits, test, _, _ = checkpoint_outputs(cfg, os.path.join(output_dir, "best"), "test")
    docs, doc_logits = aggregate_classification([test[i]["doc_id"] for i in range(len(test))],
                                                np.stack(logits))
    return docs, doc_logits.argmax(axis=-1)


def run_split(args, split_seed, out_root):
    import numpy as np

    from ppvarlen.config import load_config
    from ppvarlen.data.sources import load_corpus
    from tfidf_baseline import fit_baseline

    output_dir = os.path.join(out_root, f"split{split_seed}")
    overrides = list(args.override) + [f"Data.split_seed={split_seed}", f"Global.output_dir={output_dir}",
                                       "Global.overwrite_output_dir=true"]  # a re-run replaces it
    t0 = time.time()
    proc = subprocess.run([sys.executable, os.path.join(REPO, "tools", "train.py"), "-c", args.config,
                           *sum((["-o", o] for o in overrides), [])], cwd=REPO,
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"training split {split_seed} failed (exit {proc.returncode}); rerun "
                         f"tools/train.py -c {args.config} -o {' -o '.join(overrides)} to see why")
    train_seconds = time.time() - t0
    cfg = load_config(os.path.join(output_dir, "config.yaml"))
    corpus = load_corpus(cfg.Data)
    gold = np.array([ex["label"] for ex in corpus.splits["test"]])
    docs, model_pred = model_test_predictions(output_dir, cfg)
    if len(docs) != len(gold) or (docs != np.arange(len(gold))).any():
        raise SystemExit(f"split {split_seed}: the model predicted {len(docs)} of {len(gold)} test reviews")
    base_pred, fit = fit_baseline(corpus.splits)
    model_ok, base_ok = model_pred == gold, base_pred == gold
    only_model, only_base = int((model_ok & ~base_ok).sum()), int((base_ok & ~model_ok).sum())
    metrics = json.load(open(os.path.join(output_dir, "metrics.json"), encoding="utf-8"))
    return {"split_seed": split_seed, "test_examples": int(len(gold)),
            "model_accuracy": float(model_ok.mean()), "baseline_accuracy": float(base_ok.mean()),
            "difference": float(model_ok.mean() - base_ok.mean()),
            "only_model_right": only_model, "only_baseline_right": only_base,
            "mcnemar_p": mcnemar_exact(only_model, only_base),
            "model_dev_accuracy": metrics["dev"]["accuracy"], "baseline_dev_accuracy": fit["dev_accuracy"],
            "baseline_C": fit["C"], "train_time_s": metrics.get("train_time_s"),
            "wall_s": round(train_seconds, 1)}


def summarize(rows):
    diffs = [r["difference"] for r in rows]
    mean = sum(diffs) / len(diffs)
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1)) if len(diffs) > 1 else float("nan")
    only_model = sum(r["only_model_right"] for r in rows)
    only_base = sum(r["only_baseline_right"] for r in rows)
    return {"splits": len(rows), "mean_model_accuracy": sum(r["model_accuracy"] for r in rows) / len(rows),
            "mean_baseline_accuracy": sum(r["baseline_accuracy"] for r in rows) / len(rows),
            "mean_difference": mean, "sd_difference": sd,
            "splits_model_better": sum(d > 0 for d in diffs),
            "pooled_only_model_right": only_model, "pooled_only_baseline_right": only_base,
            "pooled_mcnemar_p": mcnemar_exact(only_model, only_base)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/sentiment/wide_deep.yaml")
    ap.add_argument("--split-seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("-o", "--override", action="append", default=[], metavar="Section.key=value")
    ap.add_argument("--out", default="output/bench/sentiment_splits", help="training output root")
    ap.add_argument("--json", default="output/bench/sentiment_splits.json")
    args = ap.parse_args()
    from ppvarlen.config import ConfigError, load_config

    try:
        cfg = load_config(args.config, args.override)
    except ConfigError as e:
        raise SystemExit(f"error: {e}")
    if cfg.Data.corpus != "sentiment":
        raise SystemExit(f"error: {args.config}: Data.corpus is {cfg.Data.corpus!r}; this compares "
                         f"sentiment configs with the TF-IDF baseline")
    rows = []
    print(f"{'split':>5} {'model':>7} {'tfidf':>7} {'diff':>7} {'only model':>10} {'only tfidf':>10} "
          f"{'McNemar p':>9} {'train s':>7}", flush=True)
    for seed in args.split_seeds:
        r = run_split(args, seed, args.out)
        rows.append(r)
        print(f"{seed:>5} {r['model_accuracy']:7.4f} {r['baseline_accuracy']:7.4f} {r['difference']:+7.4f} "
              f"{r['only_model_right']:>10} {r['only_baseline_right']:>10} {r['mcnemar_p']:9.3g} "
              f"{r['train_time_s'] or 0:7.0f}", flush=True)
    summary = summarize(rows)
    print(f"mean over {summary['splits']} splits: model {summary['mean_model_accuracy']:.4f}, tfidf "
          f"{summary['mean_baseline_accuracy']:.4f}, difference {summary['mean_difference']:+.4f} "
          f"(sd {summary['sd_difference']:.4f}), model better on {summary['splits_model_better']}/"
          f"{summary['splits']}; pooled McNemar p = {summary['pooled_mcnemar_p']:.3g}")
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w", encoding="utf-8") as f:
        json.dump({"config": args.config, "overrides": args.override, "splits": rows, "summary": summary}, f,
                  indent=2)


if __name__ == "__main__":
    main()
