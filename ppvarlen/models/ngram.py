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


def check_ngram_config(buckets, orders, dropout=0.0, prefix="ngram", min_order=2):
    """Validate ``Model.<prefix>_buckets / _orders / _dropout`` (prefix ``ngram`` or ``wide``)."""
    if not 0.0 <= dropout < 1.0:
        raise ConfigError(f"Model.{prefix}_dropout={dropout}: use a probability in [0, 1)")
    if buckets < 0 or buckets > MAX_BUCKETS:
        raise ConfigError(f"Model.{prefix}_buckets={buckets}: use 0 (off) or 1..{MAX_BUCKETS}")
    if buckets and not orders:
        raise ConfigError(f"Model.{prefix}_orders is empty while Model.{prefix}_buckets > 0; "
                          f"give orders such as [2, 3] or set {prefix}_buckets: 0")
    bad = [n for n in orders if not isinstance(n, int) or n < min_order or n > 8]
    if bad or len(set(orders)) != len(orders):
        why = " (order 1 is the char embedding itself)" if min_order == 2 else ""
        raise ConfigError(f"Model.{prefix}_orders={list(orders)}: use distinct integers in "
                          f"{min_order}..8{why}")


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


class WideNgramHead(nn.Layer):
    """Linear ("wide") logits from hashed char n-grams, fastText / logistic-regression style.

    Each n-gram bucket holds one logit per class; a text's wide logits are the
    sum over its real positions and orders divided by sqrt(number of n-grams)
    -- the l2 norm of its count vector when the n-grams are distinct, as in
    TF-IDF + LR, so the scale does not grow with length.  Pads are masked out of
    the sum and the count, so the result is padding-invariant.
    """

    def __init__(self, vocab_size, buckets, orders, num_labels, dropout=0.0):
        super().__init__()
        check_ngram_config(buckets, orders, dropout, prefix="wide", min_order=1)
        self.boundary_id = vocab_size
        self.buckets = buckets
        self.orders = tuple(orders)
        self.dropout = dropout
        # Zero init: the head starts neutral and only moves for n-grams seen in training.
        self.embedding = nn.Embedding(buckets, num_labels,
                                      weight_attr=nn.initializer.Constant(0.0))

    def forward(self, input_ids, mask):
        """``mask`` [B, L] float (1 real, 0 pad) -> wide logits [B, num_labels] float32."""
        mask = mask.astype("float32")
        total = None
        for order in self.orders:
            e = self.embedding(ngram_hashes(input_ids, order, self.buckets, self.boundary_id))
            e = F.dropout(e, self.dropout, axis=[0, 1], training=self.training)
            total = e if total is None else total + e
        summed = (total.astype("float32") * mask.unsqueeze(-1)).sum(axis=1)
        count = mask.sum(axis=1, keepdim=True) * len(self.orders)
        return summed / paddle.sqrt(paddle.clip(count, min=1.0))


def build_wide_head(vocab_size, buckets, orders, num_labels, dropout=0.0):
    """The wide head, or None when ``buckets`` is 0 (off)."""
    check_ngram_config(buckets, orders or [], dropout, prefix="wide", min_order=1)
    return WideNgramHead(vocab_size, buckets, orders, num_labels, dropout) if buckets else None
