"""A PaddleNLP AutoModel directory as an embedding model (models/paddlenlp_auto.py
``paddlenlp_embed``, pooling from models/sentence_transformers_dir.py).

One random-init ERNIE encoder (hidden 32, 2 layers) saved with PaddleNLP's save_pretrained
(safetensors) and a sentence-transformers module layout written beside it the way
SentenceTransformer.save lays it out (modules.json, 1_Pooling/config.json, 2_Normalize/).
Checked: padding invariance for every pooling, equality with PaddleNLP's own forward on the
unpadded text + the same pooling, what the directory says vs what a flag says, and
``ppvarlen-export --pretrained-dir DIR --task embedding`` (parity + admission).
"""
import json
import os
import shutil

import numpy as np
import paddle
import pytest

from ppvarlen.config import ConfigError
from ppvarlen.models import build_model
from ppvarlen.models.sentence_transformers_dir import (read_directory_pooling, resolve_pooling,
                                                       write_pooling_modules)

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
TEXTS = ["物流很快，包装完好", "好", "质量不错，下次还会再来买的", "一般般吧", "很差"]
POOLINGS = ("cls", "mean", "last")
ST = "sentence_transformers.models."
MODE_KEY = {"cls": "pooling_mode_cls_token", "mean": "pooling_mode_mean_tokens",
            "last": "pooling_mode_lasttoken"}
HIDDEN = 32


def pooling_config(**on):
    """A 1_Pooling/config.json as sentence-transformers writes it (every key present)."""
    keys = ["pooling_mode_cls_token", "pooling_mode_mean_tokens", "pooling_mode_max_tokens",
            "pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens",
            "pooling_mode_lasttoken"]
    return {"word_embedding_dimension": HIDDEN, **{k: bool(on.get(k)) for k in keys},
            "include_prompt": True}


def write_st_layout(directory, config, normalize, extra=()):
    """modules.json + 1_Pooling/config.json (+ 2_Normalize/, + ``extra`` modules)."""
    modules = [{"idx": 0, "name": "0", "path": "", "type": ST + "Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": ST + "Pooling"}]
    os.makedirs(os.path.join(directory, "1_Pooling"), exist_ok=True)
    with open(os.path.join(directory, "1_Pooling", "config.json"), "w") as f:
        json.dump(config, f)
    for kind in (["Normalize"] if normalize else []) + list(extra):
        path = f"{len(modules)}_{kind}"
        os.makedirs(os.path.join(directory, path), exist_ok=True)
        modules.append({"idx": len(modules), "name": str(len(modules)), "path": path,
                        "type": ST + kind})
    with open(os.path.join(directory, "modules.json"), "w") as f:
        json.dump(modules, f)
    return str(directory)


@pytest.fixture(scope="module")
def encoder_dir(tmp_path_factory):
    """A random-init ERNIE encoder (ErnieModel, no head) + tokenizer, by save_pretrained."""
    import paddlenlp.transformers as pt

    root = tmp_path_factory.mktemp("ernie-embed")
    chars = sorted({c for t in TEXTS for c in t})
    vocab = root / "vocab.txt"
    vocab.write_text("\n".join(SPECIALS + chars) + "\n", encoding="utf-8")
    config = pt.ErnieConfig(vocab_size=len(SPECIALS) + len(chars), hidden_size=HIDDEN,
                            num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                            max_position_embeddings=512, pad_token_id=0)
    paddle.seed(3)
    directory = root / "encoder"
    pt.ErnieModel(config).save_pretrained(str(directory), safe_serialization=True)
    pt.ErnieTokenizer(vocab_file=str(vocab)).save_pretrained(str(directory))
    return str(directory)


def copy_dir(src, dst):
    shutil.copytree(src, dst)
    return str(dst)


def embedder(directory, pooling=None, normalize=None):
    from ppvarlen.models.paddlenlp_auto import read_config

    config = read_config(directory)
    model = build_model({"name": "paddlenlp_embed", "pretrained_dir": directory,
                         "max_position": 512, "pooling": pooling, "normalize": normalize},
                        config.vocab_size, 1, 0, "embedding")
    model.eval()
    return model


def padded_batch(rows, width, rng, vocab_size):
    """Right-padded ids of ``rows`` with random ids (pad id included) in the pad positions:
    what is there must not matter."""
    ids = rng.integers(0, vocab_size, size=(len(rows), width)).astype("int64")
    for b, row in enumerate(rows):
        ids[b, :len(row)] = row
    return ids, np.array([len(r) for r in rows], dtype="int64")


def paddlenlp_reference(directory, row, pooling, normalize):
    """PaddleNLP's own AutoModel on the unpadded text (it builds its attention mask itself)
    and the pooling in numpy."""
    import paddlenlp.transformers as pt

    net = pt.AutoModel.from_pretrained(directory)
    net.eval()
    with paddle.no_grad():
        states = net(input_ids=paddle.to_tensor([row]), return_dict=False)[0].numpy()[0]
    vector = {"cls": states[0], "mean": states.mean(axis=0), "last": states[-1]}[pooling]
    return vector / max(np.linalg.norm(vector), 1e-12) if normalize else vector


def encoded_texts(directory):
    from ppvarlen.data.vocab import TextEncoder

    enc = TextEncoder.load(directory, "pretrained")
    return [[enc.cls_id] + enc.encode_text(t) + [enc.sep_id] for t in TEXTS], enc.vocab_size


# ---------------------------------------------------------------- the model contract

@pytest.mark.parametrize("pooling", POOLINGS)
def test_padding_invariant_and_equal_to_paddlenlp_forward(pooling, encoder_dir):
    rows, vocab_size = encoded_texts(encoder_dir)
    rng = np.random.default_rng(len(pooling))
    for normalize in (False, True):
        model = embedder(encoder_dir, pooling, normalize)
        ids, seq_len = padded_batch(rows, max(map(len, rows)) + 3, rng, vocab_size)
        with paddle.no_grad():
            batched = model(paddle.to_tensor(ids), paddle.to_tensor(seq_len)).numpy()
        assert batched.shape == (len(rows), HIDDEN) and batched.dtype == np.float32
        for b, row in enumerate(rows):
            with paddle.no_grad():
                alone = model(paddle.to_tensor([row]), paddle.to_tensor([len(row)])).numpy()[0]
            np.testing.assert_allclose(batched[b], alone, atol=1e-5, rtol=0)
            np.testing.assert_allclose(batched[b], paddlenlp_reference(encoder_dir, row, pooling,
                                                                       normalize),
                                       atol=1e-5, rtol=0)
        norms = np.linalg.norm(batched, axis=1)
        assert np.allclose(norms, 1.0, atol=1e-5) == normalize


def test_pooling_comes_from_the_directory_and_saves_back(encoder_dir, tmp_path):
    directory = write_st_layout(copy_dir(encoder_dir, tmp_path / "st"),
                                pooling_config(pooling_mode_lasttoken=True), normalize=True)
    model = embedder(directory)
    assert (model.pooling, model.normalize) == ("last", True)
    from ppvarlen.data.vocab import TextEncoder

    saved = model.save_paddlenlp_dir(str(tmp_path / "saved"), TextEncoder.load(directory,
                                                                              "pretrained"))
    said = read_directory_pooling(saved, HIDDEN)
    assert (said.pooling, said.normalize) == ("last", True)
    again = embedder(saved)
    rows, vocab_size = encoded_texts(directory)
    ids, seq_len = padded_batch(rows, 20, np.random.default_rng(0), vocab_size)
    with paddle.no_grad():
        np.testing.assert_array_equal(
            again(paddle.to_tensor(ids), paddle.to_tensor(seq_len)).numpy(),
            model(paddle.to_tensor(ids), paddle.to_tensor(seq_len)).numpy())


# ---------------------------------------------------------------- what the directory says

@pytest.mark.parametrize("pooling", POOLINGS)
def test_each_pooling_mode_is_read(pooling, tmp_path):
    for normalize in (False, True):
        directory = write_st_layout(tmp_path / f"{normalize}", pooling_config(
            **{MODE_KEY[pooling]: True}), normalize)
        said = read_directory_pooling(directory, HIDDEN)
        assert (said.pooling, said.normalize) == (pooling, normalize)
        assert MODE_KEY[pooling] in said.where["pooling"]
        assert resolve_pooling(directory, None, None, POOLINGS) == (pooling, normalize)
        assert resolve_pooling(directory, pooling, normalize, POOLINGS) == (pooling, normalize)


def test_hand_written_and_partial_configs_follow_sentence_transformers(tmp_path):
    # ``pooling_mode`` overrides the booleans; an absent boolean takes Pooling's default
    # (mean on); without modules.json the N_Pooling / N_Normalize directories speak
    cases = [({"pooling_mode": "lasttoken", "pooling_mode_mean_tokens": True}, "last"),
             ({"pooling_mode": "CLS"}, "cls"), ({"word_embedding_dimension": HIDDEN}, "mean"),
             ({"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}, "cls")]
    for i, (config, want) in enumerate(cases):
        directory = write_st_layout(tmp_path / str(i), config, normalize=False)
        assert read_directory_pooling(directory).pooling == want
    bare = tmp_path / "no-modules-json"
    write_st_layout(bare, pooling_config(pooling_mode_cls_token=True), normalize=True)
    os.remove(bare / "modules.json")
    said = read_directory_pooling(str(bare))
    assert (said.pooling, said.normalize) == ("cls", True)
    os.rmdir(bare / "2_Normalize")
    assert read_directory_pooling(str(bare)).normalize is None  # not said: the flag decides
    assert resolve_pooling(str(bare), None, True, POOLINGS) == ("cls", True)
    # modules.json decides: a Normalize directory it does not list is not applied
    listed = write_st_layout(tmp_path / "listed", pooling_config(pooling_mode_cls_token=True),
                             normalize=False)
    os.makedirs(os.path.join(listed, "2_Normalize"))
    assert read_directory_pooling(listed).normalize is False


def test_a_flag_contradicting_the_directory_is_refused(tmp_path):
    directory = write_st_layout(tmp_path / "d", pooling_config(pooling_mode_cls_token=True),
                                normalize=False)
    config_file = os.path.join(directory, "1_Pooling", "config.json")
    with pytest.raises(ConfigError) as e:
        resolve_pooling(directory, "mean", None, POOLINGS, pooling_key="--pooling")
    assert "--pooling=mean contradicts" in str(e.value)
    assert config_file in str(e.value) and "pooling_mode_cls_token" in str(e.value)
    with pytest.raises(ConfigError, match="--normalize=true contradicts.*modules.json: no "
                                          "Normalize module"):
        resolve_pooling(directory, None, True, POOLINGS, normalize_key="--normalize")
    normalized = write_st_layout(tmp_path / "n", pooling_config(pooling_mode_cls_token=True),
                                 normalize=True)
    with pytest.raises(ConfigError, match="normalize=false contradicts.*module Normalize"):
        resolve_pooling(normalized, "cls", False, POOLINGS)
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(ConfigError, match="does not say how to pool.*cls | mean | last"):
        resolve_pooling(str(plain), None, None, POOLINGS)
    assert resolve_pooling(str(plain), "last", None, POOLINGS) == ("last", False)


@pytest.mark.parametrize("key", ["pooling_mode_max_tokens", "pooling_mode_weightedmean_tokens",
                                 "pooling_mode_mean_sqrt_len_tokens"])
def test_an_unsupported_pooling_mode_is_refused_naming_file_and_key(key, tmp_path):
    directory = write_st_layout(tmp_path / "d", pooling_config(**{key: True}), normalize=False)
    with pytest.raises(ConfigError) as e:
        resolve_pooling(directory, None, None, POOLINGS)
    assert os.path.join(directory, "1_Pooling", "config.json") in str(e.value)
    assert f"{key}: true" in str(e.value) and "not supported" in str(e.value)


def test_directories_ppvarlen_cannot_apply_are_refused(tmp_path):
    both = write_st_layout(tmp_path / "both", pooling_config(pooling_mode_cls_token=True,
                                                            pooling_mode_mean_tokens=True), False)
    with pytest.raises(ConfigError, match="concatenates several poolings"):
        read_directory_pooling(both)
    none = write_st_layout(tmp_path / "none", pooling_config(), False)
    with pytest.raises(ConfigError, match="every pooling_mode_\\* key is false"):
        read_directory_pooling(none)
    dense = write_st_layout(tmp_path / "dense", pooling_config(pooling_mode_cls_token=True),
                            True, extra=["Dense"])
    with pytest.raises(ConfigError, match="modules.json: module Dense.*would be skipped"):
        read_directory_pooling(dense)
    other = write_st_layout(tmp_path / "dim", {**pooling_config(pooling_mode_cls_token=True),
                                               "word_embedding_dimension": 768}, False)
    with pytest.raises(ConfigError, match="word_embedding_dimension=768.*hidden_size=32"):
        read_directory_pooling(other, HIDDEN)
    typo = write_st_layout(tmp_path / "typo", {"pooling_mode_cls_tokens": True}, False)
    with pytest.raises(ConfigError, match="unknown key.*pooling_mode_cls_tokens"):
        read_directory_pooling(typo)
