"""Length statistics and bucket boundaries (numpy only: no paddle import).

Two ways to choose K bucket boundaries:
* ``quantile_boundaries`` — the rule of thumb (80/95/99% quantiles + max);
* ``optimal_boundaries`` — the K boundaries that minimise the total padded
  tokens when every example is padded to its bucket's upper boundary, found by
  exact dynamic programming over the sorted distinct lengths.
"""

import numpy as np

from ppvarlen.utils.io import atomic_save_png

PERCENTILES = (50, 80, 90, 95, 99)


def as_lengths(lengths):
    """Validate and return lengths as a 1-D int64 array of positive values."""
    arr = np.asarray(lengths)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"lengths must be a non-empty 1-D list of token counts, "
                         f"got shape {arr.shape}")
    if not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"lengths must be integers, got dtype {arr.dtype}")
    if arr.min() < 1:
        bad = int(np.argmin(arr))
        raise ValueError(f"lengths must be >= 1; item {bad} has length {int(arr[bad])} "
                         f"(drop empty examples before batching)")
    return arr.astype(np.int64)


def round_up(values, multiple):
    """Round lengths up to a multiple of ``multiple`` (1 = unchanged)."""
    if multiple < 1:
        raise ValueError(f"pad_to_multiple_of must be >= 1, got {multiple}")
    values = np.asarray(values, dtype=np.int64)
    return -(-values // multiple) * multiple


def length_stats(lengths, max_len=None):
    """count, min, mean, p50..p99, max and (with max_len) how many exceed it."""
    arr = as_lengths(lengths)
    stats = {"count": int(arr.size), "min": int(arr.min()), "mean": round(float(arr.mean()), 2)}
    for p in PERCENTILES:
        stats[f"p{p}"] = int(np.percentile(arr, p, method="inverted_cdf"))
    stats["max"] = int(arr.max())
    stats["total_tokens"] = int(arr.sum())
    if max_len is not None:
        over = int((arr > max_len).sum())
        stats.update(max_len=int(max_len), num_over_max_len=over,
                     share_over_max_len=round(over / arr.size, 6))
    return stats


def bucket_index(lengths, boundaries):
    """Index of the bucket of each length: the smallest boundary >= length."""
    b = np.asarray(boundaries, dtype=np.int64)
    idx = np.searchsorted(b, np.asarray(lengths, dtype=np.int64), side="left")
    if np.any(idx >= b.size):
        over = np.asarray(lengths)[idx >= b.size]
        raise ValueError(f"{over.size} lengths exceed the last bucket boundary {int(b[-1])} "
                         f"(longest {int(over.max())}); add a larger boundary to Data.buckets")
    return idx


def padded_tokens_bucketed(lengths, boundaries):
    """Total tokens when every example is padded to its bucket's boundary."""
    b = np.asarray(boundaries, dtype=np.int64)
    return int(b[bucket_index(lengths, b)].sum())


def quantile_boundaries(lengths, quantiles=(0.8, 0.95, 0.99), pad_to_multiple_of=1):
    """Rule-of-thumb boundaries: the given quantiles plus the max, rounded up, deduplicated."""
    arr = as_lengths(lengths)
    qs = [float(np.quantile(arr, q, method="inverted_cdf")) for q in quantiles]
    bounds = round_up(np.array(qs + [arr.max()], dtype=np.int64), pad_to_multiple_of)
    return sorted(set(int(b) for b in bounds))


def optimal_boundaries(lengths, num_buckets, pad_to_multiple_of=1):
    """At most ``num_buckets`` boundaries minimising the total padded tokens (exact DP).

    An optimal boundary always equals some (rounded) length: lowering a boundary
    to the longest length inside its bucket keeps every example in place and
    pads less.  So the search runs over the sorted distinct rounded lengths
    v_1 < ... < v_n with counts c_i (prefix sums C_i):
        best[k][i] = min_{j<i} best[k-1][j] + v_i * (C_i - C_j)
    i.e. bucket (j, i] pads its examples to v_i.  O(K n^2) with n distinct
    lengths (n <= max_len after truncation), vectorised over j.
    """
    if num_buckets < 1:
        raise ValueError(f"num_buckets must be >= 1, got {num_buckets}")
    arr = round_up(as_lengths(lengths), pad_to_multiple_of)
    values, counts = np.unique(arr, return_counts=True)
    n = values.size
    k_max = min(num_buckets, n)
    prefix = np.concatenate([[0], np.cumsum(counts)])  # prefix[i] = examples with value < values[i]
    # best[i]: min cost covering the first i distinct values with the current number of buckets;
    # one bucket: all padded to the largest value
    best = np.concatenate([[0], values * prefix[1:]])
    choice = [np.zeros(n + 1, dtype=np.int64)]  # choice[k][i] = j (start of the last bucket)
    for _ in range(1, k_max):
        new = np.zeros(n + 1, dtype=np.int64)  # every new[i], i >= 1, is set below
        arg = np.zeros(n + 1, dtype=np.int64)
        for i in range(1, n + 1):
            cost = best[:i] + values[i - 1] * (prefix[i] - prefix[:i])  # over every start j < i
            jbest = int(np.argmin(cost))
            new[i], arg[i] = cost[jbest], jbest
        best = new
        choice.append(arg)
    bounds, i = [], n
    for k in range(k_max - 1, -1, -1):
        if i == 0:
            break
        bounds.append(int(values[i - 1]))
        i = int(choice[k][i])
    return sorted(bounds)


def plot_lengths(lengths, path, max_len=None, boundaries=None, title="token lengths"):
    """Histogram + CDF PNG; ``boundaries`` {name: [b1, b2, ...]} drawn as vertical lines."""
    from matplotlib.figure import Figure  # no pyplot: the process's backend stays as it was

    arr = as_lengths(lengths)
    # a few very long outliers would squash the plot: cut the x axis at max_len / p99.5
    drawn = [max(b) for b in (boundaries or {}).values()] + [max_len or 0]
    upper = min(int(arr.max()), int(max(np.percentile(arr, 99.5), *drawn)))
    beyond = int((arr > upper).sum())
    fig = Figure(figsize=(11, 4))
    ax_h, ax_c = fig.subplots(1, 2)
    ax_h.hist(arr[arr <= upper], bins=min(100, max(10, int(np.unique(arr).size))), color="#4C72B0")
    ax_h.set_xlabel("tokens per example" + (f" ({beyond} longer than {upper} not shown)"
                                            if beyond else ""))
    ax_h.set_ylabel("examples")
    ax_h.set_title(title)
    ax_c.set_xlim(0, upper * 1.02)
    xs = np.sort(arr)
    ax_c.plot(xs, np.arange(1, xs.size + 1) / xs.size, color="#4C72B0")
    ax_c.set_xlabel("tokens per example (CDF over all examples)")
    ax_c.set_ylabel("cumulative share")
    ax_c.set_title("CDF")
    ax_c.grid(alpha=0.3)
    colours = ["#DD8452", "#55A868", "#C44E52", "#8172B3"]
    for n, (name, bounds) in enumerate((boundaries or {}).items()):
        for k, b in enumerate(bounds):
            for ax in (ax_h, ax_c):
                ax.axvline(b, color=colours[n % len(colours)], ls="--", lw=1,
                           label=name if k == 0 and ax is ax_c else None)
    if max_len is not None:
        for ax in (ax_h, ax_c):
            ax.axvline(max_len, color="black", lw=1, label="max_len" if ax is ax_c else None)
    if boundaries or max_len is not None:
        ax_c.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    atomic_save_png(fig, path, dpi=110)
    return path
