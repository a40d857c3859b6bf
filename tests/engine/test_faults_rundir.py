"""A run directory has one owner and one story (issue #46): faults injected into tiny runs.

Two live runs on one Global.output_dir (real processes), a fresh run in an old run's directory,
overwrite, resume with a changed key, a best/ save that fails or is killed (kill -9) and then
resumed, rotation after a resume from an older checkpoint, a full disk (injected, and once a
real tmpfs), and a dead writer's temp files.
"""
import contextlib
import errno
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import pytest
import yaml
from safetensors.numpy import load_file

from ppvarlen.cli import main_train
from ppvarlen.engine import checkpoint as ckpt
from ppvarlen.engine import evaluate_checkpoint
from ppvarlen.engine import trainer as trainer_mod
from ppvarlen.config import ConfigError, load_config

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HANG_GUARD_S = 120


def tiny(out, lr=1e-2, seed=7, **train):
    """A 12-step run evaluated every 4 steps; with lr 1e-2 and seed 7 dev improves at step 8,
    so best/ is written twice (steps 4 and 8): the second write is the one the faults hit."""
    return {
        "Global": {"output_dir": str(out), "seed": seed, "log_level": "WARNING"},
        "Data": {"corpus": "sentiment", "limit": 96, "max_len": 64, "max_tokens": 512},
        "Model": {"name": "transformer_cls", "hidden_size": 16, "num_layers": 1, "num_heads": 2,
                  "ffn_size": 32, "dropout": 0.3, "max_position": 64},
        "Optimizer": {"lr": lr, "warmup_steps": 2},
        "Train": dict({"max_steps": 12, "log_every": 1, "eval_every": 4, "keep_last": 2,
                       "progress_bar": False}, **train),
    }


def train(out, **kw):
    return trainer_mod.train(load_config(data=tiny(out, **kw)))


def config_file(tmp_path, out, name="run.yaml", **kw):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(tiny(out, **kw)))
    return str(path)


def cli(capsys, argv):
    """ppvarlen-train in this process -> (exit code, stderr)."""
    capsys.readouterr()
    code = main_train(argv)
    return code, capsys.readouterr().err


def logged_steps(out):
    with open(os.path.join(out, "train_log.jsonl")) as f:
        return [r["step"] for r in map(json.loads, f) if "loss" in r]


def best_step(out):
    return json.load(open(os.path.join(out, "best", "meta.json")))["step"]


def debris(out):
    return sorted(n for n in os.listdir(out) if n.startswith((".tmp-", ".old-")))


def assert_metrics_describe_best(out):
    """metrics.json's best step and dev numbers are best/'s, and its test numbers are those of
    best/'s weights evaluated again."""
    metrics = json.load(open(os.path.join(out, "metrics.json")))
    meta = json.load(open(os.path.join(out, "best", "meta.json")))
    assert metrics["best_step"] == meta["step"]
    assert metrics["dev"] == meta["metrics"]["dev"]
    cfg = load_config(os.path.join(out, "config.yaml"))
    again = evaluate_checkpoint(cfg, os.path.join(out, "best"), "test")
    assert metrics["test"]["accuracy"] == pytest.approx(again["accuracy"])
    return metrics


# a child process: a training run that stops at a chosen point (HOLD) and says so (MARKER)
CHILD = r"""
import os, sys, time
from ppvarlen.cli import main_train
from ppvarlen.engine import checkpoint as ckpt, trainer
hold, marker = os.environ["HOLD"], os.environ["MARKER"]

def wait_here():
    open(marker, "w").close()
    deadline = time.time() + 120
    while not os.path.exists(marker + ".go") and time.time() < deadline:
        time.sleep(0.05)

if hold == "step":  # hold the directory while training, until the parent says go
    real_step = trainer.Trainer.train_step
    def train_step(self, batch):
        loss = real_step(self, batch)
        if self.state["step"] == 2:
            wait_here()
        return loss
    trainer.Trainer.train_step = train_step
else:  # stop for good inside the save of HOLD (best = its second save), after the weights
    real_save = ckpt.save_weights
    def save_weights(model, path, *args, **kwargs):
        real_save(model, path, *args, **kwargs)
        parent = os.path.dirname(path)
        if os.path.basename(parent).startswith(".tmp-" + hold + ".") and (
                hold != "best" or os.path.isdir(os.path.join(os.path.dirname(parent), "best"))):
            wait_here()
            time.sleep(600)
    ckpt.save_weights = save_weights
sys.exit(main_train(sys.argv[1:]))
"""


def start_child(tmp_path, hold, argv):
    marker = str(tmp_path / f"held-{hold}")
    env = dict(os.environ, PYTHONPATH=REPO, HOLD=hold, MARKER=marker)
    child = subprocess.Popen([sys.executable, "-c", CHILD, *argv], cwd=REPO, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + HANG_GUARD_S
    while not os.path.exists(marker):
        if child.poll() is not None or time.monotonic() > deadline:
            child.kill()
            pytest.fail(f"the child never reached {hold}: {child.communicate()[1][-3000:]}")
        time.sleep(0.05)
    return child, marker


def run_cli(argv, **kw):
    return subprocess.run([sys.executable, "tools/train.py", *argv], cwd=REPO, text=True,
                          capture_output=True, timeout=300, env=dict(os.environ, PYTHONPATH=REPO),
                          **kw)


def test_a_second_run_on_a_live_run_directory_is_refused_naming_its_pid_or_waits(tmp_path):
    out = tmp_path / "out"
    config = config_file(tmp_path, out, max_steps=8)
    first, marker = start_child(tmp_path, "step", ["-c", config])
    try:
        refused = run_cli(["-c", config, "-o", "Optimizer.lr=0.003"])
        assert refused.returncode == 2 and "Traceback" not in refused.stderr
        assert f"{out} is in use by another training run (pid {first.pid} on" in refused.stderr
        assert "Global.wait_for_output_dir" in refused.stderr
        # asked to wait, a run continuing the same run starts when the first one ends
        log = open(tmp_path / "waiter.err", "w")
        waiter = subprocess.Popen(
            [sys.executable, "tools/train.py", "-c", config, "-o", "Train.resume=auto",
             "-o", "Global.wait_for_output_dir=300", "-o", "Global.log_level=INFO"], cwd=REPO,
            env=dict(os.environ, PYTHONPATH=REPO), stdout=subprocess.PIPE, stderr=log, text=True)
        deadline = time.monotonic() + HANG_GUARD_S
        while "waiting up to 300 s" not in (tmp_path / "waiter.err").read_text():
            assert waiter.poll() is None and time.monotonic() < deadline, \
                (tmp_path / "waiter.err").read_text()[-3000:]
            time.sleep(0.1)
        open(marker + ".go", "w").close()
        assert first.wait(timeout=300) == 0, first.communicate()[1][-3000:]
        assert waiter.wait(timeout=300) == 0, (tmp_path / "waiter.err").read_text()[-3000:]
    finally:
        for p in (first, locals().get("waiter")):
            if p is not None and p.poll() is None:
                p.kill()
    assert "resumed from" in (tmp_path / "waiter.err").read_text()
    assert logged_steps(out) == list(range(1, 9))  # one story: no second run's lines in it
    assert_metrics_describe_best(str(out))


def test_a_fresh_run_in_another_runs_directory_is_refused_and_overwrite_replaces_it(tmp_path,
                                                                                 capsys):
    out = tmp_path / "out"
    train(out, lr=3e-3)  # the old run: ckpt-8, ckpt-12
    (out / "notes.txt").write_text("mine")
    new_run = config_file(tmp_path, out, lr=1e-2, seed=3, max_steps=8)
    code, err = cli(capsys, ["-c", new_run])
    assert code == 2 and "Traceback" not in err
    assert f"Global.output_dir {out} holds another training run" in err
    assert "-o Train.resume=auto" in err and "-o Global.overwrite_output_dir=true" in err
    assert len(err.strip().splitlines()) == 1
    assert load_config(str(out / "config.yaml")).Optimizer.lr == 3e-3  # untouched

    code, err = cli(capsys, ["-c", new_run, "-o", "Global.overwrite_output_dir=true"])
    assert code == 0, err
    assert sorted(os.listdir(out)) == [".ppvarlen.lock", "best", "ckpt-4", "ckpt-8", "config.yaml",
                                       "curves.png", "last", "metrics.json", "notes.txt",
                                       "train_log.jsonl"]
    for d in ("best", "ckpt-4", "ckpt-8", "."):
        cfg = load_config(str(out / d / "config.yaml"))
        assert (cfg.Optimizer.lr, cfg.Global.seed) == (1e-2, 3), d
    assert os.path.realpath(out / "last") == str(out / "ckpt-8")
    assert logged_steps(out) == list(range(1, 9))
    assert json.load(open(out / "metrics.json"))["steps"] == 8
    assert (out / "notes.txt").read_text() == "mine"


def test_resume_with_a_changed_run_key_names_it_and_a_changed_speed_key_is_the_same_run(
        tmp_path, capsys):
    out = tmp_path / "out"
    config = config_file(tmp_path, out, max_steps=4)
    assert cli(capsys, ["-c", config])[0] == 0
    code, err = cli(capsys, ["-c", config, "-o", "Train.resume=auto", "-o", "Optimizer.lr=0.02",
                             "-o", "Global.seed=8"])
    assert code == 2 and "Traceback" not in err
    assert f"the run recorded in {out}/config.yaml differs" in err
    assert "Global.seed: recorded 7, now 8" in err and "Optimizer.lr: recorded 0.01, now 0.02" in err
    code, err = cli(capsys, ["-c", config, "-o", "Train.resume=auto", "-o", "Train.max_steps=8",
                             "-o", "Data.num_workers=1", "-o", "Train.log_every=2"])
    assert code == 2 and "Train.max_steps: recorded 4, now 8" in err  # the schedule spans it
    assert "num_workers" not in err and "log_every" not in err
    code, err = cli(capsys, ["-c", config, "-o", "Train.resume=auto", "-o", "Data.num_workers=1",
                             "-o", "Train.log_every=2"])
    assert code == 0, err


def _fail_second_best_save(monkeypatch, out):
    """The weights of best/'s second save are written, then the disk is full."""
    real = ckpt.save_weights

    def save_weights(model, path, *args, **kwargs):
        real(model, path, *args, **kwargs)
        if os.path.basename(os.path.dirname(path)).startswith(".tmp-best.") and \
                os.path.isdir(os.path.join(out, "best")):
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ckpt, "save_weights", save_weights)


def test_a_failed_best_save_names_the_disk_full_keeps_best_and_resume_reports_what_best_holds(
        tmp_path, capsys, monkeypatch):
    whole = tmp_path / "whole"
    uninterrupted = train(whole)
    assert uninterrupted["best_step"] == 8  # the fault below hits a real second best/ save

    out = tmp_path / "out"
    config = config_file(tmp_path, out)
    _fail_second_best_save(monkeypatch, str(out))
    code, err = cli(capsys, ["-c", config])
    assert code == 2 and "Traceback" not in err
    assert f"{out}/best: no space left on the device while writing a checkpoint (" in err
    assert "bytes needed" in err
    assert best_step(out) == 4 and debris(out) == []  # the old best/ whole, nothing partial
    kept = load_file(str(out / "best" / "model.safetensors"))
    for name, value in load_file(str(whole / "ckpt-8" / "model.safetensors")).items():
        if not (kept[name] == value).all():
            break
    else:
        pytest.fail("best/ holds step 8's weights although its save failed")

    monkeypatch.undo()
    code, err = cli(capsys, ["-c", config, "-o", "Train.resume=auto"])
    assert code == 0, err
    metrics = assert_metrics_describe_best(str(out))
    assert metrics["best_step"] == 8
    assert metrics["test"] == uninterrupted["test"] and metrics["dev"] == uninterrupted["dev"]


@pytest.mark.parametrize("hold", ["best", "ckpt-8"])
def test_a_killed_save_leaves_debris_the_next_run_reaps_and_best_agrees(tmp_path, hold):
    out = tmp_path / "out"
    config = config_file(tmp_path, out)
    child, _ = start_child(tmp_path, hold, ["-c", config])
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=60)
    left = debris(out)
    assert len(left) == 1 and left[0].startswith(f".tmp-{hold}.pid{child.pid}.")
    if hold == "best":
        assert best_step(out) == 4 and os.path.realpath(out / "last") == str(out / "ckpt-8")
    train(out, resume="auto")
    assert debris(out) == []
    metrics = assert_metrics_describe_best(str(out))
    assert metrics["best_step"] == 8


def test_rotation_keeps_the_checkpoint_just_written(tmp_path, monkeypatch):
    out = tmp_path / "out"
    train(out, max_steps=8, keep_last=3)  # ckpt-4, ckpt-8
    from interrupt_helper import interrupt_during_step

    interrupt_during_step(monkeypatch, trainer_mod, 5)
    stopped = train(out, max_steps=8, keep_last=1, resume=str(out / "ckpt-4"))
    assert stopped == {"interrupted": True, "step": 5}
    assert [s for s, _ in ckpt.list_checkpoints(str(out))] == [5]
    assert os.path.realpath(out / "last") == str(out / "ckpt-5")


def test_a_real_full_disk_names_the_checkpoint_and_leaves_nothing_partial(tmp_path, capsys):
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount = tempfile.mkdtemp(dir=tmp_path)
    # room for one checkpoint of the tiny model (about 0.26 MB of tensors) but not two
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=480k", "tmpfs", mount],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"mount refused: {done.stderr.strip()}")
    try:
        out = os.path.join(mount, "out")
        code, err = cli(capsys, ["-c", config_file(tmp_path, out)])
        assert code == 2 and "Traceback" not in err
        assert f"{out}/" in err and "no space left on the device while writing a checkpoint" in err
        assert "bytes needed" in err and "bytes free" in err
        assert debris(out) == []
        for _, path in ckpt.list_checkpoints(out):
            assert os.path.isfile(os.path.join(path, "trainer_state.json")), path
    finally:
        with contextlib.suppress(Exception):
            subprocess.run(["umount", "-l", mount], check=False, capture_output=True)


def test_resume_and_overwrite_together_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="pass only one"):
        trainer_mod.Trainer(load_config(data=tiny(tmp_path, resume="auto") | {
            "Global": {"output_dir": str(tmp_path), "overwrite_output_dir": True}}))


@pytest.mark.parametrize("damage", ["Model: [unclosed\n", "- a list\n- of lines\n"])
def test_a_damaged_recorded_config_is_named_on_resume_not_a_traceback(damage, tmp_path, capsys):
    out = tmp_path / "out"
    train(out)
    (out / "config.yaml").write_text(damage)
    code, err = cli(capsys, ["-c", config_file(tmp_path, out), "-o", "Train.resume=auto"])
    assert code == 2 and "Traceback" not in err, err
    assert f"{out / 'config.yaml'}: the recorded config of the run" in err
    assert "-o Global.overwrite_output_dir=true" in err
