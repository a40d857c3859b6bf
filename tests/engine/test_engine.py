"""The training engine end to end on tiny real data (Data.limit) and tiny models.

Covers: output layout, exact resume after a real SIGINT (same losses, same
weights), deterministic eval independent of batching, evaluate_checkpoint ==
the metrics recorded at training time, window aggregation in the reports, the
AMP-on-CPU warning, and the CLI's one-paragraph config errors.
"""
import json
import os
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest
from safetensors.numpy import load_file

from ppvarlen.config import load_config
from ppvarlen.engine import evaluate_checkpoint, load_for_inference
from ppvarlen.engine import trainer as trainer_mod
from ppvarlen.engine.evaluate import predict
from ppvarlen.tasks import get_task

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TAGS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG"]


def tiny_cfg(out, **train):
    data = {
        "Global": {"output_dir": str(out), "seed": 7},
        "Data": {"corpus": "sentiment", "limit": 96, "max_len": 64, "max_tokens": 512},
        "Model": {"name": "transformer_cls", "hidden_size": 16, "num_layers": 1, "num_heads": 2,
                  "ffn_size": 32, "dropout": 0.3, "max_position": 64},
        "Optimizer": {"lr": 3e-3, "warmup_steps": 2},
        "Train": dict({"max_steps": 8, "log_every": 1, "eval_every": 4, "keep_last": 2,
                       "progress_bar": False}, **train),
    }
    return load_config(data=data)


def losses(out):
    with open(os.path.join(out, "train_log.jsonl")) as f:
        return [(r["step"], r["loss"]) for r in map(json.loads, f) if "loss" in r]


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("full")
    result = trainer_mod.train(tiny_cfg(out))
    return str(out), result


def test_output_layout(full_run):
    out, result = full_run
    for name in ("config.yaml", "metrics.json", "train_log.jsonl", "curves.png", "best", "ckpt-8"):
        assert os.path.exists(os.path.join(out, name)), name
    assert os.path.realpath(os.path.join(out, "last")) == os.path.realpath(os.path.join(out, "ckpt-8"))
    assert sorted(d for d in os.listdir(out) if d.startswith("ckpt-")) == ["ckpt-4", "ckpt-8"]
    for f in ("model.safetensors", "optimizer.safetensors", "vocab.txt", "encoder.json",
              "config.yaml", "meta.json", "trainer_state.json"):
        assert os.path.isfile(os.path.join(out, "best", f)), f
    meta = json.load(open(os.path.join(out, "best", "meta.json")))
    assert meta["task"] == "classification" and meta["label_names"] == ["negative", "positive"]
    assert set(meta["length_profile"]) == {"p50", "p95", "p99", "max"}
    assert meta["length_profile"]["max"] <= 64 and meta["buckets"]
    metrics = json.load(open(os.path.join(out, "metrics.json")))
    assert metrics["steps"] == 8 and metrics["best_step"] in (4, 8)
    assert metrics["test"]["num_examples"] == 96
    # the test accuracy, recomputed from the best checkpoint's outputs with scikit-learn
    from sklearn.metrics import accuracy_score

    from ppvarlen.data.collate import Collator
    from ppvarlen.store_build import build_datasets

    model, _, encoder, cfg = load_for_inference(os.path.join(out, "best"))
    test = build_datasets(cfg.Data, encoder=encoder).test
    logits = predict(model, test, "classification", Collator(encoder.pad_id, fields=test.store.fields),
                     max_tokens=4096)
    gold = [test[i]["label"] for i in range(len(test))]
    assert metrics["test"]["accuracy"] == pytest.approx(
        accuracy_score(gold, np.stack(logits).argmax(-1)))
    tp = metrics["throughput"]
    assert tp["real_tokens_per_s"] > 0 and 0 < tp["padding_efficiency"] <= 1
    assert [s for s, _ in losses(out)] == list(range(1, 9))


def test_resume_after_interrupt_gives_identical_losses_and_weights(full_run, tmp_path, monkeypatch):
    out_full, _ = full_run
    original = trainer_mod.Trainer.train_step

    def interrupt_after_step_5(self, batch):
        loss = original(self, batch)
        if self.state["step"] == 4:  # the 5th step is running: Ctrl-C arrives during it
            os.kill(os.getpid(), signal.SIGINT)
        return loss

    monkeypatch.setattr(trainer_mod.Trainer, "train_step", interrupt_after_step_5)
    first = trainer_mod.train(tiny_cfg(tmp_path))
    assert first == {"interrupted": True, "step": 5}
    assert os.path.realpath(os.path.join(tmp_path, "last")).endswith("ckpt-5")
    monkeypatch.setattr(trainer_mod.Trainer, "train_step", original)
    trainer_mod.train(tiny_cfg(tmp_path, resume="auto"))
    assert losses(tmp_path) == losses(out_full)  # exact float equality, steps 1..8
    a = load_file(os.path.join(out_full, "ckpt-8", "model.safetensors"))
    b = load_file(os.path.join(tmp_path, "ckpt-8", "model.safetensors"))
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_eval_is_deterministic_and_matches_recorded_metrics(full_run):
    out, _ = full_run
    model, meta, encoder, cfg = load_for_inference(os.path.join(out, "best"))
    from ppvarlen.data.collate import Collator
    from ppvarlen.store_build import build_datasets

    dev = build_datasets(cfg.Data, encoder=encoder).dev
    collate = Collator(encoder.pad_id, fields=dev.store.fields)
    small = predict(model, dev, "classification", collate, max_tokens=64)
    large = predict(model, dev, "classification", collate, max_tokens=100_000)
    np.testing.assert_allclose(np.stack(small), np.stack(large), rtol=1e-5, atol=1e-5)
    # the metrics recomputed here with scikit-learn from the model's outputs and the gold labels
    from sklearn.metrics import accuracy_score, f1_score

    gold = [dev[i]["label"] for i in range(len(dev))]
    guess = np.stack(large).argmax(-1)
    accuracy, macro_f1 = accuracy_score(gold, guess), f1_score(gold, guess, average="macro",
                                                                labels=[0, 1], zero_division=0)
    again = evaluate_checkpoint(cfg, os.path.join(out, "best"), "dev")
    assert again["accuracy"] == pytest.approx(accuracy) == meta["metrics"]["dev"]["accuracy"]
    assert again["macro_f1"] == pytest.approx(macro_f1)
    assert meta["metrics"]["dev"]["macro_f1"] == pytest.approx(macro_f1)
    assert again["items"] == len(dev) and again["predict_seconds"] > 0
    # the summary counts truncation and warns: documents longer than max_len 64 (specials in)
    long = int((dev.doc_lengths > 64).sum())
    assert long > 0 and again["long_text"]["truncated"] == long
    assert len(again["warnings"]) == 1 and f"{long} of {len(dev)} dev texts" in again["warnings"][0]


def test_reports_aggregate_windows_per_document():
    # doc 0 split in two windows (content offsets 0 and 2), doc 1 a single window.
    # Specials carry -100.  Window 0 sees tokens 0..3, window 1 tokens 2..5.
    dataset = [
        {"input_ids": [2, 9, 9, 9, 9, 3], "labels": [-100, 1, 2, 0, 3, -100], "doc_id": 0, "offset": 0},
        {"input_ids": [2, 9, 9, 9, 9, 3], "labels": [-100, 0, 3, 4, 0, -100], "doc_id": 0, "offset": 2},
        {"input_ids": [2, 9, 9, 3], "labels": [-100, 5, 6, -100], "doc_id": 1, "offset": 0},
    ]
    gold_tags = [np.asarray(d["labels"]).clip(0) for d in dataset]
    out = get_task("tagging").report(dataset, gold_tags, TAGS)
    assert out["num_examples"] == 2 and out["f1"] == 1.0
    # window 1 (most central for doc positions 3..5) misses the LOC: only it counts there
    wrong = [gold_tags[0], np.asarray([0, 0, 0, 0, 0, 0]), gold_tags[2]]
    out = get_task("tagging").report(dataset, wrong, TAGS)
    assert out["recall"] == pytest.approx(2 / 3) and out["precision"] == 1.0
    cls = [{"input_ids": [1], "label": 1, "doc_id": 0}, {"input_ids": [1], "label": 1, "doc_id": 0},
           {"input_ids": [1], "label": 0, "doc_id": 1}]
    # doc 0: mean of (+3, -1) favours class 1 although one window says 0
    logits = [np.array([0.0, 3.0]), np.array([1.0, 0.0]), np.array([2.0, 0.0])]
    rep = get_task("classification").report(cls, logits, ["neg", "pos"])
    assert rep == {"accuracy": 1.0, "macro_f1": 1.0, "num_examples": 2}


def test_amp_on_cpu_warns_once_and_trains_fp32(tmp_path, capfd):
    cfg = tiny_cfg(tmp_path, max_steps=2, eval_every=0, amp={"enable": True, "dtype": "float16"})
    result = trainer_mod.train(cfg)
    err = capfd.readouterr().err
    assert err.count("Train.amp.enable=true") == 1 and "training in float32" in err
    assert result["amp"] == "off (float32)"


def test_cli_config_error_is_one_paragraph_exit_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("Train:\n  epoch: 3\n")
    r = subprocess.run([sys.executable, "tools/train.py", "-c", str(bad)], cwd=REPO,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr and "did you mean 'epochs'" in r.stderr


def test_rdrop_with_label_smoothing_and_foreign_warm_start_are_config_errors(tmp_path):
    from ppvarlen.config import ConfigError
    from ppvarlen.models import build_model
    from ppvarlen.models.weights import save_weights

    base = tiny_cfg(tmp_path).to_dict()
    base["Model"]["rdrop_alpha"] = 1.0
    base["Train"]["label_smoothing"] = 0.1
    with pytest.raises(ConfigError, match="rdrop_alpha"):
        trainer_mod.Trainer(load_config(data=base))
    # same vocabulary size, different token order: the embedding rows would be scrambled
    base["Model"]["rdrop_alpha"], base["Train"]["label_smoothing"] = 0.0, 0.0
    model = build_model(load_config(data=base).Model, 2000, 2, 0, "classification")
    path = str(tmp_path / "enc.safetensors")
    save_weights(model, path, metadata={"vocab_sha256": "0" * 64})
    base["Model"]["init_from"] = path
    with pytest.raises(ConfigError, match="different vocabulary"):
        trainer_mod.Trainer(load_config(data=base))


def test_the_first_epoch_is_planned_while_the_model_is_set_up(tmp_path, monkeypatch):
    """The sampler's plan runs in a thread beside the model's set-up: here the model cannot be
    built until the plan has started, and the plan cannot end until the static program has
    been compiled (either would time out if the order were serial), with a step budget and
    with epochs (whose schedule needs the plan's count).  An error in the plan still reaches
    the caller of Trainer()."""
    from ppvarlen.data.errors import DataError

    planning, compiled = threading.Event(), threading.Event()
    real_build, real_loader = trainer_mod.build_model, trainer_mod.train_loader
    real_compile = trainer_mod.compile_loss

    def build_model(*args, **kwargs):
        assert planning.wait(timeout=30), "the model was built before the plan started"
        return real_build(*args, **kwargs)

    def compile_loss(*args, **kwargs):
        compiled.set()
        return real_compile(*args, **kwargs)

    def loader_with(plan):
        def make(*args, **kwargs):
            loader = real_loader(*args, **kwargs)
            sampler = loader.sampler
            sampler.__class__ = type("Planned", (type(sampler),), {"__len__": plan})
            return loader
        return make

    def plan_beside_the_model(sampler):
        planning.set()
        assert compiled.wait(timeout=30), "the plan was waited for before the compile"
        return type(sampler).__mro__[1].__len__(sampler)

    monkeypatch.setattr(trainer_mod, "build_model", build_model)
    monkeypatch.setattr(trainer_mod, "compile_loss", compile_loss)
    monkeypatch.setattr(trainer_mod, "train_loader", loader_with(plan_beside_the_model))
    for train in ({"max_steps": 2}, {"max_steps": 0, "epochs": 1}):
        planning.clear()
        compiled.clear()
        t = trainer_mod.Trainer(tiny_cfg(tmp_path / str(len(train)), to_static=True, **train))
        assert t.total_steps == (train["max_steps"] or len(t.sampler)) > 0
        assert t.static_loss is not None

    def failing_plan(sampler):
        planning.set()
        raise DataError("planned badly")

    monkeypatch.setattr(trainer_mod, "train_loader", loader_with(failing_plan))
    with pytest.raises(DataError, match="planned badly"):
        trainer_mod.Trainer(tiny_cfg(tmp_path / "failing"))


def test_max_len_beyond_the_position_table_is_refused_before_training(tmp_path):
    """PITFALLS 17: Data.max_len > Model.max_position would index past the position table at the
    first long batch; the trainer refuses it first, naming both keys (seq2seq: max_source_len)."""
    from ppvarlen.config import ConfigError

    base = tiny_cfg(tmp_path).to_dict()
    base["Data"]["max_len"] = 65
    with pytest.raises(ConfigError, match=r"Data.max_len=65 .*Model.max_position=64"):
        trainer_mod.Trainer(load_config(data=base))
    seq2seq = load_config(os.path.join(REPO, "configs/g2p/transformer.yaml"),
                          ["Data.max_source_len=65", "Model.max_position=64"])
    with pytest.raises(ConfigError, match=r"Data.max_source_len=65"):
        get_task("seq2seq").check_lengths(seq2seq)
    get_task("seq2seq").check_lengths(load_config(os.path.join(REPO, "configs/g2p/transformer.yaml")))
