"""A run directory (``Global.output_dir``) has one owner and tells one run's story.

A training run holds ``.ppvarlen.lock`` (``fcntl.flock``, its pid written inside) for its whole
life: a second run on the directory is refused at once, naming the holder, or waits for it
(``Global.wait_for_output_dir``).  A directory holding another run's files (``RUN_ENTRIES``,
``ckpt-N``) is refused unless this run continues it (``Train.resume``: the recorded config must
agree on the keys that define a run) or replaces it (``Global.overwrite_output_dir``: the old
files are moved out of the way first, ``config.yaml`` last, so a crash half-way still leaves a
directory that names its run).  Files that are no run's (a README, a data folder) are left
alone.  A dead run's temp files (``.tmp-*``, ``.old-*``) are removed when the next run claims
the directory.
"""
import contextlib
import fcntl
import os
import shutil
import socket
import tempfile
import time

import yaml

from ..config import ConfigError, _absolute_paths
from ..utils.io import HOST_TAG, owned_prefix, owner_of, pid_alive, reap_dead_owners
from ..utils.log import get_logger
from .checkpoint import CKPT_RE, list_checkpoints
from .logbook import flatten

log = get_logger("engine")

LOCK_FILE = ".ppvarlen.lock"
# what a training run writes into its output_dir (the trainer, a task's write_artifacts, the
# PaddleNLP copy of the best weights); config.yaml is the run's identity
RUN_ENTRIES = ("config.yaml", "metrics.json", "train_log.jsonl", "curves.png", "best", "last",
               "visualdl", "paddlenlp", "encoder.safetensors", "vocab.txt", "encoder.json")
# sections whose every key defines what a run learns, but for these (how fast it reads data,
# where caches go): resuming with another value is the same run
DEFINING_SECTIONS = ("Model", "Data", "Optimizer", "Pretrain")
NOT_DEFINING = {"Data.num_workers", "Data.num_proc", "Data.cache_dir", "Data.rebuild_cache",
                "Data.eval_max_tokens", "Data.max_line_bytes", "Data.max_decompressed_ratio",
                "Data.verify_store"}
DEFINING_KEYS = {"Global.seed", "Train.task", "Train.epochs", "Train.max_steps",
                 "Train.label_smoothing", "Train.loss_weighting", "Train.amp.enable",
                 "Train.amp.level", "Train.amp.dtype"}
POLL_S = 0.2


def run_entries(output_dir):
    """The names in ``output_dir`` that a training run wrote, sorted."""
    try:
        names = os.listdir(output_dir)
    except FileNotFoundError:
        return []
    return sorted(n for n in names if n in RUN_ENTRIES or CKPT_RE.match(n))


class OutputDirLock:
    """An exclusive ``flock`` on ``output_dir/.ppvarlen.lock`` with the holder's pid and host in
    it; ``release`` (or this process's exit, however it ends) lets the next run in."""

    def __init__(self, output_dir, wait_s=0.0):
        os.makedirs(output_dir, exist_ok=True)
        self.path = os.path.join(output_dir, LOCK_FILE)
        self.file = open(self.path, "a+")  # closed with the object: a dropped Trainer frees it
        deadline = time.monotonic() + max(0.0, wait_s)
        waited = False
        while True:
            try:
                fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = self.holder()
                    self.file.close()
                    raise ConfigError(
                        f"Global.output_dir {output_dir} is in use by another training run "
                        f"({holder}, holding {self.path}); wait for it to end, train into another "
                        f"directory with -o Global.output_dir=DIR, or queue behind it with -o "
                        f"Global.wait_for_output_dir=SECONDS") from None
                if not waited:
                    log.warning("Global.output_dir %s is in use by another run (%s); waiting up "
                                "to %.0f s for it to end", output_dir, self.holder(), wait_s)
                    waited = True
                time.sleep(POLL_S)
        self.file.seek(0)
        self.file.truncate()
        self.file.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
        self.file.flush()

    def holder(self):
        """'pid N on HOST' as the holder wrote it (it writes right after it locks)."""
        for _ in range(10):
            with open(self.path, encoding="utf-8", errors="replace") as f:
                text = f.read().strip()
            if text:
                return text
            time.sleep(0.05)
        return "pid unknown: its lock file is empty"

    def release(self):
        if not self.file.closed:
            self.file.seek(0)
            self.file.truncate()  # still ours: no one else can hold it yet
            self.file.close()  # closing drops the flock


def claim_output_dir(cfg):
    """Lock ``Global.output_dir`` for this run, clear a dead run's debris and check that the
    directory is this run's to write (module docstring) -> the held ``OutputDirLock``.

    Refusals are ``ConfigError``s naming the directory and the ``-o`` to pass.  Nothing is
    removed here: ``start_run`` does it when the run is about to write."""
    out = cfg.Global.output_dir
    lock = OutputDirLock(out, cfg.Global.wait_for_output_dir)
    try:
        restore_interrupted_swap(out, "best")
        for path in reap_dead_owners(out):
            log.info("removed %s (left by a dead process)", path)
        entries = run_entries(out)
        if cfg.Train.resume and cfg.Global.overwrite_output_dir:
            raise ConfigError(f"Train.resume={cfg.Train.resume} continues the run in {out} and "
                              f"Global.overwrite_output_dir=true removes it; pass only one")
        if cfg.Train.resume:
            check_same_run(cfg, out, entries)
        elif entries and not cfg.Global.overwrite_output_dir:
            raise ConfigError(
                f"Global.output_dir {out} holds another training run ({', '.join(entries[:6])}"
                f"{', ...' if len(entries) > 6 else ''}); continue it with -o Train.resume=auto, "
                f"replace it with -o Global.overwrite_output_dir=true, or train into another "
                f"directory with -o Global.output_dir=DIR")
    except BaseException:
        lock.release()
        raise
    return lock


def start_run(cfg):
    """Rank 0, right before the run writes: with ``Global.overwrite_output_dir`` the old run's
    files are moved into one owned ``.old-run.*`` directory (config.yaml last), then removed."""
    out = cfg.Global.output_dir
    entries = run_entries(out)
    if not (cfg.Global.overwrite_output_dir and entries):
        return
    trash = tempfile.mkdtemp(prefix=owned_prefix(".old-run"), dir=out)
    for name in sorted(entries, key=lambda n: n == "config.yaml"):
        os.replace(os.path.join(out, name), os.path.join(trash, name))
    shutil.rmtree(trash, ignore_errors=True)
    log.warning("Global.overwrite_output_dir: removed the previous run in %s (%s)", out,
                ", ".join(entries))


def recorded_config(output_dir):
    """(path, raw dict) of the config a run recorded in ``output_dir``: its config.yaml, else
    its newest checkpoint's; None when there is none."""
    candidates = [os.path.join(output_dir, "config.yaml")] + \
        [os.path.join(p, "config.yaml") for _, p in reversed(list_checkpoints(output_dir))]
    for path in candidates:
        if os.path.isfile(path):
            return path, read_recorded(path)
    return None


def read_recorded(path):
    """A run's recorded config.yaml as a dict; a damaged one is a ConfigError naming it."""
    try:
        with open(path, encoding="utf-8") as f:
            recorded = yaml.safe_load(f)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise ConfigError(f"{path}: the recorded config of the run cannot be read ({e}); "
                          f"restore it, or start anew with -o Global.overwrite_output_dir=true"
                          ) from None
    if not isinstance(recorded, dict):
        raise ConfigError(f"{path}: the recorded config of the run is not a mapping of sections; "
                          f"restore it, or start anew with -o Global.overwrite_output_dir=true")
    return recorded


def defines_run(key):
    return key in DEFINING_KEYS or (key.split(".", 1)[0] in DEFINING_SECTIONS
                                    and key not in NOT_DEFINING)


def differing_keys(recorded, current):
    """[(key, recorded value, current value)] of the run-defining keys that differ; a key one
    side lacks (a config written by another ppvarlen version) is not compared."""
    old, new = flatten(recorded, "."), flatten(current, ".")
    return [(k, old[k], new[k]) for k in sorted(set(old) & set(new))
            if defines_run(k) and old[k] != new[k]]


def check_same_run(cfg, output_dir, entries):
    """``Train.resume`` continues the run recorded in ``output_dir`` (and in the checkpoint a
    PATH names): refuse when a key that defines the run differs, naming each."""
    current = _absolute_paths(cfg.to_dict())
    sources = [recorded_config(output_dir)] if entries else []
    resume = cfg.Train.resume
    if resume != "auto" and os.path.isfile(os.path.join(resume, "config.yaml")):
        sources.append((os.path.join(resume, "config.yaml"),
                        read_recorded(os.path.join(resume, "config.yaml"))))
    for path, recorded in filter(None, sources):
        diff = differing_keys(recorded, current)
        if diff:
            shown = "; ".join(f"{k}: recorded {a!r}, now {b!r}" for k, a, b in diff[:8])
            more = f"; and {len(diff) - 8} more" if len(diff) > 8 else ""
            raise ConfigError(
                f"Train.resume={resume}: the run recorded in {path} differs in keys that define "
                f"a run ({shown}{more}); resume with the recorded values, start over with -o "
                f"Global.overwrite_output_dir=true, or train into another directory with -o "
                f"Global.output_dir=DIR")


def restore_interrupted_swap(output_dir, name):
    """A process killed between the two renames of ``atomic_dir`` left ``name`` missing and the
    previous complete one as ``.old-<name>.*``: put that back before the debris is reaped."""
    path = os.path.join(output_dir, name)
    if os.path.lexists(path):
        return
    with contextlib.suppress(FileNotFoundError):
        for entry in sorted(os.listdir(output_dir)):
            owner = owner_of(entry)
            if (entry.startswith(f".old-{name}.") and owner and owner[1] == HOST_TAG
                    and not pid_alive(owner[0])):
                os.replace(os.path.join(output_dir, entry), path)
                log.warning("restored %s from %s (its writer died while replacing it)", path,
                            entry)
                return
