"""GPU settings of the Paddle Inference engine: one precision contract, refusals named.

Every requested precision/engine is used as asked or refused with a message,
never silently downgraded:

* ``gpu_precision_type``: fp32 -> Float32, fp16 -> Half, bf16 -> Bfloat16 (the
  ``PrecisionType`` members of Paddle 3.3.1's ``paddle.inference``; the third
  argument of ``Config.enable_use_gpu``).  int8 on GPU is refused: the export has
  no calibrated Paddle int8 program.
* TensorRT: Paddle 3 runs TensorRT on a PIR program (``model.json``) through an
  offline conversion, ``paddle.tensorrt.convert(model_prefix, TensorRTConfig)``,
  which writes a new program holding TensorRT engine ops; Paddle Inference then
  runs that program on GPU.  The legacy ``Config.enable_tensorrt_engine`` switch
  belongs to the old ProgramDesc pass pipeline and cannot be relied on for a PIR
  ``model.json``, so it is not used.  ``paddle.tensorrt`` exists only in GPU
  builds compiled with TensorRT; anywhere else ``--tensorrt`` is refused.
  The dynamic shape ranges come from the manifest (``shape_ranges``, derived from
  the training data's length profile).  This path could not be run here (no GPU).
"""
import os

from ppvarlen.config import ConfigError
from ppvarlen.runtime.manifest import UnservableExportError

GPU_PRECISIONS = ("fp32", "fp16", "bf16")


def require_cuda_paddle():
    import paddle

    if not paddle.device.is_compiled_with_cuda():
        raise ConfigError("device 'gpu' was requested but this Paddle build has no CUDA; "
                         "install paddlepaddle-gpu or use --device cpu")


def gpu_precision_type(precision):
    """The ``paddle.inference.PrecisionType`` for a GPU precision (refuses the others)."""
    from paddle.inference import PrecisionType

    if precision not in GPU_PRECISIONS:
        raise ConfigError(f"precision {precision!r} cannot run on GPU with the paddle backend; "
                         f"choose one of {list(GPU_PRECISIONS)}")
    return {"fp32": PrecisionType.Float32, "fp16": PrecisionType.Half,
            "bf16": PrecisionType.Bfloat16}[precision]


def tensorrt_module():
    """``paddle.tensorrt``, or a ValueError saying why TensorRT cannot run here."""
    import paddle

    if not paddle.device.is_compiled_with_cuda():
        raise ConfigError("--tensorrt needs a CUDA build of Paddle with TensorRT "
                         "(paddlepaddle-gpu); this Paddle build has no CUDA")
    try:
        import paddle.tensorrt as trt
    except ImportError as e:
        raise ConfigError(f"--tensorrt: this Paddle build has no paddle.tensorrt ({e}); Paddle 3 "
                         f"runs TensorRT on PIR programs only through paddle.tensorrt.convert. "
                         f"Install a paddlepaddle-gpu wheel built with TensorRT, or drop "
                         f"--tensorrt") from None
    return trt


def tensorrt_shapes(manifest, names):
    """{input name: (min, opt, max)} from ``manifest.shape_ranges`` (refuses a missing one)."""
    ranges = manifest.get("shape_ranges") or {}
    missing = [n for n in names if n not in ranges]
    if missing:
        raise UnservableExportError(f"TensorRT needs manifest.shape_ranges for every input; missing "
                                    f"{missing} — re-export")
    return {n: tuple(list(ranges[n][k]) for k in ("min", "opt", "max")) for n in names}


def convert_tensorrt(model_json, manifest, names, precision, out_dir):
    """``paddle.tensorrt.convert`` of ``model_json`` -> prefix of the TensorRT program.

    Unverified here (no GPU); follows the Paddle 3 "Paddle-TensorRT" API reference:
    ``Input(min_input_shape, optim_input_shape, max_input_shape)`` per input,
    ``TensorRTConfig(inputs=...)`` with ``precision_mode`` and ``save_model_dir``.
    """
    if not model_json.endswith(".json"):
        raise ConfigError(f"--tensorrt needs a PIR program (model.json); {model_json} is not one")
    trt = tensorrt_module()
    gpu_precision_type(precision)  # refuse int8 etc. before the slow conversion
    if precision == "bf16":
        raise ConfigError("--tensorrt with bf16 is not supported by paddle.tensorrt.PrecisionMode "
                         "for this export; use --precision fp16 or fp32")
    inputs = []
    for name, (lo, opt, hi) in tensorrt_shapes(manifest, names).items():
        spec = trt.Input(min_input_shape=tuple(lo), optim_input_shape=tuple(opt),
                         max_input_shape=tuple(hi), name=name)
        spec.input_data_type = "int64"
        spec.input_range = (1, 10)  # valid ids and lengths for the warm-up build
        inputs.append(spec)
    config = trt.TensorRTConfig(inputs=inputs)
    config.precision_mode = {"fp32": trt.PrecisionMode.FP32,
                             "fp16": trt.PrecisionMode.FP16}[precision]
    prefix = os.path.join(out_dir, f"model_trt_{precision}")
    config.save_model_dir = prefix
    trt.convert(model_json[:-len(".json")], config)
    return prefix
