"""ppvarlen.utils.search: the numpy greedy loop the ONNX seq2seq predictor runs.

A scripted "model" (numpy) makes every row's output known in advance, so the loop's bookkeeping
(cache growth, EOS per row, limits, early exit) is checked exactly; one test runs the real
Seq2SeqTransformer's encoder and cached step eagerly through the loop and compares with
``greedy_decode``.
"""
import numpy as np
import pytest

from ppvarlen.utils.search import greedy_search, length_limits, strip_eos

BOS, EOS, VOCAB = 4, 5, 12
LAYERS, HEADS, HEAD_DIM = 2, 3, 4


class ScriptedModel:
    """Row i (source length i + 1) wants to emit ``script[i]`` then EOS; counts steps and rows
    stepped, and checks that the cache rows it is given belong to the rows it is asked about."""

    def __init__(self, scripts):
        self.scripts, self.steps, self.row_steps, self.fed = scripts, 0, 0, []

    def encoder(self, src_ids, src_len):
        shape = (LAYERS, src_ids.shape[0], HEADS, src_ids.shape[1], HEAD_DIM)
        row = src_len.astype(np.float32).reshape(1, -1, 1, 1, 1)
        return np.ones(shape, np.float32) * row, np.ones(shape, np.float32) * 2 * row

    def step(self, tokens, src_len, self_k, self_v, cross_k, cross_v):
        batch = tokens.shape[0]
        assert tokens.shape == (batch, 1) and tokens.dtype == np.int64
        assert self_k.shape == (LAYERS, batch, HEADS, 1 + self.steps, HEAD_DIM)
        row = src_len.astype(np.float32)
        np.testing.assert_array_equal(cross_k[0, :, 0, 0, 0], row)
        np.testing.assert_array_equal(cross_v[0, :, 0, 0, 0], 2 * row)
        np.testing.assert_array_equal(self_k[0, :, 0, 1:, 0], np.repeat(row[:, None],
                                                                        self.steps, 1))
        self.fed.append(tokens[:, 0].copy())
        t = self.steps
        logp = np.full((batch, VOCAB), -5.0, np.float32)
        for i, n in enumerate(src_len):
            script = self.scripts[n - 1]
            want = script[t] if t < len(script) else EOS
            logp[i, want] = -0.1
        self.steps += 1
        self.row_steps += batch
        grow = np.ones((LAYERS, batch, HEADS, 1, HEAD_DIM), np.float32) * row.reshape(1, -1, 1,
                                                                                     1, 1)
        return logp, np.concatenate([self_k, grow], 3), np.concatenate([self_v, grow], 3)


def run(scripts, limits, shrink=True):
    model = ScriptedModel(scripts)
    src = np.full((len(scripts), len(scripts)), 7, np.int64)
    out = greedy_search(model.encoder, model.step, src, np.arange(1, len(scripts) + 1),
                        BOS, EOS, np.asarray(limits, np.int64), shrink=shrink)
    return out, model


def test_rows_stop_at_their_own_eos_and_the_loop_exits_early():
    scripts = [[6, 7], [8, 9, 10, 11], []]
    out, model = run(scripts, [50, 50, 50])
    assert out == scripts
    assert model.steps == 5  # longest row: 4 tokens + EOS, not the limit of 50
    # each step feeds the previous step's argmax (BOS first)
    assert model.fed[0].tolist() == [BOS] * 3
    assert model.fed[1].tolist() == [6, 8]  # row 2 ended with EOS at step 1: it left the batch
    assert model.fed[2].tolist() == [7, 9]
    assert model.fed[3].tolist() == [10]  # row 0 ended at step 2
    assert model.row_steps == 3 + 2 + 2 + 1 + 1


def test_without_shrink_every_row_steps_to_the_end():
    scripts = [[6, 7], [8, 9, 10, 11], []]
    out, model = run(scripts, [50, 50, 50], shrink=False)
    assert out == scripts
    assert model.steps == 5 and model.row_steps == 3 * 5
    assert model.fed[1].tolist() == [6, 8, EOS]


def test_a_row_at_its_limit_is_forced_to_end():
    # limit counts EOS: limit 3 leaves room for 2 tokens
    out, model = run([[6, 7, 8, 9, 10], [6, 7, 8, 9, 10]], [3, 1])
    assert out == [[6, 7], []]
    assert model.steps == 3


def test_strip_eos_drops_eos_and_what_follows():
    tokens = np.array([[6, 7, EOS, 0, 0], [8, EOS, 9, EOS, 0], [6, 6, 6, 6, 6]])
    assert strip_eos(tokens, EOS) == [[6, 7], [8], [6, 6, 6, 6, 6]]


def test_bad_arguments_are_named():
    model = ScriptedModel([[6]])
    src = np.full((1, 2), 7, np.int64)
    with pytest.raises(ValueError, match="limit must be >= 1"):
        greedy_search(model.encoder, model.step, src, np.array([2]), BOS, EOS, np.array([0]))
    with pytest.raises(ValueError, match="one per row"):
        greedy_search(model.encoder, model.step, src, np.array([2, 2]), BOS, EOS, np.array([3]))
    assert greedy_search(model.encoder, model.step, np.zeros((0, 2), np.int64),
                         np.zeros(0, np.int64), BOS, EOS, np.zeros(0, np.int64)) == []
    with pytest.raises(ValueError, match="max_len_b"):
        length_limits(np.array([3]), 1.0, 0, 10)


@pytest.mark.parametrize("a,b", [(0.1, 1), (3.7, 2), (8.0, 10), (0.0, 4), (1.3, 1)])
def test_length_limits_match_the_model(a, b):
    import paddle

    from ppvarlen.models.seq2seq import Seq2SeqTransformer

    paddle.seed(0)
    model = Seq2SeqTransformer(VOCAB, hidden_size=8, num_heads=2, ffn_size=8, num_layers=1,
                               num_decoder_layers=1, max_position=40, max_len_a=a, max_len_b=b)
    src_len = np.arange(0, 200, dtype=np.int64)
    want = model.length_limits(paddle.to_tensor(src_len)).numpy()
    got = length_limits(src_len, a, b, 40)
    np.testing.assert_array_equal(got, want)
    assert got.max() <= 40
    uncapped = int(np.floor(np.float32(10) * np.float32(a))) + b
    assert length_limits(np.array([10]), a, b, None)[0] == uncapped


def test_the_loop_over_the_real_model_step_equals_greedy_decode():
    import paddle

    from ppvarlen.models.seq2seq import DecoderStepProgram, EncoderProgram, Seq2SeqTransformer

    paddle.seed(3)
    model = Seq2SeqTransformer(VOCAB, hidden_size=16, num_heads=2, ffn_size=32, num_layers=1,
                               num_decoder_layers=2, max_position=64, max_len_a=1.5, max_len_b=2)
    model.eval()
    with paddle.no_grad():  # make EOS likely so rows end at different steps
        model.out_proj.bias[EOS] = 1.0
    enc, step = EncoderProgram(model), DecoderStepProgram(model)

    def numpy_fn(layer):
        def call(*arrays):
            with paddle.no_grad():
                return tuple(o.numpy() for o in layer(*[paddle.to_tensor(a) for a in arrays]))
        return call

    rng = np.random.default_rng(0)
    lengths = np.array([1, 7, 3, 12, 5], np.int64)
    src = np.zeros((5, 12), np.int64)
    for i, n in enumerate(lengths):
        src[i, :n] = rng.integers(6, VOCAB, n)
    limits = length_limits(lengths, 1.5, 2, 64)
    got = greedy_search(numpy_fn(enc), numpy_fn(step), src, lengths, BOS, EOS, limits)
    assert got == model.greedy_decode(src, lengths)
    ends = [len(g) + 1 for g in got]  # EOS included
    assert all(n <= lim for n, lim in zip(ends, limits))
    # interesting: some rows end with their own EOS, some are cut at their limit
    assert any(n < lim for n, lim in zip(ends, limits))
    assert any(n == lim for n, lim in zip(ends, limits))
