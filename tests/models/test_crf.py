"""The CRF loss is the exact NLL under the decoder's convention (brute force over all paths)."""
import itertools

import ppvarlen  # noqa: F401  (quiet imports before paddle)
import numpy as np
import paddle
import pytest

from ppvarlen.models.crf import LinearChainCRF

T = 3


def _random_crf(seed):
    paddle.seed(seed)
    crf = LinearChainCRF(T)
    rng = np.random.default_rng(seed)
    # Larger-than-init scales so paths really differ and argmax ties are improbable.
    for p in (crf.transitions, crf.start, crf.stop):
        p.set_value(rng.normal(0, 1.5, p.shape).astype("float32"))
    return crf, rng


def _brute_force_score(crf, emissions, path):
    trans, start, stop = (p.numpy() for p in (crf.transitions, crf.start, crf.stop))
    score = start[path[0]] + stop[path[-1]]
    score += sum(emissions[t, tag] for t, tag in enumerate(path))
    score += sum(trans[a, b] for a, b in zip(path[:-1], path[1:]))
    return score


@pytest.mark.parametrize("seed", range(6))
def test_exp_neg_loss_sums_to_one_and_viterbi_is_argmax(seed):
    crf, rng = _random_crf(seed)
    lengths = [4, 1, 3, 2]  # mixed lengths in one batch, L = 4
    batch, max_len = len(lengths), max(lengths)
    emissions = rng.normal(0, 2, (batch, max_len, T)).astype("float32")
    seq_len = paddle.to_tensor(lengths, dtype="int64")
    em = paddle.to_tensor(emissions)

    log_z = crf.log_partition(em, seq_len).numpy()
    decoded = crf.decode(em, seq_len).numpy()
    assert decoded.shape == (batch, max_len) and decoded.dtype == np.int64

    for b, n in enumerate(lengths):
        paths = list(itertools.product(range(T), repeat=n))
        scores = np.array([_brute_force_score(crf, emissions[b], p) for p in paths])
        # exp(-loss) over every path of this row, each path padded with junk tags.
        total = 0.0
        for p in paths:
            tags = np.array(list(p) + list(rng.integers(-100, T, max_len - n)), dtype="int64")
            tags_b = np.zeros((batch, max_len), dtype="int64")  # other rows: any valid path
            tags_b[b] = tags
            for other, m in enumerate(lengths):
                if other != b:
                    tags_b[other, :m] = 0
            per_row = (crf.log_partition(em, seq_len) - crf.path_score(em, paddle.to_tensor(tags_b), seq_len)).numpy()
            total += np.exp(-per_row[b])
        np.testing.assert_allclose(total, 1.0, rtol=1e-4)
        np.testing.assert_allclose(log_z[b], np.log(np.exp(scores - scores.max()).sum()) + scores.max(), rtol=1e-5)
        best = paths[int(np.argmax(scores))]
        assert tuple(decoded[b, :n]) == best, (b, decoded[b], best)
        assert (decoded[b, n:] == 0).all()


def test_nll_matches_brute_force_and_batch_mean():
    crf, rng = _random_crf(11)
    lengths = [2, 3, 1]
    emissions = rng.normal(0, 1, (3, 3, T)).astype("float32")
    gold = rng.integers(0, T, (3, 3)).astype("int64")
    for b, n in enumerate(lengths):
        gold[b, n:] = -100  # pads carry the ignore index, as the collator writes them
    loss = crf.nll(paddle.to_tensor(emissions), paddle.to_tensor(gold), paddle.to_tensor(lengths, dtype="int64"))
    expected = []
    for b, n in enumerate(lengths):
        scores = [_brute_force_score(crf, emissions[b], p) for p in itertools.product(range(T), repeat=n)]
        log_z = np.log(np.sum(np.exp(scores)))
        expected.append(log_z - _brute_force_score(crf, emissions[b], gold[b, :n]))
    np.testing.assert_allclose(float(loss), np.mean(expected), rtol=1e-5)


def test_nll_gradients_flow_and_empty_row_is_ignored():
    crf, rng = _random_crf(3)
    em = paddle.to_tensor(rng.normal(0, 1, (2, 3, T)).astype("float32"), stop_gradient=False)
    tags = paddle.to_tensor([[0, 1, 2], [-100, -100, -100]], dtype="int64")
    loss = crf.nll(em, tags, paddle.to_tensor([3, 0], dtype="int64"))
    loss.backward()
    assert np.isfinite(float(loss))
    assert np.abs(em.grad.numpy()[1]).max() == 0.0  # the empty row gets no gradient
    assert np.abs(crf.transitions.grad.numpy()).max() > 0


def test_ignore_label_inside_a_sequence_is_a_clear_error():
    crf, _ = _random_crf(0)
    em = paddle.zeros([1, 3, T])
    with pytest.raises(ValueError, match="add_special_tokens"):
        crf.nll(em, paddle.to_tensor([[-100, 1, 2]], dtype="int64"), paddle.to_tensor([3], dtype="int64"))


def test_decode_single_position_and_all_length_one():
    crf, rng = _random_crf(5)
    em = rng.normal(0, 1, (2, 1, T)).astype("float32")
    tags = crf.decode(paddle.to_tensor(em), paddle.to_tensor([1, 1], dtype="int64")).numpy()
    start, stop = crf.start.numpy(), crf.stop.numpy()
    assert list(tags[:, 0]) == [int(np.argmax(em[b, 0] + start + stop)) for b in range(2)]


def test_numpy_viterbi_of_the_onnx_path_agrees_with_the_graph_decoder():
    viterbi = pytest.importorskip("ppvarlen.utils.viterbi")
    if not hasattr(viterbi, "crf_matrix"):
        pytest.skip("ppvarlen.utils.viterbi has no crf_matrix/crf_decode yet")
    crf, rng = _random_crf(7)
    lengths = np.array([5, 2, 1, 4], dtype="int64")
    em = rng.normal(0, 1, (4, 5, T)).astype("float32")
    graph_tags = crf.decode(paddle.to_tensor(em), paddle.to_tensor(lengths)).numpy()
    matrix = viterbi.crf_matrix(crf.transitions.numpy(), crf.start.numpy(), crf.stop.numpy())
    np.testing.assert_array_equal(graph_tags, viterbi.crf_decode(em, matrix, lengths))
