"""Checkpoint directories (layout in docs/DESIGN.md): write atomically, rotate, resume, load.

Nothing here unpickles: weights and optimizer moments are safetensors, the rest
is JSON/YAML/text.  Optimizer tensors are keyed by the model's *structured*
parameter names (``encoder.layers.0.linear1.weight/moment1_0``), not by
Paddle's process-global tensor names, so a checkpoint loads into a model built
in any process.
"""
import contextlib
import json
import os
import random
import re
import shutil
import uuid

import numpy as np
import paddle
from safetensors.numpy import load_file, save_file

from ..config import ConfigError, load_config, save_config
from ..data.vocab import TextEncoder
from ..models import build_model
from ..models.weights import load_weights, save_weights
from ..tasks import get_task
from ..utils.io import DiskFullError, atomic_dir, atomic_write_json, is_disk_full, owned_prefix

CKPT_RE = re.compile(r"^ckpt-(\d+)$")


# ---------------------------------------------------------------- RNG state (JSON-able)

def rng_state():
    np_state = np.random.get_state()
    py_state = random.getstate()
    return {
        "paddle": [list(s.__getstate__()) for s in paddle.get_rng_state()],
        "numpy": [np_state[0], np_state[1].tolist(), *[float(x) if isinstance(x, float) else int(x)
                                                      for x in np_state[2:]]],
        "python": [py_state[0], list(py_state[1]), py_state[2]],
    }


def set_rng_state(state):
    gens = []
    for s in state["paddle"]:
        g = paddle.base.core.GeneratorState.__new__(paddle.base.core.GeneratorState)
        g.__setstate__(tuple(s))
        gens.append(g)
    paddle.set_rng_state(gens)
    n = state["numpy"]
    np.random.set_state((n[0], np.asarray(n[1], dtype=np.uint32), n[2], n[3], n[4]))
    p = state["python"]
    random.setstate((p[0], tuple(p[1]), p[2]))


# ---------------------------------------------------------------- optimizer state

def _structured_names(model):
    return {p.name: n for n, p in model.named_parameters()}


def optimizer_arrays(optimizer, model):
    names = _structured_names(model)
    out = {}
    for acc, per_param in optimizer._accumulators.items():
        for pname, t in per_param.items():
            out[f"{names[pname]}/{acc}"] = t.numpy()
    for pname, t in getattr(optimizer, "_master_weights", {}).items():
        out[f"{names[pname]}/master_weight"] = t.numpy()
    return out


def load_optimizer_arrays(optimizer, model, arrays, source):
    """Create the accumulators now (Paddle makes them lazily at the first step) and fill them."""
    names = _structured_names(model)
    params = [p for p in model.parameters() if not p.stop_gradient]
    block = paddle.static.default_main_program().global_block()
    optimizer._create_accumulators(block, params)
    targets = {f"{names[pn]}/{acc}": t for acc, per in optimizer._accumulators.items()
               for pn, t in per.items()}
    targets.update({f"{names[pn]}/master_weight": t
                    for pn, t in getattr(optimizer, "_master_weights", {}).items()})
    missing = sorted(set(targets) - set(arrays))
    unexpected = sorted(set(arrays) - set(targets))
    if missing or unexpected:
        raise ValueError(f"{source}: optimizer state does not match the model: missing "
                         f"{missing[:5]}{'...' if len(missing) > 5 else ''}, unexpected "
                         f"{unexpected[:5]}{'...' if len(unexpected) > 5 else ''}; was it written "
                         f"for a different Model/Optimizer config?")
    for key, t in targets.items():
        if tuple(t.shape) != arrays[key].shape:
            raise ValueError(f"{source}: optimizer tensor {key} has shape {arrays[key].shape}, "
                             f"model needs {tuple(t.shape)}")
        t.set_value(arrays[key])


# ---------------------------------------------------------------- write / rotate

def save_checkpoint(path, model, optimizer, scheduler, encoder, cfg, meta, trainer_state):
    """Write one complete checkpoint directory atomically (old one kept until the new is whole,
    every file fsynced before the swap).  A full disk -> ``DiskFullError`` naming ``path`` and
    the bytes the tensors need; the partial directory is removed, an old ``path`` stays."""
    arrays = optimizer_arrays(optimizer, model)
    needed = sum(a.nbytes for a in arrays.values()) + sum(
        int(np.prod(p.shape)) * p.element_size() for p in model.parameters())
    with _disk_full_names(path, needed), atomic_dir(path) as tmp:
        save_weights(model, os.path.join(tmp, "model.safetensors"))
        save_file(arrays, os.path.join(tmp, "optimizer.safetensors"))
        encoder.save(tmp)
        save_config(cfg, os.path.join(tmp, "config.yaml"))
        atomic_write_json(os.path.join(tmp, "meta.json"), meta)
        state = dict(trainer_state, scheduler=scheduler.state_dict(), rng=rng_state())
        atomic_write_json(os.path.join(tmp, "trainer_state.json"), state)
        fsync_tree(tmp)
    fsync_tree(os.path.dirname(os.path.abspath(path)), files=False)
    return path


def copy_checkpoint(src, dst):
    """``src`` copied to ``dst`` as atomically as ``save_checkpoint`` writes."""
    with _disk_full_names(dst, _tree_bytes(src)), atomic_dir(dst) as tmp:
        shutil.copytree(src, tmp, dirs_exist_ok=True)
        fsync_tree(tmp)
    fsync_tree(os.path.dirname(os.path.abspath(dst)), files=False)
    return dst


@contextlib.contextmanager
def _disk_full_names(path, needed):
    """A full disk met anywhere in a checkpoint's write names the checkpoint directory, not the
    file inside its temp directory that hit it (which is gone by then)."""
    try:
        yield
    except OSError as e:
        if not is_disk_full(e):
            raise
        raise DiskFullError(path, needed, "writing a checkpoint") from None


def _tree_bytes(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def fsync_tree(path, files=True):
    """fsync ``path``'s files (with ``files``) and the directory itself, so a rename that
    publishes it is not seen before its contents after a power loss."""
    if files:
        for d, _, names in os.walk(path):
            for name in names:
                fd = os.open(os.path.join(d, name), os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_best(output_dir):
    """(step, dev metrics) that ``output_dir/best`` holds (its meta.json, written inside the
    same atomic directory as its weights), or None when there is no best/."""
    meta_file = os.path.join(output_dir, "best", "meta.json")
    if not os.path.isfile(meta_file):
        return None
    with open(meta_file, encoding="utf-8") as f:
        meta = json.load(f)
    return meta["step"], meta["metrics"].get("dev", {})


def list_checkpoints(output_dir):
    """``[(step, path)]`` of ``ckpt-N`` dirs, oldest first."""
    if not os.path.isdir(output_dir):
        return []
    found = [(int(m.group(1)), os.path.join(output_dir, d))
             for d in os.listdir(output_dir) if (m := CKPT_RE.match(d))]
    return sorted(found)


def point_last(output_dir, ckpt_path):
    """``output_dir/last`` -> newest checkpoint (a relative symlink, swapped atomically)."""
    link = os.path.join(output_dir, "last")
    tmp = os.path.join(output_dir, owned_prefix(".tmp-last") + uuid.uuid4().hex[:8])
    os.symlink(os.path.basename(ckpt_path), tmp)
    os.replace(tmp, link)


def rotate(output_dir, keep_last, just_written):
    """Keep the newest ``keep_last`` checkpoints, ``just_written`` always among them (a resume
    from an older checkpoint writes below numbers still on disk)."""
    keep = {os.path.abspath(just_written)}
    others = [path for _, path in list_checkpoints(output_dir)
              if os.path.abspath(path) not in keep]
    for path in others[:max(0, len(others) - (max(1, keep_last) - 1))]:
        shutil.rmtree(path, ignore_errors=True)


def resolve_resume(resume, output_dir):
    """``Train.resume`` -> checkpoint dir to continue from, or None to start fresh."""
    if not resume:
        return None
    if resume == "auto":
        last = os.path.join(output_dir, "last")
        if os.path.isfile(os.path.join(last, "trainer_state.json")):
            return os.path.realpath(last)
        ckpts = list_checkpoints(output_dir)
        return ckpts[-1][1] if ckpts else None
    if not os.path.isfile(os.path.join(resume, "trainer_state.json")):
        raise ConfigError(f"Train.resume: {resume!r} is not a checkpoint directory (no "
                          f"trainer_state.json); use auto or a path like {output_dir}/ckpt-100")
    return resume


def load_training_state(ckpt_dir, model, optimizer, scheduler):
    """Restore weights, optimizer, scheduler and RNG; return trainer_state (step, epoch, ...)."""
    load_weights(model, os.path.join(ckpt_dir, "model.safetensors"))
    opt_file = os.path.join(ckpt_dir, "optimizer.safetensors")
    load_optimizer_arrays(optimizer, model, load_file(opt_file), opt_file)
    with open(os.path.join(ckpt_dir, "trainer_state.json"), encoding="utf-8") as f:
        state = json.load(f)
    scheduler.set_state_dict(state["scheduler"])
    set_rng_state(state["rng"])
    return state


# ---------------------------------------------------------------- inference

def load_for_inference(ckpt_dir):
    """-> (model in eval mode, meta dict, encoder, cfg) from a checkpoint directory."""
    meta_file = os.path.join(ckpt_dir, "meta.json")
    if not os.path.isfile(meta_file):
        raise ConfigError(f"{ckpt_dir}: not a checkpoint directory (no meta.json); pass e.g. "
                         f"output/run/best")
    with open(meta_file, encoding="utf-8") as f:
        meta = json.load(f)
    cfg = load_config(os.path.join(ckpt_dir, "config.yaml"))
    encoder = TextEncoder.load(ckpt_dir)
    model = build_model(cfg.Model, encoder.vocab_size, meta["num_labels"], encoder.pad_id, meta["task"],
                        init_weights=False)  # the checkpoint holds every weight
    get_task(meta["task"]).configure_model(model, cfg, encoder)
    load_weights(model, os.path.join(ckpt_dir, "model.safetensors"))
    model.eval()
    return model, meta, encoder, cfg
