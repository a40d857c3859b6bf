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
    text = write_st_layout(tmp_path / "text", {"pooling_mode_cls_token": "true"}, False)
    with pytest.raises(ConfigError, match="pooling_mode_cls_token='true'.*true or false"):
        read_directory_pooling(text)


# ---------------------------------------------------------------- train -> directory -> export

def pairs_files(root):
    """A tiny {"text_a", "text_b"} corpus (every split the same lines)."""
    lines = "".join(json.dumps({"text_a": a, "text_b": b}, ensure_ascii=False) + "\n"
                    for a, b in zip(TEXTS, TEXTS[1:] + TEXTS[:1]))
    paths = {}
    for split in ("train", "dev", "test"):
        paths[split] = str(root / f"{split}.jsonl")
        with open(paths[split], "w", encoding="utf-8") as f:
            f.write(lines)
    return paths


@pytest.fixture(scope="module")
def exported(encoder_dir, tmp_path_factory):
    """{"st": export of a sentence-transformers layout (mean, Normalize) with its verify file,
    "trained": a 3-step paddlenlp_embed run (cls, no normalisation) and the export of the
    PaddleNLP directory it wrote, with the same values given as flags}."""
    from tiny_task import tiny_task_cfg

    from ppvarlen.cli import main_export
    from ppvarlen.engine import trainer as trainer_mod

    root = tmp_path_factory.mktemp("embed-export")
    paths = pairs_files(root)
    st = write_st_layout(copy_dir(encoder_dir, root / "st"),
                         pooling_config(pooling_mode_mean_tokens=True), normalize=True)
    assert main_export(["--pretrained-dir", st, "--task", "embedding", "--precision", "fp32",
                        "--output",
                        str(root / "st-export"), "--verify-file", paths["test"]]) == 0
    run = root / "run"
    cfg = tiny_task_cfg(run, paths, {"tokenizer": "pretrained", "vocab_file": encoder_dir,
                                     "add_special_tokens": True, "max_len": 32,
                                     "max_tokens": 512},
                        {"name": "paddlenlp_embed", "pretrained_dir": encoder_dir,
                         "max_position": 512, "pooling": "cls", "normalize": False})
    raw = cfg.to_dict()
    raw["Train"].update(max_steps=3, eval_every=3)
    from ppvarlen.config import load_config

    result = trainer_mod.train(load_config(data=raw))
    assert main_export(["--pretrained-dir", result["paddlenlp_dir"], "--task", "embedding",
                        "--pooling", "cls", "--no-normalize", "--format", "onnx",
                        "--precision", "fp32", "--output", str(root / "trained-export")]) == 0
    return {"st": (st, str(root / "st-export")),
            "trained": (result["paddlenlp_dir"], str(root / "trained-export"))}


def test_export_records_the_embedding_and_passes_parity_and_admission(exported):
    from tiny_task import assert_exact_parity

    st, out = exported["st"]
    manifest = json.load(open(os.path.join(out, "manifest.json")))
    assert manifest["model_name"] == "paddlenlp_embed" and manifest["task"] == "embedding"
    assert manifest["embedding"] == {"dim": HIDDEN, "pooling": "mean", "normalize": True}
    assert manifest["label_names"] == []
    assert manifest["outputs"][0]["compare"] == "cosine"
    assert_exact_parity(out)  # parity.json passed: grid + the verify file, both backends
    report = json.load(open(os.path.join(out, "parity.json")))
    for part in ("grid", "test"):
        for r in report["results"][part].values():
            assert r["min_cosine"] >= report["thresholds"]["cosine_min"] == 0.9999
    _, trained_out = exported["trained"]
    manifest = json.load(open(os.path.join(trained_out, "manifest.json")))
    assert manifest["embedding"] == {"dim": HIDDEN, "pooling": "cls", "normalize": False}
    assert sorted(manifest["backends"]) == ["onnx"]


@pytest.mark.parametrize("backend", ["paddle", "onnx"])
def test_exported_engines_take_any_shape_and_equal_paddlenlp(backend, exported):
    from ppvarlen.runtime.backends import OnnxEngine, PaddleEngine

    st, out = exported["st"]
    manifest = json.load(open(os.path.join(out, "manifest.json")))
    engine = (PaddleEngine if backend == "paddle" else OnnxEngine)(out, manifest)
    rows, vocab_size = encoded_texts(st)
    rng = np.random.default_rng(7)
    for width, order in ((23, [0, 1, 2, 3, 4]), (17, [2, 1])):  # shapes off the parity grid
        chosen = [rows[i] for i in order]
        ids, seq_len = padded_batch(chosen, width, rng, vocab_size)
        got = engine.run(ids, seq_len)["embedding"]
        assert got.shape == (len(chosen), HIDDEN)
        for b, row in enumerate(chosen):
            np.testing.assert_allclose(got[b], paddlenlp_reference(st, row, "mean", True),
                                       atol=1e-4, rtol=0)


def test_training_writes_a_directory_that_says_its_pooling(exported):
    directory, out = exported["trained"]
    said = read_directory_pooling(directory, HIDDEN)
    assert (said.pooling, said.normalize) == ("cls", False)
    from ppvarlen.runtime.backends import OnnxEngine

    manifest = json.load(open(os.path.join(out, "manifest.json")))
    rows, vocab_size = encoded_texts(directory)
    ids, seq_len = padded_batch(rows, 19, np.random.default_rng(2), vocab_size)
    got = OnnxEngine(out, manifest).run(ids, seq_len)["embedding"]
    for b, row in enumerate(rows):
        np.testing.assert_allclose(got[b], paddlenlp_reference(directory, row, "cls", False),
                                   atol=1e-4, rtol=0)


def test_export_refusals_are_one_line_and_name_the_file(exported, encoder_dir, tmp_path, capsys):
    from ppvarlen.cli import main_export

    st, _ = exported["st"]
    pooling_file = os.path.join(st, "1_Pooling", "config.json")
    out = ["--output", str(tmp_path / "o")]
    cases = [
        (["--pretrained-dir", st, "--task", "embedding", "--pooling", "cls"],
         ["--pooling=cls contradicts", pooling_file, "pooling_mode_mean_tokens: true"]),
        (["--pretrained-dir", st, "--task", "embedding", "--no-normalize"],
         ["--normalize=false contradicts", "modules.json: module Normalize"]),
        (["--pretrained-dir", encoder_dir, "--task", "embedding"],
         ["does not say how to pool", "--pooling (cls | mean | last)"]),
        (["--pretrained-dir", encoder_dir, "--pooling", "cls"], ["do not say the task"]),
        (["--checkpoint", str(tmp_path), "-c", "x.yaml", "--pooling", "cls"],
         ["go with --pretrained-dir"]),
    ]
    for argv, wanted in cases:
        assert main_export(argv + out) == 2, argv
        err = capsys.readouterr().err
        for text in wanted:
            assert text in err, (argv, err)
    with pytest.raises(SystemExit):  # argparse: not a choice
        main_export(["--pretrained-dir", encoder_dir, "--task", "embedding", "--pooling", "max"]
                    + out)
    assert "invalid choice: 'max'" in capsys.readouterr().err
    weighted = write_st_layout(copy_dir(encoder_dir, tmp_path / "w"), pooling_config(
        pooling_mode_weightedmean_tokens=True), normalize=False)
    assert main_export(["--pretrained-dir", weighted, "--task", "embedding"] + out) == 2
    err = capsys.readouterr().err
    assert os.path.join(weighted, "1_Pooling", "config.json") in err
    assert "pooling_mode_weightedmean_tokens: true" in err and "not supported" in err
    classifier = copy_dir(encoder_dir, tmp_path / "classifier")
    with open(os.path.join(classifier, "config.json")) as f:
        config = json.load(f)
    with open(os.path.join(classifier, "config.json"), "w") as f:
        json.dump({**config, "architectures": ["ErnieForSequenceClassification"]}, f)
    assert main_export(["--pretrained-dir", classifier, "--pooling", "mean"] + out) == 2
    assert "--pooling: the classification model paddlenlp_seq_cls has no pooling setting " \
           "(only paddlenlp_embed reads it: --task embedding)" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "o")
