"""manifest.json: everything a serving host needs to know about an export directory.

The deploy side (ppvarlen/runtime/manifest.py) reads it without training code;
the field names follow docs/DESIGN.md "Export directory" (example there).
"""
import os

import onnx
import paddle

from .. import __version__
from ..tasks import get_task
from ..utils.io import sha256_file

FORMAT_VERSION = 1


def shape_ranges(length_profile, max_len, max_batch_size, max_batch_tokens, inputs):
    """TensorRT min/opt/max per input, from the training data's length profile (PITFALLS 23).

    Lengths: min 1, opt the profile's p95 (most batches are at most that long),
    max ``max_len`` (longer texts are cut or windowed before the graph).
    Batch: min 1, max ``max_batch_size``, opt what the token budget allows at
    the opt length.  ``inputs``: the task's declared input specs: a [B, L] input (2 dims) gets
    batch x length, a [B] input batch.
    """
    profile = length_profile or {}
    opt_len = int(min(max_len, max(1, round(profile.get("p95") or profile.get("max") or max_len))))
    opt_batch = int(max(1, min(max_batch_size, max_batch_tokens // opt_len)))
    rows = {"min": [1, 1], "opt": [opt_batch, opt_len], "max": [max_batch_size, max_len]}
    per_row = {"min": [1], "opt": [opt_batch], "max": [max_batch_size]}
    return {s["name"]: dict(rows) if len(s["dims"]) == 2 else dict(per_row) for s in inputs}


def file_hashes(export_dir):
    """{relative path: sha256} of every file under ``export_dir`` except the manifest itself."""
    files = {}
    for root, _, names in os.walk(export_dir):
        for name in sorted(names):
            full = os.path.join(root, name)
            rel = os.path.relpath(full, export_dir).replace(os.sep, "/")
            if rel != "manifest.json":
                files[rel] = sha256_file(full)
    return dict(sorted(files.items()))


def versions():
    import onnxruntime  # ONNX libraries load only when needed (tests/test_hygiene.py)
    import paddle2onnx

    return {"ppvarlen": __version__, "paddle": paddle.__version__,
            "paddle2onnx": paddle2onnx.__version__, "onnx": onnx.__version__,
            "onnxruntime": onnxruntime.__version__}


def build_manifest(export_dir, meta, data_cfg, deploy_cfg, backends, precisions, tokenizer_files,
                   decoding=None):
    """The manifest dict for a finished export directory (hashes taken from the files on disk).

    ``decoding``: seq2seq only, the greedy loop's settings (exporter.GreedyView.decoding).
    """
    task = get_task(meta["task"])
    max_len = int(meta["max_len"])
    max_position = meta.get("max_position")
    inputs = [dict(spec) for spec in task.input_specs]
    manifest = {
        "format_version": FORMAT_VERSION,
        "task": task.name,
        "model_name": meta.get("model_name"),
        "label_names": list(meta["label_names"]),
        "inputs": inputs,
        "outputs": [dict(spec) for spec in task.output_specs],
        "tokenizer": {"kind": data_cfg.tokenizer, "lowercase": data_cfg.lowercase,
                      # null in the config means the task's default (data.dataset)
                      "add_special_tokens": (task.default_special_tokens
                                             if data_cfg.add_special_tokens is None
                                             else data_cfg.add_special_tokens),
                      "padding_side": "right", **tokenizer_files},
        "special_ids": dict(meta["special_ids"]),
        "max_len": max_len,
        "max_position": max_position,
        "long_text": {"policy": meta.get("long_text") or data_cfg.long_text,
                      "stride": data_cfg.stride, "max_len": max_len},
        "buckets": list(meta.get("buckets") or []),
        "length_profile": meta.get("length_profile"),
        "shape_ranges": shape_ranges(meta.get("length_profile"), max_len,
                                     deploy_cfg.max_batch_size, deploy_cfg.max_batch_tokens,
                                     inputs),
        "backends": backends,
        "precisions": precisions,
        "files": file_hashes(export_dir),
        "versions": versions(),
    }
    manifest.update(task.manifest_extras(meta))  # e.g. tagging: the tag scheme
    if decoding is not None:
        manifest["decoding"] = decoding
    return manifest
