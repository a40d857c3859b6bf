"""Which precision to serve, from what the export verified and measured (manifest data).

``manifest["precision_measured"][backend][precision]`` (written by ``--verify``,
ppvarlen/export/precision_speed.py) says whether the precision passed the parity
gates and how many examples/s it ran on the export host's CPU.

* ``resolve(manifest, backend, "auto", device)`` -> the fastest verified precision
  of that backend, a reduced one only when >= ``AUTO_MIN_GAIN`` x fp32 (fp32 when
  nothing was measured, or on GPU: CPU timings say nothing about a GPU).
* an explicit precision is served as asked; on CPU, one measured slower than fp32
  logs a warning with both numbers (fp16 with no measurement: a warning too,
  ONNX Runtime's fp16 kernels are for CUDA).
* bf16 on a CPU without bf16 instructions (avx512_bf16 / AMX): Paddle Inference
  logs "CPU does not support BFLOAT16 calculations" at glog level and runs fp32
  kernels; that is said here as a warning, and ``auto`` never picks such a bf16.
"""
from ppvarlen.utils.log import get_logger

log = get_logger("deploy.precision")


def cpu_supports_bf16():
    from paddle.base import core

    return bool(core.supports_bfloat16())


def measured(manifest, backend):
    """{precision: entry} the export verified for ``backend`` (with examples/s when timed)."""
    section = (manifest.get("precision_measured") or {}).get(backend) or {}
    return {p: e for p, e in section.items() if isinstance(e, dict) and e.get("verified")}


def _speed(entry):
    return (entry or {}).get("examples_per_s")


# ``auto`` leaves fp32 only for a precision at least this much faster on the export host:
# the export's timing is a few interleaved rounds on a possibly shared CPU, and e.g. int8 of
# the BiGRU-CRF tagger (only its emission head quantizes) timed 1.04x fp32, within noise,
# for tags that differ from fp32's on 0.005% of tokens (docs/PRECISION.md).
AUTO_MIN_GAIN = 1.10


def fastest(manifest, backend):
    """The verified precision with the most examples/s; a reduced precision only when it
    beat fp32 by ``AUTO_MIN_GAIN`` (fp32 when none was timed)."""
    timed = {p: _speed(e) for p, e in measured(manifest, backend).items()
             if _speed(e) and (p != "bf16" or (e.get("cpu_bf16") and cpu_supports_bf16()))}
    if "fp32" in timed:
        timed = {p: v for p, v in timed.items() if p == "fp32" or v >= AUTO_MIN_GAIN * timed["fp32"]}
    if not timed:
        return "fp32"
    return max(sorted(timed), key=lambda p: timed[p])


def resolve(manifest, backend, precision, device="cpu"):
    """The precision to serve for a request of ``precision`` (``auto`` picks by measurement)."""
    if precision == "auto":
        if device != "cpu":
            log.info("--precision auto on %s: serving fp32 (the export's timings are from the "
                     "export host's CPU; pass --precision fp16/bf16 to choose)", device)
            return "fp32"
        chosen = fastest(manifest, backend)
        speeds = {p: round(_speed(e), 1) for p, e in measured(manifest, backend).items()
                  if _speed(e)}
        log.info("--precision auto: %s for backend %s (verified examples/s on the export host: "
                 "%s)", chosen, backend, speeds or "none measured")
        return chosen
    if device == "cpu":
        warn_if_slower(manifest, backend, precision)
        if precision == "bf16" and not cpu_supports_bf16():
            log.warning("precision bf16 requested but this CPU has no bf16 instructions "
                        "(avx512_bf16/AMX): Paddle Inference runs its fp32 kernels, so this is "
                        "fp32 in effect; use --precision fp32 (or int8 with --backend onnx)")
    return precision


def warn_if_slower(manifest, backend, precision):
    """Log (and return) a warning when ``precision`` was measured slower than fp32 on CPU."""
    if precision == "fp32":
        return None
    entries = (manifest.get("precision_measured") or {}).get(backend) or {}
    mine, ref = _speed(entries.get(precision)), _speed(entries.get("fp32"))
    message = None
    if mine and ref and mine < ref:
        message = (f"precision {precision} was measured SLOWER than fp32 on CPU for backend "
                   f"{backend} ({mine:.1f} vs {ref:.1f} examples/s on the export host); serving "
                   f"it anyway as requested — use --precision fp32 or auto")
    elif mine is None and precision == "fp16":
        message = (f"precision fp16 on CPU was not measured for backend {backend}; ONNX Runtime's "
                   f"fp16 kernels target CUDA and its CPU path usually runs slower than fp32")
    if message:
        log.warning(message)
    return message
