"""A float16 copy of an ONNX graph that runs here (CPU ONNX Runtime), as a plain cast would make it.

onnxconverter-common converts every float tensor; by default it first clamps constants to
+-1e4, which hides exactly what check 5 looks for (a -1e9 mask becomes a harmless -1e4).  Here
nothing is clamped (``max_finite_val=inf``, ``min_positive_val=0``): each constant becomes the
float16 a cast gives, so a -1e9 becomes -inf as it does in any half-precision arithmetic that
does not rewrite constants.  Inputs and outputs keep their types; the ops ppvarlen's own fp16
export keeps in float32 stay so here (RNN cells, the graph's Cast nodes, named so the
converter can skip them: ``ppvarlen.export.precision``).
"""
import warnings

import numpy as np
import onnx
from onnxconverter_common import float16

KEEP_FP32_OPS = ["LSTM", "GRU", "RNN"]


def plain_cast(model):
    """A float16 copy of ``model`` (an ``onnx.ModelProto``; the original is left as it is)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    names = set()
    for k, node in enumerate(copy.graph.node):
        if node.op_type == "Cast" and (not node.name or node.name in names):
            node.name = f"ppvarlen_doctor_cast_{k}"
        names.add(node.name)
    casts = [n.name for n in copy.graph.node if n.op_type == "Cast"]
    with warnings.catch_warnings(), np.errstate(over="ignore", under="ignore"):
        warnings.simplefilter("ignore")
        return float16.convert_float_to_float16(
            copy, min_positive_val=0.0, max_finite_val=float("inf"), keep_io_types=True,
            op_block_list=list(float16.DEFAULT_OP_BLOCK_LIST) + KEEP_FP32_OPS,
            node_block_list=casts)
