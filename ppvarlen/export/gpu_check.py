"""``tools/check_gpu.py``: build every GPU configuration of an export, check it, time it.

On a CUDA machine: for each configuration (Paddle Inference fp32 / fp16 / bf16 /
TensorRT fp16, ONNX Runtime CUDA fp32 / fp16) build the deploy engine, compare it
with the CPU fp32 reference (Paddle Inference, else ONNX Runtime) on the
export's shape grid (parity.grid_batches from the manifest's max_len/buckets)
and, with ``test_batches``, on real test data; then time it.  Writes
``gpu_report.json``: one entry per configuration, ``status`` ok / failed (the
exception named) / parity_failed (the gate named).  Nothing is skipped: a
configuration the export lacks (e.g. no onnx backend) is reported as failed
with the reason.

Without a usable GPU (Paddle without CUDA or no device, and no CUDA provider in
onnxruntime) it says so and returns exit code 2.  Lives on the export side
because it reuses the parity grid and gates (deploy code never imports export).
"""
import time

import numpy as np
import paddle

from ..data.collate import Collator
from ..data.vocab import TextEncoder
from ppvarlen.runtime.backends import build_engine
from ppvarlen.runtime.manifest import load_manifest
from ..tasks import get_task
from ..utils.io import atomic_write_json
from ..utils.log import get_logger
from . import parity
from .exporter import load_test_split

log = get_logger("gpu_check")
NO_GPU_EXIT = 2
# (name, backend, precision, tensorrt)
CONFIGURATIONS = [("paddle_gpu_fp32", "paddle", "fp32", False),
                  ("paddle_gpu_fp16", "paddle", "fp16", False),
                  ("paddle_gpu_bf16", "paddle", "bf16", False),
                  ("paddle_tensorrt_fp16", "paddle", "fp16", True),
                  ("onnx_cuda_fp32", "onnx", "fp32", False),
                  ("onnx_cuda_fp16", "onnx", "fp16", False)]


def gpu_status():
    """(usable, why): is there a GPU that Paddle or onnxruntime can run on?"""
    import onnxruntime as ort
    reasons = []
    paddle_gpu = paddle.device.is_compiled_with_cuda()
    if paddle_gpu:
        count = paddle.device.cuda.device_count()
        paddle_gpu = count > 0
        if not count:
            reasons.append("Paddle is built with CUDA but sees no GPU device")
    else:
        reasons.append(f"Paddle {paddle.__version__} is a CPU build (no CUDA)")
    ort_gpu = "CUDAExecutionProvider" in ort.get_available_providers()
    if not ort_gpu:
        reasons.append(f"onnxruntime {ort.__version__} has no CUDAExecutionProvider "
                       f"(the onnxruntime-gpu extra of setup.py, docs/PRECISION.md)")
    return paddle_gpu or ort_gpu, "; ".join(reasons)


def _engine_runner(engine, outputs):
    names = [s["name"] for s in outputs]

    def run(*inputs):
        out = engine.run(*inputs)
        return {n: out[n] for n in names if n in out}
    return run


def _timed(run, batches, repeats=3):
    run(*batches[0])
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for inputs in batches:
            run(*inputs)
        best = min(best, time.perf_counter() - start)
    examples = sum(len(b[1]) for b in batches)
    return {"examples_per_s": examples / best, "seconds": best}


def check_export(export_dir, manifest, test_batches=None, gpu_id=0):
    """The gpu_report dict (see module docstring)."""
    backends = manifest["backends"]
    ref_backend = "paddle" if "paddle" in backends else "onnx"
    task = get_task(manifest["task"])
    outputs = task.output_specs
    reference = _engine_runner(build_engine(export_dir, manifest, ref_backend, device="cpu",
                                            precision="fp32"), outputs)
    rng = np.random.RandomState(0)
    tok = manifest["tokenizer"]
    grid = parity.grid_batches(int(manifest["max_len"]), manifest.get("buckets"),
                               int(tok["vocab_size"]), min(6, int(tok["vocab_size"]) - 1))
    sources = {"grid": [(ids, sl, *task.synthetic_inputs(ids, sl, rng))
                        for _, _, ids, sl in grid]}
    if test_batches:
        sources["test"] = list(test_batches)
    report = {"export_dir": export_dir, "reference": f"{ref_backend} cpu fp32",
              "test_data": bool(test_batches), "configurations": {}}
    for name, backend, precision, tensorrt in CONFIGURATIONS:
        entry = {"backend": backend, "precision": precision, "tensorrt": tensorrt}
        try:
            engine = build_engine(export_dir, manifest, backend, tensorrt=tensorrt, device="gpu",
                                  precision=precision, gpu_id=gpu_id)
            run = _engine_runner(engine, outputs)
            results = {part: parity.compare(reference, {name: run}, batches, outputs)
                       for part, batches in sources.items()}
            failures = parity.check(results, {name: precision})
            entry.update(parity={p: r[name] for p, r in results.items()}, failures=failures,
                         status="parity_failed" if failures else "ok",
                         **_timed(run, sources.get("test") or sources["grid"]))
        except Exception as e:  # each configuration's failure is named, the others still run
            entry.update(status="failed", error=f"{type(e).__name__}: {e}")
        log.info("%s: %s", name, entry["status"])
        report["configurations"][name] = entry
    report["passed"] = all(c["status"] == "ok" for c in report["configurations"].values())
    return report


class NoGpu(Exception):
    """This machine has no usable GPU: nothing can be checked (exit code NO_GPU_EXIT)."""


def run(export_dir, report_path, cfg=None, gpu_id=0):
    """Check every GPU configuration of ``export_dir`` (plus ``cfg``'s test split when given),
    write ``report_path`` and print one line per configuration -> True when all passed."""
    usable, why = gpu_status()
    if not usable:
        raise NoGpu(f"no usable GPU on this machine: {why}. Nothing was checked; run this on a "
                    f"CUDA host with paddlepaddle-gpu and/or onnxruntime-gpu installed.")
    manifest = load_manifest(export_dir)
    test_batches = _test_batches(cfg, export_dir, manifest) if cfg is not None else None
    report = check_export(export_dir, manifest, test_batches, gpu_id)
    atomic_write_json(report_path, report)
    for name, entry in report["configurations"].items():
        detail = entry.get("error") or "; ".join(entry.get("failures") or []) or \
            f"{entry['examples_per_s']:.1f} examples/s"
        print(f"{name:<22} {entry['status']:<14} {detail}")
    print(f"report: {report_path}")
    return report["passed"]


def _test_batches(cfg, export_dir, manifest):
    tok = manifest["tokenizer"]
    encoder = TextEncoder.load(export_dir, tok.get("kind"))
    task = get_task(manifest["task"])
    fields = task.store_fields()
    items = [{f.name: e[f.name] for f in fields}
             for e in load_test_split(cfg, encoder, manifest["task"])]
    _, batches = parity.split_batches(items, Collator(encoder.pad_id, fields=fields),
                                      cfg.Data.eval_max_tokens)
    return [tuple(b[s["name"]] for s in task.input_specs) for b in batches]
