"""Subprocess body of the ONNX export: ``python .../_onnx_worker.py MODEL.json PARAMS OUT OPSET``.

paddle2onnx SIGABRTs the whole process on an unsupported op, so it runs here,
never in the caller's process.  Before converting, the worker prints
(``CANDIDATES a,b``) the program's ops missing from paddle2onnx's supported
list, so the parent can name them if the conversion then aborts.  The list is
only a hint (paddle2onnx maps some PIR names, e.g. ``flatten``, internally), so
the conversion itself decides.
Exit codes: 0 ok, 4 paddle2onnx raised (message on the ``FAILED`` line), 5 the disk was full
(``DISKFULL <bytes> <path>``: the bytes it could not write, the file).
``--check MODEL.onnx [OPTIMIZER ...]`` loads a graph in onnxruntime and runs one
batch, because a malformed graph can abort onnxruntime too (a C++ assertion).
"""
import errno
import json
import os
import sys

import numpy as np

# Standalone script: imports nothing from ppvarlen (the child may not have it on sys.path).

FAILED_EXIT = 4
DISK_FULL_EXIT = 5
DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
# PIR op names that paddle2onnx converts under another name.
CONVERTED_UNDER_OTHER_NAMES = {"flatten", "data", "fetch", "feed"}


def program_ops(model_json):
    """Names of the Paddle ops in a PIR ``model.json`` (nested blocks included)."""
    with open(model_json, encoding="utf-8") as f:
        program = json.load(f)["program"]
    ops = set()

    def walk(node):
        if isinstance(node, dict):
            if isinstance(node.get("ops"), list):
                for op in node["ops"]:
                    name = op.get("#", "") if isinstance(op, dict) else ""
                    if name.startswith("1."):  # "1." = pd_op dialect, "0." = builtin
                        ops.add(name[2:])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(program)
    return ops


def smoke_run(onnx_path, disabled_optimizers):
    """Load the graph in onnxruntime and run one mixed-length batch (aborts stay in this child)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    session = ort.InferenceSession(onnx_path, opts, providers=["CPUExecutionProvider"],
                                   disabled_optimizers=disabled_optimizers)
    names = [i.name for i in session.get_inputs()]
    if names == ["input_ids", "seq_len"]:
        ids = np.full((2, 3), 6, dtype=np.int64)
        ids[1, 1:] = 0
        feed = {"input_ids": ids, "seq_len": np.array([3, 1], dtype=np.int64)}
    else:  # other graphs (seq2seq encoder / decoder step): dynamic dims 2, ints 1, floats 0
        feed = {i.name: np.full([d if isinstance(d, int) else 2 for d in i.shape],
                                1 if "int" in i.type else 0,
                                dtype=np.int64 if "int64" in i.type else np.float32)
                for i in session.get_inputs()}
    try:
        session.run(None, feed)
    except Exception as e:
        print(f"FAILED onnxruntime cannot run the graph: {e}", file=sys.stderr)
        return FAILED_EXIT
    return 0


def main(argv):
    if argv[0] == "--check":
        return smoke_run(argv[1], argv[2:])
    model_json, params, out_path, opset = argv[0], argv[1], argv[2], int(argv[3])
    import paddle2onnx
    import paddle2onnx.paddle2onnx_cpp2py_export as c_p2o

    supported = set(c_p2o.get_all_supported_operators_pir()) | CONVERTED_UNDER_OTHER_NAMES
    print("CANDIDATES " + ",".join(sorted(program_ops(model_json) - supported)),
          file=sys.stderr, flush=True)
    # optimize_tool=None: the default polygraphy folding pip-installs packages at run time.
    try:
        onnx_bytes = paddle2onnx.export(model_json, params, save_file=None, opset_version=opset,
                                        auto_upgrade_opset=True, enable_onnx_checker=True,
                                        optimize_tool=None)
    except Exception as e:  # paddle2onnx logs, then fails on its unset result
        onnx_bytes, why = None, f"{type(e).__name__}: {e}"
    else:
        why = "paddle2onnx returned no model"
    if not onnx_bytes:
        print("FAILED " + why, file=sys.stderr)
        return FAILED_EXIT
    try:
        with open(out_path, "wb") as f:
            f.write(onnx_bytes)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        if e.errno not in DISK_FULL_ERRNOS:
            raise
        print(f"DISKFULL {len(onnx_bytes)} {out_path}", file=sys.stderr)
        return DISK_FULL_EXIT
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
