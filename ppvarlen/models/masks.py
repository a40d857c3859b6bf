"""The one place masks, masked pooling and pad-ignoring losses are built.

Every model builds its masks inside ``forward`` from ``seq_len`` (right
padding), so the exported graph needs only ``input_ids`` and ``seq_len``.
All helpers are static-graph safe: lengths and shapes stay tensors, no Python
branching on tensor values.

Rules (docs/PITFALLS.md 9-15):
* additive masks use the dtype's most negative *finite* value: a literal
  -1e9 overflows float16 and -inf turns a fully masked softmax row into NaN;
* pooled means divide by the real length, and an empty row pools to zeros;
* logits are cast to float32 before softmax / loss, and pad labels (-100)
  never reach the loss.

float16 / bfloat16 inputs: Paddle 3.3.1 has almost no CPU kernels for them
(no add, divide, where, max, softmax in float16), so the reductions here run
in float32 and cast back.  That is also the numerically right thing to do.
"""
import paddle
import paddle.nn.functional as F

IGNORE_INDEX = -100

_LOW_PRECISION = ("float16", "bfloat16")


def _dtype_name(dtype):
    """'float16' for paddle.float16 / 'float16' / np.float16 alike."""
    return str(dtype).replace("paddle.", "").split(".")[-1]


def masked_fill_value(dtype="float32"):
    """Most negative finite value of ``dtype`` (never -inf, never a literal -1e9)."""
    name = _dtype_name(dtype)
    if name not in ("float16", "bfloat16", "float32", "float64"):
        raise ValueError(f"masked_fill_value: {name!r} is not a float dtype; "
                         f"use float16, bfloat16, float32 or float64")
    return float(paddle.finfo(getattr(paddle, name)).min)


def sequence_mask(seq_len, max_len, dtype="bool"):
    """[B, L] mask, True (1) at real positions ``i < seq_len[b]`` (right padding).

    ``max_len`` is an int or a 0-d/1-element int tensor such as
    ``paddle.shape(input_ids)[1]`` (keeps the graph shape-polymorphic).
    """
    positions = paddle.arange(max_len, dtype="int64")
    mask = positions.unsqueeze(0) < seq_len.astype("int64").unsqueeze(1)
    return mask if _dtype_name(dtype) == "bool" else mask.astype(dtype)


def key_padding_mask(seq_len, max_len, dtype="float32"):
    """Additive attention mask [B, 1, 1, L]: 0 on real keys, most negative finite on pads.

    Shaped for ``paddle.nn.MultiHeadAttention`` / ERNIE, which add it to the
    [B, heads, L_q, L_k] scores.  A float mask is used on purpose: Paddle turns
    bool/int masks into ``(mask - 1) * 1e9``, which overflows float16.
    """
    keep = sequence_mask(seq_len, max_len, dtype=dtype)
    additive = (1.0 - keep) * masked_fill_value(dtype)
    return additive.unsqueeze([1, 2])


def _to_float32(x):
    return x.astype("float32") if _dtype_name(x.dtype) in _LOW_PRECISION else x


def masked_mean(x, mask):
    """Mean of ``x`` [B, L, H] over real positions of ``mask`` [B, L]; empty rows give 0."""
    xf = _to_float32(x)
    m = mask.astype(xf.dtype).unsqueeze(-1)
    total = (xf * m).sum(axis=1)
    count = paddle.clip(m.sum(axis=1), min=1.0)  # a length-0 row: 0 / 1, not 0 / 0
    return (total / count).astype(x.dtype)


def masked_max(x, mask):
    """Max of ``x`` [B, L, H] over real positions; empty rows give 0 (not the fill value)."""
    xf = _to_float32(x)
    keep = mask.astype("bool").unsqueeze(-1)
    filled = paddle.where(keep, xf, paddle.full_like(xf, masked_fill_value(xf.dtype)))
    best = filled.max(axis=1)
    has_any = keep.any(axis=1).astype(xf.dtype)
    return (best * has_any).astype(x.dtype)


def gather_last(x, seq_len):
    """``x[b, seq_len[b] - 1]`` for [B, L, H] ``x`` (row 0 for an empty sequence)."""
    index = paddle.clip(seq_len.astype("int64") - 1, min=0)
    index = index.reshape([-1, 1, 1]).expand([-1, 1, paddle.shape(x)[2]])
    return paddle.take_along_axis(x, index, axis=1).squeeze(1)


def pool(x, seq_len, method):
    """Pool [B, L, H] states into [B, H]: ``cls`` (position 0), ``mean``, ``max`` or ``last``."""
    if method == "cls":
        return x[:, 0]
    if method == "last":
        return gather_last(x, seq_len)
    mask = sequence_mask(seq_len, paddle.shape(x)[1])
    if method == "mean":
        return masked_mean(x, mask)
    if method == "max":
        return masked_max(x, mask)
    raise ValueError(f"Model.pooling: unknown pooling {method!r}; use cls, mean, max or last")


def masked_cross_entropy(logits, labels, ignore_index=IGNORE_INDEX, smoothing=0.0):
    """Mean cross entropy over labels != ``ignore_index``; logits cast to float32.

    ``logits`` [..., C], ``labels`` [...] int64.  A batch with no real label
    gives loss 0 (with zero gradient) instead of 0 / 0 = NaN.

    ``smoothing`` s > 0: label smoothing uniform over the C classes, per item
    (1 - s) * CE + s * mean_c(-log p_c).  Since -log p_c = lse - z_c and lse = CE + z_y,
    that is CE + s * (z_y - mean_c z): the softmax pass cross_entropy already makes, plus
    a gather and a mean.  (A separate logsumexp pass, or log_softmax's backward, costs
    several times cross_entropy's forward + backward on Paddle 3.3.1's CPU.)
    """
    logits = logits.astype("float32")
    num_classes = paddle.shape(logits)[-1]
    flat_logits = logits.reshape([-1, num_classes])
    flat_labels = labels.reshape([-1]).astype("int64")
    keep = (flat_labels != ignore_index).astype("float32")
    safe_labels = paddle.where(flat_labels == ignore_index, paddle.zeros_like(flat_labels),
                               flat_labels).unsqueeze(-1)
    per_item = F.cross_entropy(flat_logits, safe_labels, reduction="none").squeeze(-1)
    if smoothing:
        target_logit = paddle.take_along_axis(flat_logits, safe_labels, axis=-1).squeeze(-1)
        per_item = per_item + smoothing * (target_logit - flat_logits.mean(axis=-1))
    return (per_item * keep).sum() / paddle.clip(keep.sum(), min=1.0)


def position_cross_entropy(outputs, positions, seq_len):
    """Mean over the K outputs [B, L] of the cross-entropy of ``positions`` [B, K] (the gold
    position of each output per row, e.g. a span's start and end), pads never a candidate."""
    real = sequence_mask(seq_len, paddle.shape(outputs[0])[1])
    total = 0.0
    for k, out in enumerate(outputs):
        out = _to_float32(out)
        low = paddle.full_like(out, masked_fill_value(out.dtype))
        total = total + F.cross_entropy(paddle.where(real, out, low), positions[:, k])
    return total / len(outputs)
