"""Length analysis report: the length table and batching strategies side by side.

``analyze_lengths(cfg, split)`` is what ``tools/analyze_lengths.py`` runs (it reads
the split from the store cache, encoding it only on a first run);
``compare_strategies(lengths, ...)`` simulates one epoch of each strategy on a
lengths array and reports its padding efficiency (real tokens / computed
tokens, padding counted), number of batches and largest batch cost.  The
strategies reuse the real samplers, so the numbers are what training gets.
"""
import numpy as np

from .data.errors import DataError
from .data.lengths import (length_stats, optimal_boundaries, padded_tokens_bucketed,
                           plot_lengths, quantile_boundaries)
from .data.samplers import BucketBatchSampler, TokenBudgetBatchSampler
from .store_build import build_datasets


def _summary(lengths, batches, pad_lengths):
    """Efficiency / batch count / largest batch cost of one epoch's batches."""
    costs = [len(b) * p for b, p in zip(batches, pad_lengths)]
    real = int(np.asarray(lengths).sum())
    return {"padding_efficiency": round(real / sum(costs), 4), "num_batches": len(batches),
            "max_tokens_per_batch": int(max(costs)),
            "mean_batch_size": round(len(lengths) / len(batches), 1)}


def _group_by_length(lengths, batch_size, rng, mega=50):
    """Hugging Face ``group_by_length``: shuffle, sort megabatches of 50 batches, cut, shuffle."""
    perm = rng.permutation(len(lengths))
    step = mega * batch_size
    batches = []
    for s in range(0, len(perm), step):
        chunk = perm[s:s + step]
        chunk = chunk[np.argsort(-lengths[chunk], kind="stable")]
        batches += [chunk[i:i + batch_size].tolist() for i in range(0, len(chunk), batch_size)]
    return [batches[i] for i in rng.permutation(len(batches))]


def strategy_batches(lengths, max_len, batch_size=32, max_tokens=4096, num_buckets=4,
                     pool_sizes=(50, 100, 200), pad_to_multiple_of=1, seed=0):
    """One epoch of each strategy: {name: (batches, padded length per batch)}, boundaries.

    Padded length per batch: max_len for pad_to_max_len, the bucket boundary for
    the bucket strategies, the batch's longest example otherwise.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    rng = np.random.default_rng(seed)
    longest = lambda batches: [int(lengths[b].max()) for b in batches]  # noqa: E731
    out = {}
    random_batches = [b.tolist() for b in np.array_split(rng.permutation(len(lengths)),
                                                        -(-len(lengths) // batch_size))]
    out["pad_to_max_len"] = (random_batches, [max_len] * len(random_batches))
    out["random_dynamic"] = (random_batches, longest(random_batches))
    grouped = _group_by_length(lengths, batch_size, rng)
    out["group_by_length"] = (grouped, longest(grouped))
    quantile = quantile_boundaries(lengths, pad_to_multiple_of=pad_to_multiple_of)
    k = max(num_buckets, len(quantile))
    bounds = {"quantile": quantile,
              "optimal": optimal_boundaries(lengths, len(quantile), pad_to_multiple_of)}
    if k != len(quantile):
        bounds[f"optimal_k{k}"] = optimal_boundaries(lengths, k, pad_to_multiple_of)
    for name, b in bounds.items():
        s = BucketBatchSampler(lengths, b, batch_size=batch_size, pad_to_bucket=True, seed=seed)
        batches = s.epoch_batches()
        out[f"{name}_buckets"] = (batches, [s.pad_length(x) for x in batches])
    for pool in list(pool_sizes) + [0]:
        batches = TokenBudgetBatchSampler(lengths, max_tokens, pool_size=pool,
                                          seed=seed).epoch_batches()
        out[f"token_budget_pool{pool}" if pool else "fairseq"] = (batches, longest(batches))
    return out, bounds


def compare_strategies(lengths, max_len, batch_size=32, max_tokens=4096, num_buckets=4,
                       pool_sizes=(50, 100, 200), pad_to_multiple_of=1, seed=0):
    """One simulated epoch per strategy -> {name: summary}; also the boundary sets."""
    lengths = np.asarray(lengths, dtype=np.int64)
    batches, bounds = strategy_batches(lengths, max_len, batch_size, max_tokens, num_buckets,
                                       pool_sizes, pad_to_multiple_of, seed)
    out = {}
    for name, (b, pads) in batches.items():
        out[name] = _summary(lengths, b, pads)
        if name.endswith("_buckets"):
            bnd = bounds[name[:-len("_buckets")]]
            out[name].update(boundaries=[int(x) for x in bnd],
                             padded_tokens_all=padded_tokens_bucketed(lengths, bnd))
        elif name.startswith("token_budget") or name == "fairseq":
            out[name]["max_tokens"] = max_tokens
    return out, bounds


def analyze_lengths(cfg, split="train", png=None, batch_size=32, pool_sizes=(50, 100, 200)):
    """Build (or read from the store cache) the data ``cfg`` describes and report ``split``'s
    lengths and strategies."""
    d = cfg.Data
    bundle = build_datasets(d, splits=(split,))
    ds = getattr(bundle, split)
    if len(ds) == 0:
        raise DataError(f"split {split!r} of corpus {d.corpus!r} is empty; pick another --split")
    max_tokens = d.max_tokens or 4096  # null (bucket with fixed batch_size): compare at 4096
    strategies, bounds = compare_strategies(ds.lengths, d.max_len, batch_size, max_tokens,
                                            d.num_buckets, pool_sizes, d.pad_to_multiple_of,
                                            cfg.Global.seed)
    report = {"corpus": d.corpus, "task": bundle.task, "split": split, "max_len": d.max_len,
              "documents": length_stats(ds.doc_lengths, d.max_len),
              "items": length_stats(ds.lengths), "long_text": ds.long_text_stats,
              "batch_size": batch_size, "max_tokens": max_tokens, "strategies": strategies}
    if png:
        plot_lengths(ds.doc_lengths, png, d.max_len, bounds,
                     title=f"{d.corpus} {split}: tokens per example")
        report["png"] = png
    return report


def format_report(report):
    """Human-readable tables of ``analyze_lengths``' result."""
    docs = report["documents"]
    lines = [f"{report['corpus']} ({report['task']}) {report['split']}: {docs['count']} examples, "
             f"max_len {report['max_len']}"]
    keys = ["count", "min", "mean", "p50", "p80", "p90", "p95", "p99", "max"]
    lines.append("  " + "  ".join(f"{k:>7}" for k in keys) + "  over_max_len")
    lines.append("  " + "  ".join(f"{docs[k]:>7}" for k in keys)
                 + f"  {docs['num_over_max_len']} ({100 * docs['share_over_max_len']:.2f}%)")
    lines.append("")
    lines.append(f"  {'strategy':<24}{'efficiency':>11}{'batches':>9}{'max tok/batch':>15}"
                 f"{'mean size':>11}  notes")
    for name, s in report["strategies"].items():
        note = f"boundaries {s['boundaries']}" if "boundaries" in s else \
            (f"max_tokens {s['max_tokens']}" if "max_tokens" in s else
             f"batch_size {report['batch_size']}")
        lines.append(f"  {name:<24}{100 * s['padding_efficiency']:>10.1f}%{s['num_batches']:>9}"
                     f"{s['max_tokens_per_batch']:>15}{s['mean_batch_size']:>11}  {note}")
    return "\n".join(lines)
