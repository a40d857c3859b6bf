"""Precision variants: how each is produced (fp16 ONNX file) or switched on at run time (bf16).

* fp32 - the exported files as they are.
* bf16 - Paddle Inference on CPU with oneDNN bfloat16 kernels; nothing new is
  written, it is a predictor setting recorded in the manifest (AMP and
  ``model.to(bfloat16)`` have no CPU kernels in Paddle 3.3.1).
* fp16 - an ONNX copy converted by onnxconverter-common (fp32 inputs/outputs
  kept; RNN cells kept fp32 because ONNX Runtime's CPU LSTM/GRU have no fp16
  kernels); on GPU, the Paddle Inference half-precision / TensorRT settings
  below (cannot run here).  The graph's own ``Cast`` nodes stay fp32 too (the
  converter does not rewrite their ``to``, so converting around them gives type
  errors).  They are blocked by NAME (node_block_list): with
  onnxconverter-common 1.16, ``Cast`` in op_block_list loops forever, since each
  Cast it inserts around a blocked node is itself a blocked Cast.
* int8 - an ONNX copy with int8 MatMul/Gemm weights (export/quantize.py), CPU;
  Paddle Inference int8 is not produced (docs/PRECISION.md says why).
"""
import warnings

import onnx
import paddle
from paddle import inference
from paddle.inference import PrecisionType

PRECISIONS = ("fp32", "bf16", "fp16", "int8")
# Ops kept in fp32 in the fp16 ONNX file, on top of onnxconverter-common's defaults.
FP16_KEEP_FP32_OPS = ["LSTM", "GRU", "RNN"]


def convert_onnx_fp16(src, dst):
    from onnxconverter_common import float16

    model = onnx.load(src)
    block = list(float16.DEFAULT_OP_BLOCK_LIST) + FP16_KEEP_FP32_OPS
    casts = [n.name for n in model.graph.node if n.op_type == "Cast"]
    if len(set(casts)) != len(casts) or "" in casts:
        raise ValueError(f"{src}: Cast nodes need unique names to be kept fp32")
    with warnings.catch_warnings():
        # Expected: constants beyond fp16's range (e.g. the mask fill value) are clamped to
        # +-1e4 and tiny weights to +-1e-7; the parity report measures the effect.
        warnings.filterwarnings("ignore", message="the float32 number", category=UserWarning)
        half = float16.convert_float_to_float16(model, keep_io_types=True, op_block_list=block,
                                                node_block_list=casts)
    onnx.save(half, dst)
    return dst


def paddle_config(model_dir, precision="fp32", onednn=True, threads=2, device="cpu",
                  shape_ranges=None):
    """A ``paddle.inference.Config`` for ``{model_dir}/model.json`` in the given precision.

    Not the served settings: serving and the export's parity check of the served backends both
    build engines with ``ppvarlen.runtime.backends.build_engine``.  This config is for the
    diagnostics around them (Paddle Inference with oneDNN off, the GPU check, benchmarks).
    """
    config = inference.Config(f"{model_dir}/model.json", f"{model_dir}/model.pdiparams")
    config.disable_glog_info()
    if device == "gpu":
        if not paddle.is_compiled_with_cuda():
            raise ValueError("device gpu requested but this Paddle build has no CUDA; "
                             "install paddlepaddle-gpu or use device cpu")
        _gpu_settings(config, precision, shape_ranges)
        return config
    config.disable_gpu()
    config.set_cpu_math_library_num_threads(threads)
    if precision == "fp16":
        raise ValueError("fp16 on CPU runs through ONNX Runtime (onnx/model_fp16.onnx); "
                         "Paddle Inference CPU has no fp16 kernels")
    if precision == "bf16" and not onednn:
        raise ValueError("bf16 on CPU needs oneDNN (onednn=True)")
    if onednn:
        config.enable_onednn()
        if precision == "bf16":
            config.enable_onednn_bfloat16()
    else:
        config.disable_onednn()
    return config


def _gpu_settings(config, precision, shape_ranges):
    """GPU half precision and TensorRT dynamic shapes, per the Paddle Inference docs."""
    mode = {"fp32": PrecisionType.Float32, "fp16": PrecisionType.Half,
            "bf16": PrecisionType.Bfloat16}[precision]
    config.enable_use_gpu(256, 0, mode)
    if shape_ranges:  # the legacy switch does not apply to PIR programs
        raise ValueError("TensorRT on a PIR model.json goes through paddle.tensorrt.convert "
                         "(ppvarlen.runtime.gpu.convert_tensorrt), not Config.enable_tensorrt_engine")

