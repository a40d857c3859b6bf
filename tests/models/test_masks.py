"""Mask helpers: correct and finite in float16 / bfloat16 / float32, for length-1 and empty rows."""
import ppvarlen  # noqa: F401  (quiet imports before paddle)
import numpy as np
import paddle
import paddle.nn.functional as F
import pytest

from ppvarlen.models.masks import (gather_last, key_padding_mask, masked_cross_entropy, masked_fill_value,
                                   masked_max, masked_mean, pool, sequence_mask)

DTYPES = ["float16", "bfloat16", "float32"]
LENGTHS = [3, 1, 0, 4]  # a full row, a length-1 row, a fully padded row
MAX_LEN = 4


def as_numpy(t):
    return (t.astype("float32") if t.dtype == paddle.bfloat16 else t).numpy()


def tensor(array, dtype):
    return paddle.to_tensor(np.asarray(array, dtype="float32")).astype(dtype)


def test_fill_value_is_most_negative_finite():
    assert masked_fill_value("float16") == float(np.finfo(np.float16).min) == -65504.0
    assert masked_fill_value(paddle.float32) == float(np.finfo(np.float32).min)
    assert masked_fill_value("bfloat16") == -3.3895313892515355e38
    for dtype in DTYPES:
        fill = tensor([masked_fill_value(dtype)], dtype)
        assert np.isfinite(as_numpy(fill)).all()
    with pytest.raises(ValueError, match="not a float dtype"):
        masked_fill_value("int64")


def test_sequence_mask_values_and_tensor_max_len():
    seq_len = paddle.to_tensor(LENGTHS, dtype="int64")
    expected = np.arange(MAX_LEN)[None, :] < np.array(LENGTHS)[:, None]
    np.testing.assert_array_equal(sequence_mask(seq_len, MAX_LEN).numpy(), expected)
    ids = paddle.zeros([4, MAX_LEN], dtype="int64")
    np.testing.assert_array_equal(sequence_mask(seq_len, paddle.shape(ids)[1], "float32").numpy(),
                                  expected.astype("float32"))


@pytest.mark.parametrize("dtype", DTYPES)
def test_key_padding_mask_shape_values_finite(dtype):
    mask = key_padding_mask(paddle.to_tensor(LENGTHS, dtype="int64"), MAX_LEN, dtype=dtype)
    assert mask.shape == [4, 1, 1, MAX_LEN] and mask.dtype == getattr(paddle, dtype)
    values = as_numpy(mask)[:, 0, 0]
    assert np.isfinite(values).all()
    real = np.arange(MAX_LEN)[None, :] < np.array(LENGTHS)[:, None]
    assert (values[real] == 0).all()
    assert (values[~real] == np.float32(masked_fill_value(dtype))).all()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_fully_masked_row_softmax_is_finite_after_float32_cast(dtype):
    # Low-precision masks are added to float32 scores (logits go float32 before softmax);
    # Paddle has no float16 softmax/add kernels on CPU.
    scores = paddle.to_tensor(np.random.default_rng(0).normal(0, 3, (4, MAX_LEN)).astype("float32"))
    mask = key_padding_mask(paddle.to_tensor(LENGTHS, dtype="int64"), MAX_LEN, dtype=dtype)[:, 0, 0]
    probs = F.softmax(scores + mask.astype("float32"), axis=-1).numpy()
    assert np.isfinite(probs).all()
    np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-5)
    assert probs[1, 0] == pytest.approx(1.0)  # length 1: all weight on the one real key
    assert (probs[1, 1:] < 1e-20).all() and (probs[0, 3] < 1e-20)


def test_fully_masked_row_float32_softmax_is_uniform_and_inf_would_be_nan():
    mask = key_padding_mask(paddle.to_tensor([0], dtype="int64"), 3)[:, 0, 0]
    np.testing.assert_allclose(F.softmax(mask, axis=-1).numpy(), [[1 / 3] * 3], rtol=1e-6)
    # Why the fill is finite: -inf on every key of a row gives NaN.
    assert np.isnan(F.softmax(paddle.full([1, 3], float("-inf")), axis=-1).numpy()).all()


def _rows(dtype, pad_value):
    rng = np.random.default_rng(1)
    x = rng.normal(0, 2, (4, MAX_LEN, 3)).astype("float32") - 5.0  # negative: a max must not be 0/fill
    real = np.arange(MAX_LEN)[None, :] < np.array(LENGTHS)[:, None]
    x[~real] = pad_value  # large junk on pads must not leak in
    x_low = tensor(x, dtype)
    return x_low, as_numpy(x_low), real


@pytest.mark.parametrize("dtype", DTYPES)
def test_masked_mean_divides_by_real_length(dtype):
    x, x_ref, real = _rows(dtype, pad_value=1000.0)
    mask = sequence_mask(paddle.to_tensor(LENGTHS, dtype="int64"), MAX_LEN)
    out = masked_mean(x, mask)
    assert out.dtype == x.dtype
    out = as_numpy(out)
    assert np.isfinite(out).all()
    tol = {"float16": 2e-3, "bfloat16": 2e-2, "float32": 1e-6}[dtype]
    for b, n in enumerate(LENGTHS):
        expected = x_ref[b, :n].mean(0) if n else np.zeros(3)
        np.testing.assert_allclose(out[b], expected, rtol=tol, atol=tol)
    np.testing.assert_array_equal(out[1], x_ref[1, 0])  # length 1: the element itself, exactly
    assert (out[2] == 0).all()  # fully padded row: zeros, not NaN


@pytest.mark.parametrize("dtype", DTYPES)
def test_masked_max_ignores_pads_and_empty_rows_give_zero(dtype):
    x, x_ref, real = _rows(dtype, pad_value=1000.0)
    mask = sequence_mask(paddle.to_tensor(LENGTHS, dtype="int64"), MAX_LEN)
    out = as_numpy(masked_max(x, mask))
    assert np.isfinite(out).all()
    for b, n in enumerate(LENGTHS):
        expected = x_ref[b, :n].max(0) if n else np.zeros(3)
        np.testing.assert_array_equal(out[b], expected)


def test_pool_last_and_cls():
    x = paddle.arange(2 * 3 * 2, dtype="float32").reshape([2, 3, 2])
    seq_len = paddle.to_tensor([2, 0], dtype="int64")
    np.testing.assert_array_equal(gather_last(x, seq_len).numpy(), x.numpy()[[0, 1], [1, 0]])
    np.testing.assert_array_equal(pool(x, seq_len, "cls").numpy(), x.numpy()[:, 0])
    with pytest.raises(ValueError, match="pooling"):
        pool(x, seq_len, "median")


def test_masked_cross_entropy_ignores_pads_and_casts_to_float32():
    rng = np.random.default_rng(2)
    logits = rng.normal(0, 1, (2, 3, 4)).astype("float32")
    labels = np.array([[1, 2, -100], [3, -100, -100]], dtype="int64")
    loss = masked_cross_entropy(paddle.to_tensor(logits), paddle.to_tensor(labels))
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    expected = -np.mean([logp[0, 0, 1], logp[0, 1, 2], logp[1, 0, 3]])
    assert float(loss) == pytest.approx(expected, rel=1e-5)
    # Changing the logits at ignored positions does not change the loss.
    logits[labels == -100] = 1e4
    assert float(masked_cross_entropy(paddle.to_tensor(logits), paddle.to_tensor(labels))) == \
        pytest.approx(expected, rel=1e-5)
    low = masked_cross_entropy(paddle.to_tensor(logits).astype("bfloat16"), paddle.to_tensor(labels))
    assert low.dtype == paddle.float32 and np.isfinite(float(low))


def test_masked_cross_entropy_all_ignored_is_zero_not_nan():
    logits = paddle.zeros([2, 3], dtype="float32")
    logits.stop_gradient = False
    loss = masked_cross_entropy(logits, paddle.to_tensor([-100, -100], dtype="int64"))
    loss.backward()
    assert float(loss) == 0.0
    assert (logits.grad.numpy() == 0).all()
