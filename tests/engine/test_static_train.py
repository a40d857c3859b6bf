"""Train.to_static: the static forward + loss gives eager's losses, traces once, resumes exactly.

Each shipped config family runs with tiny -o overrides (few examples, small models) so a
Trainer builds in seconds; the same batches go through an eager and a static Trainer.
"""
import json
import os

import numpy as np
import paddle
import pytest
from safetensors.numpy import load_file

from interrupt_helper import interrupt_during_step
from ppvarlen.config import ConfigError, load_config
from ppvarlen.config_schema import MODEL_KEYS
from ppvarlen.engine import trainer as trainer_mod

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NO_DROPOUT = ["Model.dropout=0.0", "Model.ngram_dropout=0.0", "Model.wide_dropout=0.0",
              "Model.token_dropout=0.0"]
TINY_TRANSFORMER = ["Model.hidden_size=16", "Model.num_heads=2", "Model.ffn_size=32"]
TINY_ERNIE = ("Model.ernie_config={hidden_size: 16, num_hidden_layers: 1, num_attention_heads: 2, "
              "intermediate_size: 32, max_position_embeddings: 256, hidden_dropout_prob: 0.0, "
              "attention_probs_dropout_prob: 0.0}")
# config file -> tiny overrides; one entry per shipped model family / loss path
FAMILIES = {
    "transformer_cls": ("configs/sentiment/transformer.yaml", TINY_TRANSFORMER),
    "transformer_ngram_smoothing": ("configs/sentiment/transformer_ngram.yaml",
                                    TINY_TRANSFORMER + ["Model.ngram_buckets=500"]),
    "wide_deep": ("configs/sentiment/wide_deep.yaml",
                  TINY_TRANSFORMER + ["Model.wide_buckets=1024"]),
    "rnn_cls": ("configs/sentiment/bilstm.yaml",
                ["Model.emb_size=16", "Model.hidden_size=16", "Model.ngram_buckets=500"]),
    "ernie_cls": ("configs/sentiment/ernie_tiny.yaml", [TINY_ERNIE]),
    "bigru_crf": ("configs/ner/bigru_crf.yaml", ["Model.emb_size=16", "Model.hidden_size=16"]),
    "ernie_tagger": ("configs/ner/bigru_crf.yaml", ["Model.name=ernie_tagger", TINY_ERNIE,
                                                    "Model.max_position=256"]),
    "seq2seq": ("configs/g2p/transformer.yaml", TINY_TRANSFORMER + ["Data.max_tokens=512"]),
}


def _own_model_keys(config, overrides):
    """``overrides`` without Model keys the config's model does not read (per-model keys)."""
    name = next((o.split("=", 1)[1] for o in overrides if o.startswith("Model.name=")), None)
    name = name or load_config(os.path.join(REPO, config)).Model.name
    return [o for o in overrides if not o.startswith("Model.")
            or o.split("=", 1)[0][len("Model."):] in ("name", *MODEL_KEYS[name])]


def trainer(config, out, extra, to_static):
    cfg = load_config(os.path.join(REPO, config), _own_model_keys(config, [
        "Data.limit=48", "Data.max_tokens=1024", "Train.progress_bar=false", "Train.max_steps=40",
        f"Global.output_dir={out}", f"Train.to_static={str(to_static).lower()}"] + extra))
    return trainer_mod.Trainer(cfg)


def batches(t, n):
    t.sampler.set_epoch(0)
    return [t.collate([t.data.train[i] for i in idxs]) for idxs in list(t.sampler)[:n]]


def step_losses(t, batch_list):
    t.ddp_model.train()
    return [t.train_step(b) for b in batch_list]


# Paddle 3.3.1 cannot differentiate the CRF's forward-algorithm loop over a dynamic length
# (ppvarlen/models/crf.py log_partition) inside a program: the run must refuse at start
CANNOT_CONVERT = {"bigru_crf": "should exist"}


@pytest.mark.parametrize("family", sorted(set(FAMILIES) - set(CANNOT_CONVERT)))
def test_losses_match_eager_with_dropout_off(family, tmp_path):
    config, extra = FAMILIES[family]
    eager = trainer(config, tmp_path / "eager", extra + NO_DROPOUT, False)
    static = trainer(config, tmp_path / "static", extra + NO_DROPOUT, True)
    assert eager.static_loss is None and static.static_loss is not None
    data = batches(eager, 5)
    assert len({b[next(iter(b))].shape for b in data}) > 1  # several shapes, one program
    a, b = step_losses(eager, data), step_losses(static, data)
    np.testing.assert_allclose(b, a, rtol=2e-5, atol=2e-6)
    assert static.static_loss.traced_count() == 1
    for (name, p), q in zip(eager.model.named_parameters(), static.model.parameters()):
        np.testing.assert_allclose(q.numpy(), p.numpy(), rtol=1e-4, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("family", sorted(CANNOT_CONVERT))
def test_family_that_cannot_convert_fails_at_start(family, tmp_path):
    config, extra = FAMILIES[family]
    with pytest.raises(ConfigError, match=f"Model.name={family} cannot run as one static program"
                                          f".*{CANNOT_CONVERT[family]}.*Train.to_static: false"):
        trainer(config, tmp_path, extra + NO_DROPOUT, True)


def test_traced_once_across_many_shapes(tmp_path):
    t = trainer("configs/sentiment/transformer.yaml", tmp_path, TINY_TRANSFORMER +
                ["Data.limit=200", "Data.max_tokens=512", "Data.pool_size=2"], True)
    data = batches(t, 30)
    shapes = {b["input_ids"].shape for b in data}
    assert len(shapes) >= 10 and len({s[0] for s in shapes}) >= 5  # batch AND length vary
    step_losses(t, data)
    assert t.static_loss.traced_count() == 1


def test_retrace_is_an_error(tmp_path):
    t = trainer("configs/sentiment/transformer.yaml", tmp_path, TINY_TRANSFORMER, True)
    batch = batches(t, 1)[0]
    t.static_loss.eval()  # another mode = another program: the trace-once check must notice
    with pytest.raises(RuntimeError, match="traced 2 times"):
        t.train_step(batch)


def tiny_cfg(out, dropout=0.3, clip_norm=0.05, **train):
    return load_config(data={
        "Global": {"output_dir": str(out), "seed": 7},
        "Data": {"corpus": "sentiment", "limit": 96, "max_len": 64, "max_tokens": 512},
        "Model": {"name": "transformer_cls", "hidden_size": 16, "num_layers": 1, "num_heads": 2,
                  "ffn_size": 32, "dropout": dropout, "max_position": 64},
        "Optimizer": {"lr": 3e-3, "warmup_steps": 2, "clip_norm": clip_norm},
        "Train": dict({"max_steps": 8, "log_every": 1, "eval_every": 4, "keep_last": 2,
                       "progress_bar": False, "to_static": True}, **train)})


def logged_losses(out):
    with open(os.path.join(out, "train_log.jsonl")) as f:
        return [(r["step"], r["loss"]) for r in map(json.loads, f) if "loss" in r]


def test_exact_resume_with_dropout_after_sigint(tmp_path, monkeypatch):
    full = tmp_path / "full"
    trainer_mod.train(tiny_cfg(full))
    no_dropout = tmp_path / "no_dropout"
    trainer_mod.train(tiny_cfg(no_dropout, dropout=0.0, max_steps=3, eval_every=0))
    # dropout really acts inside the program (the per-step paddle.seed drives it) and draws
    # the masks eager draws: the program's dropout ops use the same generator in the same order
    assert logged_losses(no_dropout)[1:] != logged_losses(full)[1:3]
    eager = tmp_path / "eager"
    trainer_mod.train(tiny_cfg(eager, to_static=False))
    np.testing.assert_allclose([l for _, l in logged_losses(full)],
                               [l for _, l in logged_losses(eager)], rtol=1e-5)
    original = interrupt_during_step(monkeypatch, trainer_mod, 5)
    part = tmp_path / "part"
    assert trainer_mod.train(tiny_cfg(part)) == {"interrupted": True, "step": 5}
    monkeypatch.setattr(trainer_mod.Trainer, "train_step", original)
    trainer_mod.train(tiny_cfg(part, resume="auto"))
    assert logged_losses(part) == logged_losses(full)  # exact, steps 1..8
    a = load_file(os.path.join(full, "ckpt-8", "model.safetensors"))
    b = load_file(os.path.join(part, "ckpt-8", "model.safetensors"))
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    # the checkpoint holds the plain model (no wrapper names): it exports as before
    from ppvarlen.export.exporter import export_checkpoint

    manifest = export_checkpoint(os.path.join(full, "best"), str(tmp_path / "export"),
                                 formats=["paddle"], precisions=["fp32"], verify=True)
    assert os.path.isfile(tmp_path / "export" / "manifest.json") and manifest


def test_clipping_and_amp_setting_keep_working(tmp_path, capfd):
    # clip_norm 0.05 clips every step here: static and eager weights agree, and differ from
    # unclipped ones; Train.amp on CPU warns and trains fp32 as in eager mode
    runs = {}
    for name, static, clip, amp in (("eager", False, 0.05, False), ("static", True, 0.05, True),
                                    ("unclipped", True, 0.0, False)):
        cfg = tiny_cfg(tmp_path / name, dropout=0.0, clip_norm=clip, max_steps=4, eval_every=0,
                       to_static=static, amp={"enable": amp})
        runs[name] = trainer_mod.train(cfg)
        runs[name]["weights"] = load_file(os.path.join(tmp_path / name, "ckpt-4",
                                                       "model.safetensors"))
    assert "training in float32" in capfd.readouterr().err
    assert runs["static"]["amp"] == "off (float32)"
    w = {k: r["weights"] for k, r in runs.items()}
    for k in w["eager"]:
        np.testing.assert_allclose(w["static"][k], w["eager"][k], rtol=1e-4, atol=1e-5, err_msg=k)
    assert any(not np.allclose(w["unclipped"][k], w["static"][k], atol=1e-4) for k in w["eager"])


class _Unconvertible(paddle.nn.Layer):
    """A model that reads a tensor's value on the host mid-forward: cannot be one program."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, seq_len, labels=None):
        longest = max(seq_len.tolist())  # a host round trip: no values exist while tracing
        return self.model(input_ids[:, :longest], seq_len, labels=labels)


def test_unconvertible_model_fails_at_start_with_the_reason(tmp_path, monkeypatch):
    real_build = trainer_mod.build_model  # patched where the trainer looks it up
    monkeypatch.setattr(trainer_mod, "build_model",
                        lambda *a, **k: _Unconvertible(real_build(*a, **k)))
    with pytest.raises(ConfigError) as err:
        trainer("configs/sentiment/transformer.yaml", tmp_path, TINY_TRANSFORMER, True)
    msg = str(err.value)
    assert "Train.to_static" in msg and "Model.name=transformer_cls" in msg
    assert "tolist" in msg and "test_static_train.py" in msg  # the reason and the line
    assert "Train.to_static: false" in msg and len(msg) < 1200


DP_DRIVER = '''
import os, sys
from ppvarlen.config import load_config
from ppvarlen.engine import trainer
from ppvarlen.models.weights import save_weights

out, to_static = sys.argv[1], sys.argv[2] == "static"
cfg = load_config(data={
    "Global": {"output_dir": out, "seed": 5},
    "Data": {"corpus": "sentiment", "limit": 64, "max_len": 48, "max_tokens": 384},
    "Model": {"name": "transformer_cls", "hidden_size": 16, "num_layers": 1, "num_heads": 2,
              "ffn_size": 32, "max_position": 48, "dropout": 0.0},
    "Train": {"max_steps": 4, "log_every": 1, "eval_every": 0, "progress_bar": False,
              "to_static": to_static}})
t = trainer.Trainer(cfg)
t.fit()
assert to_static == (t.static_loss is not None)
if to_static:
    assert t.static_loss.traced_count() == 1
save_weights(t.model, os.path.join(out, "final.rank%s.safetensors" % os.environ["PADDLE_TRAINER_ID"]))
'''


def test_two_process_data_parallel(tmp_path):
    import subprocess
    import sys

    driver = tmp_path / "driver.py"
    driver.write_text(DP_DRIVER)
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    weights = {}
    for mode in ("eager", "static"):
        out, logs = tmp_path / mode, tmp_path / f"logs_{mode}"
        r = subprocess.run([sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node",
                            "2", "--log_dir", str(logs), str(driver), str(out), mode],
                           cwd=REPO, env=env, capture_output=True, text=True, timeout=400)
        assert r.returncode == 0, "".join(open(logs / f).read()[-3000:] for f in os.listdir(logs))
        weights[mode] = [load_file(out / f"final.rank{k}.safetensors") for k in (0, 1)]
    static0, static1 = weights["static"]
    for k in static0:  # gradients were all-reduced through the static program: ranks agree
        np.testing.assert_array_equal(static0[k], static1[k], err_msg=k)
        np.testing.assert_allclose(static0[k], weights["eager"][0][k], rtol=1e-4, atol=1e-5,
                                   err_msg=k)


def test_executor_flags_hold_only_while_each_trainer_steps(tmp_path):
    """Paddle's executor flags (Train.static_executor) are process-wide and a program built with
    serial_run cannot run without it: each trainer sets its own around its steps, so a serial and
    a threaded trainer can step in turn, and the process keeps its flags between steps."""
    names = ["FLAGS_new_executor_serial_run", "FLAGS_new_executor_use_inplace"]
    before = paddle.get_flags(names)
    config, extra = FAMILIES["transformer_cls"]
    serial = trainer(config, tmp_path / "serial", extra + ["Train.static_executor=serial"], True)
    threaded = trainer(config, tmp_path / "threaded", extra + ["Train.static_executor=threaded"], True)
    assert paddle.get_flags(names) == before
    data = batches(serial, 4)
    for batch in data:
        for t in (serial, threaded, serial):
            assert np.isfinite(t.train_step(batch))
            assert paddle.get_flags(names) == before
    assert serial.static_loss.traced_count() == threaded.static_loss.traced_count() == 1
