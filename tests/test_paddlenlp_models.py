"""PaddleNLP save_pretrained directories as ppvarlen models (models/paddlenlp_auto.py).

Random-init ERNIE and BERT sequence and token classifiers (hidden 32, 2 layers, a vocab.txt
of the sentiment + NER characters) are saved with PaddleNLP's save_pretrained, trained with
tools/train.py, written back as a PaddleNLP directory, exported with tools/export.py
--pretrained-dir, and compared with PaddleNLP's own eager model on that directory.
"""
import json
import os
import pickle
import zlib

import numpy as np
import paddle
import pytest

from interrupt_helper import interrupt_during_step
from ppvarlen.cli import main_export, main_infer, main_train
from ppvarlen.config import ConfigError, load_config
from ppvarlen.data.sources import load_corpus
from ppvarlen.models import build_model

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
HEADS = {"seq": ("classification", "configs/sentiment/paddlenlp.yaml", "sentiment"),
         "token": ("tagging", "configs/ner/paddlenlp.yaml", "people_daily_ner")}
COMBOS = [(arch, head) for arch in ("ernie", "bert") for head in HEADS]
CLASSES = {"ernie": ("ErnieConfig", "ErnieTokenizer",
                     {"seq": "ErnieForSequenceClassification", "token": "ErnieForTokenClassification"}),
           "bert": ("BertConfig", "BertTokenizer",
                    {"seq": "BertForSequenceClassification", "token": "BertForTokenClassification"})}
AUTO = {"seq": "AutoModelForSequenceClassification", "token": "AutoModelForTokenClassification"}


def _corpus(name):
    return load_corpus(load_config(overrides=[f"Data.corpus={name}"]).Data)


@pytest.fixture(scope="session")
def vocab_file(tmp_path_factory):
    chars = set()
    for ex in _corpus("sentiment").splits["train"]:
        chars.update(ex["text"])
    for ex in _corpus("people_daily_ner").splits["train"]:
        chars.update(ex["tokens"])
    chars = sorted(c for c in chars if len(c) == 1 and not c.isspace() and c not in "[]")
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(SPECIALS + chars) + "\n", encoding="utf-8")
    return str(path)


def save_random_dir(directory, arch, head, vocab_file, seed=0):
    """A random-init PaddleNLP model + tokenizer, written by save_pretrained (safetensors)."""
    import paddlenlp.transformers as pt

    config_name, tokenizer_name, models = CLASSES[arch]
    task, _, corpus = HEADS[head]
    labels = _corpus(corpus).label_names
    vocab_size = sum(1 for _ in open(vocab_file, encoding="utf-8"))
    config = getattr(pt, config_name)(
        vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=512, num_labels=len(labels),
        id2label=dict(enumerate(labels)), pad_token_id=0)
    paddle.seed(seed)
    getattr(pt, models[head])(config).save_pretrained(directory, safe_serialization=True)
    getattr(pt, tokenizer_name)(vocab_file=vocab_file, do_lower_case=True).save_pretrained(directory)
    return str(directory)


def eager_reference(directory, head, ids, seq_len):
    """PaddleNLP's own model on the directory, called the PaddleNLP way (2-D attention_mask)."""
    import paddlenlp.transformers as pt

    net = getattr(pt, AUTO[head]).from_pretrained(directory)
    net.eval()
    mask = (np.arange(ids.shape[1])[None, :] < seq_len[:, None]).astype("int64")
    with paddle.no_grad():
        out = net(input_ids=paddle.to_tensor(ids), token_type_ids=paddle.zeros(ids.shape, "int64"),
                  attention_mask=paddle.to_tensor(mask), return_dict=False)
    return (out[0] if isinstance(out, (tuple, list)) else out).numpy()


def mixed_batch(rng, lengths, vocab_size, width=None, pad_ids=(0,)):
    width = width or max(lengths)
    ids = rng.choice(pad_ids, size=(len(lengths), width)).astype("int64")
    for b, n in enumerate(lengths):
        ids[b, :n] = rng.integers(5, vocab_size, n)
        ids[b, 0], ids[b, n - 1] = 2, 3  # [CLS] ... [SEP]
    return ids, np.array(lengths, dtype="int64")


def wrapped(directory, head):
    task = HEADS[head][0]
    from ppvarlen.models.paddlenlp_auto import read_config

    config = read_config(directory)
    name = {"seq": "paddlenlp_seq_cls", "token": "paddlenlp_token_cls"}[head]
    return build_model({"name": name, "pretrained_dir": directory, "max_position": 512},
                       config.vocab_size, config.num_labels, 0, task)


def first_output(out):
    return (out[0] if isinstance(out, (tuple, list)) else out).numpy()


# ---------------------------------------------------------------- the model contract

@pytest.mark.parametrize("arch, head", COMBOS)
def test_padding_invariant_and_pad_rows_get_no_gradient(arch, head, vocab_file, tmp_path):
    directory = save_random_dir(tmp_path / "m", arch, head, vocab_file)
    model = wrapped(directory, head)
    vocab_size = model.net.config.vocab_size
    pad_only = [0, vocab_size - 1, vocab_size - 2, vocab_size - 3]
    rng = np.random.default_rng(zlib.crc32(f"{arch}{head}".encode()))
    model.eval()
    for _ in range(3):
        n = int(rng.integers(2, 9))
        alone_ids, alone_len = mixed_batch(rng, [n], vocab_size - 3)
        alone = first_output(model(paddle.to_tensor(alone_ids), paddle.to_tensor(alone_len)))
        lengths = [n + 3, max(2, n - 2), int(rng.integers(2, 12))]
        row = int(rng.integers(0, 4))
        lengths.insert(row, n)
        ids, seq_len = mixed_batch(rng, lengths, vocab_size - 3, max(lengths) + 2, pad_only)
        ids[row, :n] = alone_ids[0]
        batched = first_output(model(paddle.to_tensor(ids), paddle.to_tensor(seq_len)))
        np.testing.assert_allclose(batched[row][:n] if head == "token" else batched[row],
                                   alone[0][:n] if head == "token" else alone[0], atol=1e-5, rtol=0)
    model.train()  # the training loss, dropout on: pad-only ids must get exactly no gradient
    ids, seq_len = mixed_batch(rng, [5, 2, 7, 3], vocab_size - 3, 9, pad_only)
    if head == "token":
        labels = np.where(np.arange(9)[None, :] < seq_len[:, None], 1, -100).astype("int64")
    else:
        labels = np.array([0, 1, 1, 0], dtype="int64")
    loss, _ = model(paddle.to_tensor(ids), paddle.to_tensor(seq_len), labels=paddle.to_tensor(labels))
    loss.backward()
    grad = model.net.get_input_embeddings().weight.grad.numpy()
    real = np.unique(np.concatenate([ids[b, :n] for b, n in enumerate(seq_len)]))
    assert np.abs(grad[real]).max() > 0
    assert np.abs(grad[pad_only]).max() == 0.0


def test_to_static_traces_once(vocab_file, tmp_path):
    from paddle.static import InputSpec

    model = wrapped(save_random_dir(tmp_path / "m", "bert", "token", vocab_file), "token")
    model.eval()
    rng = np.random.default_rng(1)
    batches = [mixed_batch(rng, lengths, 100, width) for lengths, width in
               (([4, 2], 4), ([9, 3, 6], 11), ([3], 3))]
    eager = [first_output(model(paddle.to_tensor(i), paddle.to_tensor(s))) for i, s in batches]
    spec = [InputSpec([None, None], "int64", "input_ids"), InputSpec([None], "int64", "seq_len")]
    static = paddle.jit.to_static(model, input_spec=spec, full_graph=True)
    for (ids, seq_len), want in zip(batches, eager):
        np.testing.assert_allclose(first_output(static(paddle.to_tensor(ids),
                                                       paddle.to_tensor(seq_len))), want, atol=1e-5)
    assert static.forward.get_traced_count() == 1


# ---------------------------------------------------------------- offline, no pickle, clear errors

@pytest.fixture
def no_pickle(monkeypatch):
    import paddlenlp.transformers as pt  # imported first: its modules subclass pickle.Unpickler
    import paddlenlp.transformers.model_utils as mu

    def refuse(*args, **kwargs):
        raise AssertionError("unpickling on a PaddleNLP directory path")
    for name in ("load", "loads", "Unpickler"):
        monkeypatch.setattr(pickle, name, refuse)
    monkeypatch.setattr(paddle, "load", refuse)
    monkeypatch.setattr(mu, "paddlenlp_load", refuse)
    assert pt.AutoModelForSequenceClassification  # the loaders run with the patches above


def test_loads_without_unpickling_and_keeps_the_head(vocab_file, tmp_path, no_pickle):
    import paddlenlp.transformers as pt
    from safetensors.numpy import load_file

    directory = save_random_dir(tmp_path / "m", "ernie", "seq", vocab_file, seed=5)
    model = wrapped(directory, "seq")
    saved = load_file(os.path.join(directory, "model.safetensors"))
    np.testing.assert_array_equal(model.net.classifier.weight.numpy(), saved["classifier.weight"])
    assert isinstance(model.net, pt.ErnieForSequenceClassification)


def test_pickle_only_directory_and_missing_directory_are_clear_errors(vocab_file, tmp_path,
                                                                      no_pickle):
    directory = save_random_dir(tmp_path / "m", "bert", "seq", vocab_file)
    os.rename(os.path.join(directory, "model.safetensors"),
              os.path.join(directory, "model_state.pdparams"))
    with pytest.raises(ConfigError, match="only pickle weights.*save_pretrained.*safe_serialization"):
        wrapped(directory, "seq")
    with pytest.raises(ConfigError, match="not a local directory.*Nothing is downloaded"):
        build_model({"name": "paddlenlp_seq_cls", "pretrained_dir": "ernie-3.0-medium-zh"}, 10, 2,
                    0, "classification")


def test_label_count_and_vocabulary_are_checked_against_the_data(vocab_file, tmp_path):
    directory = save_random_dir(tmp_path / "m", "ernie", "seq", vocab_file)
    vocab_size = sum(1 for _ in open(vocab_file, encoding="utf-8"))
    with pytest.raises(ConfigError, match="num_labels=2.*data has 7 labels"):
        build_model({"name": "paddlenlp_seq_cls", "pretrained_dir": directory}, vocab_size, 7, 0,
                    "classification")
    with pytest.raises(ConfigError, match="vocab_size=.*Data.vocab_file"):
        build_model({"name": "paddlenlp_seq_cls", "pretrained_dir": directory}, 99, 2, 0,
                    "classification")
    with pytest.raises(ConfigError, match="tagging"):
        build_model({"name": "paddlenlp_seq_cls", "pretrained_dir": directory}, vocab_size, 2, 0,
                    "tagging")


def test_tokenizer_config_decides_lowercasing_and_travels_with_the_encoder(vocab_file, tmp_path):
    from paddlenlp.transformers import AutoTokenizer

    from ppvarlen.data.vocab import TextEncoder

    directory = save_random_dir(tmp_path / "m", "bert", "seq", vocab_file)
    text = "ABC很好 Xyz，质量不错"
    want = AutoTokenizer.from_pretrained(directory)(text)["input_ids"]
    enc = TextEncoder.load(directory, "pretrained")
    assert enc.lowercase and enc.auto_tokenizer
    assert [enc.cls_id] + enc.encode_text(text) + [enc.sep_id] == want
    enc.save(str(tmp_path / "saved"))  # what a checkpoint / export holds
    again = TextEncoder.load(str(tmp_path / "saved"), "pretrained")
    assert [again.cls_id] + again.encode_text(text) + [again.sep_id] == want
    assert json.load(open(tmp_path / "saved" / "tokenizer_config.json"))["do_lower_case"] is True


# ---------------------------------------------------------------- train -> save_pretrained -> export

@pytest.fixture(scope="session")
def trained(vocab_file, tmp_path_factory):
    """{(arch, head): (run dir, export dir, verify file)}, built on first use."""
    cache = {}

    def get(arch, head):
        if (arch, head) not in cache:
            root = tmp_path_factory.mktemp(f"{arch}-{head}")
            directory = save_random_dir(root / "pretrained", arch, head, vocab_file)
            _, config, corpus = HEADS[head]
            run = root / "run"
            assert main_train(["-c", os.path.join(REPO, config), "-o", f"Model.pretrained_dir={directory}",
                               "-o", f"Data.vocab_file={directory}", "-o", f"Global.output_dir={run}",
                               "-o", "Train.max_steps=3", "-o", "Data.limit=24", "-o", "Data.max_len=48",
                               "-o", "Train.progress_bar=false", "-o", "Optimizer.lr=1e-3"]) == 0
            examples = _corpus(corpus).splits["test"][:12]
            verify = root / "verify.jsonl"
            verify.write_text("".join(json.dumps(e, ensure_ascii=False) + "\n" for e in examples),
                              encoding="utf-8")
            out = root / "export"
            precision = "fp32,bf16,fp16" if (arch, head) == ("ernie", "seq") else "fp32"
            assert main_export(["--pretrained-dir", str(run / "paddlenlp"), "--output", str(out),
                                "--verify-file", str(verify), "--precision", precision]) == 0
            cache[arch, head] = (run, out, verify)
        return cache[arch, head]
    return get


@pytest.mark.parametrize("arch, head", COMBOS)
def test_trained_model_saved_with_save_pretrained_reloads_with_identical_logits(arch, head, trained):
    from ppvarlen.engine.checkpoint import load_for_inference

    run, _, _ = trained(arch, head)
    model, meta, encoder, _ = load_for_inference(str(run / "best"))
    directory = str(run / "paddlenlp")
    assert json.load(open(os.path.join(directory, "config.json")))["id2label"]["0"] == meta["label_names"][0]
    rng = np.random.default_rng(4)
    ids, seq_len = mixed_batch(rng, [7, 3, 12, 2, 9], encoder.vocab_size)
    ours = first_output(model(paddle.to_tensor(ids), paddle.to_tensor(seq_len)))
    theirs = eager_reference(directory, head, ids, seq_len)
    for b, n in enumerate(seq_len):
        got, want = (ours[b, :n], theirs[b, :n]) if head == "token" else (ours[b], theirs[b])
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    # sanity: training moved the weights, so the reload is not the untouched directory
    assert not np.allclose(theirs, eager_reference(str(run.parent / "pretrained"), head, ids,
                                                   seq_len), atol=1e-6)


@pytest.mark.parametrize("arch, head", COMBOS)
def test_export_from_directory_matches_paddlenlp_eager(arch, head, trained):
    from ppvarlen.runtime.backends import OnnxEngine, PaddleEngine

    run, out, _ = trained(arch, head)
    manifest = json.load(open(out / "manifest.json"))
    assert manifest["model_name"] == f"paddlenlp_{head}_cls"
    assert {"tokenizer_config.json", "vocab.txt"} <= set(manifest["files"])
    parity = json.load(open(out / "parity.json"))
    assert parity["passed"]
    rng = np.random.default_rng(11)
    ids, seq_len = mixed_batch(rng, [5, 17, 2, 30, 9, 11], manifest["tokenizer"]["vocab_size"])
    want = eager_reference(str(run / "paddlenlp"), head, ids, seq_len)
    for engine in (PaddleEngine(str(out), manifest), OnnxEngine(str(out), manifest)):
        got = engine.run(ids, seq_len)[manifest["outputs"][0]["name"]]
        for b, n in enumerate(seq_len):
            pair = (got[b, :n], want[b, :n]) if head == "token" else (got[b], want[b])
            np.testing.assert_allclose(*pair, atol=1e-4, rtol=0)


def test_reduced_precisions_and_deploy_infer_serve_the_export(trained, tmp_path):
    _, out, _ = trained("ernie", "seq")
    manifest = json.load(open(out / "manifest.json"))
    assert manifest["precisions"] == {"paddle": ["fp32", "bf16", "fp16"], "onnx": ["fp32", "fp16"]}
    texts = tmp_path / "texts.txt"
    texts.write_text("物流很快，包装完好\n江泽民在北京会见了客人\n", encoding="utf-8")
    for arch, head in (("ernie", "seq"), ("bert", "token")):
        _, out, _ = trained(arch, head)
        manifest = json.load(open(out / "manifest.json"))
        preds = tmp_path / f"{arch}-{head}.jsonl"
        assert main_infer(["--model-dir", str(out), "--backend", "onnx", "--input", str(texts),
                           "--output", str(preds), "--no-progress"]) == 0
        rows = [json.loads(line) for line in open(preds, encoding="utf-8")]
        assert len(rows) == 2
        for row, text in zip(rows, ("物流很快，包装完好", "江泽民在北京会见了客人")):
            if head == "seq":
                assert row["label"] in manifest["label_names"]
            else:  # one tag per character, the [CLS]/[SEP] positions dropped
                assert len(row["tags"]) == len(text)
                assert set(row["tags"]) <= set(manifest["label_names"])


def test_export_cli_errors_are_one_line(tmp_path, capsys):
    assert main_export(["--pretrained-dir", str(tmp_path / "none"), "--output",
                        str(tmp_path / "o")]) == 2
    assert "not a local directory" in capsys.readouterr().err
    assert main_export(["--checkpoint", str(tmp_path), "--output", str(tmp_path / "o")]) == 2
    assert "needs -c" in capsys.readouterr().err


def test_resume_after_interrupt_gives_identical_losses_and_weights(vocab_file, tmp_path,
                                                                   monkeypatch):
    from safetensors.numpy import load_file

    import ppvarlen.engine.trainer as trainer_mod

    directory = save_random_dir(tmp_path / "pretrained", "bert", "token", vocab_file)

    def config(out, resume=None):
        return load_config(os.path.join(REPO, HEADS["token"][1]), [
            f"Model.pretrained_dir={directory}", f"Data.vocab_file={directory}",
            f"Global.output_dir={out}", "Train.max_steps=4", "Data.limit=24", "Data.max_len=32",
            "Data.max_tokens=256", "Data.stride=8", "Train.progress_bar=false", "Train.log_every=1",
            "Train.eval_every=2", "Optimizer.lr=1e-3"] + ([f"Train.resume={resume}"] if resume else []))

    def losses(out):
        return [(r["step"], r["loss"]) for r in map(json.loads, open(out / "train_log.jsonl"))
                if "loss" in r]

    trainer_mod.train(config(tmp_path / "full"))
    original = interrupt_during_step(monkeypatch, trainer_mod, 3)
    assert trainer_mod.train(config(tmp_path / "cut")) == {"interrupted": True, "step": 3}
    monkeypatch.setattr(trainer_mod.Trainer, "train_step", original)
    trainer_mod.train(config(tmp_path / "cut", resume="auto"))
    assert losses(tmp_path / "cut") == losses(tmp_path / "full")
    a = load_file(str(tmp_path / "full" / "ckpt-4" / "model.safetensors"))
    b = load_file(str(tmp_path / "cut" / "ckpt-4" / "model.safetensors"))
    assert sorted(a) == sorted(b) and any(k.startswith("net.bert.") for k in a)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
