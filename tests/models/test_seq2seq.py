"""Seq2seq Transformer: masks, pad-free loss, decoding invariances, cache, to_static.

The decoding tests use a tiny model trained for a few seconds on a toy task (each source token
doubled: targets 2x the source length) so that sequences in a batch really end at different
steps with EOS; a random-init model emits EOS at once or never, which tests nothing.
"""
import copy
import os

import numpy as np
import paddle
import pytest

from ppvarlen.config import load_config
from ppvarlen.models.seq2seq import (DecoderStepProgram, EncoderProgram, Seq2SeqTransformer,
                                     build_seq2seq, target_mask)
from ppvarlen.tasks.seq2seq_metrics import (edit_distance, seq2seq_metrics,
                                              sequence_accuracy, token_error_rate)

PAD, BOS, EOS, VOCAB = 0, 4, 5, 16
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def toy_batch(rng, lengths, pad_src=PAD, pad_tgt=PAD):
    """Right-padded batch for the doubling task, shaped like the Collator's seq2seq batch."""
    src = np.full((len(lengths), max(lengths)), pad_src, dtype="int64")
    targets = []
    for i, n in enumerate(lengths):
        src[i, :n] = rng.integers(6, VOCAB, n)
        targets.append(list(np.repeat(src[i, :n], 2)))
    tgt_len = np.array([len(t) + 1 for t in targets], dtype="int64")
    tgt_in = np.full((len(lengths), tgt_len.max()), pad_tgt, dtype="int64")
    tgt_out = np.full(tgt_in.shape, -100, dtype="int64")
    for i, t in enumerate(targets):
        tgt_in[i, :len(t) + 1] = [BOS] + t
        tgt_out[i, :len(t) + 1] = t + [EOS]
    return {"src_ids": src, "src_len": np.array(lengths, dtype="int64"), "tgt_in": tgt_in,
            "tgt_len": tgt_len, "tgt_out": tgt_out, "targets": targets}


def example(batch, i):
    """Example ``i`` of a batch as a batch of one, padding removed."""
    n_src, n_tgt = batch["src_len"][i], batch["tgt_len"][i]
    return {"src_ids": batch["src_ids"][i:i + 1, :n_src], "src_len": batch["src_len"][i:i + 1],
            "tgt_in": batch["tgt_in"][i:i + 1, :n_tgt], "tgt_len": batch["tgt_len"][i:i + 1],
            "tgt_out": batch["tgt_out"][i:i + 1, :n_tgt]}


def sequence_logprob(model, src_ids, src_len, hyp):
    """Teacher-forced log-probability of ``hyp`` + EOS for one source (no cache, no search)."""
    tgt_in = paddle.to_tensor([[BOS] + hyp], dtype="int64")
    logits = model(paddle.to_tensor(src_ids), paddle.to_tensor(src_len), tgt_in,
                   paddle.to_tensor([len(hyp) + 1], dtype="int64"))
    logp = model._next_logp(logits)[0].numpy()
    return float(sum(logp[t, tok] for t, tok in enumerate(hyp + [EOS])))


def run(model, batch, with_loss=True):
    names = ["src_ids", "src_len", "tgt_in", "tgt_len"] + (["tgt_out"] if with_loss else [])
    return model(*[paddle.to_tensor(batch[n]) for n in names])


@pytest.fixture(scope="module")
def model():
    paddle.seed(0)
    m = Seq2SeqTransformer(VOCAB, hidden_size=32, num_heads=4, ffn_size=64, num_layers=1,
                           num_decoder_layers=2, dropout=0.0, max_position=64,
                           max_len_a=3, max_len_b=2)
    opt = paddle.optimizer.Adam(learning_rate=3e-3, parameters=m.parameters())
    rng = np.random.default_rng(0)
    for _ in range(200):
        loss, _ = run(m, toy_batch(rng, rng.integers(1, 8, 32)))
        loss.backward()
        opt.step()
        opt.clear_grad()
    m.eval()
    return m


@pytest.fixture()
def sources():
    rng = np.random.default_rng(1)
    return toy_batch(rng, [5, 1, 7, 3, 6, 2])


def test_target_mask_is_causal_and_hides_pad_keys():
    mask = target_mask(paddle.to_tensor([3, 1]), 4).numpy()
    assert mask.shape == (2, 1, 4, 4) and np.isfinite(mask).all()
    keep = mask[:, 0] == 0
    assert keep[0].tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 0]]
    assert keep[1].tolist() == [[1, 0, 0, 0]] * 4  # every row keeps >= 1 key: no NaN


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_loss_ignores_padding(model, smoothing):
    model.label_smoothing = smoothing
    try:
        rng = np.random.default_rng(2)
        batch = toy_batch(rng, [4, 1, 6])
        loss, logits = run(model, batch)
        # other pad ids, and 5 more pad columns on the source and target sides, change nothing
        rng = np.random.default_rng(2)
        wider = toy_batch(rng, [4, 1, 6], pad_src=9, pad_tgt=11)
        for key, pad in (("src_ids", 9), ("tgt_in", 11), ("tgt_out", -100)):
            wider[key] = np.pad(wider[key], ((0, 0), (0, 5)), constant_values=pad)
        loss2, logits2 = run(model, wider)
        assert abs(float(loss) - float(loss2)) < 1e-5
        real = batch["tgt_out"] != -100
        np.testing.assert_allclose(logits.numpy()[real], logits2.numpy()[:, :real.shape[1]][real],
                                   atol=1e-5)
        # the loss is the mean over real target tokens: token-weighted mean of per-example losses
        alone = [float(run(model, example(batch, i))[0]) for i in range(3)]
        weights = batch["tgt_len"]
        assert abs(float(loss) - np.dot(alone, weights) / weights.sum()) < 1e-5
    finally:
        model.label_smoothing = 0.0


def test_smoothed_loss_is_the_textbook_formula():
    from ppvarlen.models.masks import masked_cross_entropy

    rng = np.random.default_rng(4)
    logits = rng.normal(size=(2, 3, 7)).astype("float32") * 3
    labels = np.array([[1, 4, -100], [6, -100, -100]])
    got = float(masked_cross_entropy(paddle.to_tensor(logits), paddle.to_tensor(labels),
                                     smoothing=0.2))
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    real = labels != -100
    nll = -logp[real, labels[real]].mean()
    uniform = -logp[real].mean(-1).mean()
    assert abs(got - (0.8 * nll + 0.2 * uniform)) < 1e-5


def test_padding_positions_get_no_gradient_signal(model):
    """A batch whose only difference is garbage in pad positions gives identical gradients."""
    rng = np.random.default_rng(3)
    batch = toy_batch(rng, [2, 5])
    grads = []
    for pad in (PAD, 13):
        b = dict(batch)
        real = np.arange(5)[None] < batch["src_len"][:, None]
        b["src_ids"] = np.where(real, batch["src_ids"], pad)
        loss, _ = run(model, b)
        loss.backward()
        grads.append(model.embed.weight.grad.numpy().copy())
        model.clear_gradients()
    np.testing.assert_allclose(grads[0], grads[1], atol=1e-6)


def test_greedy_is_the_same_alone_or_batched_and_stops_at_eos(model, sources):
    out = model.greedy_decode(sources["src_ids"], sources["src_len"])
    for i, n in enumerate(sources["src_len"]):
        alone = model.greedy_decode(sources["src_ids"][i:i + 1, :n], sources["src_len"][i:i + 1])
        assert alone[0] == out[i]
    # sequences end at their own EOS (at different steps), mostly before their length limits
    # (3 * len + 2 tokens including EOS)
    lengths = [len(o) for o in out]
    assert len(set(lengths)) > 3
    assert sum(len(o) < 3 * n + 1 for o, n in zip(out, sources["src_len"])) >= 4
    assert sequence_accuracy([" ".join(map(str, o)) for o in out],
                             [" ".join(map(str, t)) for t in sources["targets"]]) >= 0.5


def test_cached_decoding_equals_full_recomputation(model, sources):
    cached = model.greedy_decode(sources["src_ids"], sources["src_len"])
    full = model.greedy_decode(sources["src_ids"], sources["src_len"], use_cache=False)
    assert cached == full
    # and step by step the log-probs agree, not just the argmax
    src, src_len = paddle.to_tensor(sources["src_ids"]), paddle.to_tensor(sources["src_len"])
    with paddle.no_grad():
        memory = model.encode(src, src_len)
        cache = model.init_cache(memory)
        prefix = paddle.full([len(sources["src_len"]), 1], BOS, dtype="int64")
        for _ in range(6):
            logp, k, v = model.decode_step(prefix[:, -1:], src_len, *cache)
            cache = (k, v) + cache[2:]
            ref = model.full_step(prefix, memory, src_len)
            np.testing.assert_allclose(logp.numpy(), ref.numpy(), atol=1e-4)
            prefix = paddle.concat([prefix, logp.argmax(-1).unsqueeze(1)], axis=1)


@pytest.mark.parametrize("length_penalty", [0.0, 1.0])
def test_beam_is_the_same_alone_or_batched(model, sources, length_penalty):
    out = model.beam_search(sources["src_ids"], sources["src_len"], beam_size=3,
                            length_penalty=length_penalty)
    for i, n in enumerate(sources["src_len"]):
        alone = model.beam_search(sources["src_ids"][i:i + 1, :n], sources["src_len"][i:i + 1],
                                  beam_size=3, length_penalty=length_penalty)
        assert alone[0] == out[i]
    assert len({len(o) for o in out}) > 3


@pytest.fixture()
def unsure_model(model):
    """The toy model with flattened output distributions, so that beams often swap places."""
    unsure = copy.deepcopy(model)
    with paddle.no_grad():
        unsure.out_proj.weight.set_value(unsure.out_proj.weight * 0.15)
    return unsure


def test_beam_scores_match_rescoring_and_beat_greedy(unsure_model, sources):
    """The search's own score of its best hypothesis equals a teacher-forced rescoring (so the
    cache was reordered with the beams), and with no length penalty it is >= greedy's."""
    model = unsure_model
    beams, scores = model.beam_search(sources["src_ids"], sources["src_len"], beam_size=4,
                                      length_penalty=0.0, return_scores=True)
    greedy = model.greedy_decode(sources["src_ids"], sources["src_len"])
    with paddle.no_grad():
        for i, n in enumerate(sources["src_len"]):
            src, src_len = sources["src_ids"][i:i + 1, :n], sources["src_len"][i:i + 1]
            rescored = sequence_logprob(model, src, src_len, beams[i])
            assert abs(rescored - scores[i]) < 1e-3
            assert rescored >= sequence_logprob(model, src, src_len, greedy[i]) - 1e-4


def test_beam_of_one_is_greedy_and_max_len_caps(model, sources):
    greedy = model.greedy_decode(sources["src_ids"], sources["src_len"])
    assert model.beam_search(sources["src_ids"], sources["src_len"], beam_size=1) == greedy
    capped = model.greedy_decode(sources["src_ids"], sources["src_len"], max_len=4)
    assert all(len(c) <= 3 and c == g[:len(c)] for c, g in zip(capped, greedy))
    beams = model.beam_search(sources["src_ids"], sources["src_len"], beam_size=3, max_len=4)
    assert all(len(b) <= 3 for b in beams)


def test_encoder_and_decoder_step_trace_once_with_dynamic_dims(model):
    enc_program, step_program = EncoderProgram(model), DecoderStepProgram(model)
    enc = paddle.jit.to_static(enc_program, full_graph=True, input_spec=enc_program.input_spec())
    step = paddle.jit.to_static(step_program, full_graph=True,
                                input_spec=step_program.input_spec())
    rng = np.random.default_rng(4)
    with paddle.no_grad():
        for lengths in ([3], [5, 1, 7], [2, 2, 6, 4]):
            batch = toy_batch(rng, lengths)
            src, src_len = paddle.to_tensor(batch["src_ids"]), paddle.to_tensor(batch["src_len"])
            cross_k, cross_v = enc(src, src_len)
            self_k, self_v, ref_k, ref_v = model.init_cache(model.encode(src, src_len))
            np.testing.assert_allclose(cross_k.numpy(), ref_k.numpy(), atol=1e-5)
            tokens = paddle.full([len(lengths), 1], BOS, dtype="int64")
            for _ in range(3):  # cache lengths 1, 2, 3: the self-attention length is dynamic
                logp, self_k, self_v = step(tokens, src_len, self_k, self_v, cross_k, cross_v)
                ref, _, _ = model.decode_step(tokens, src_len, self_k[:, :, :, :-1],
                                              self_v[:, :, :, :-1], ref_k, ref_v)
                np.testing.assert_allclose(logp.numpy(), ref.numpy(), atol=1e-5)
                tokens = logp.argmax(-1).unsqueeze(1)
    assert len(enc.forward.program_cache) == 1 and len(step.forward.program_cache) == 1


def test_saved_programs_run_in_paddle_inference_with_onednn(model, tmp_path):
    """jit.save'd encoder + step programs under the CPU predictor (oneDNN on) match eager."""
    import paddle.inference as pi

    predictors = {}
    for name, program in (("encoder", EncoderProgram(model)), ("step", DecoderStepProgram(model))):
        static = paddle.jit.to_static(program, input_spec=program.input_spec(), full_graph=True)
        paddle.jit.save(static, str(tmp_path / name))
        config = pi.Config(str(tmp_path / f"{name}.json"), str(tmp_path / f"{name}.pdiparams"))
        config.disable_gpu()
        config.enable_mkldnn()
        predictors[name] = pi.create_predictor(config)

    def call(name, *arrays):
        p = predictors[name]
        for input_name, x in zip(p.get_input_names(), arrays):
            p.get_input_handle(input_name).copy_from_cpu(np.ascontiguousarray(x))
        p.run()
        return [p.get_output_handle(n).copy_to_cpu() for n in p.get_output_names()]

    batch = toy_batch(np.random.default_rng(6), [4, 1, 6])
    src, src_len = batch["src_ids"], batch["src_len"]
    cross_k, cross_v = call("encoder", src, src_len)
    with paddle.no_grad():
        cache = model.init_cache(model.encode(paddle.to_tensor(src), paddle.to_tensor(src_len)))
        self_k, self_v = cache[0].numpy(), cache[1].numpy()
        tokens = np.full([3, 1], BOS, dtype="int64")
        for _ in range(4):
            logp, self_k, self_v = call("step", tokens, src_len, self_k, self_v, cross_k, cross_v)
            ref, k, v = model.decode_step(paddle.to_tensor(tokens), paddle.to_tensor(src_len),
                                          *cache)
            cache = (k, v) + cache[2:]
            np.testing.assert_allclose(logp, ref.numpy(), atol=1e-4)
            tokens = ref.numpy().argmax(-1)[:, None].astype("int64")


def test_build_from_config():
    cfg = load_config(data={"Model": {"name": "seq2seq", "hidden_size": 32, "num_heads": 4,
                                      "ffn_size": 64, "num_layers": 1, "num_decoder_layers": 1}})
    m = build_seq2seq(cfg.Model, vocab_size=50, label_smoothing=0.1)
    assert len(m.encoder.layers) == 1 and len(m.decoder.layers) == 1
    assert m.label_smoothing == 0.1 and m.out_proj.weight.shape == [32, 50]
    with pytest.raises(ValueError, match="divisible"):
        Seq2SeqTransformer(50, hidden_size=30, num_heads=4)


def test_too_long_inputs_name_the_config_key(model):
    rng = np.random.default_rng(5)
    batch = toy_batch(rng, [70])  # model.max_position is 64
    with pytest.raises(ValueError, match="Model.max_position=64"):
        run(model, batch)
    with pytest.raises(ValueError, match="max_len must be >= 1"):
        model.greedy_decode(batch["src_ids"][:, :5], [5], max_len=0)


def test_metrics():
    assert edit_distance("abc", "abc") == 0 and edit_distance("", "ab") == 2
    assert edit_distance(["zhong", "guo"], ["zhong", "gou", "ren"]) == 2
    hyps = ["zhong guo", "ren min", "bei jing shi"]
    refs = ["zhong guo", "ren ming", "bei jing"]
    assert sequence_accuracy(hyps, refs) == pytest.approx(1 / 3)
    assert token_error_rate(hyps, refs) == pytest.approx(2 / 6)
    assert seq2seq_metrics(hyps, refs) == {"seq_acc": pytest.approx(1 / 3),
                                           "ter": pytest.approx(2 / 6), "num_examples": 3}
    with pytest.raises(ValueError, match="input order"):
        sequence_accuracy(hyps, refs[:2])


def test_g2p_batches_through_the_model():
    """Real g2p data -> B's dataset/sampler/collator -> C's registry -> this model, end to end."""
    from ppvarlen.data.collate import Collator
    from ppvarlen.store_build import build_datasets
    from ppvarlen.data.samplers import build_batch_sampler
    from ppvarlen.models import build_model

    cfg = load_config(os.path.join(REPO, "configs", "g2p", "transformer.yaml"), [
        "Data.limit=40", "Data.max_source_len=40", "Data.max_target_len=160",
        "Data.max_tokens=6000", "Model.hidden_size=32", "Model.ffn_size=64",
        "Data.target_tokenizer=char", "Model.max_position=200"])  # letters: targets > 2x sources
    data = build_datasets(cfg.Data)
    enc = data.encoder
    assert (enc.bos_id, enc.eos_id, enc.pad_id) == (BOS, EOS, PAD)
    model = build_model(cfg.Model, enc.vocab_size, enc.output_size, enc.pad_id, "seq2seq")
    assert model.output_size == enc.output_size < 120  # letters, digits, punctuation
    collate = Collator(enc.pad_id, fields=data.train.store.fields)
    indices = next(iter(build_batch_sampler(data.train, cfg.Data, shuffle=True)))
    batch = collate([data.train[i] for i in indices])
    assert len(set(batch["src_len"].tolist())) > 1
    assert (batch["tgt_len"] > 2 * batch["src_len"]).all()
    loss, logits = run(model, batch)
    assert np.isfinite(float(loss)) and logits.shape[1] == batch["tgt_in"].shape[1]
    loss.backward()
    model.eval()
    hyps = model.greedy_decode(batch["src_ids"], batch["src_len"], max_len=20)
    text = [enc.decode_target(h) for h in hyps]
    assert len(text) == len(indices) and all(len(h) < 20 for h in hyps)
    refs = [enc.decode_target(data.train[i]["tgt_ids"][1:-1]) for i in indices]
    assert all(r and not any("\u4e00" <= c <= "\u9fff" for c in r) for r in refs)
    assert 0.0 <= seq2seq_metrics(text, refs)["ter"]
