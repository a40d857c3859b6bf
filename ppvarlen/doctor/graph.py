"""One small view of a model graph, whatever file it came from, and what the doctor reads off it.

``onnx_graph`` (an ONNX file) and ``paddle_graph`` (a PIR ``.json`` or legacy ``.pdmodel``
program) each turn their format into a ``Graph``: the inputs with their declared shapes, and
the ops as ``Node``s of a few kinds the checks care about (embedding lookups, softmaxes,
shape reads, matrix products, constants).  On that view:

* ``word_table``: the embedding table the ids input indexes by *value* (its rows are the
  vocabulary the model can take);
* ``position_table``: a table indexed by something computed from the ids input's *shape*
  only (``arange(length)``), or from a position-ids input: its rows are the longest length;
* ``mask_constants``: constants at or below float16's lowest value (-65504, e.g. a -1e9
  additive mask) that reach a softmax through elementwise ops, never through a matrix
  product (a weight is not a mask).
"""
FLOAT16_LOWEST = -65504.0
MASK_REACH = 12  # ops between a mask constant and the softmax it feeds (adds, casts, reshapes)


class GraphInput:
    """A graph input: ``shape`` lists an int for a fixed dimension, None (or the ONNX
    dimension's symbolic name) for a dynamic one; ``dtype`` a numpy dtype name."""

    def __init__(self, name, shape, dtype):
        self.name, self.shape, self.dtype = name, shape, dtype

    def fixed(self, axis):
        """The fixed size of ``axis``; None when it is dynamic or the input has no such axis."""
        if self.shape is None or axis >= len(self.shape):
            return None
        size = self.shape[axis]
        return size if isinstance(size, int) and size > 0 else None

    def shape_text(self):
        if self.shape is None:
            return "?"
        return "[" + ", ".join(str(d) if isinstance(d, int) and d > 0 else
                               (d if isinstance(d, str) and d else "?") for d in self.shape) + "]"

    def as_dict(self):
        return {"name": self.name, "shape": self.shape_text(), "dtype": self.dtype}


class Node:
    """One op: ``kind`` is embedding (inputs [indices, table]), softmax, shape, matmul,
    constant or other; ``constants`` the float values the op itself introduces (a fill value,
    a small constant tensor's entries, a scale attribute)."""

    def __init__(self, kind, op, inputs, outputs, constants=()):
        self.kind, self.op = kind, op
        self.inputs, self.outputs = list(inputs), list(outputs)
        self.constants = [float(c) for c in constants]


class Graph:
    def __init__(self, source, inputs, nodes, tensor_shapes, labels=None):
        self.source = source  # the file, for the report
        self.inputs = inputs
        self.nodes = nodes
        self.tensor_shapes = tensor_shapes  # {weight / constant value: shape}
        self.labels = labels or {}  # {value: the weight's name} where the value is a number
        self._value_deps, self._shape_deps = self._dependencies()

    def input(self, name):
        return next((i for i in self.inputs if i.name == name), None)

    def _dependencies(self):
        """For every value: {graph input: ops away} its values depend on, and the graph inputs
        it depends on through their shapes only (a shape read cuts value dependence)."""
        value = {i.name: {i.name: 0} for i in self.inputs}
        shape = {}
        for node in self.nodes:
            deps, through_shape = {}, set()
            for name in node.inputs:
                for src, steps in value.get(name, {}).items():
                    deps[src] = min(deps.get(src, steps + 1), steps + 1)
                through_shape |= shape.get(name, set())
            if node.kind == "shape":
                through_shape |= set(deps)
                deps = {}
            for out in node.outputs:
                value[out], shape[out] = deps, through_shape
        return value, shape

    def _tables(self):
        for node in self.nodes:
            if node.kind == "embedding" and len(node.inputs) >= 2:
                shape = self.tensor_shapes.get(node.inputs[1])
                if shape is not None and len(shape) == 2:
                    yield node, int(shape[0])

    def word_table(self, ids_name):
        """(rows, table name) of the embedding the ids input indexes by value (the nearest one
        when several do), or None."""
        found = []
        for node, rows in self._tables():
            steps = self._value_deps.get(node.inputs[0], {}).get(ids_name)
            if steps is not None:
                found.append((steps, -rows, node.inputs[1]))
        if not found:
            return None
        steps, rows, name = min(found)
        return -rows, self.labels.get(name, name)

    def position_table(self, ids_name, positions_name=None):
        """(rows, table name) of an embedding indexed from the ids input's shape alone, or by a
        position-ids input; None when there is none."""
        for node, rows in self._tables():
            deps = self._value_deps.get(node.inputs[0], {})
            by_shape = ids_name not in deps and ids_name in self._shape_deps.get(node.inputs[0], ())
            if by_shape or (positions_name is not None and positions_name in deps):
                return rows, self.labels.get(node.inputs[1], node.inputs[1])
        return None

    def mask_constants(self, lowest=FLOAT16_LOWEST):
        """[{"value", "op", "softmax", "ops_between"}] of constants <= ``lowest`` that reach a
        softmax within ``MASK_REACH`` elementwise ops."""
        consumers = {}
        for node in self.nodes:
            for name in node.inputs:
                consumers.setdefault(name, []).append(node)
        found = []
        for node in self.nodes:
            low = [c for c in node.constants if c <= lowest]
            if not low:
                continue
            frontier, seen = list(node.outputs), set(node.outputs)
            for steps in range(1, MASK_REACH + 1):
                reached, following = None, []
                for name in frontier:
                    for user in consumers.get(name, ()):
                        if user.kind == "softmax":
                            reached = user
                        elif user.kind not in ("matmul", "embedding"):
                            following += [o for o in user.outputs if o not in seen]
                            seen.update(user.outputs)
                if reached is not None:
                    found.append({"value": min(low), "op": node.op, "softmax": reached.op,
                                  "ops_between": steps - 1})
                    break
                frontier = following
                if not frontier:
                    break
        return found
