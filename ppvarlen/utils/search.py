"""Greedy seq2seq decoding in numpy, over an exported encoder and one cached decoder step.

The ONNX export of a seq2seq model holds the encoder and ONE decoder step (paddle2onnx cannot
take the Paddle while loop), so the loop runs here: numpy only, no Paddle, so a serving host
needs just onnxruntime.  It reproduces ``Seq2SeqTransformer.greedy_decode`` step for step:

* the self-attention cache starts as one dummy slot (zeros [layers, B, heads, 1, head_dim],
  masked inside the step; see ``Seq2SeqTransformer.init_cache``);
* each step feeds the previous token of every row ([B, 1], BOS first) and takes the argmax
  (first index on ties, as Paddle's argmax);
* a row at its own limit is forced to emit EOS; a row that emitted EOS is finished and leaves
  the batch: the next step runs on the rows still decoding only (their caches, source lengths
  and limits gathered), as CTranslate2 does; the loop stops as soon as every row is finished.
  Each row's computation does not depend on the other rows of its batch, so the outputs are
  the ones the full batch gives (``shrink=False`` keeps every row stepping to the end: the
  reference the shrinking loop is tested and benchmarked against).

Limits (EOS included): ``min(floor(max_len_a * src_len) + max_len_b, max_position)``, computed
in float32 like the model's ``length_limits`` so both agree for every source length.
"""
import numpy as np


def length_limits(src_len, max_len_a, max_len_b, max_position):
    """Per-source cap on generated tokens (EOS included) as int64 [B]."""
    src_len = np.asarray(src_len)
    if max_position is not None and max_position < 1:
        raise ValueError(f"max_position must be >= 1, got {max_position}")
    if max_len_a < 0 or max_len_b < 1:
        raise ValueError(f"max_len_a ({max_len_a}) must be >= 0 and max_len_b ({max_len_b}) "
                         f">= 1 (every output needs room for its EOS); check the manifest's "
                         f"decoding section or Model.max_len_a / max_len_b")
    # float32 like the model (Paddle's scale op): float64 may floor differently (e.g. 0.1 * 30)
    scaled = np.floor(src_len.astype(np.float32) * np.float32(max_len_a)).astype(np.int64)
    limits = scaled + int(max_len_b)
    return np.minimum(limits, max_position) if max_position is not None else limits


def strip_eos(tokens, eos_id):
    """[B, T] generated ids (after BOS) -> lists up to, not including, each row's first EOS."""
    out = []
    for row in np.asarray(tokens).tolist():
        out.append(row[:row.index(eos_id)] if eos_id in row else row)
    return out


def greedy_search(run_encoder, run_step, src_ids, src_len, bos_id, eos_id, limits, shrink=True):
    """Greedy outputs (lists of ids without BOS/EOS), one per source row, in input order.

    ``run_encoder(src_ids, src_len) -> (cross_k, cross_v)`` [layers, B, heads, S, head_dim];
    ``run_step(tokens [b, 1], src_len, self_k, self_v, cross_k, cross_v) -> (logp [b, V],
    self_k, self_v)`` with the self cache one slot longer than given; b is the number of rows
    still decoding (all B with ``shrink=False``).  ``limits`` [B] from ``length_limits``.  All
    arrays are numpy; ids and lengths int64.
    """
    src_ids = np.asarray(src_ids, dtype=np.int64)
    src_len = np.asarray(src_len, dtype=np.int64)
    limits = np.asarray(limits, dtype=np.int64)
    batch = src_ids.shape[0]
    if src_len.shape != (batch,) or limits.shape != (batch,):
        raise ValueError(f"src_len {src_len.shape} and limits {limits.shape} must both be "
                         f"[{batch}] (one per row of src_ids {src_ids.shape})")
    if batch == 0:
        return []
    if limits.min() < 1:
        raise ValueError(f"every limit must be >= 1 (room for EOS), got {limits.min()}")
    cross_k, cross_v = run_encoder(src_ids, src_len)
    self_k = np.zeros(cross_k.shape[:3] + (1,) + cross_k.shape[4:], dtype=cross_k.dtype)
    self_v = self_k
    steps = int(limits.max())
    # generated ids by source row; a row's first EOS ends it (what follows is never read)
    out = np.full((batch, steps), eos_id, dtype=np.int64)
    rows = np.arange(batch)  # the source row of each row in the decoding batch
    last = np.full((batch, 1), bos_id, dtype=np.int64)
    finished = np.zeros(batch, dtype=bool)
    for t in range(steps):
        logp, self_k, self_v = run_step(last, src_len, self_k, self_v, cross_k, cross_v)
        nxt = np.asarray(logp).argmax(axis=-1).astype(np.int64)
        nxt[limits <= t + 1] = eos_id  # a row at its own limit ends now
        out[rows, t] = nxt
        finished |= nxt == eos_id
        if finished.all():
            return strip_eos(out[:, :t + 1], eos_id)
        last = nxt[:, None]
        if shrink and finished.any():
            keep = np.flatnonzero(~finished)
            rows, last, src_len, limits, finished = (
                a[keep] for a in (rows, last, src_len, limits, finished))
            self_k, self_v, cross_k, cross_v = (
                np.take(a, keep, axis=1) for a in (self_k, self_v, cross_k, cross_v))
    return strip_eos(out, eos_id)
