"""Paddle inference program -> ONNX, converted in a subprocess, then fixed and named."""
import os
import subprocess
import sys

import onnx

from . import onnx_fix
from ._onnx_worker import FAILED_EXIT
from .errors import ExportError


def _last_line(text, prefix):
    lines = [ln for ln in text.splitlines() if ln.startswith(prefix)]
    return lines[-1][len(prefix):].strip() if lines else ""


def convert(paddle_prefix, onnx_path, model_name, opset=13, timeout=900):
    """Run paddle2onnx on ``{paddle_prefix}.json/.pdiparams`` in a child process -> raw ONNX file."""
    if opset < 13:
        raise ExportError(f"Export.opset must be >= 13 (dynamic-axis Slice/Unsqueeze need it), "
                          f"got {opset}")
    cmd = [sys.executable, "-m", "ppvarlen.export._onnx_worker", paddle_prefix + ".json",
           paddle_prefix + ".pdiparams", onnx_path, str(opset)]
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        raise ExportError(f"ONNX export of {model_name} did not finish in {timeout}s") from None
    if proc.returncode == 0 and os.path.isfile(onnx_path):
        return onnx_path
    ops = _last_line(proc.stderr, "CANDIDATES")
    hint = (f"Paddle op(s) paddle2onnx does not list as supported: {ops}. Export with --format "
            f"paddle only, or change the model to avoid them" if ops else
            "\n".join(proc.stderr.strip().splitlines()[-8:]))
    if proc.returncode == FAILED_EXIT:
        why = _last_line(proc.stderr, "FAILED")
    elif proc.returncode < 0:
        why = f"paddle2onnx aborted (signal {-proc.returncode}) on ops it cannot convert"
    else:
        why = f"paddle2onnx exited with code {proc.returncode}"
    raise ExportError(f"ONNX export of {model_name} failed: {why}. {hint}")


def export_onnx(paddle_prefix, onnx_path, model_name, output_names, opset=13, fix_rnn=True):
    """Convert, wire RNN ``sequence_lens`` to ``seq_len``, name the outputs; returns graph facts."""
    convert(paddle_prefix, onnx_path, model_name, opset)
    model = onnx.load(onnx_path)
    wired = onnx_fix.wire_rnn_sequence_lens(model) if fix_rnn else 0
    onnx_fix.rename_outputs(model, output_names)
    onnx.checker.check_model(model)
    onnx.save(model, onnx_path)
    return {"opset": max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
            "rnn_nodes": onnx_fix.rnn_nodes(model), "rnn_sequence_lens_wired": wired}
