"""Precision variants: how each is produced (fp16 ONNX file) or switched on at run time (bf16).

* fp32 - the exported files as they are.
* bf16 - Paddle Inference on CPU with oneDNN bfloat16 kernels; nothing new is
  written, it is a predictor setting recorded in the manifest (AMP and
  ``model.to(bfloat16)`` have no CPU kernels in Paddle 3.3.1).
* fp16 - an ONNX copy converted by onnxconverter-common (fp32 inputs/outputs
  kept, ``Cast`` blocked so the seq_len -> int32 cast stays intact, RNN cells
  blocked because ONNX Runtime's CPU LSTM/GRU have no fp16 kernels); on GPU, the
  Paddle Inference half-precision / TensorRT settings below (cannot run here).
"""
import onnx

PRECISIONS = ("fp32", "bf16", "fp16")
# Ops kept in fp32 in the fp16 ONNX file, on top of onnxconverter-common's defaults.
FP16_KEEP_FP32_OPS = ["Cast", "LSTM", "GRU", "RNN"]


def convert_onnx_fp16(src, dst):
    from onnxconverter_common import float16

    model = onnx.load(src)
    block = list(float16.DEFAULT_OP_BLOCK_LIST) + FP16_KEEP_FP32_OPS
    half = float16.convert_float_to_float16(model, keep_io_types=True, op_block_list=block)
    onnx.save(half, dst)
    return dst


def paddle_config(model_dir, precision="fp32", onednn=True, threads=2, device="cpu",
                  shape_ranges=None):
    """A ``paddle.inference.Config`` for ``{model_dir}/model.json`` in the given precision.

    This mirrors the run-time settings recorded in ``manifest.precisions`` (the
    deploy predictor applies the same ones without importing this module).
    """
    import paddle
    from paddle import inference

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
    from paddle.inference import PrecisionType

    mode = {"fp32": PrecisionType.Float32, "fp16": PrecisionType.Half,
            "bf16": PrecisionType.Bfloat16}[precision]
    config.enable_use_gpu(256, 0, mode)
    if shape_ranges:
        config.enable_tensorrt_engine(workspace_size=1 << 30, max_batch_size=1,
                                      min_subgraph_size=3, precision_mode=mode,
                                      use_static=False, use_calib_mode=False)
        config.set_trt_dynamic_shape_info(*trt_shape_dicts(shape_ranges))


def trt_shape_dicts(shape_ranges):
    """manifest ``shape_ranges`` -> (min, max, opt) dicts for ``set_trt_dynamic_shape_info``."""
    return tuple({name: list(r[key]) for name, r in shape_ranges.items()}
                 for key in ("min", "max", "opt"))


def manifest_entries(formats, precisions, onnx_fp16_file="onnx/model_fp16.onnx"):
    """What ``manifest.precisions`` says about each requested precision."""
    entries = {}
    for p in precisions:
        if p == "fp32":
            entries[p] = {"backends": list(formats)}
        elif p == "bf16":
            entries[p] = {"backends": ["paddle"], "device": "cpu",
                          "paddle_config": {"enable_onednn": True, "enable_onednn_bfloat16": True},
                          "note": "run-time setting; needs a CPU with AVX512-BF16/AMX for speed"}
        elif p == "fp16":
            entries[p] = {"backends": ["onnx"] if "onnx" in formats else [], "device": "cpu",
                          "onnx_file": onnx_fp16_file if "onnx" in formats else None,
                          "fp32_ops": FP16_KEEP_FP32_OPS, "keep_io_types": True,
                          "gpu": {"paddle_config": {"enable_use_gpu": [256, 0, "Half"],
                                                    "tensorrt": {"precision_mode": "Half",
                                                                 "dynamic_shape": "shape_ranges"}}}}
    return entries
