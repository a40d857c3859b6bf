"""Masked-LM pretraining (the masked_lm task, trained by the Trainer) and the Model.init_from
warm start."""
import json
import os

import ppvarlen  # noqa: F401  (quiet imports before paddle)
import numpy as np
import paddle
import pytest

from interrupt_helper import interrupt_during_step
from ppvarlen.config import ConfigError, load_config
from ppvarlen.data.vocab import vocab_sha256
from ppvarlen.engine import train
from ppvarlen.tasks.masked_lm import ENCODER_FILE, mask_batch
from ppvarlen.models import build_model
from ppvarlen.models.weights import load_matching_weights, read_metadata, save_weights

TINY_MODEL = {"name": "transformer_cls", "hidden_size": 16, "num_layers": 1, "num_heads": 2,
              "ffn_size": 32, "max_position": 64, "pooling": "mean", "wide_buckets": 1000}


def _config(tmp_path, **sections):
    data = {"Global": {"output_dir": str(tmp_path / "pt"), "log_level": "WARNING"},
            "Data": {"corpus": "sentiment", "limit": 60, "max_len": 64, "min_freq": 1},
            "Model": dict(TINY_MODEL),
            "Pretrain": {"extra_corpora": []},
            "Train": {"task": "masked_lm", "max_steps": 4, "log_every": 2,
                      "progress_bar": False}}
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    return load_config(data=data)


def test_mask_batch_masks_only_real_ordinary_tokens_and_keeps_the_originals_as_targets():
    rng = np.random.default_rng(0)
    seqs = [[2] + list(rng.integers(6, 50, n)) + [3] for n in (30, 3, 60, 1)]
    seqs[0][5] = 1  # an [UNK]: never a target
    ids, lengths, positions, targets = mask_batch(seqs, pad_id=0, mask_id=4, vocab_size=50, mask_prob=0.3,
                                                  rng=rng, first_real_id=6)
    width = ids.shape[1]
    rows, cols = positions // width, positions % width
    assert lengths.tolist() == [len(s) for s in seqs]
    assert (cols < lengths[rows]).all(), "targets only at real positions"
    originals = np.array([seqs[r][c] for r, c in zip(rows, cols)])
    np.testing.assert_array_equal(targets, originals)
    assert (targets >= 6).all(), "never a special token or [UNK]"
    assert set(rows.tolist()) == {0, 1, 2, 3}, "every sequence gets at least one prediction"
    # Unchosen positions are untouched; pads stay pads.
    untouched = np.ones(ids.shape, bool)
    untouched[rows, cols] = False
    for b, s in enumerate(seqs):
        np.testing.assert_array_equal(ids[b, :len(s)][untouched[b, :len(s)]],
                                      np.array(s)[untouched[b, :len(s)]])
        assert (ids[b, len(s):] == 0).all()
    assert (ids[rows, cols] == 4).mean() > 0.5, "most targets are replaced by the mask id"


def test_mask_rate_is_close_to_mask_prob():
    rng = np.random.default_rng(1)
    seqs = [list(rng.integers(6, 100, 200)) for _ in range(50)]
    _, _, positions, _ = mask_batch(seqs, 0, 4, 100, 0.15, rng, first_real_id=6)
    assert abs(len(positions) / 10_000 - 0.15) < 0.02


def test_pretrain_writes_encoder_that_warm_starts_a_classifier(tmp_path):
    cfg = _config(tmp_path)
    result = train(cfg)
    out = cfg.Global.output_dir
    assert result["task"] == "masked_lm" and result["steps"] == 4
    assert np.isfinite(result["dev"]["mlm_loss"]) and 0.0 <= result["dev"]["masked_acc"] <= 1.0
    assert result["dev"]["masked_tokens"] > 0 and result["test"]["num_examples"] > 0
    sources = result["pretraining_text"]
    assert list(sources) == ["sentiment/train"] and sources["sentiment/train"] >= 60  # no dev/test
    for name in (ENCODER_FILE, "vocab.txt", "train_log.jsonl", "metrics.json"):
        assert os.path.isfile(os.path.join(out, name)), name
    with open(os.path.join(out, "metrics.json"), encoding="utf-8") as f:
        assert json.load(f)["encoder_file"] == os.path.join(out, ENCODER_FILE)

    from ppvarlen.store_build import build_datasets
    from ppvarlen.models.weights import read_weights

    encoder = build_datasets(cfg.Data, splits=("train",)).encoder
    assert read_metadata(os.path.join(out, ENCODER_FILE))["vocab_sha256"] == vocab_sha256(encoder)
    saved = read_weights(os.path.join(out, ENCODER_FILE))
    assert not any(k.startswith(("classifier.", "wide_head.")) for k in saved), "task heads not saved"

    model_cfg = dict(TINY_MODEL, init_from=os.path.join(out, ENCODER_FILE))
    model = build_model(model_cfg, encoder.vocab_size, 2, encoder.pad_id, "classification")
    state = model.state_dict()
    for name, array in saved.items():
        np.testing.assert_array_equal(state[name].numpy(), array)
    # Without init_weights (checkpoint loading), the file is not read at all.
    fresh = build_model(dict(model_cfg, init_from="/nonexistent.safetensors"), encoder.vocab_size, 2,
                        encoder.pad_id, "classification", init_weights=False)
    assert not np.array_equal(fresh.token_embedding.weight.numpy(), saved["token_embedding.weight"])


def test_init_from_errors_name_the_key(tmp_path):
    with pytest.raises(ValueError, match="Model.init_from=.*file not found"):
        build_model(dict(TINY_MODEL, init_from=str(tmp_path / "missing.safetensors")), 40, 2, 0,
                    "classification")
    paddle.seed(0)
    other = build_model(dict(TINY_MODEL, hidden_size=8), 40, 2, 0, "classification")
    save_weights(other, tmp_path / "small.safetensors")
    with pytest.raises(ValueError, match="(?s)Model.init_from.*shape mismatch: token_embedding.weight"):
        build_model(dict(TINY_MODEL, init_from=str(tmp_path / "small.safetensors")), 40, 2, 0,
                    "classification")


def test_load_matching_weights_reports_loaded_missing_unexpected(tmp_path):
    paddle.seed(0)
    source = build_model(dict(TINY_MODEL, wide_buckets=0), 40, 2, 0, "classification")
    save_weights(source, tmp_path / "w.safetensors", skip_prefixes=("classifier.",))
    target = build_model(dict(TINY_MODEL, ngram_buckets=50), 40, 2, 0, "classification")
    report = load_matching_weights(target, tmp_path / "w.safetensors")
    assert "token_embedding.weight" in report["loaded"]
    assert {"classifier.weight", "classifier.bias", "wide_head.embedding.weight",
            "ngram_embedding.embedding.weight"} <= set(report["missing"])
    assert report["unexpected"] == []


def test_pretrain_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="Pretrain.mask_prob"):
        train(_config(tmp_path, Pretrain={"mask_prob": 0.0}))
    with pytest.raises(ConfigError, match="transformer_cls"):
        train(_config(tmp_path, Model={"name": "rnn_cls"}))
    with pytest.raises(ConfigError, match="extra_corpora"):
        _config(tmp_path, Pretrain={"extra_corpora": ["wikipedia"]})
    with pytest.raises(ConfigError, match="Model.init_from is set in a pretraining config"):
        train(_config(tmp_path, Model={"init_from": str(tmp_path / "x.safetensors")}))
    # extra text is the masked-LM task's: a classifier run refuses it instead of ignoring it
    with pytest.raises(ConfigError, match="only the masked_lm task reads extra text"):
        train(_config(tmp_path, Train={"task": None}, Pretrain={"extra_corpora": ["sentiment"]}))


def test_pretraining_resumes_exactly(tmp_path, monkeypatch):
    """The Trainer's exact resume holds for masked-LM too (masks drawn from the step's seed)."""
    from ppvarlen.engine import trainer as trainer_mod

    train_cfg = {"eval_every": 2, "log_every": 1}
    full = train(_config(tmp_path / "full", Train=train_cfg))
    original = interrupt_during_step(monkeypatch, trainer_mod, 3)
    assert train(_config(tmp_path / "cut", Train=train_cfg)) == {"interrupted": True, "step": 3}
    monkeypatch.setattr(trainer_mod.Trainer, "train_step", original)
    resumed = train(_config(tmp_path / "cut", Train=dict(train_cfg, resume="auto")))

    def losses(run):
        with open(os.path.join(run, "pt", "train_log.jsonl"), encoding="utf-8") as f:
            return [r["loss"] for r in map(json.loads, f) if "loss" in r]

    assert len(losses(tmp_path / "full")) == 4
    assert losses(tmp_path / "cut") == losses(tmp_path / "full")  # exact float equality
    assert resumed["dev"] == full["dev"]
    full_w, cut_w = read_weights_of(tmp_path / "full"), read_weights_of(tmp_path / "cut")
    for name, array in full_w.items():
        np.testing.assert_array_equal(cut_w[name], array, err_msg=name)


def read_weights_of(run_dir):
    from ppvarlen.models.weights import read_weights

    return read_weights(os.path.join(run_dir, "pt", ENCODER_FILE))


def test_shipped_pretrain_config_runs_and_opens_with_its_command(tmp_path):
    path = "configs/sentiment/pretrain_mlm.yaml"
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(repo, path), encoding="utf-8") as f:
        assert f.readline().startswith("# python tools/train.py -c " + path)
    cfg = load_config(os.path.join(repo, path), [
        f"Global.output_dir={tmp_path}", "Data.limit=24", "Data.max_len=48", "Train.max_steps=2",
        "Pretrain.extra_corpora=[]", "Global.log_level=WARNING", "Train.progress_bar=false"])
    assert train(cfg)["steps"] == 2
    assert os.path.isfile(tmp_path / ENCODER_FILE)


def test_tools_pretrain_is_train_with_the_masked_lm_task(tmp_path):
    """tools/pretrain.py keeps working: the same library function as tools/train.py."""
    import subprocess
    import sys

    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    overrides = [f"Global.output_dir={tmp_path}", "Data.limit=24", "Data.max_len=48",
                 "Train.max_steps=2", "Pretrain.extra_corpora=[]", "Global.log_level=WARNING",
                 "Train.progress_bar=false", "Train.task=null"]
    r = subprocess.run([sys.executable, os.path.join(repo, "tools", "pretrain.py"), "-c",
                        "configs/sentiment/pretrain_mlm.yaml"]
                       + [arg for o in overrides for arg in ("-o", o)],
                       capture_output=True, text=True, cwd=repo, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout)["task"] == "masked_lm"
    assert os.path.isfile(tmp_path / ENCODER_FILE)
