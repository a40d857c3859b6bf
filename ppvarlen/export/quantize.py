"""int8 ONNX copies of an exported ``onnx/model.onnx`` (ONNX Runtime quantization, CPU).

paddle2onnx 2.1 with ``optimize_tool=None`` writes every weight as a ``Constant``
node (often behind an ``Identity``), and ``quantize_dynamic`` quantizes only
MatMuls whose B input is an initializer ("non constant B"): on the raw graph it
quantizes nothing.  ONNX Runtime's own quantization pre-processing
(``quant_pre_process``) already fixes that: its basic graph optimisation turns
Constant nodes into initializers and folds the Identity in front of them, so no
hand-written graph pass is needed.  Symbolic shape inference is skipped (it
fails on paddle2onnx's dynamic Reshape/Slice chains; plain ONNX shape
inference is enough for MatMul/Gemm).

Methods:
* ``static`` (the export's, ``DEFAULT_INT8``) - QDQ graph with uint8 activations whose
  ranges are calibrated (MinMax) on a sample of train-split batches (the exporter's
  ``calibration_batches``): fixed scales, so each row's answer is the same alone
  or batched with any other rows, as the serving admission checks.  The MatMul/Gemm
  outputs stay float (``matmul_outputs: float``): ONNX Runtime then runs each as one
  ``MatMulIntegerToFloat`` instead of a ``QLinearMatMul`` that requantizes its output to
  uint8 and a ``DequantizeLinear`` that turns it back before the bias is added.
* ``dynamic`` - weights int8 ahead of time, activations quantized per batch at run
  time (``MatMulInteger``/``DynamicQuantizeMatMul``); no data needed, but the
  activation scale comes from the whole batch, so a text's answer depends on its
  neighbours: the admission's padding check refuses it.  Kept for the benchmark.
"""
import logging
import os
import tempfile

import onnx

from .errors import ExportFailedError

INT8_OP_TYPES = ["MatMul", "Gemm"]
WEIGHT_TYPES = ("qint8", "quint8")
# Recorded in the manifest (backends.onnx.int8).  Static: activation scales calibrated at
# export, so a row's answer does not depend on the rows batched with it (dynamic quantization
# takes each activation's scale from the whole batch, which the serving admission's padding
# check refuses).  reduce_range: 7-bit weights.  Without VNNI, ONNX Runtime's u8s8 kernels add
# pairs of u8*s8 products in int16 (vpmaddubsw), which saturates with full 8-bit weights and
# flipped answers measurably (docs/PRECISION.md); the file may be served on any host, so
# always on.
# onnxruntime's logger severities: 2 (warnings, its default) and 3 (errors only)
ORT_DEFAULT_SEVERITY, ORT_ERRORS_ONLY = 2, 3
DEFAULT_INT8 = {"method": "static", "weight_type": "qint8", "per_channel": False,
                "reduce_range": True}
# Static activations are uint8 whatever the weights: ONNX Runtime's x86 QLinearMatMul kernels
# take u8 activations; with int8 ones it runs the QDQ graph at fp32 speed or slower
# (docs/PRECISION.md has both measured).
STATIC_ACTIVATION_TYPE = "quint8"
# Static MatMul/Gemm outputs: float (module docstring); "quint8" is kept for the benchmark.
MATMUL_OUTPUTS = ("float", "quint8")
STATIC_MATMUL_OUTPUTS = "float"
_QUANTIZED_OPS = ("MatMulInteger", "DynamicQuantizeMatMul", "QLinearMatMul", "QGemm",
                  "MatMulIntegerToFloat", "DequantizeLinear")


def fold_weights(src, dst):
    """``src`` with Constant(+Identity) weights turned into initializers -> ``dst``."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    quant_pre_process(src, dst, skip_symbolic_shape=True)
    return dst


def non_initializer_weights(model):
    """Names of MatMul/Gemm nodes whose weight (input 1) is not a graph initializer."""
    inits = {i.name for i in model.graph.initializer}
    return [n.name or n.output[0] for n in model.graph.node
            if n.op_type in INT8_OP_TYPES and n.input[1] not in inits]


def quantized_node_count(model):
    return sum(n.op_type in _QUANTIZED_OPS for n in model.graph.node)


def _weight_type(name):
    from onnxruntime.quantization import QuantType

    if name not in WEIGHT_TYPES:
        raise ExportFailedError(f"int8 weight_type {name!r} not valid; choose {list(WEIGHT_TYPES)}")
    return QuantType.QInt8 if name == "qint8" else QuantType.QUInt8


class _Calibration:
    """onnxruntime CalibrationDataReader over batches (tuples of the graph's inputs, in
    ``names`` order)."""

    def __init__(self, batches, names=("input_ids", "seq_len")):
        self._feeds = iter([dict(zip(names, b)) for b in batches])

    def get_next(self):
        return next(self._feeds, None)


def quantize_onnx(src, dst, method="dynamic", weight_type="qint8", per_channel=False,
                  reduce_range=True, calibration_batches=None,
                  input_names=("input_ids", "seq_len"), activation_type=STATIC_ACTIVATION_TYPE,
                  matmul_outputs=STATIC_MATMUL_OUTPUTS):
    """int8 copy of ``src`` at ``dst``; returns the facts recorded in the manifest.
    ``matmul_outputs`` (static): "float" or "quint8" (requantized, the quantizer's default)."""
    import onnxruntime as ort

    quiet = logging.getLogger().level
    logging.getLogger().setLevel(max(quiet, logging.WARNING))  # the quantizer logs every node
    # the quantizer's own sessions (shape inference, calibration) log a "Removing initializer
    # ... not used by any node" warning per unused paddle2onnx constant; errors still show
    ort.set_default_logger_severity(ORT_ERRORS_ONLY)
    try:
        return _quantize(src, dst, method, weight_type, per_channel, reduce_range,
                         calibration_batches, input_names, activation_type, matmul_outputs)
    finally:
        logging.getLogger().setLevel(quiet)
        ort.set_default_logger_severity(ORT_DEFAULT_SEVERITY)


def _quantize(src, dst, method, weight_type, per_channel, reduce_range, calibration_batches,
              input_names, activation_type, matmul_outputs):
    from onnxruntime.quantization import QuantFormat, quantize_dynamic, quantize_static

    with tempfile.TemporaryDirectory(prefix="ppvarlen-int8-") as work:
        folded = fold_weights(src, os.path.join(work, "folded.onnx"))
        left = non_initializer_weights(onnx.load(folded))
        if method == "dynamic":
            quantize_dynamic(folded, dst, op_types_to_quantize=INT8_OP_TYPES,
                             weight_type=_weight_type(weight_type), per_channel=per_channel,
                             reduce_range=reduce_range)
        elif method == "static":
            if not calibration_batches:
                raise ExportFailedError("static int8 needs calibration batches (train-split inputs)")
            if matmul_outputs not in MATMUL_OUTPUTS:
                raise ExportFailedError(f"int8 matmul_outputs {matmul_outputs!r} not valid; "
                                        f"choose {list(MATMUL_OUTPUTS)}")
            quantize_static(folded, dst, _Calibration(calibration_batches, input_names),
                            quant_format=QuantFormat.QDQ, op_types_to_quantize=INT8_OP_TYPES,
                            activation_type=_weight_type(activation_type),
                            weight_type=_weight_type(weight_type), per_channel=per_channel,
                            reduce_range=reduce_range,
                            extra_options={"OpTypesToExcludeOutputQuantization": INT8_OP_TYPES}
                            if matmul_outputs == "float" else {})
        else:
            raise ExportFailedError(f"int8 method {method!r} not valid; choose dynamic or static")
    quantized = quantized_node_count(onnx.load(dst, load_external_data=False))
    if not quantized:
        raise ExportFailedError(f"int8 quantization of {src} changed no MatMul/Gemm (weights still "
                                f"computed in the graph: {left[:3]}); export without int8")
    return {"method": method, "weight_type": weight_type,
            "activation_type": activation_type if method == "static" else "dynamic",
            "matmul_outputs": matmul_outputs if method == "static" else "float",
            "per_channel": per_channel, "reduce_range": reduce_range,
            "quantized_nodes": quantized,
            "unquantized_matmuls": len(left)}
