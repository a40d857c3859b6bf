"""Graph edits for what paddle2onnx 2.1.0 gets wrong or leaves unnamed.

paddle2onnx drops the Paddle RNN's ``sequence_length``: every LSTM/GRU node is
emitted with an empty ``sequence_lens`` input, so ONNX Runtime runs each row to
the padded length (the backward direction starts on pad tokens, final states
come from pads) and mixed-length batches give wrong outputs (PITFALLS 12, 21).
Paddle's RNN op is lowered to one ONNX LSTM/GRU node per layer (bidirectional
layers become ``direction="bidirectional"`` nodes), each over the whole input
batch, so the graph's ``seq_len`` input is the right ``sequence_lens`` for all
of them.  The parity report checks the result against Paddle on mixed lengths.

A second paddle2onnx limit, not fixed here: for a multi-layer RNN the final
states in ONNX hold only the LAST layer's ([2, B, H] instead of
[2 * layers, B, H]).  Models must read final states as ``h[-2]``/``h[-1]``
(ppvarlen's rnn_cls does); the parity report would catch anything else.
"""
import onnx
from onnx import TensorProto, helper

RNN_OPS = ("LSTM", "GRU", "RNN")
SEQUENCE_LENS_INPUT = 4  # X, W, R, B, sequence_lens, initial_h, (initial_c, P)


def wire_rnn_sequence_lens(model, seq_len_name="seq_len"):
    """Feed int32(seq_len) to every RNN node's empty ``sequence_lens``; returns how many."""
    graph = model.graph
    if seq_len_name not in [i.name for i in graph.input]:
        raise ValueError(f"ONNX graph has no input {seq_len_name!r}; inputs: "
                         f"{[i.name for i in graph.input]}")
    lens32 = seq_len_name + "_int32"
    wired = 0
    for node in graph.node:
        if node.op_type not in RNN_OPS:
            continue
        inputs = list(node.input) + [""] * max(0, SEQUENCE_LENS_INPUT + 1 - len(node.input))
        if inputs[SEQUENCE_LENS_INPUT]:
            continue  # already wired (a future paddle2onnx may do it itself)
        inputs[SEQUENCE_LENS_INPUT] = lens32
        del node.input[:]
        node.input.extend(inputs)
        wired += 1
    if wired:
        cast = helper.make_node("Cast", [seq_len_name], [lens32], to=TensorProto.INT32,
                                name="ppvarlen_seq_len_to_int32")
        graph.node.insert(0, cast)
    return wired


def rename_outputs(model, names):
    """Give the graph outputs stable names (paddle2onnx calls them fetch_name_N)."""
    graph = model.graph
    if len(names) != len(graph.output):
        raise ValueError(f"expected {len(names)} ONNX outputs {list(names)}, graph has "
                         f"{[o.name for o in graph.output]}")
    for out, new in zip(graph.output, names):
        old = out.name
        if old == new:
            continue
        for node in graph.node:
            for i, name in enumerate(node.output):
                if name == old:
                    node.output[i] = new
            for i, name in enumerate(node.input):
                if name == old:
                    node.input[i] = new
        out.name = new
    return model


def rnn_nodes(model):
    """(op_type, direction, has sequence_lens) for each RNN node, for the manifest and tests."""
    found = []
    for node in model.graph.node:
        if node.op_type in RNN_OPS:
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            direction = attrs.get("direction", b"forward")
            found.append({"op": node.op_type,
                          "direction": direction.decode() if isinstance(direction, bytes) else direction,
                          "sequence_lens": len(node.input) > SEQUENCE_LENS_INPUT
                          and bool(node.input[SEQUENCE_LENS_INPUT])})
    return found


def load(path):
    return onnx.load(path)
