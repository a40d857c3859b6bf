"""Dygraph -> static: one program for every (batch, length), saved for Paddle Inference."""
import contextlib
import os
import tempfile

import paddle
from paddle.static import InputSpec

from ..utils.io import DIRECT_BLOCK, disk_full_named, owned_prefix
from ..utils.viterbi import crf_matrix

MAX_INPUTS = 6  # parameters of _ExportWrapper.forward


def input_spec(specs):
    """``InputSpec``s of a task's declared inputs (``Task.input_specs``: name, dtype, dims with
    -1 for a free dim): None for batch and sequence dims, so to_static traces once for all
    shapes (PITFALLS 20)."""
    if not 2 <= len(specs) <= MAX_INPUTS:
        raise ValueError(f"a forward export takes 2..{MAX_INPUTS} declared inputs, "
                         f"got {[s['name'] for s in specs]}")
    return [InputSpec([None if d < 0 else d for d in s["dims"]], s["dtype"], s["name"])
            for s in specs]


class _ExportWrapper(paddle.nn.Layer):
    """What gets converted: the model's inference forward (no labels).

    Wrapping keeps ``paddle.jit.to_static`` from replacing the model's own
    ``forward``, so the same model object still runs eagerly for the parity
    check.  ``emissions_only`` keeps a tagger's first output, so its decode op is
    pruned from the saved program (for ONNX, which cannot carry Viterbi).
    """

    def __init__(self, model, emissions_only=False):
        super().__init__()
        self.model = model
        self.emissions_only = emissions_only

    # named parameters, not *inputs: to_static maps an InputSpec to each named parameter; the
    # ones a task does not declare stay None and are left out of the model's call
    def forward(self, in0, in1, in2=None, in3=None, in4=None, in5=None):
        inputs = [x for x in (in0, in1, in2, in3, in4, in5) if x is not None]
        out = self.model(*inputs)
        return out[0] if self.emissions_only else out


def to_static(model, specs, emissions_only=False):
    """Eval-mode static layer of ``model`` over the task's declared inputs ``specs``."""
    model.eval()
    layer = _ExportWrapper(model, emissions_only)
    layer.eval()
    return paddle.jit.to_static(layer, input_spec=input_spec(specs), full_graph=True)


def traced_count(static_layer):
    """How many concrete programs the static forward holds (1 = traced once for all shapes)."""
    return static_layer.forward.get_traced_count()


@contextlib.contextmanager
def dropout_left_out(layer):
    """Trace ``layer`` with its eval-mode dropouts left out of the program.

    In eval mode an ``upscale_in_train`` dropout is the identity, but traced it
    stays a ``pd_op.dropout`` (is_test) op that copies its input, and Paddle
    Inference 3.3.1's CPU/oneDNN pipeline does not delete it: with each op a
    oneDNN -> Paddle layout change too, they cost a sizeable share of the Paddle
    Inference CPU time of the sentiment transformer (docs/PRECISION.md).  ``F.dropout``
    returns its input for ``p == 0``, so p is 0 while tracing, restored after.
    (``downscale_in_infer`` scales in eval: left as it is.)  Yields the count.
    """
    saved = []
    for sub in layer.sublayers(include_self=True):
        if isinstance(sub, paddle.nn.Dropout) and sub.mode == "upscale_in_train" and sub.p:
            saved.append((sub, "p", sub.p))
        elif isinstance(sub, paddle.nn.MultiHeadAttention) and sub.dropout:
            saved.append((sub, "dropout", sub.dropout))  # attention weights, upscale_in_train
    for sub, name, _ in saved:
        setattr(sub, name, 0.0)
    try:
        yield len(saved)
    finally:
        for sub, name, value in saved:
            setattr(sub, name, value)


def save_program(layer, prefix, spec):
    """to_static (one program for all shapes) + ``paddle.jit.save`` -> ``{prefix}.json`` (PIR
    program) + ``{prefix}.pdiparams``; returns the static layer.  Eval-mode dropouts are
    left out of the program (``dropout_left_out``)."""
    layer.eval()
    with dropout_left_out(layer):
        static_layer = paddle.jit.to_static(layer, input_spec=spec, full_graph=True)
        paddle.jit.save(static_layer, prefix, input_spec=spec)
    missing = [f for f in (prefix + ".json", prefix + ".pdiparams") if not os.path.isfile(f)]
    if missing:
        raise RuntimeError(f"paddle.jit.save did not write {missing}; is PIR enabled "
                           f"(FLAGS_enable_pir_api)?")
    check_room_left(os.path.dirname(os.path.abspath(prefix)), "saving the Paddle program")
    return static_layer


def check_room_left(directory, what):
    """DiskFullError for ``directory`` when a block cannot be written and synced there.

    ``paddle.jit.save`` writes through C++ streams and checks no write: on a full disk it
    leaves a truncated program and raises nothing.  A disk with no room for one more block
    right after it is taken as having cut the save short (at worst a save that fitted with
    less than a block to spare, where the next file would not have fitted)."""
    with disk_full_named(directory, None, what):
        fd, probe = tempfile.mkstemp(prefix=owned_prefix(".tmp-room"), dir=directory)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(bytes(DIRECT_BLOCK))
                f.flush()
                os.fsync(f.fileno())
        finally:
            os.remove(probe)


def save_inference(model, prefix, specs, emissions_only=False):
    """A forward-view model's inference program over the task's declared inputs ``specs``."""
    model.eval()
    save_program(_ExportWrapper(model, emissions_only), prefix, input_spec(specs))
    return [prefix + ".json", prefix + ".pdiparams"]


def crf_matrix_of(model):
    """The [T+2, T] crf matrix (ppvarlen.utils.viterbi layout) of a CRF tagger, or None.

    Finds a CRF layer with ``transitions``/``start``/``stop`` parameters
    (ppvarlen.models.crf.LinearChainCRF), or a ``paddle.text.ViterbiDecoder``.
    """
    for layer in model.sublayers(include_self=True):
        if isinstance(layer, paddle.text.ViterbiDecoder):
            trans = layer.transitions.numpy()
            if layer.include_bos_eos_tag:
                return crf_matrix(trans, trans[-1], trans[-2])
            return crf_matrix(trans, trans[0] * 0, trans[0] * 0)
        params = [getattr(layer, n, None) for n in ("transitions", "start", "stop")]
        if all(isinstance(p, paddle.Tensor) for p in params):
            return crf_matrix(*(p.numpy() for p in params))
    return None
