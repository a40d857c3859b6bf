"""Which precisions an export offers by default, and the gate a reduced precision must pass.

``Export.precision: [auto]`` (the default) is every precision this host can verify:

* fp32 always (the reference files);
* bf16 when the Paddle format is written and the CPU has bf16 instructions
  (``paddle.base.core.supports_bfloat16()``: avx512_bf16 / AMX); without them Paddle Inference
  runs its fp32 kernels, so bf16 is recorded as *not verifiable here* with that reason;
* int8 (ONNX) -- the static, calibrated variant (``quantize.DEFAULT_INT8``) whose activation
  scales are fixed at export, so a text's answer does not depend on the texts batched with it;
* fp16 stays opt-in on CPU (ONNX Runtime's fp16 kernels target CUDA): *not offered by default*.

A precision left out is recorded (``left_out``: precision -> {status, reason}) in
``manifest["precision_measured"]``, never dropped silently.

The gate: each reduced precision runs the parity examples (the test split) and is judged by
the TASK's main metric against fp32's metric on the same examples (``METRIC_MAX_DROP``), or for
an embedding by its rows' mean cosine to fp32's (``MEAN_COSINE_MIN``); where the metric cannot
be computed at export (``gate_kind``) the parity agreement decides
(``parity.LOW_PRECISION_AGREEMENT``; ``row_cosine`` here is the one cosine both use).  A
precision that fails is *refused*: its files are left
out of the export, the others written, the numbers kept in parity.json and the manifest.
"""
import numpy as np
from paddle.base import core

AUTO = "auto"
NOT_VERIFIABLE = "not verifiable here"
NOT_DEFAULT = "not offered by default"

# A reduced precision's task metric (``Task.main_metric``: accuracy, entity F1, ...) may be at
# most this much lower than fp32's on the same examples (metrics in [0, 1]: half a point).
METRIC_MAX_DROP = 0.005
# A row-vector task (an output compared by cosine, an embedding): the rows' mean cosine with
# fp32's rows (retrieval metrics need pairs of texts, which the single-text graph never sees).
MEAN_COSINE_MIN = 0.99


def cpu_bf16():
    return bool(core.supports_bfloat16())


def resolve(formats, requested, fixed_precision=None, verify=True):
    """(precisions to export, {precision: {"status", "reason"}} left out) for ``requested``,
    which may hold ``auto``.  ``fixed_precision``: the reason a view exports fp32 only
    (seq2seq), else None.  Without ``verify`` auto is fp32: nothing is verified, and a reduced
    precision is offered only once it is."""
    explicit = [p for p in requested if p != AUTO]
    if AUTO not in requested:
        return explicit, {}
    left_out = {}
    if not verify:
        return ["fp32"] + [p for p in explicit if p != "fp32"], \
            {p: {"status": NOT_DEFAULT, "reason": "the export is not verified (--no-verify): "
                 "auto offers only precisions it verified"}
             for p in ("bf16", "fp16", "int8") if p not in explicit}
    if fixed_precision:  # an explicit reduced precision is still refused by the view
        return ["fp32"] + [p for p in explicit if p != "fp32"], \
            {p: {"status": NOT_DEFAULT, "reason": fixed_precision}
             for p in ("bf16", "fp16", "int8") if p not in explicit}
    chosen = ["fp32"]
    if "paddle" not in formats:
        left_out["bf16"] = {"status": NOT_VERIFIABLE, "reason": "bf16 runs the Paddle Inference "
                            "files and the export writes no paddle format"}
    elif not cpu_bf16():
        left_out["bf16"] = {"status": NOT_VERIFIABLE, "reason": "this CPU has no bf16 "
                            "instructions (avx512_bf16 / AMX): Paddle Inference would run its "
                            "fp32 kernels, so bf16 cannot be measured; export on a host with "
                            "them to verify bf16"}
    else:
        chosen.append("bf16")
    if "onnx" not in formats:
        left_out["int8"] = {"status": NOT_VERIFIABLE, "reason": "int8 is an ONNX Runtime "
                            "variant and the export writes no onnx format"}
    else:
        chosen.append("int8")
    left_out["fp16"] = {"status": NOT_DEFAULT, "reason": "fp16 on CPU runs ONNX Runtime's fp16 "
                        "path, made for CUDA and usually slower than fp32; ask for it with "
                        "--precision fp32,fp16"}
    chosen += [p for p in explicit if p not in chosen]
    return chosen, {p: r for p, r in left_out.items() if p not in chosen}


class _Rows:
    """What ``Task.engine_rows`` reads of a predictor, for parity's runners (whose tags are
    decoded already)."""
    crf_matrix = None

    def __init__(self, label_names):
        self.label_names = list(label_names)


def per_example(task, label_names, order, batch_outputs, batch_lengths):
    """A runner's outputs over the test batches -> one engine row per example, in the examples'
    order (``order``: the examples' indices in each batch)."""
    shim, rows = _Rows(label_names), [None] * sum(len(idx) for idx in order)
    for idx, out, seq_len in zip(order, batch_outputs, batch_lengths):
        for i, row in zip(idx, task.engine_rows(shim, out, seq_len)):
            rows[int(i)] = row
    return rows


def gate_kind(task, examples):
    """How ``task``'s reduced precisions are judged on ``examples``: "cosine" (an output
    compared by cosine), "metric" (the task's main metric, from its own report over the
    engine's rows), or None (the parity agreement decides): outputs scored per position
    (spans) are read by the report in another form than the engine gives, and unlabelled
    examples (an item without every field the task stores) have no metric."""
    specs = task.output_specs
    if any(s.get("compare") == "cosine" for s in specs):
        return "cosine"
    if any(s.get("per") == "position" for s in specs) or not task.main_metric:
        return None
    fields = [f.name for f in task.store_fields()]
    if not examples or not all(f in e for e in examples for f in fields):
        return None
    return "metric"


def task_metrics(task, examples, label_names, order, kept, lengths):
    """{runner: the gate's value} over the test examples; ``kept``: {runner: [outputs per
    batch]} (the reference ``dygraph`` included).  {} when the agreement gate decides."""
    kind = gate_kind(task, examples)
    if kind == "metric":
        return {name: float(task.report(examples, per_example(task, label_names, order, outs,
                                                              lengths),
                                        label_names)[task.main_metric])
                for name, outs in kept.items()}
    if kind == "cosine":
        key = next(s["name"] for s in task.output_specs if s.get("compare") == "cosine")
        ref = kept["dygraph"]
        return {name: float(np.mean(np.concatenate([row_cosine(a[key], b[key])
                                                    for a, b in zip(ref, outs)])))
                for name, outs in kept.items()}
    return {}


def judge(task, metrics, reference="dygraph"):
    """{runner: gate record} of each runner against ``reference``'s value: {"metric", "value",
    "fp32_value", "drop", "max_drop" | "min", "passed"}."""
    if not metrics:
        return {}
    if any(s.get("compare") == "cosine" for s in task.output_specs):
        return {name: {"metric": "mean_cosine_to_fp32", "value": v, "min": MEAN_COSINE_MIN,
                       "passed": v >= MEAN_COSINE_MIN}
                for name, v in metrics.items() if name != reference}
    base = metrics[reference]
    return {name: {"metric": task.main_metric, "value": v, "fp32_value": base, "drop": base - v,
                   "max_drop": METRIC_MAX_DROP, "passed": base - v <= METRIC_MAX_DROP + 1e-12}
            for name, v in metrics.items() if name != reference}


def row_cosine(a, b):
    """Cosine similarity of each row of ``a`` with the same row of ``b`` (float64; two
    all-zero rows count as equal, one all-zero row as orthogonal)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    na, nb = np.linalg.norm(a, axis=-1), np.linalg.norm(b, axis=-1)
    both_zero = (na == 0) & (nb == 0)
    cosine = (a * b).sum(-1) / np.maximum(na * nb, np.finfo(np.float64).tiny)
    return np.where(both_zero, 1.0, cosine)


def refusal(gate):
    """The reason a failed gate record refuses its precision (one line, with the numbers)."""
    if "fp32_value" in gate:
        return (f"{gate['metric']} {gate['value']:.4f} vs fp32 {gate['fp32_value']:.4f} on the "
                f"test examples: {gate['drop'] * 100:.2f} points lower, more than the "
                f"{gate['max_drop'] * 100:.2f} allowed")
    return f"{gate['metric']} {gate['value']:.4f} < {gate['min']}"
