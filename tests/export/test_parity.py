"""numpy Viterbi == Paddle's decoder; the input validator; the parity gates."""
import numpy as np
import paddle
import pytest

from ppvarlen.export import parity
from ppvarlen.utils.inputs import validate_batch
from ppvarlen.utils.viterbi import crf_decode, crf_matrix, viterbi_decode


@pytest.mark.parametrize("include_bos_eos_tag", [False, True])
def test_numpy_viterbi_equals_paddle_decoder(include_bos_eos_tag):
    rng = np.random.RandomState(0)
    for _ in range(60):
        batch, length, tags = rng.randint(1, 6), rng.randint(1, 9), rng.randint(3, 7)
        emissions = rng.randn(batch, length, tags).astype(np.float32)
        transitions = rng.randn(tags, tags).astype(np.float32)
        lengths = rng.randint(1, length + 1, batch).astype(np.int64)
        lengths[0] = length
        decoder = paddle.text.ViterbiDecoder(paddle.to_tensor(transitions), include_bos_eos_tag)
        want_scores, want_paths = decoder(paddle.to_tensor(emissions), paddle.to_tensor(lengths))
        scores, paths = viterbi_decode(emissions, transitions, lengths, include_bos_eos_tag)
        np.testing.assert_array_equal(paths[:, :want_paths.shape[1]], want_paths.numpy())
        assert (paths[:, want_paths.shape[1]:] == 0).all()
        np.testing.assert_allclose(scores, want_scores.numpy(), rtol=1e-5, atol=1e-5)


def test_crf_decode_equals_the_models_crf_layer():
    from ppvarlen.models.crf import LinearChainCRF

    paddle.seed(0)
    crf = LinearChainCRF(5)
    rng = np.random.RandomState(1)
    emissions = rng.randn(4, 8, 5).astype(np.float32)
    lengths = np.array([8, 3, 1, 6], dtype=np.int64)
    want = crf.decode(paddle.to_tensor(emissions), paddle.to_tensor(lengths)).numpy()
    matrix = crf_matrix(crf.transitions.numpy(), crf.start.numpy(), crf.stop.numpy())
    np.testing.assert_array_equal(crf_decode(emissions, matrix, lengths), want)


def _batch():
    ids = np.array([[7, 8, 9], [7, 0, 0]], dtype=np.int64)
    return ids, np.array([3, 1], dtype=np.int64)


@pytest.mark.parametrize("mutate, message", [
    (lambda i, s: (i.astype(np.int32), s), "input_ids must be int64"),
    (lambda i, s: (i[0], s), "input_ids must have rank 2"),
    (lambda i, s: (i, s[:1]), "seq_len has 1 entries"),
    (lambda i, s: (i, np.array([3, 0])), r"seq_len\[1\] = 0 is outside"),
    (lambda i, s: (i, np.array([2, 1])), "row 0: seq_len 2 is shorter"),
    (lambda i, s: (i, np.array([3, 2])), "row 1: seq_len 2 is longer"),
    (lambda i, s: (i * 10, s), r"input_ids\[0, 0\] = 70 is outside the vocabulary"),
])
def test_validator_names_the_problem(mutate, message):
    ids, lens = mutate(*_batch())
    with pytest.raises(ValueError, match=message):
        validate_batch(ids, lens, vocab_size=50, pad_id=0)


def test_validator_rejects_lengths_beyond_max_position():
    ids = np.ones((1, 9), dtype=np.int64)
    with pytest.raises(ValueError, match="exceeds the model's max_position 8"):
        validate_batch(ids, np.array([9]), max_position=8)
    validate_batch(*_batch(), max_position=8, vocab_size=50, pad_id=0)  # a good batch passes


def test_grid_has_bucket_neighbours_and_random_neighbour_rows():
    assert parity.grid_lengths(32, [8, 16]) == [1, 2, 7, 8, 9, 15, 16, 17, 32]
    grid = parity.grid_batches(32, [8, 16], vocab_size=50, first_id=6, batch_sizes=(1, 3, 32))
    assert len(grid) == 27
    for length, bsz, ids, lens in grid:
        assert ids.shape == (bsz, lens.max()) and lens[0] == length
        validate_batch(ids, lens, vocab_size=50, pad_id=0)
    assert len({tuple(lens[1:]) for _, bsz, _, lens in grid if bsz == 32}) > 1


def test_gates():
    def res(diff, agree):
        return {"max_abs_diff": diff, "agreement": agree, "compared": 10}

    prec = {"onnx": "fp32", "onnx_fp16": "fp16"}
    ok = {"grid": {"onnx": res(1e-6, 1.0), "onnx_fp16": res(1e-2, 0.9)},
          "test": {"onnx": res(1e-6, 1.0), "onnx_fp16": res(1e-2, 0.996)}}
    assert parity.check(ok, prec) == []  # low precision is gated on the test split only
    bad = {"grid": {"onnx": res(2e-4, 0.99), "onnx_fp16": res(1e-2, 0.9)},
           "test": {"onnx": res(1e-6, 1.0), "onnx_fp16": res(1e-2, 0.99)}}
    failures = parity.check(bad, prec)
    assert len(failures) == 3
    assert any("grid/onnx: max |diff|" in f for f in failures)
    assert any("test/onnx_fp16: agreement" in f for f in failures)
