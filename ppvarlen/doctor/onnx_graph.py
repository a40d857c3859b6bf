"""An ONNX model as the doctor's ``Graph`` (inputs with dim_value / dim_param, Gather tables,
Softmax, small constants from initializers, ``Constant`` and ``ConstantOfShape`` nodes)."""
import numpy as np
import onnx
from onnx import helper, numpy_helper

from .graph import Graph, GraphInput, Node

SMALL_CONSTANT = 64  # entries: a constant this small may be a mask value; larger ones are weights
KINDS = {"Softmax": "softmax", "LogSoftmax": "softmax", "Shape": "shape", "Size": "shape",
         "MatMul": "matmul", "Gemm": "matmul", "MatMulInteger": "matmul", "Conv": "matmul",
         "Einsum": "matmul"}


def _dims(value_info):
    tensor = value_info.type.tensor_type
    if not tensor.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
            for d in tensor.shape.dim]


def _dtype(value_info):
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(value_info.type.tensor_type.elem_type)).name
    except (KeyError, TypeError, ValueError):
        return "unknown"


def _float_values(array):
    """The float entries of a small constant (an empty list for integer or large tensors)."""
    if array.dtype.kind != "f" or array.size > SMALL_CONSTANT:
        return []
    return [float(v) for v in array.ravel()]


def graph_inputs(model):
    """The graph's real inputs (initializers listed as inputs by older exporters left out)."""
    weights = {t.name for t in model.graph.initializer}
    return [GraphInput(i.name, _dims(i), _dtype(i)) for i in model.graph.input
            if i.name not in weights]


def read_graph(model, source):
    """``model`` (a loaded ``onnx.ModelProto``) -> ``Graph``."""
    shapes, nodes = {}, []
    for tensor in model.graph.initializer:
        shapes[tensor.name] = list(tensor.dims)
        if int(np.prod(tensor.dims)) <= SMALL_CONSTANT:
            nodes.append(Node("constant", f"initializer {tensor.name}", [], [tensor.name],
                              _float_values(numpy_helper.to_array(tensor))))
    for node in model.graph.node:
        if node.op_type in ("Constant", "ConstantOfShape"):
            value = next((a.t for a in node.attribute if a.name == "value"), None)
            floats = [a.f for a in node.attribute if a.name == "value_float"]
            floats += [f for a in node.attribute if a.name == "value_floats" for f in a.floats]
            if value is not None:
                if node.op_type == "Constant":  # ConstantOfShape's value is its fill, not its shape
                    shapes[node.output[0]] = list(value.dims)
                floats += _float_values(numpy_helper.to_array(value))
            nodes.append(Node("constant", f"{node.op_type} {node.name or node.output[0]}",
                              node.input, node.output, floats))
        elif node.op_type == "Gather" and len(shapes.get(node.input[0], ())) == 2:
            nodes.append(Node("embedding", f"Gather {node.name}", [node.input[1], node.input[0]],
                              node.output))
        else:
            nodes.append(Node(KINDS.get(node.op_type, "other"), f"{node.op_type} {node.name}",
                              node.input, node.output))
    return Graph(source, graph_inputs(model), nodes, shapes)


def load_model(path):
    """``onnx.load`` (external data read from beside the file)."""
    return onnx.load(path)
