"""Model weights as safetensors (numpy), never pickle.

``paddle.load`` unpickles, so a crafted checkpoint could run code; safetensors
is a flat header plus raw arrays.  numpy has no bfloat16, so bfloat16
parameters are stored as float32 (exact: every bfloat16 is a float32) and the
original dtype is recorded in the file's metadata; ``load_weights`` casts each
array to the dtype of the parameter it lands in.
"""
import json
import os

import numpy as np
import paddle
from safetensors import safe_open
from safetensors.numpy import load_file, save

from ..utils.io import atomic_write_bytes

_DTYPES_KEY = "ppvarlen_dtypes"


def _dtype_name(tensor):
    return str(tensor.dtype).replace("paddle.", "")


def _to_numpy(tensor):
    if _dtype_name(tensor) == "bfloat16":
        tensor = tensor.astype("float32")
    return np.ascontiguousarray(tensor.numpy())


def save_weights(model, path, skip_prefixes=(), metadata=None):
    """Write ``model.state_dict()`` to ``path`` (.safetensors) atomically.

    ``skip_prefixes`` leaves out parameters whose names start with one of them
    (e.g. task heads of a pretrained encoder); ``metadata`` adds string entries
    to the file header (read back with ``read_metadata``).
    """
    state = {k: t for k, t in model.state_dict().items() if not k.startswith(tuple(skip_prefixes))}
    arrays = {name: _to_numpy(t) for name, t in state.items()}
    dtypes = {name: _dtype_name(t) for name, t in state.items()}
    header = dict(metadata or {}, **{_DTYPES_KEY: json.dumps(dtypes)})
    atomic_write_bytes(os.fspath(path), save(arrays, metadata=header))


def read_weights(path):
    """``{name: np.ndarray}`` from a safetensors file, with a clear error if it is not one."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ValueError(f"weights file not found: {path}")
    try:
        return load_file(path)
    except Exception as e:  # safetensors raises its own error types for bad headers
        raise ValueError(f"{path}: not a readable safetensors file ({e}); weights must be saved "
                         f"with ppvarlen.models.weights.save_weights") from None


def assign_weights(model, arrays, source, allow_unexpected=False):
    """Copy ``arrays`` into ``model``'s parameters and buffers, checking names and shapes.

    Any missing or shape-mismatched key (and, unless ``allow_unexpected``, any
    unexpected key) raises one ValueError listing all of them with shapes.
    Returns the list of unexpected keys that were ignored.
    """
    state = model.state_dict()
    missing = [k for k in state if k not in arrays]
    unexpected = [k for k in arrays if k not in state]
    mismatched = [k for k in state if k in arrays and tuple(arrays[k].shape) != tuple(state[k].shape)]
    if missing or mismatched or (unexpected and not allow_unexpected):
        lines = [f"{source}: weights do not fit {type(model).__name__}"]
        lines += [f"  missing: {k} {list(state[k].shape)}" for k in missing]
        if not allow_unexpected:
            lines += [f"  unexpected: {k} {list(arrays[k].shape)}" for k in unexpected]
        lines += [f"  shape mismatch: {k} file {list(arrays[k].shape)} vs model {list(state[k].shape)}"
                  for k in mismatched]
        lines.append("  (was the checkpoint trained with a different Model config or vocabulary?)")
        raise ValueError("\n".join(lines))
    for name, target in state.items():
        value = paddle.to_tensor(arrays[name])
        if value.dtype != target.dtype:
            value = value.astype(target.dtype)
        target.set_value(value)
    return unexpected


def load_weights(model, path):
    """Load a file written by ``save_weights`` into ``model`` (strict: names and shapes)."""
    assign_weights(model, read_weights(path), source=os.fspath(path))
    return model


def read_metadata(path):
    """The string metadata of a safetensors file's header (``{}`` when it has none)."""
    read_weights(path)  # the clear errors for a missing / unreadable file
    with safe_open(os.fspath(path), framework="numpy") as f:
        return dict(f.metadata() or {})


def load_matching_weights(model, path, key="Model.init_from"):
    """Initialise ``model`` from the weights in ``path`` whose names it shares (warm start).

    Returns ``{"loaded", "missing", "unexpected"}`` name lists: ``missing`` are
    the model's parameters the file lacks (they keep their fresh init, e.g. a
    new classification head); ``unexpected`` are file entries the model has no
    place for.  A shared name with a different shape, or a file that shares no
    name at all, is a ValueError naming ``key``: the model config differs from
    the one that wrote the file.
    """
    if not os.path.isfile(os.fspath(path)):
        raise ValueError(f"{key}={path}: file not found; run the pretraining that writes it "
                         f"(tools/pretrain.py) or set {key}: null")
    arrays = read_weights(path)
    state = model.state_dict()
    shared = [k for k in state if k in arrays]
    mismatched = [k for k in shared if tuple(arrays[k].shape) != tuple(state[k].shape)]
    if mismatched or not shared:
        lines = [f"{key}={path}: weights do not fit {type(model).__name__}"]
        lines += [f"  shape mismatch: {k} file {list(arrays[k].shape)} vs model {list(state[k].shape)}"
                  for k in mismatched]
        if not shared:
            lines.append(f"  no parameter name in common (file has e.g. {sorted(arrays)[:3]})")
        lines.append("  (pretrain with the same Model and Data sections as the model you initialise)")
        raise ValueError("\n".join(lines))
    for name in shared:
        target = state[name]
        value = paddle.to_tensor(arrays[name])
        target.set_value(value.astype(target.dtype) if value.dtype != target.dtype else value)
    return {"loaded": shared, "missing": [k for k in state if k not in arrays],
            "unexpected": [k for k in arrays if k not in state]}
