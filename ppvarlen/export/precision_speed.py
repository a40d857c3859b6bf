"""Which precisions were verified AND how fast each ran on the export host (manifest data).

``--verify`` already builds one runner per backend/precision for the parity
report; ``measure`` times them on the same batches (the test split, length-sorted
token-budget batches, else the shape grid), a few rounds interleaved so load from
other processes falls on all alike, best round kept.  ``manifest_section`` turns
parity + timings into ``manifest["precision_measured"]``::

    {"host": {...}, "batches": n, "examples": n, "math_threads": n,
     "paddle": {"fp32": {"verified": true, "agreement": 1.0, "max_abs_diff": 2e-6,
                         "examples_per_s": 812.0}, "bf16": {...}},
     "onnx":   {"fp32": {...}, "fp16": {...}, "int8": {...}}}

The deploy side (ppvarlen/runtime/precision_choice.py) reads it for
``--precision auto`` and for the slower-than-fp32 warning.
"""
import os
import platform
import time

from paddle.base import core

# parity backend name -> (manifest backend, precision).  ``paddle_inference`` (oneDNN off)
# is a parity check only: the deploy engine runs oneDNN.
PARITY_BACKENDS = {"paddle_inference_onednn": ("paddle", "fp32"),
                   "paddle_inference_onednn_bf16": ("paddle", "bf16"),
                   "onnx": ("onnx", "fp32"), "onnx_fp16": ("onnx", "fp16"),
                   "onnx_int8": ("onnx", "int8")}
MAX_BATCHES = 16
# Bounds export time for big models (ERNIE-base: a few thousand tokens/s per runner on 2 cores).
MAX_TOKENS = 20000
ROUNDS = 3


def _spread(batches, limit, max_tokens=MAX_TOKENS):
    """At most ``limit`` batches / about ``max_tokens`` real tokens, spread over the
    length-sorted list (short and long batches alike)."""
    picked = list(batches)
    if len(picked) > limit:
        step = len(picked) / limit
        picked = [picked[int(i * step)] for i in range(limit)]
    while len(picked) > 1 and sum(int(b[1].sum()) for b in picked) > max_tokens:
        picked = picked[::2]
    return picked


def one_pass(run, batches):
    """Seconds ``run(*inputs)`` takes over ``batches`` (tuples: ids, lengths, the task's own)."""
    start = time.perf_counter()
    for inputs in batches:
        run(*inputs)
    return time.perf_counter() - start


def measure(runners, batches, rounds=ROUNDS, max_batches=MAX_BATCHES):
    """{runner name: {"examples_per_s", "tokens_per_s"}} for the deployable runners."""
    timed = {name: run for name, run in runners.items() if name in PARITY_BACKENDS}
    batches = _spread(batches, max_batches)
    if not timed or not batches:
        return {}
    examples = sum(len(b[1]) for b in batches)
    tokens = sum(int(b[1].sum()) for b in batches)
    for run in timed.values():  # warm-up: oneDNN primitive caches, allocator
        run(*batches[0])
    best = dict.fromkeys(timed, float("inf"))
    for _ in range(rounds):
        for name, run in timed.items():
            best[name] = min(best[name], one_pass(run, batches))
    return {"batches": len(batches), "examples": examples, "tokens": tokens, "rounds": rounds,
            "runners": {name: {"examples_per_s": examples / s, "tokens_per_s": tokens / s}
                        for name, s in best.items()}}


def host():
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {"machine": platform.machine(), "processor": platform.processor() or None,
            "cpu_count": os.cpu_count(), "load_average_1m": load,
            "cpu_bf16": bool(core.supports_bfloat16()), "cpu_vnni": bool(core.supports_vnni())}


def manifest_section(report, refused=None, left_out=None):
    """parity report (with ``speed``) -> ``manifest["precision_measured"]``.  ``refused``:
    {(backend, precision): why} left out of the export by a gate (``verified`` false, ``refused``
    the reason); ``left_out``: {precision: {"status", "reason"}} never exported (e.g. bf16 on a
    CPU without bf16 instructions: "not verifiable here")."""
    speed = report.get("speed") or {}
    part = "test" if "test" in report["results"] else "grid"
    results = report["results"][part]
    refused = refused or {}
    gates = (report.get("metric_gate") or {}).get("gates", {})
    section = {"device": "cpu", "host": host(), "parity_on": part,
               "batches": speed.get("batches"), "examples": speed.get("examples"),
               "math_threads": speed.get("math_threads")}
    for name, (backend, precision) in PARITY_BACKENDS.items():
        if name not in results:
            continue
        r = results[name]
        entry = {"verified": (backend, precision) not in refused, "agreement": r["agreement"],
                 "max_abs_diff": r["max_abs_diff"]}
        if "max_prob_diff" in r:
            entry["max_prob_diff"] = r["max_prob_diff"]
        if name in gates:
            entry["metric_gate"] = gates[name]
        if (backend, precision) in refused:
            entry["refused"] = refused[backend, precision]
        entry.update((speed.get("runners") or {}).get(name, {}))
        if precision == "bf16":  # without bf16 instructions Paddle silently runs fp32 kernels
            entry["cpu_bf16"] = section["host"]["cpu_bf16"]
        section.setdefault(backend, {})[precision] = entry
    _add_left_out(section, left_out)
    return section


# the backend a precision left out of an export belongs to
LEFT_OUT_BACKEND = {"bf16": "paddle", "fp16": "onnx", "int8": "onnx"}


def left_out_section(left_out):
    """``manifest["precision_measured"]`` of an export not verified: only what was left out."""
    section = {"device": "cpu", "host": host()}
    _add_left_out(section, left_out)
    return section


def _add_left_out(section, left_out):
    for precision, why in (left_out or {}).items():
        backend = LEFT_OUT_BACKEND[precision]
        section.setdefault(backend, {})[precision] = {"verified": False, **why}
