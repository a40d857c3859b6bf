"""Finished rows leave the seq2seq decode batch, on both served backends.

The served loops (ONNX: ``utils.search.greedy_search`` over the decoder-step session; Paddle:
``GreedyProgram``'s in-graph while loop) step only the rows still decoding.  Checked here: the
tokens equal the full-batch loop's (``shrink=False``, every row stepping to the end) and the
eager model's, on a fixed corpus in arrival order and length-sorted, with rows ending at very
different steps, rows cut at their limit and at ``max_position``, and batches of one; and the
decoder runs fewer row-steps (counted through an instrumented ONNX session and the Paddle
program's own counter), exactly one per generated token.

The model is a tiny random one whose EOS logit is biased so that outputs end anywhere from the
first step to their limit (asserted below, or the tests would test little).
"""
import numpy as np
import paddle
import pytest

from ppvarlen.config import load_config
from ppvarlen.data.vocab import SPECIAL_TOKENS, TextEncoder
from ppvarlen.export import parity
from ppvarlen.export.exporter import export_model, save_view
from ppvarlen.export.precision import paddle_config
from ppvarlen.models.seq2seq import GreedyProgram, Seq2SeqTransformer
from ppvarlen.runtime.backends import OnnxGreedyEngine, build_engine
from ppvarlen.runtime.predictor import Predictor
from ppvarlen.utils.search import greedy_search, length_limits

VOCAB, OUTPUT_SIZE, EOS, MAX_LEN = 14, 11, 5, 14
MAX_POSITION = 16  # below 1.5 * 14 + 2: the longest sources are cut at max_position
A, B = 1.5, 2
CFG = load_config(data={"Deploy": {"max_batch_size": 16, "max_batch_tokens": 256}})
META = {"task": "seq2seq", "model_name": "seq2seq", "label_names": [], "num_labels": 0,
        "special_ids": {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "bos": 4, "eos": 5},
        "max_len": MAX_LEN, "max_position": MAX_POSITION, "long_text": "error", "buckets": [7],
        "length_profile": {"p50": 6, "p95": 12, "p99": 14, "max": 14}}


def tiny_model():
    paddle.seed(3)
    model = Seq2SeqTransformer(VOCAB, hidden_size=16, num_heads=2, ffn_size=32, num_layers=1,
                               num_decoder_layers=2, dropout=0.0, max_position=MAX_POSITION,
                               max_len_a=A, max_len_b=B, output_size=OUTPUT_SIZE)
    with paddle.no_grad():
        model.out_proj.bias[EOS] = 1.0
    model.eval()
    return model


def corpus(n=40, seed=0):
    """A fixed corpus: n sources of 1..MAX_LEN ids, in arrival order."""
    rng = np.random.RandomState(seed)
    return [rng.randint(6, VOCAB, rng.randint(1, MAX_LEN + 1)).tolist() for _ in range(n)]


def pad(sources):
    lens = np.array([len(s) for s in sources], np.int64)
    ids = np.zeros((len(sources), lens.max()), np.int64)
    for i, s in enumerate(sources):
        ids[i, :len(s)] = s
    return ids, lens


def batches(sources, size):
    """Arrival order (as a server's batcher takes them) and length-sorted, ``size`` per batch."""
    by_length = sorted(sources, key=len)
    return ([sources[i:i + size] for i in range(0, len(sources), size)]
            + [by_length[i:i + size] for i in range(0, len(by_length), size)])


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    model = tiny_model()
    out = tmp_path_factory.mktemp("shrink") / "export"
    encoder = TextEncoder(list(SPECIAL_TOKENS) + [chr(0x4e00 + i) for i in range(VOCAB - 6)])
    manifest = export_model(model, META, encoder, CFG, str(out), ["paddle", "onnx"], ["fp32"],
                            verify=False)
    check_the_corpus_ends_rows_at_very_different_steps(model)
    return model, str(out), manifest


def check_the_corpus_ends_rows_at_very_different_steps(model):
    ids, lens = pad(corpus())
    ends = np.array([len(o) + 1 for o in model.greedy_decode(ids, lens)])  # EOS included
    limits = length_limits(lens, A, B, MAX_POSITION)
    assert ends.min() <= 2 and ends.max() >= 15
    assert (ends < limits).sum() >= 10 and (ends == limits).sum() >= 10
    assert (ends == MAX_POSITION).any()  # a row cut at max_position, not at a * len + b


class CountingSession:
    """An ONNX Runtime session that counts the rows of every decoder step it runs."""

    def __init__(self, session):
        self.session, self.row_steps = session, 0

    def get_inputs(self):
        return self.session.get_inputs()

    def run(self, names, feed):
        self.row_steps += len(feed["tokens"])
        return self.session.run(names, feed)


def counting_onnx_engine(export_dir, manifest):
    engine = build_engine(export_dir, manifest, "onnx")
    assert isinstance(engine, OnnxGreedyEngine)
    step = CountingSession(engine._step)
    return OnnxGreedyEngine(None, manifest, _sessions=(engine._encoder, step, engine.settings)), step


class CountingProgram(GreedyProgram):
    """The greedy program that also returns its decoder row-steps."""

    def forward(self, src_ids, src_len):
        return self.decode(src_ids, src_len)


def paddle_inference_runner(model, prefix, shrink):
    """GreedyProgram(shrink) saved and run by Paddle Inference (oneDNN) -> (ids, row_steps)."""
    save_view(CountingProgram(model, shrink=shrink), prefix + "/model")
    predictor = paddle.inference.create_predictor(paddle_config(prefix, "fp32", True, 1))

    def run(ids, lens):
        predictor.get_input_handle("src_ids").copy_from_cpu(ids)
        predictor.get_input_handle("src_len").copy_from_cpu(lens)
        predictor.run()
        tokens, row_steps = (predictor.get_output_handle(n).copy_to_cpu()
                             for n in predictor.get_output_names())
        return [r[:r.index(EOS)] for r in tokens.tolist()], int(row_steps)
    return run


def test_onnx_shrinking_loop_is_token_identical_and_steps_only_live_rows(exported):
    model, out, manifest = exported
    engine, step = counting_onnx_engine(out, manifest)
    run_encoder, run_step = parity.onnx_step_sessions(out, threads=1)
    full_rows = 0

    def counted_step(*arrays):
        nonlocal full_rows
        full_rows += len(arrays[0])
        return run_step(*arrays)

    for sources in batches(corpus(), 8) + [corpus()] + [[s] for s in corpus()[:6]]:
        ids, lens = pad(sources)
        before = step.row_steps
        got = engine.run(ids, lens)["output_ids"]
        limits = length_limits(lens, A, B, MAX_POSITION)
        full_before = full_rows
        want = greedy_search(run_encoder, counted_step, ids, lens, 4, EOS, limits, shrink=False)
        assert got == want == model.greedy_decode(ids, lens)
        # one row-step per generated token (EOS included); the full batch: rows x longest
        assert step.row_steps - before == sum(len(g) + 1 for g in got)
        assert full_rows - full_before == len(got) * max(len(g) + 1 for g in got)
        if len({len(g) for g in got}) > 1:
            assert step.row_steps - before < full_rows - full_before


def test_paddle_program_shrinks_in_graph_token_identical(exported, tmp_path):
    model, out, manifest = exported
    served = build_engine(out, manifest, "paddle")  # the exported GreedyProgram
    shrinking = paddle_inference_runner(model, str(tmp_path / "shrink"), True)
    full = paddle_inference_runner(model, str(tmp_path / "full"), False)
    eos = manifest["decoding"]["eos_id"]
    for sources in batches(corpus(), 8) + [corpus()] + [[s] for s in corpus()[:6]]:
        ids, lens = pad(sources)
        (got, steps), (want, full_steps) = shrinking(ids, lens), full(ids, lens)
        tokens = served.run(ids, lens)["tokens"].tolist()
        assert got == want == model.greedy_decode(ids, lens)
        assert [r[:r.index(eos)] for r in tokens] == want
        assert steps == sum(len(g) + 1 for g in got)
        assert full_steps == len(got) * max(len(g) + 1 for g in got)
        if len({len(g) for g in got}) > 1:
            assert steps < full_steps


def test_a_decode_loop_keeps_a_cache_of_weight_copies(exported):
    """A decode loop's steps are shapes of their own ([rows, step] grows every step): with
    capacity 0 (one weight copy shared by every shape) they would pile up without bound, and
    such shapes join to one cache key there; so a generating export's Paddle engine keeps a
    capacity counted in weight copies."""
    _, out, _ = exported
    engine = Predictor(out, "paddle").engine
    assert engine.shape_grid is not None
    assert engine.settings["onednn_shared_weights"] is False
    assert engine.settings["onednn_cache_capacity"] >= 1
