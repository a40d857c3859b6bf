"""Checkpoint directories (layout in docs/DESIGN.md): write atomically, rotate, resume, load.

Nothing here unpickles: weights and optimizer moments are safetensors, the rest
is JSON/YAML/text.  Optimizer tensors are keyed by the model's *structured*
parameter names (``encoder.layers.0.linear1.weight/moment1_0``), not by
Paddle's process-global tensor names, so a checkpoint loads into a model built
in any process.
"""
import json
import os
import random
import re
import shutil

import numpy as np
import paddle
from safetensors.numpy import load_file, save_file

from ..config import ConfigError, load_config, save_config
from ..data.vocab import TextEncoder
from ..models import build_model
from ..models.weights import load_weights, save_weights
from ..tasks import get_task
from ..utils.io import atomic_dir, atomic_write_json

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
    """Write one complete checkpoint directory atomically (old one kept until the new is whole)."""
    with atomic_dir(path) as tmp:
        save_weights(model, os.path.join(tmp, "model.safetensors"))
        save_file(optimizer_arrays(optimizer, model), os.path.join(tmp, "optimizer.safetensors"))
        encoder.save(tmp)
        save_config(cfg, os.path.join(tmp, "config.yaml"))
        atomic_write_json(os.path.join(tmp, "meta.json"), meta)
        state = dict(trainer_state, scheduler=scheduler.state_dict(), rng=rng_state())
        atomic_write_json(os.path.join(tmp, "trainer_state.json"), state)
    return path


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
    tmp = link + ".tmp"
    if os.path.lexists(tmp):
        os.remove(tmp)
    os.symlink(os.path.basename(ckpt_path), tmp)
    os.replace(tmp, link)


def rotate(output_dir, keep_last):
    ckpts = list_checkpoints(output_dir)
    for _, path in ckpts[:max(0, len(ckpts) - max(1, keep_last))]:
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
