"""Viterbi decoding in numpy, the same convention as ``paddle.text.ViterbiDecoder``.

The ONNX export cannot carry Paddle's ``viterbi_decode`` op, so the ONNX
predictor decodes the exported emissions here (numpy only: a serving host needs
no Paddle).  Convention, read from Paddle's CPU kernel
(phi/kernels/cpu/viterbi_decode_kernel.cc):

* ``transitions[i, j]`` scores moving from tag ``i`` to tag ``j``;
* with ``include_bos_eos_tag`` the last row is the start tag's transitions
  (added at step 0) and the second-to-last row is the stop tag's, added at each
  sequence's last real step;
* positions at or beyond a sequence's length get tag 0; ties go to the lowest
  tag index (first argmax), as in Paddle.

The export stores a CRF as one "crf matrix" [T+2, T] (``crf_transitions.npy``):
rows 0..T-1 are ``transitions[from, to]``, row T the stop scores, row T+1 the
start scores (Paddle's row layout without its two helper columns);
``crf_decode`` reads that layout.
"""
import numpy as np


def viterbi_decode(emissions, transitions, lengths, include_bos_eos_tag=False):
    """``paddle.text.viterbi_decode`` in numpy.

    emissions [B, L, T] float, transitions [T, T] float, lengths [B] int.
    Returns ``(scores [B] float32, paths [B, L] int64)``.
    """
    transitions = np.asarray(transitions, dtype=np.float32)
    zeros = np.zeros(transitions.shape[-1], np.float32)
    start = transitions[-1] if include_bos_eos_tag else zeros
    stop = transitions[-2] if include_bos_eos_tag else zeros
    return _decode(emissions, transitions, start, stop, lengths)


def crf_matrix(transitions, start, stop):
    """Stack a CRF's parameters into the exported [T+2, T] layout."""
    return np.concatenate([np.asarray(transitions, np.float32),
                           np.asarray(stop, np.float32)[None], np.asarray(start, np.float32)[None]])


def crf_decode(emissions, matrix, lengths):
    """Best paths [B, L] int64 (0 on pads) under an exported crf matrix [T+2, T]."""
    matrix = np.asarray(matrix, dtype=np.float32)
    tags = matrix.shape[-1]
    if matrix.shape != (tags + 2, tags):
        raise ValueError(f"crf matrix must be [T+2, T] (transitions, stop row, start row), "
                         f"got shape {matrix.shape}")
    return _decode(emissions, matrix[:tags], matrix[tags + 1], matrix[tags], lengths)[1]


def _decode(emissions, transitions, start, stop, lengths):
    emissions = np.asarray(emissions, dtype=np.float32)
    lengths = np.asarray(lengths, dtype=np.int64)
    if emissions.ndim != 3:
        raise ValueError(f"emissions must be [batch, length, tags], got shape {emissions.shape}")
    batch, max_len, num_tags = emissions.shape
    if transitions.shape != (num_tags, num_tags):
        raise ValueError(f"transitions must be [{num_tags}, {num_tags}] to match the emissions' "
                         f"tag axis, got {transitions.shape}")
    if lengths.shape != (batch,) or (lengths < 0).any() or (lengths > max_len).any():
        raise ValueError(f"lengths must be [{batch}] ints in [0, {max_len}], got {lengths.tolist()}")

    # Forward pass over the batch at once; finished sequences keep their alpha.
    alpha = emissions[:, 0] + start
    alpha = alpha + stop * (lengths == 1)[:, None]
    backpointers = np.zeros((max(max_len - 1, 0), batch, num_tags), dtype=np.int64)
    for t in range(1, max_len):
        scores = alpha[:, :, None] + transitions[None]          # [B, from, to]
        backpointers[t - 1] = scores.argmax(axis=1)
        step = scores.max(axis=1) + emissions[:, t]
        active = (t < lengths)[:, None]
        alpha = np.where(active, step, alpha)
        alpha = alpha + stop * (lengths == t + 1)[:, None]
    best_last = alpha.argmax(axis=1)
    best_score = alpha[np.arange(batch), best_last]

    paths = np.zeros((batch, max_len), dtype=np.int64)
    for b in range(batch):
        n = int(lengths[b])
        if n == 0:
            continue
        tag = best_last[b]
        paths[b, n - 1] = tag
        for t in range(n - 2, -1, -1):
            tag = backpointers[t, b, tag]
            paths[b, t] = tag
    return best_score.astype(np.float32), paths
