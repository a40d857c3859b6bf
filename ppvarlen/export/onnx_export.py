"""Paddle inference program -> ONNX, converted in a subprocess, then fixed and named."""
import os
import subprocess
import sys

import onnx

from . import onnx_fix
from ..utils.io import DiskFullError
from ..utils.parallel import child_environ
from ._onnx_worker import DISK_FULL_EXIT, FAILED_EXIT
from .errors import ExportFailedError

# onnxruntime 1.32's NchwcTransformer (ORT_ENABLE_ALL) segfaults at session creation on
# the fp16 BiGRU-CRF emission graph; it only helps conv nets, so every session skips it.
# Recorded in manifest.backends.onnx.session for the deploy predictor.
ORT_DISABLED_OPTIMIZERS = ["NchwcTransformer"]


def _last_line(text, prefix):
    lines = [ln for ln in text.splitlines() if ln.startswith(prefix)]
    return lines[-1][len(prefix):].strip() if lines else ""


def _worker(args, timeout):
    worker = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_onnx_worker.py")
    env = child_environ(PYTHONWARNINGS="ignore")
    return subprocess.run([sys.executable, worker, *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def _failure(proc):
    if proc.returncode == FAILED_EXIT:
        return _last_line(proc.stderr, "FAILED")
    if proc.returncode < 0:
        return f"the process was killed by signal {-proc.returncode}"
    tail = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()][-3:]
    return f"exit code {proc.returncode}: " + " | ".join(tail)


def check_loads(onnx_path, model_name, timeout=300):
    """Load + run the graph once in a child process: a bad graph can abort onnxruntime."""
    try:
        proc = _worker(["--check", onnx_path, *ORT_DISABLED_OPTIMIZERS], timeout)
    except subprocess.TimeoutExpired:
        raise ExportFailedError(f"onnxruntime check of {model_name} did not finish in {timeout}s") from None
    if proc.returncode != 0:
        raise ExportFailedError(f"ONNX export of {model_name}: onnxruntime cannot load or run "
                                f"{os.path.basename(onnx_path)} ({_failure(proc)}); paddle2onnx "
                                f"mis-converted an op. Export with --format paddle only, or change "
                                f"the op (e.g. expand_as -> expand(paddle.shape(x)))")


def convert(paddle_prefix, onnx_path, model_name, opset=13, timeout=900):
    """Run paddle2onnx on ``{paddle_prefix}.json/.pdiparams`` in a child process -> raw ONNX file."""
    if opset < 13:
        raise ExportFailedError(f"Export.opset must be >= 13 (dynamic-axis Slice/Unsqueeze need it), "
                                f"got {opset}")
    # The worker runs by path: it needs only paddle2onnx, not ppvarlen on sys.path.
    args = [paddle_prefix + ".json", paddle_prefix + ".pdiparams", onnx_path, str(opset)]
    try:
        proc = _worker(args, timeout)
    except subprocess.TimeoutExpired:
        raise ExportFailedError(f"ONNX export of {model_name} did not finish in {timeout}s") from None
    if proc.returncode == 0 and os.path.isfile(onnx_path):
        return onnx_path
    if proc.returncode == DISK_FULL_EXIT:  # not an operator paddle2onnx lacks
        needed, path = _last_line(proc.stderr, "DISKFULL").split(" ", 1)
        raise DiskFullError(path, int(needed), f"writing the ONNX model of {model_name}")
    ops = _last_line(proc.stderr, "CANDIDATES")
    hint = (f"Paddle op(s) paddle2onnx does not list as supported: {ops}. Export with --format "
            f"paddle only, or change the model to avoid them" if ops else
            "\n".join(proc.stderr.strip().splitlines()[-8:]))
    why = (f"paddle2onnx aborted (signal {-proc.returncode}) on ops it cannot convert"
           if proc.returncode < 0 else f"paddle2onnx failed ({_failure(proc)})")
    raise ExportFailedError(f"ONNX export of {model_name} failed: {why}. {hint}")


def export_onnx(paddle_prefix, onnx_path, model_name, output_names, opset=13, fix_rnn=True):
    """Convert, wire RNN ``sequence_lens`` to ``seq_len``, name the outputs; returns graph facts."""
    convert(paddle_prefix, onnx_path, model_name, opset)
    model = onnx.load(onnx_path)
    wired = onnx_fix.wire_rnn_sequence_lens(model) if fix_rnn else 0
    onnx_fix.rename_outputs(model, output_names)
    onnx.checker.check_model(model)
    onnx.save(model, onnx_path)
    check_loads(onnx_path, model_name)
    return {"opset": max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
            "session": {"disabled_optimizers": ORT_DISABLED_OPTIMIZERS},
            "rnn_nodes": onnx_fix.rnn_nodes(model), "rnn_sequence_lens_wired": wired}
