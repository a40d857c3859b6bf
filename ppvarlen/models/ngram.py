"""Hashed char n-gram embeddings computed inside the graph (fastText-style).

The n-gram ending at position ``t`` is hashed from ``ids[t-n+1 .. t]`` only,
i.e. from the token itself and PRECEDING positions; positions before the
start read a fixed boundary id (``vocab_size``, which no token has).  With
right padding a real position therefore never reads a pad, and a pad
position's contribution is multiplied by the mask, so the model stays exactly
padding-invariant and pad-only rows of the bucket table get zero gradient.

Only integer tensor ops (concat, slice, multiply, add, remainder) are used, so
the same code runs eagerly, traces once under ``to_static`` with [None, None]
inputs and converts to ONNX (Concat / Slice / Mul / Add / Mod).
"""
import paddle
import paddle.nn as nn
import paddle.nn.functional as F

from ..config import ConfigError

# Odd multiplier for the polynomial rolling hash.  Every step reduces modulo
# the bucket count, so values stay below buckets * HASH_PRIME (no int64 overflow).
HASH_PRIME = 1_000_003
MAX_BUCKETS = 1 << 24


def check_ngram_config(buckets, orders, dropout=0.0):
    if not 0.0 <= dropout < 1.0:
        raise ConfigError(f"Model.ngram_dropout={dropout}: use a probability in [0, 1)")
    if buckets < 0 or buckets > MAX_BUCKETS:
        raise ConfigError(f"Model.ngram_buckets={buckets}: use 0 (off) or 1..{MAX_BUCKETS}")
    if buckets and not orders:
        raise ConfigError("Model.ngram_orders is empty while Model.ngram_buckets > 0; "
                          "give orders such as [2, 3] or set ngram_buckets: 0")
    bad = [n for n in orders if not isinstance(n, int) or n < 2 or n > 8]
    if bad or len(set(orders)) != len(orders):
        raise ConfigError(f"Model.ngram_orders={list(orders)}: use distinct integers in 2..8 "
                          f"(order 1 is the char embedding itself)")


def shift_right(ids, k, boundary_id):
    """``ids`` [B, L] moved k positions right; the first k columns hold ``boundary_id``."""
    batch, length = paddle.shape(ids)[0], paddle.shape(ids)[1]
    fill = paddle.full([batch, k], boundary_id, dtype=ids.dtype)
    # Pad left then cut back to L (not ids[:, :-k], which is wrong when L < k).
    return paddle.concat([fill, ids], axis=1)[:, :length]


def ngram_hashes(ids, order, buckets, boundary_id):
    """Bucket id [B, L] of the ``order``-gram ending at each position (int64)."""
    ids = ids.astype("int64")
    # Constants as int64 tensors, not Python scalars: ``h * 1000003`` becomes Paddle's
    # ``scale`` op, which paddle2onnx computes in float32 (wrong above 2**24).
    prime = paddle.full_like(ids, HASH_PRIME)
    modulus = paddle.full_like(ids, buckets)
    h = paddle.full_like(ids, order)  # the order seeds the hash: "ab" as a 2- and 3-gram differ
    for k in range(order - 1, -1, -1):  # oldest token first
        token = shift_right(ids, k, boundary_id) if k else ids
        h = paddle.remainder(h * prime + token, modulus)
    return h


class HashedNgramEmbedding(nn.Layer):
    """Sum of the hashed n-gram embeddings [B, L, dim] of every order, zero at pads."""

    def __init__(self, vocab_size, buckets, orders, dim, dropout=0.0):
        super().__init__()
        check_ngram_config(buckets, orders, dropout)
        self.boundary_id = vocab_size
        self.buckets = buckets
        self.orders = tuple(orders)
        self.dropout = dropout
        self.embedding = nn.Embedding(buckets, dim)

    def forward(self, input_ids, mask):
        """``mask`` [B, L] float (1 real, 0 pad), the same dtype the result should have."""
        total = None
        for order in self.orders:
            e = self.embedding(ngram_hashes(input_ids, order, self.buckets, self.boundary_id))
            # Training only: drop whole n-grams (every dim of a position at once), so the model
            # cannot lean on one memorised rare n-gram.  Identity in eval / export.
            e = F.dropout(e, self.dropout, axis=[0, 1], training=self.training)
            total = e if total is None else total + e
        return total * mask.unsqueeze(-1)


def build_ngram_embedding(vocab_size, buckets, orders, dim, dropout=0.0):
    """The n-gram layer, or None when ``buckets`` is 0 (off)."""
    check_ngram_config(buckets, orders or [], dropout)
    return HashedNgramEmbedding(vocab_size, buckets, orders, dim, dropout) if buckets else None
