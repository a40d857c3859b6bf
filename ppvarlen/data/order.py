"""Sort by length, batch by token budget, restore the input order (numpy only).

The ONE sort-and-restore helper: the trainer's eval, the export parity check
and the deploy predictor all batch with ``length_sorted_batches`` and put
per-example outputs back in input order with ``restore_order``.  Deploy imports
this module, so it must stay paddle-free.

Cost of a batch = batch size x longest example in it (padding counted).
"""
import numpy as np


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
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    if max_batch_size is not None and max_batch_size < 1:
        raise ValueError(f"max_batch_size / max_sentences must be >= 1, got {max_batch_size}")
    if batch_size_multiple < 1:
        raise ValueError(f"batch_size_multiple must be >= 1, got {batch_size_multiple}")
    cap = max_batch_size or len(order) + 1
    rows = np.asarray(lengths, dtype=np.int64)
    rows = (rows.reshape(-1, 1) if rows.ndim == 1 else rows).tolist()  # python ints: fast loop

    def widest(indices):  # per-column max over a batch
        if not indices:
            return [0] * len(rows[0])
        return [max(col) for col in zip(*(rows[i] for i in indices))]

    batches, cur = [], []
    cur_max = widest(cur) if rows else []
    for idx in order:
        idx = int(idx)
        new_max = [max(a, b) for a, b in zip(cur_max, rows[idx])]
        while cur and (len(cur) + 1 > cap or (len(cur) + 1) * sum(new_max) > max_tokens):
            keep = len(cur)
            if batch_size_multiple > 1 and keep > batch_size_multiple:
                keep -= keep % batch_size_multiple
            batches.append(cur[:keep])
            cur = cur[keep:]
            cur_max = widest(cur)
            new_max = [max(a, b) for a, b in zip(cur_max, rows[idx])]
        cur.append(idx)
        cur_max = new_max
    if cur:
        batches.append(cur)
    return batches


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
