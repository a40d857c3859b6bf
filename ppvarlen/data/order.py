"""Sort by length, batch by token budget, restore the input order (numpy only).

The ONE sort-and-restore helper: the trainer's eval, the export parity check
and the deploy predictor all batch with ``length_sorted_batches`` and put
per-example outputs back in input order with ``restore_order``.  Deploy imports
this module, so it must stay paddle-free.

Cost of a batch = batch size x longest example in it (padding counted).
"""
import numpy as np


def _check_budget(max_tokens, max_batch_size, batch_size_multiple):
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    if max_batch_size is not None and max_batch_size < 1:
        raise ValueError(f"max_batch_size / max_sentences must be >= 1, got {max_batch_size}")
    if batch_size_multiple < 1:
        raise ValueError(f"batch_size_multiple must be >= 1, got {batch_size_multiple}")


def pack_by_budget(order, lengths, max_tokens, max_batch_size=None, batch_size_multiple=1):
    """Cut ``order`` (indices, usually sorted by length) into consecutive batches.

    ``lengths`` is [n] or [n, k] (e.g. source and target lengths for seq2seq);
    a batch costs ``size * sum_k(max length of column k in the batch)``, so for
    seq2seq the budget counts source AND target padding (B*max_src + B*max_tgt).
    A batch grows while its cost stays <= ``max_tokens`` and its size <
    ``max_batch_size``.  An example that alone exceeds ``max_tokens`` gets a
    batch of its own (callers that must refuse it check before).  With
    ``batch_size_multiple`` m, a closed batch larger than m is trimmed to a
    multiple of m and the rest starts the next batch (as fairseq does).
    Returns a list of lists of int indices; every index appears exactly once.
    """
    order = np.asarray(order, dtype=np.int64).reshape(-1)
    rows = np.asarray(lengths)
    rows = rows[order] if rows.ndim == 2 else rows.reshape(-1)[order]
    ends = budget_cuts(rows, max_tokens, max_batch_size, batch_size_multiple)
    flat = order.tolist()
    return [flat[a:b] for a, b in zip([0] + ends[:-1].tolist(), ends.tolist())]


def budget_cuts(rows, max_tokens, max_batch_size=None, batch_size_multiple=1, segment_ends=None):
    """``pack_by_budget`` on rows already in packing order, as batch end offsets.

    ``rows``: [n] or [n, k] non-negative integer lengths in the order to pack;
    ``segment_ends``: increasing ends of runs packed independently (the sampler's
    pools; default one run of n).  Returns an int64 array: batch i is
    ``rows[ends[i-1]:ends[i]]`` (``ends[-1] == n``).  The size of the batch starting at
    every position is computed at once (one ``searchsorted`` for [n] lengths sorted
    within each run, binary lifting over column maxima otherwise: O(n log n) numpy
    work), then a walk of one step per batch applies the greedy rule.  Zero lengths or
    batches over ``_MAX_LIFT`` examples fall back to a numpy step per batch.
    """
    _check_budget(max_tokens, max_batch_size, batch_size_multiple)
    rows = np.asarray(rows)
    if not np.issubdtype(rows.dtype, np.integer):
        rows = rows.astype(np.int64)  # e.g. float lengths: truncated as before
    if rows.ndim == 2 and rows.shape[1] == 1:
        rows = rows[:, 0]
    n = rows.shape[0]
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    if rows.min() < 0:
        raise ValueError("lengths must be >= 0 to be packed by a token budget")
    ends = np.asarray([n] if segment_ends is None else segment_ends, dtype=np.int64)
    if ends.size == 0 or ends[-1] != n or np.any(np.diff(ends) <= 0) or ends[0] <= 0:
        raise ValueError(f"segment_ends must increase to n={n}, got {ends[:5]}...")
    cap = int(max_batch_size or n + 1)
    if rows.ndim == 1 and _sorted_within(rows, ends):
        # sorted runs: cut as groups of equal lengths (a group ends where the length changes)
        change = np.empty(n, dtype=bool)
        np.not_equal(rows[1:], rows[:-1], out=change[:-1])
        change[ends - 1] = True
        group_end = np.flatnonzero(change) + 1
        return _cuts_of_groups(rows[group_end - 1].astype(np.int64), group_end, ends,
                               int(max_tokens), cap, int(batch_size_multiple))
    rows = rows.reshape(n, -1)
    key = rows.sum(axis=1, dtype=np.int64)
    if key.min() == 0 or min(cap, int(max_tokens) // int(key.min()) + 1) > _MAX_LIFT:
        # zero lengths (no bound on a batch's size) or very large batches
        return _cuts_any(rows, ends, int(max_tokens), cap, int(batch_size_multiple))
    run_end = np.repeat(ends, np.diff(ends, prepend=0))
    # limit[s]: examples the batch starting at s may hold at most (cap, end of its run)
    limit = np.minimum(run_end - np.arange(n, dtype=np.int64), cap)
    size = _sizes_lifted(rows, key, int(max_tokens), limit)
    return _walk(size, run_end, int(batch_size_multiple))


_MAX_HISTOGRAM = 1 << 22  # longest length counted by bincount (beyond: np.unique)
_MAX_LIFT = 1 << 14  # largest batch the doubling table serves (beyond: batch-by-batch loop)
_BLOCK = 1 << 19     # starts per block of the doubling table (bounds its memory)


def _sorted_within(rows, ends):
    """True when every run of ``rows`` is non-decreasing."""
    steps = np.diff(rows) >= 0
    steps[ends[:-1] - 1] = True  # a run's first item may be shorter than the last one's
    return bool(steps.all())


def _trim(size, multiple):
    """Examples a closed batch keeps (the rest starts the next batch)."""
    return size - size % multiple if multiple > 1 and size > multiple else size


def _walk(size, run_end, multiple):
    """Batch ends from ``size[s]`` (examples the batch starting at s takes before the first
    one that does not fit).  A batch closed by a misfit is trimmed to ``multiple``; the
    trimmed-off examples start the next batch, and re-planning that batch from its own start
    is exact because a subset of a batch that fit fits again.  One step per batch."""
    n = len(size)
    out, s = [], 0
    while s < n:
        k = int(size[s])
        end = int(run_end[s])
        s += _trim(k, multiple) if s + k < end else k  # a run's last batch: untrimmed
        out.append(s)
    return np.asarray(out, dtype=np.int64)


def sorted_batch_count(lengths, max_tokens, max_batch_size=None, batch_size_multiple=1):
    """How many batches ``budget_cuts`` packs ``lengths`` ([n] non-negative integers) into once
    they are sorted, from their histogram (no sort of the n lengths)."""
    _check_budget(max_tokens, max_batch_size, batch_size_multiple)
    lengths = np.asarray(lengths).reshape(-1)
    if int(lengths.max()) < _MAX_HISTOGRAM:
        counts = np.bincount(lengths)
        values = np.flatnonzero(counts)
        counts = counts[values]
    else:
        values, counts = np.unique(lengths, return_counts=True)
    group_end = np.cumsum(counts)
    n = int(group_end[-1])
    return len(_cuts_of_groups(values.astype(np.int64), group_end, np.asarray([n], dtype=np.int64),
                               int(max_tokens), int(max_batch_size or n + 1),
                               int(batch_size_multiple)))


def _cuts_of_groups(length, group_end, ends, max_tokens, cap, multiple):
    """Batch ends of sorted runs given as groups of equal lengths: group g is positions
    [group_end[g - 1], group_end[g]) of length ``length[g]``, within one run; runs end at ``ends``.

    Example j does not fit a batch starting at s when (j - s + 1) * length > max_tokens,
    i.e. s <= j - fit with fit = max_tokens // length (the most examples of that length a
    batch holds; a zero length never misfits).  Lengths grow along a run, so fit shrinks and
    j - fit strictly grows: within a group it is j + a constant, so the first misfit after s
    is a search over the groups' last keys (runs kept apart by an offset per run).
    A batch that starts and closes inside one group is followed by batches of the same size
    until the group's end is within reach, so those are cut in one step: each run takes one
    searched step per group, not one per batch, and every run takes its step in the same
    numpy call.  All arrays are per group or per run, none per example."""
    n = int(ends[-1])
    group_start = np.concatenate([[0], group_end[:-1]])
    never = n + max_tokens + 1  # zero lengths never misfit: fit beyond any batch
    fit = np.where(length > 0, max_tokens // np.maximum(length, 1), never)
    stride = n + 2 * never  # j - fit + never lies in [0, stride)
    group_run = np.searchsorted(ends, group_start, "right")
    offset = group_run * stride - fit + never  # the misfit key of position j is offset + j
    last_key = offset + group_end - 1
    steady = np.minimum(fit, cap)  # a batch inside one group holds this many
    if multiple > 1:  # it is closed, so it is trimmed
        steady = np.where(steady > multiple, steady - steady % multiple, steady)
    steady = np.maximum(steady, 1)
    runs = np.arange(len(ends), dtype=np.int64)
    start, stop = np.concatenate([[0], ends[:-1]]).astype(np.int64), ends.astype(np.int64)
    out = []
    while len(runs):
        # one batch from every run's current start, by the first misfit
        s = start
        q = runs * stride + s + never
        g = np.minimum(np.searchsorted(last_key, q, "left"), len(length) - 1)
        first_misfit = np.where(last_key[g] >= q, np.maximum(group_start[g], q - offset[g]), n)
        k = np.minimum(np.maximum(first_misfit, s + 1) - s, np.minimum(stop - s, cap))
        if multiple > 1:
            k = np.where((s + k < stop) & (k > multiple), k - k % multiple, k)
        s = s + k
        out.append(s)
        # then the batches of the same size that fit in s's group with room to spare
        live = s < stop
        runs, s, stop = runs[live], s[live], stop[live]
        g = np.searchsorted(group_end, s, "right")
        m, d = np.minimum(fit[g], cap), steady[g]
        # steady batches: t >= 1 with s + (t-1)d + m < the group's end (none over the budget)
        reps = np.where(m > 0, np.maximum(group_end[g] - m - s + d - 1, 0) // d, 0)
        if reps.any():
            first = np.cumsum(reps) - reps
            step = np.arange(1, int(reps.sum()) + 1, dtype=np.int64) - np.repeat(first, reps)
            out.append(np.repeat(s, reps) + np.repeat(d, reps) * step)
            s = s + reps * d
            live = s < stop
            runs, s, stop = runs[live], s[live], stop[live]
        start = s
    return np.sort(np.concatenate(out))


def _sizes_lifted(rows, key, max_tokens, limit):
    """``size[s]`` for every start s of [n, k] lengths in any order, by binary lifting.

    A batch's cost only grows as it takes more examples, so its size is the largest count
    whose cost fits, found bit by bit from a table of column maxima over 2**i examples
    (built per block of starts to bound memory).  A batch from s holds at most
    max_tokens // key[s] examples (key = row sum), which bounds the bits per block."""
    n = rows.shape[0]
    size = np.empty(n, dtype=np.int64)
    narrow = np.int32 if int(key.max()) < 1 << 30 else np.int64
    for b0 in range(0, n, _BLOCK):
        b1 = min(n, b0 + _BLOCK)
        longest = min(int(limit[b0:b1].max()), max_tokens // int(key[b0:b1].min()) + 1)
        levels = max(1, longest.bit_length())
        end = min(n, b1 + (1 << levels))
        # tables[c][i][s]: max of column c over examples s .. s + 2**i - 1 (from block start)
        tables = []
        for c in range(rows.shape[1]):
            level = [rows[b0:end, c].astype(narrow)]
            for i in range(1, levels):
                prev, step = level[-1], 1 << (i - 1)
                nxt = prev.copy()  # windows cut short by the span's end: never read
                if step < len(prev):
                    np.maximum(prev[:-step], prev[step:], out=nxt[:-step])
                level.append(nxt)
            tables.append(level)
        m = b1 - b0
        count = np.zeros(m, dtype=np.int64)
        widest = [np.zeros(m, dtype=np.int64) for _ in tables]
        lim = limit[b0:b1]
        local = np.arange(m, dtype=np.int64)
        for i in range(levels - 1, -1, -1):
            grown = count + (1 << i)
            at = np.minimum(local + count, end - b0 - 1)
            wider = [np.maximum(w, level[i][at]) for w, level in zip(widest, tables)]
            cost = sum(wider[1:], wider[0]) * grown
            ok = (grown <= lim) & (cost <= max_tokens)
            np.copyto(count, grown, where=ok)
            for w, wide in zip(widest, wider):
                np.copyto(w, wide, where=ok)
        size[b0:b1] = np.maximum(count, 1)  # an example over the budget gets a batch alone
    return size


def _cuts_any(rows, ends, max_tokens, cap, multiple):
    """Greedy cuts batch by batch (lengths with zeros, or batches too large for the doubling
    table): one numpy step per batch over a window that doubles until the example that does
    not fit is inside it."""
    out = []
    counts = np.arange(1, 65, dtype=np.int64)
    window = 64
    for run_start, run_end in zip([0] + ends[:-1].tolist(), ends.tolist()):
        s, forced = run_start, run_start + 1  # examples before ``forced`` are already in
        while s < run_end:
            while True:
                e = min(run_end, s + window)
                if counts.size < e - s:
                    counts = np.arange(1, 2 * (e - s) + 1, dtype=np.int64)
                widest = np.maximum.accumulate(rows[s:e], axis=0).sum(axis=1, dtype=np.int64)
                over = widest * counts[:e - s] > max_tokens
                over[cap:] = True  # example number cap + 1 opens a new batch
                over[:forced - s] = False
                j = int(over.argmax())
                if over[j]:
                    j += s
                    break
                if e == run_end:
                    j = run_end
                    break
                window *= 2
            window = max(64, 2 * (j - s))
            keep = _trim(j - s, multiple) if j < run_end else j - s
            s += keep
            forced = max(j, s + 1)
            out.append(s)
    return np.asarray(out, dtype=np.int64)


def batch_cost(batch, lengths):
    """Tokens computed for one batch: size x (sum over columns of the column max)."""
    rows = np.asarray(lengths, dtype=np.int64)[np.asarray(batch, dtype=np.int64)]
    return int(len(batch) * (rows.max(axis=0).sum() if rows.ndim == 2 else rows.max()))


def length_sorted_batches(lengths, max_tokens, max_batch_size=None):
    """Deterministic batches for eval/inference: stable sort by length, pack by budget.

    ``lengths`` [n] or [n, k] (sorted by the row sum), see ``pack_by_budget``.
    No randomness: the same lengths always give the same batches.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.ndim not in (1, 2):
        raise ValueError(f"lengths must be [n] or [n, k], got shape {lengths.shape}")
    key = lengths if lengths.ndim == 1 else lengths.sum(axis=1)
    order = np.argsort(key, kind="stable")
    return pack_by_budget(order, lengths, max_tokens, max_batch_size)


def restore_order(batches, per_batch_outputs):
    """Per-example outputs in input order from per-batch outputs.

    ``per_batch_outputs[b]`` holds one row per example of ``batches[b]`` (a numpy
    array with the batch on axis 0, or a list).  Returns a list with one entry
    per example, ``out[i]`` being the output for input ``i``.  Rows are not
    concatenated across batches, so outputs padded to different lengths
    (tagging) never collide; un-pad each row with the example's length.
    """
    if len(batches) != len(per_batch_outputs):
        raise ValueError(f"restore_order: {len(batches)} batches but "
                         f"{len(per_batch_outputs)} outputs")
    total = sum(len(b) for b in batches)
    out = [None] * total
    seen = np.zeros(total, dtype=bool)
    for b, (indices, rows) in enumerate(zip(batches, per_batch_outputs)):
        if len(rows) != len(indices):
            raise ValueError(f"restore_order: batch {b} has {len(indices)} examples but "
                             f"{len(rows)} output rows")
        for idx, row in zip(indices, rows):
            if idx < 0 or idx >= total or seen[idx]:
                raise ValueError(f"restore_order: index {idx} in batch {b} is out of range or "
                                 f"repeated; batches must partition range({total})")
            seen[idx] = True
            out[idx] = row
    return out


def grid_lengths(max_len, buckets):
    """The lengths every export is checked at: 1, 2, 7, ``max_len`` and each bucket boundary
    with its neighbours (b - 1, b, b + 1), those in 1..max_len, sorted.  The export's parity
    gate (export/parity.py) and the serving smoke check (deploy/repository.py) share it."""
    lengths = {1, 2, 7, max_len}
    for b in buckets or []:
        lengths.update({b - 1, b, b + 1})
    return sorted(n for n in lengths if 1 <= n <= max_len)
