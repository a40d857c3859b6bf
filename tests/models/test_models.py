"""Every model is padding-invariant, keeps pad gradients at zero and converts with to_static.

Tiny dimensions and a handful of seeded shapes keep this fast on a shared CPU.
"""
import os
import zlib

from ppvarlen.tasks.base import INPUTS
import ppvarlen  # noqa: F401  (quiet imports before paddle)
import numpy as np
import paddle
import pytest
from paddle.static import InputSpec

from ppvarlen.config import ConfigError
from ppvarlen.models import build_model

VOCAB = 40
NUM_LABELS = 3
PAD_ID = 0
# Ids no real token uses; pad positions are filled with random picks from them.
PAD_ONLY_IDS = [0, 36, 37, 38, 39]
REAL_IDS = (1, 36)  # [low, high)

TINY = dict(hidden_size=16, num_layers=2, num_heads=2, ffn_size=32, emb_size=12, max_position=64,
            dropout=0.1)
TINY_ERNIE = dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
                  type_vocab_size=2)

# Hashed char n-grams (ppvarlen/models/ngram.py); 2**20 buckets so hash products pass 2**24
# (where a float32 computation of the hash would go wrong, e.g. in a bad ONNX conversion).
NGRAMS = dict(ngram_buckets=1 << 20, ngram_orders=[2, 3])
# Linear "wide" head over hashed char 1-3-grams (ngram.WideNgramHead), same bucket reasoning.
WIDE = dict(wide_buckets=1 << 20, wide_orders=[1, 2, 3])

CASES = {
    "transformer_cls-cls": ("classification", dict(name="transformer_cls", pooling="cls")),
    "transformer_cls-mean": ("classification", dict(name="transformer_cls", pooling="mean")),
    "transformer_cls-max": ("classification", dict(name="transformer_cls", pooling="max")),
    "rnn_cls-lstm-last": ("classification", dict(name="rnn_cls", cell="lstm", pooling="last")),
    "rnn_cls-lstm-mean": ("classification", dict(name="rnn_cls", cell="lstm", pooling="mean")),
    "rnn_cls-lstm-max": ("classification", dict(name="rnn_cls", cell="lstm", pooling="max")),
    "rnn_cls-gru-last": ("classification", dict(name="rnn_cls", cell="gru", pooling="last")),
    "rnn_cls-gru-mean": ("classification", dict(name="rnn_cls", cell="gru", pooling="mean")),
    "rnn_cls-gru-max": ("classification", dict(name="rnn_cls", cell="gru", pooling="max")),
    "transformer_cls-ngram-mean_max": ("classification", dict(name="transformer_cls", pooling="mean_max",
                                                              **NGRAMS)),
    "transformer_cls-ngram-cls": ("classification", dict(name="transformer_cls", pooling="cls",
                                                         ngram_dropout=0.3, **NGRAMS)),
    "rnn_cls-lstm-ngram-last": ("classification", dict(name="rnn_cls", cell="lstm", pooling="last",
                                                       ngram_dropout=0.3, **NGRAMS)),
    "rnn_cls-gru-ngram-mean_max": ("classification", dict(name="rnn_cls", cell="gru", pooling="mean_max",
                                                          **NGRAMS)),
    "transformer_cls-wide-mean": ("classification", dict(name="transformer_cls", pooling="mean",
                                                         wide_dropout=0.3, wide_scale=5.0,
                                                         token_dropout=0.2, rdrop_alpha=1.0, **WIDE)),
    "transformer_cls-ngram-wide-cls": ("classification", dict(name="transformer_cls", pooling="cls",
                                                              **NGRAMS, **WIDE)),
    "bigru_crf": ("tagging", dict(name="bigru_crf")),
    "ernie_cls": ("classification", dict(name="ernie_cls", ernie_config=TINY_ERNIE)),
    "ernie_tagger": ("tagging", dict(name="ernie_tagger", ernie_config=TINY_ERNIE)),
}


def make_model(case, seed=0):
    task, extra = CASES[case]
    paddle.seed(seed)
    return build_model(dict(TINY, **extra), VOCAB, NUM_LABELS, PAD_ID, task), task


def padded_batch(rng, lengths, extra_pad=0):
    """Right-padded ids [B, max+extra] with random pad-only ids on pads, and seq_len [B]."""
    width = max(lengths) + extra_pad
    ids = rng.choice(PAD_ONLY_IDS, size=(len(lengths), width)).astype("int64")
    for b, n in enumerate(lengths):
        ids[b, :n] = rng.integers(*REAL_IDS, n)
    return ids, np.array(lengths, dtype="int64")


def run(model, ids, seq_len):
    out = model(paddle.to_tensor(ids), paddle.to_tensor(seq_len))
    return [o.numpy() for o in out] if isinstance(out, (tuple, list)) else [out.numpy()]


@pytest.mark.parametrize("case", list(CASES))
def test_output_same_alone_or_batched_with_any_padding(case):
    model, task = make_model(case)
    model.eval()
    rng = np.random.default_rng(zlib.crc32(case.encode()))
    for _ in range(3):
        n = int(rng.integers(1, 9))
        alone_ids, alone_len = padded_batch(rng, [n])
        alone = run(model, alone_ids, alone_len)
        neighbours = [int(v) for v in rng.integers(1, 13, size=int(rng.integers(1, 4)))]
        neighbours += [n + 3, max(1, n - 2)]  # always one longer and one shorter neighbour
        row = int(rng.integers(0, len(neighbours) + 1))
        lengths = neighbours[:row] + [n] + neighbours[row:]
        ids, seq_len = padded_batch(rng, lengths, extra_pad=int(rng.integers(0, 4)))
        ids[row, :n] = alone_ids[0]
        batched = run(model, ids, seq_len)
        if task == "classification":
            np.testing.assert_allclose(batched[0][row], alone[0][0], atol=1e-5, rtol=0)
            assert batched[0].dtype == np.float32
        else:
            emissions, tags = batched
            assert emissions.dtype == np.float32 and tags.dtype == np.int64
            assert emissions.shape == (len(lengths), ids.shape[1], NUM_LABELS)
            np.testing.assert_allclose(emissions[row, :n], alone[0][0], atol=1e-5, rtol=0)
            np.testing.assert_array_equal(tags[row, :n], alone[1][0])
            for b, m in enumerate(lengths):
                assert (tags[b, m:] == 0).all(), "pads must get tag 0"


def _training_labels(rng, task, seq_len, width):
    if task == "classification":
        return rng.integers(0, NUM_LABELS, len(seq_len)).astype("int64")
    labels = np.full((len(seq_len), width), -100, dtype="int64")
    for b, n in enumerate(seq_len):
        labels[b, :n] = rng.integers(0, NUM_LABELS, n)
    return labels


def _word_embedding(model):
    for name, param in model.named_parameters():
        if "word_embeddings" in name or name in ("token_embedding.weight", "embedding.weight"):
            return param
    raise AssertionError("no word embedding found")


@pytest.mark.parametrize("case", list(CASES))
def test_gradient_of_pad_only_embedding_rows_is_exactly_zero(case):
    model, task = make_model(case, seed=1)
    model.train()  # the real training loss, dropout included
    rng = np.random.default_rng(7)
    ids, seq_len = padded_batch(rng, [5, 2, 7, 1], extra_pad=2)
    labels = _training_labels(rng, task, seq_len, ids.shape[1])
    loss, _ = model(paddle.to_tensor(ids), paddle.to_tensor(seq_len), labels=paddle.to_tensor(labels))
    loss.backward()
    assert np.isfinite(float(loss))
    grad = _word_embedding(model).grad.numpy()
    real_rows = np.unique(np.concatenate([ids[b, :n] for b, n in enumerate(seq_len)]))
    assert np.abs(grad[real_rows]).max() > 0, "real tokens must get gradient (test sanity)"
    assert np.abs(grad[PAD_ONLY_IDS]).max() == 0.0
    if "ngram" in case:  # n-gram buckets hit only at pad positions get no gradient either
        ngram_grad = model.ngram_embedding.embedding.weight.grad.numpy()
        real = set().union(*(reference_ngram_buckets(ids[b, :n], NGRAMS) for b, n in enumerate(seq_len)))
        all_hit = set().union(*(reference_ngram_buckets(row, NGRAMS) for row in ids))
        pad_only = np.array(sorted(all_hit - real))
        assert len(pad_only) > 0 and np.abs(ngram_grad[sorted(real)]).max() > 0, "test sanity"
        assert np.abs(ngram_grad[pad_only]).max() == 0.0
        untouched = np.setdiff1d(np.arange(NGRAMS["ngram_buckets"]), sorted(real))
        assert np.abs(ngram_grad[untouched]).max() == 0.0
    if "wide" in case:  # the wide table: same rule, its own hash orders
        wide_grad = model.wide_head.embedding.weight.grad.numpy()
        spec = dict(ngram_orders=WIDE["wide_orders"], ngram_buckets=WIDE["wide_buckets"])
        real = set().union(*(reference_ngram_buckets(ids[b, :n], spec) for b, n in enumerate(seq_len)))
        assert np.abs(wide_grad[sorted(real)]).max() > 0, "test sanity"
        untouched = np.setdiff1d(np.arange(WIDE["wide_buckets"]), sorted(real))
        assert np.abs(wide_grad[untouched]).max() == 0.0
    if case.startswith("transformer_cls"):  # positions past the longest sequence are pad-only too
        position_grad = model.position_embedding.weight.grad.numpy()
        assert np.abs(position_grad[seq_len.max():]).max() == 0.0


STATIC_CASES = ["transformer_cls-mean", "transformer_cls-cls", "rnn_cls-lstm-last", "rnn_cls-gru-max",
                "transformer_cls-ngram-mean_max", "rnn_cls-lstm-ngram-last",
                "transformer_cls-ngram-wide-cls", "bigru_crf", "ernie_cls", "ernie_tagger"]


@pytest.mark.parametrize("case", STATIC_CASES)
def test_to_static_traces_once_and_matches_dygraph(case, tmp_path):
    model, task = make_model(case, seed=2)
    model.eval()
    rng = np.random.default_rng(3)
    batches = [padded_batch(rng, lengths, extra) for lengths, extra in
               (([4, 2], 0), ([9, 1, 6], 2), ([3], 0), ([7, 3, 5], 1))]
    # Eager references first: to_static(layer) converts the layer's own forward in place.
    eager = [run(model, ids, seq_len) for ids, seq_len in batches]
    spec = [InputSpec([None, None], "int64", "input_ids"), InputSpec([None], "int64", "seq_len")]
    static_model = paddle.jit.to_static(model, input_spec=spec, full_graph=True)
    for (ids, seq_len), eager_out in zip(batches[:3], eager):
        for s, e in zip(run(static_model, ids, seq_len), eager_out, strict=True):
            assert s.shape == e.shape and s.dtype == e.dtype
            np.testing.assert_allclose(s, e, atol=1e-5, rtol=0)
    assert static_model.forward.get_traced_count() == 1  # one program for every (batch, length)
    paddle.jit.save(static_model, str(tmp_path / "model"))
    assert os.path.isfile(tmp_path / "model.json") and os.path.isfile(tmp_path / "model.pdiparams")
    loaded = paddle.jit.load(str(tmp_path / "model"))
    ids, seq_len = batches[3]
    for s, e in zip(run(loaded, ids, seq_len), eager[3], strict=True):
        np.testing.assert_allclose(s, e, atol=1e-5, rtol=0)


def test_build_model_errors_name_the_key():
    with pytest.raises(ConfigError, match="tagging model"):
        build_model(dict(TINY, name="bigru_crf"), VOCAB, NUM_LABELS, PAD_ID, "classification")
    with pytest.raises(ConfigError, match="num_heads"):
        build_model(dict(TINY, name="transformer_cls", hidden_size=15), VOCAB, 2, PAD_ID, "classification")
    with pytest.raises(ConfigError, match="unknown key"):
        build_model(dict(TINY, name="rnn_cls", hiden_size=8), VOCAB, 2, PAD_ID, "classification")
    with pytest.raises(ConfigError, match="pretrained_dir"):
        build_model(dict(TINY, name="ernie_cls"), VOCAB, 2, PAD_ID, "classification")
    with pytest.raises(ConfigError, match="did you mean 'hidden_size'"):
        build_model(dict(TINY, name="ernie_cls", ernie_config=dict(TINY_ERNIE, hiden_size=8)), VOCAB, 2,
                    PAD_ID, "classification")
    with pytest.raises(ConfigError, match="directory not found"):
        build_model(dict(TINY, name="ernie_cls", pretrained_dir="/nonexistent/ernie"), VOCAB, 2, PAD_ID,
                    "classification")


def test_input_longer_than_position_table_is_a_clear_error():
    model, _ = make_model("transformer_cls-cls")
    ids = np.ones((1, TINY["max_position"] + 1), dtype="int64")
    with pytest.raises(ValueError, match="max_position"):
        model(paddle.to_tensor(ids), paddle.to_tensor([ids.shape[1]], dtype="int64"))


def test_default_pooling_per_model():
    from ppvarlen.config import load_config

    cfg = load_config(data={"Model": {"name": "rnn_cls", "hidden_size": 8, "emb_size": 8}})
    assert build_model(cfg.Model, VOCAB, 2, PAD_ID, "classification").pooling == "last"
    cfg = load_config(data={"Model": {"name": "transformer_cls", "hidden_size": 8, "ffn_size": 8}})
    assert build_model(cfg.Model, VOCAB, 2, PAD_ID, "classification").pooling == "cls"


@pytest.mark.parametrize("case", ["transformer_cls-mean", "rnn_cls-gru-last", "bigru_crf", "ernie_tagger"])
def test_training_loss_falls_on_a_fixed_batch(case):
    """The loss is wired to the parameters: 40 Adam steps on one padded batch at least halve it."""
    model, task = make_model(case, seed=4)
    model.train()
    rng = np.random.default_rng(5)
    ids, seq_len = padded_batch(rng, [6, 3, 8, 2, 5], extra_pad=1)
    labels = _training_labels(rng, task, seq_len, ids.shape[1])
    inputs = [paddle.to_tensor(a) for a in (ids, seq_len)]
    optimizer = paddle.optimizer.Adam(learning_rate=0.01, parameters=model.parameters())
    losses = []
    for _ in range(40):
        loss, _ = model(*inputs, labels=paddle.to_tensor(labels))
        loss.backward()
        optimizer.step()
        optimizer.clear_grad()
        losses.append(float(loss))
    assert losses[-1] < 0.5 * losses[0], losses[::10]


def test_seq2seq_slot_builds_the_seq2seq_module_lazily():
    seq2seq = pytest.importorskip("ppvarlen.models.seq2seq")
    model = build_model(dict(TINY, name="seq2seq", num_decoder_layers=1), VOCAB, 0, PAD_ID, "seq2seq")
    assert type(model).__module__ == seq2seq.__name__


# ------------------------------------------------------------------ hashed n-grams

def reference_ngram_hashes(row, order, buckets, vocab=VOCAB):
    """Plain-Python hash of the ``order``-gram ending at each position of ``row`` (boundary = vocab)."""
    from ppvarlen.models.ngram import HASH_PRIME

    padded = [vocab] * (order - 1) + [int(i) for i in row]
    hashes = []
    for t in range(len(row)):
        h = order
        for token in padded[t:t + order]:
            h = (h * HASH_PRIME + token) % buckets
        hashes.append(h)
    return hashes


def reference_ngram_buckets(row, ngrams):
    """Every bucket the n-grams of ``row`` hit, over all orders."""
    return {h for order in ngrams["ngram_orders"]
            for h in reference_ngram_hashes(row, order, ngrams["ngram_buckets"])}


def test_ngram_hashes_match_a_plain_python_hash_and_read_only_preceding_tokens():
    from ppvarlen.models.ngram import ngram_hashes

    buckets = NGRAMS["ngram_buckets"]
    ids = np.random.default_rng(11).integers(1, VOCAB, size=(3, 9)).astype("int64")
    for order in (2, 3):
        got = ngram_hashes(paddle.to_tensor(ids), order, buckets, VOCAB).numpy()
        assert got.dtype == np.int64 and got.min() >= 0 and got.max() < buckets
        assert got.tolist() == [reference_ngram_hashes(row, order, buckets) for row in ids]
        # A prefix hashes the same: position t reads ids[: t + 1] only (right padding is safe).
        for width in (1, 2, 5):  # 1 and 2 are shorter than the shifts: boundary ids fill in
            prefix = ngram_hashes(paddle.to_tensor(ids[:, :width]), order, buckets, VOCAB).numpy()
            np.testing.assert_array_equal(prefix, got[:, :width])
    assert len(np.unique(got)) > 20  # the hash spreads distinct trigrams (test sanity)


@pytest.mark.parametrize("bad, message", [
    (dict(ngram_buckets=-1), "ngram_buckets"),
    (dict(ngram_buckets=100, ngram_orders=[]), "ngram_orders is empty"),
    (dict(ngram_buckets=100, ngram_orders=[1, 2]), "ngram_orders"),
    (dict(ngram_buckets=100, ngram_orders=[2, 2]), "ngram_orders"),
    (dict(ngram_buckets=100, ngram_dropout=1.0), "ngram_dropout"),
    (dict(pooling="mean_max_typo"), "pooling"),
])
def test_ngram_and_pooling_config_errors_name_the_key(bad, message):
    for name in ("transformer_cls", "rnn_cls"):
        with pytest.raises(ConfigError, match=message):
            build_model(dict(TINY, name=name, **bad), VOCAB, 2, PAD_ID, "classification")


def test_ngrams_off_by_default_keep_old_checkpoints_loadable():
    model, _ = make_model("transformer_cls-mean")
    assert model.ngram_embedding is None and model.wide_head is None
    assert not any("ngram" in name or "wide" in name for name, _ in model.named_parameters())


@pytest.mark.parametrize("bad, message", [
    (dict(wide_buckets=-1), "wide_buckets"),
    (dict(wide_buckets=100, wide_orders=[]), "wide_orders is empty"),
    (dict(wide_buckets=100, wide_orders=[0, 1]), "wide_orders"),
    (dict(wide_buckets=100, wide_dropout=1.0), "wide_dropout"),
    (dict(token_dropout=-0.1), "token_dropout"),
    (dict(rdrop_alpha=-1.0), "rdrop_alpha"),
])
def test_wide_head_config_errors_name_the_key(bad, message):
    with pytest.raises(ConfigError, match=message):
        build_model(dict(TINY, name="transformer_cls", **bad), VOCAB, 2, PAD_ID, "classification")


def test_wide_head_is_a_length_normalised_sum_of_its_ngram_logits():
    """Wide logits = sum of the table rows of every real n-gram / sqrt(count), checked by hand."""
    from ppvarlen.models.ngram import WideNgramHead

    paddle.seed(9)
    head = WideNgramHead(VOCAB, buckets=997, orders=[1, 2, 3], num_labels=NUM_LABELS)
    table = np.random.default_rng(9).normal(size=(997, NUM_LABELS)).astype("float32")
    head.embedding.weight.set_value(table)
    head.eval()
    ids, seq_len = padded_batch(np.random.default_rng(10), [5, 1, 8], extra_pad=2)
    mask = (np.arange(ids.shape[1])[None] < seq_len[:, None]).astype("float32")
    got = head(paddle.to_tensor(ids), paddle.to_tensor(mask)).numpy()
    for b, n in enumerate(seq_len):
        rows = [h for order in (1, 2, 3) for h in reference_ngram_hashes(ids[b, :n], order, 997)]
        np.testing.assert_allclose(got[b], table[rows].sum(axis=0) / np.sqrt(len(rows)), rtol=1e-5)


@pytest.mark.parametrize("case", ["transformer_cls-ngram-mean_max", "rnn_cls-lstm-ngram-last",
                                  "transformer_cls-ngram-wide-cls"])
def test_ngram_models_export_to_onnx_exactly_on_mixed_lengths(case, tmp_path):
    """The team exporter converts the integer hash ops (Concat/Slice/Mul/Mod) to ONNX exactly."""
    import onnxruntime as ort

    from ppvarlen.export.onnx_export import export_onnx
    from ppvarlen.export.static import save_inference

    model, _ = make_model(case, seed=6)
    model.eval()
    prefix = str(tmp_path / "model")
    save_inference(model, prefix, INPUTS)
    export_onnx(prefix, str(tmp_path / "model.onnx"), case, ["logits"])
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    session = ort.InferenceSession(str(tmp_path / "model.onnx"), opts, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(8)
    for lengths, extra in (([11, 1, 4, 9, 2], 0), ([2], 0), ([6, 3], 3)):
        ids, seq_len = padded_batch(rng, lengths, extra)
        want = run(model, ids, seq_len)[0]
        got = session.run(None, {"input_ids": ids, "seq_len": seq_len})[0]
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


def test_rdrop_adds_a_symmetric_kl_between_two_dropout_passes():
    from ppvarlen.models.transformer_cls import symmetric_kl

    a = np.random.default_rng(12).normal(size=(4, NUM_LABELS)).astype("float32")
    b = np.random.default_rng(13).normal(size=(4, NUM_LABELS)).astype("float32")
    pa, pb = (np.exp(x) / np.exp(x).sum(-1, keepdims=True) for x in (a, b))
    want = ((pa * np.log(pa / pb)).sum(-1) + (pb * np.log(pb / pa)).sum(-1)).mean() / 2
    np.testing.assert_allclose(float(symmetric_kl(paddle.to_tensor(a), paddle.to_tensor(b))), want, rtol=1e-5)
    assert float(symmetric_kl(paddle.to_tensor(a), paddle.to_tensor(a))) == 0.0
    # Without any dropout both passes agree: the R-Drop loss is exactly the plain loss.
    ids, seq_len = padded_batch(np.random.default_rng(15), [4, 6], extra_pad=1)
    inputs = (paddle.to_tensor(ids), paddle.to_tensor(seq_len))
    labels = paddle.to_tensor(np.array([0, 2], "int64"))
    paddle.seed(14)
    no_dropout = build_model(dict(TINY, name="transformer_cls", dropout=0.0, rdrop_alpha=1.0, **WIDE), VOCAB,
                             NUM_LABELS, PAD_ID, "classification")
    no_dropout.train()
    train_loss, _ = no_dropout(*inputs, labels=labels)
    no_dropout.eval()
    np.testing.assert_allclose(float(train_loss), float(no_dropout(*inputs, labels=labels)[0]), rtol=1e-6)
    # With dropout the two passes differ and the KL term adds to the loss.
    model, _ = make_model("transformer_cls-wide-mean", seed=14)
    model.train()
    paddle.seed(16)
    rdrop_loss, _ = model(*inputs, labels=labels)
    model.rdrop_alpha = 0.0
    paddle.seed(16)
    plain_loss, _ = model(*inputs, labels=labels)
    assert np.isfinite(float(rdrop_loss)) and float(rdrop_loss) != float(plain_loss)
