"""A Paddle inference program as the doctor's ``Graph``.

Two formats: a PIR program (``model.json``: ``data`` ops with name, shape and dtype, ``p``
parameter ops with their shapes, ``full`` / ``full_like`` / ``assign_value`` ops holding fill
values) and a legacy ``ProgramDesc`` (``.pdmodel``, protobuf: ``feed`` ops, variable
descriptions with dims, ``fill_constant`` / ``scale`` attributes).  Both are read as data
(JSON, protobuf), never executed or unpickled; the weights (``.pdiparams``) are not read here.
"""
import json

from paddle.base.proto import framework_pb2

from .graph import Graph, GraphInput, Node

PIR_KINDS = {"embedding": "embedding", "softmax": "softmax", "log_softmax": "softmax",
             "shape": "shape", "shape64": "shape", "matmul": "matmul",
             "fused_gemm_epilogue": "matmul", "conv2d": "matmul", "full": "constant",
             "full_like": "constant", "full_with_tensor": "constant", "assign_value": "constant",
             "assign_value_": "constant"}
LEGACY_KINDS = {"lookup_table_v2": "embedding", "lookup_table": "embedding",
                "softmax": "softmax", "log_softmax": "softmax", "shape": "shape",
                "matmul": "matmul", "matmul_v2": "matmul", "mul": "matmul", "fc": "matmul",
                "conv2d": "matmul", "fill_constant": "constant", "fill_any_like": "constant",
                "assign_value": "constant"}
# attributes whose values an op brings into the graph (fill values, scale factors and biases)
VALUE_ATTRS = ("value", "values", "str_value", "fp32_values", "fp64_values", "scale", "bias")
LEGACY_DTYPES = {"BOOL": "bool", "INT16": "int16", "INT32": "int32", "INT64": "int64",
                 "FP16": "float16", "FP32": "float32", "FP64": "float64", "UINT8": "uint8",
                 "INT8": "int8", "BF16": "bfloat16"}


class ProgramFormatError(ValueError):
    """The file is not a Paddle program this reader understands."""


def _floats(data):
    """Every number inside a PIR attribute value (nested arrays of typed scalars)."""
    if isinstance(data, bool):
        return []
    if isinstance(data, (int, float)):
        return [float(data)]
    if isinstance(data, str):
        try:
            return [float(data)]
        except ValueError:
            return []
    if isinstance(data, dict):
        return _floats(data.get("D"))
    if isinstance(data, list):
        return [v for item in data for v in _floats(item)]
    return []


def _pir_attrs(op):
    attrs = op.get("A")
    if not isinstance(attrs, list):
        return {}
    return {a["N"]: a.get("AT", {}).get("D") for a in attrs if isinstance(a, dict) and "N" in a}


def _pir_ops(node):
    """Every op of a PIR program, nested blocks included, in program order."""
    if isinstance(node, dict):
        if isinstance(node.get("ops"), list):
            for op in node["ops"]:
                if isinstance(op, dict):
                    yield op
                    yield from _pir_ops(op.get("regions"))
        else:
            for value in node.values():
                yield from _pir_ops(value)
    elif isinstance(node, list):
        for value in node:
            yield from _pir_ops(value)


def _pir_outputs(op):
    outs = op.get("O")
    outs = [outs] if isinstance(outs, dict) else (outs or [])
    return [o for o in outs if isinstance(o, dict)]


def _pir_shape(value):
    try:
        return list(value["TT"]["D"][1])
    except (KeyError, IndexError, TypeError):
        return None


def read_pir(path):
    """A PIR ``model.json`` -> ``Graph``; ProgramFormatError when it is not one."""
    try:
        with open(path, encoding="utf-8") as f:
            program = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ProgramFormatError(f"{path}: not a readable JSON file ({e})") from None
    if not isinstance(program, dict) or "program" not in program or "base_code" not in program:
        raise ProgramFormatError(f"{path}: JSON without 'base_code' and 'program': not a Paddle "
                                 f"PIR program")
    inputs, nodes, shapes, labels = [], [], {}, {}
    for op in _pir_ops(program["program"]):
        name = str(op.get("#", ""))
        short = name.split(".", 1)[-1]
        outs = [str(o.get("%")) for o in _pir_outputs(op)]
        ins = [str(i.get("%")) for i in op.get("I") or [] if isinstance(i, dict)]
        if name == "p" or short == "parameter":
            label = op.get("A")[-1] if isinstance(op.get("A"), list) and op.get("A") else None
            for o in _pir_outputs(op):
                shapes[str(o.get("%"))] = _pir_shape(o)
                if isinstance(label, str):
                    labels[str(o.get("%"))] = label
            continue
        attrs = _pir_attrs(op)
        if short == "data":
            shape = attrs.get("shape")
            inputs.append(GraphInput(str(attrs.get("name")), list(shape) if shape else None,
                                     str(attrs.get("dtype", "unknown"))))
            # the data op's output value stands for the input itself
            nodes.append(Node("other", f"data {attrs.get('name')}", [str(attrs.get("name"))], outs))
            continue
        constants = [v for key in VALUE_ATTRS if key in attrs for v in _floats(attrs[key])]
        nodes.append(Node(PIR_KINDS.get(short, "other"), short, ins, outs, constants))
    return Graph(path, inputs, nodes, shapes, labels)


def read_legacy(path):
    """A legacy ``.pdmodel`` (ProgramDesc protobuf) -> ``Graph``; ProgramFormatError when it is
    not one."""
    desc = framework_pb2.ProgramDesc()
    try:
        with open(path, "rb") as f:
            desc.ParseFromString(f.read())
    except Exception as e:  # noqa: BLE001 - protobuf's DecodeError and friends
        raise ProgramFormatError(f"{path}: not a Paddle ProgramDesc ({type(e).__name__})") from None
    if not desc.blocks:
        raise ProgramFormatError(f"{path}: a ProgramDesc without blocks")
    variables = {}
    for block in desc.blocks:
        for var in block.vars:
            if var.type.HasField("dense_tensor"):
                tensor = var.type.dense_tensor.tensor
                dtype = framework_pb2.VarType.Type.Name(tensor.data_type)
                variables[var.name] = (list(tensor.dims), LEGACY_DTYPES.get(dtype, dtype.lower()))
    inputs, nodes = [], []
    for block in desc.blocks:
        for op in block.ops:
            ins = {i.parameter: list(i.arguments) for i in op.inputs}
            outs = [a for o in op.outputs for a in o.arguments]
            if op.type == "feed":
                for name in outs:
                    dims, dtype = variables.get(name, (None, "unknown"))
                    inputs.append(GraphInput(name, dims, dtype))
                continue
            if op.type == "fetch":
                continue
            kind = LEGACY_KINDS.get(op.type, "other")
            ordered = ins.get("Ids", []) + ins.get("W", []) if kind == "embedding" else \
                [a for args in ins.values() for a in args]
            constants = []
            for attr in op.attrs:
                if attr.name in VALUE_ATTRS:
                    constants += [attr.f] if attr.HasField("f") else []
                    constants += [attr.float64] if attr.HasField("float64") else []
                    constants += list(attr.floats) + list(attr.float64s)
                    constants += _floats(attr.s) if attr.HasField("s") else []
            nodes.append(Node(kind, op.type, ordered, outs, constants))
    shapes = {name: dims for name, (dims, _) in variables.items()}
    return Graph(path, inputs, nodes, shapes)
