"""Parity report: the exported graphs must compute what the dygraph model computes (PITFALLS 21).

Every backend (static program, Paddle Inference with oneDNN off/on, bf16,
ONNX Runtime fp32/fp16) runs the same batches as the eager model, which is the
reference.  Two batch sources:

* a shape grid - target lengths {1, 2, 7, each bucket boundary -1/0/+1,
  max_len} x batch sizes {1, 3, 32}; row 0 is the target, the other rows are
  neighbours of random lengths (shorter and longer), so padding is exercised;
* the real test split, batched with the shared length-sorted order helper.

Measured per backend: max |diff| of logits / emissions (real positions only)
and argmax / tag agreement.  fp32 backends must be within ``FP32_TOL`` with
100% agreement everywhere; bf16/fp16 need ``LOW_PRECISION_AGREEMENT`` on the
test split (their grid numbers are reported, not gated: random-id inputs have
near-tied logits that low precision may flip).
"""
import numpy as np

from ..data.order import length_sorted_batches
from ..utils.viterbi import crf_decode

FP32_TOL = 1e-4
LOW_PRECISION_AGREEMENT = 0.995
GRID_BATCH_SIZES = (1, 3, 32)


# ---------------------------------------------------------------- backends

def dygraph_runner(model):
    """An eager ``paddle.nn.Layer`` (the model, or a loaded static program) as a runner."""
    import paddle

    model.eval()

    def run(input_ids, seq_len):
        with paddle.no_grad():
            out = model(paddle.to_tensor(input_ids), paddle.to_tensor(seq_len))
        return _named(out)
    return run


def static_runner(prefix):
    """The saved static program, run by ``paddle.jit.load`` (no inference passes)."""
    import paddle

    return dygraph_runner(paddle.jit.load(prefix))


def paddle_inference_runner(model_dir, precision="fp32", onednn=True, threads=2):
    from paddle import inference

    from .precision import paddle_config

    predictor = inference.create_predictor(paddle_config(model_dir, precision, onednn, threads))

    def run(input_ids, seq_len):
        predictor.get_input_handle("input_ids").copy_from_cpu(input_ids)
        predictor.get_input_handle("seq_len").copy_from_cpu(seq_len)
        predictor.run()
        return _named([predictor.get_output_handle(n).copy_to_cpu()
                       for n in predictor.get_output_names()])
    return run


def onnx_runner(path, crf=None, threads=2):
    """ONNX Runtime; with a ``crf`` matrix the tags come from the numpy Viterbi."""
    import onnxruntime as ort

    from .onnx_export import ORT_DISABLED_OPTIMIZERS

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.log_severity_level = 3  # paddle2onnx graphs carry unused initializers
    session = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"],
                                   disabled_optimizers=ORT_DISABLED_OPTIMIZERS)

    def run(input_ids, seq_len):
        out = _named(session.run(None, {"input_ids": input_ids, "seq_len": seq_len}))
        if crf is not None:
            out["tags"] = crf_decode(out["emissions"], crf, seq_len)
        return out
    return run


def _named(out):
    """Model outputs -> {"logits"} or {"emissions", "tags"} numpy arrays."""
    if not isinstance(out, (list, tuple)):
        out = [out]
    arrays = [o.numpy() if hasattr(o, "numpy") else np.asarray(o) for o in out]
    if len(arrays) == 1:
        return {"logits" if arrays[0].ndim == 2 else "emissions": arrays[0]}
    return {"emissions": arrays[0], "tags": arrays[1]}


# ---------------------------------------------------------------- batches

def grid_lengths(max_len, buckets):
    lengths = {1, 2, 7, max_len}
    for b in buckets or []:
        lengths.update({b - 1, b, b + 1})
    return sorted(n for n in lengths if 1 <= n <= max_len)


def grid_batches(max_len, buckets, vocab_size, first_id, seed=0, batch_sizes=GRID_BATCH_SIZES):
    """[(target_len, batch_size, input_ids, seq_len)]: the target in row 0, random neighbours."""
    rng = np.random.RandomState(seed)
    out = []
    for length in grid_lengths(max_len, buckets):
        for bsz in batch_sizes:
            lens = rng.randint(1, min(max_len, max(2 * length, 16)) + 1, size=bsz)
            lens[0] = length
            ids = np.zeros((bsz, int(lens.max())), dtype=np.int64)
            for i, n in enumerate(lens):
                ids[i, :n] = rng.randint(first_id, vocab_size, size=n)
            out.append((length, bsz, ids, lens.astype(np.int64)))
    return out


def split_batches(examples, collate, max_tokens, max_batch_size=64):
    """Test-split batches in length-sorted order; ``examples`` are encoded dataset items."""
    lengths = np.array([len(e["input_ids"]) for e in examples], dtype=np.int64)
    order = length_sorted_batches(lengths, max_tokens, max_batch_size)
    return order, [collate([examples[i] for i in idx]) for idx in order]


# ---------------------------------------------------------------- comparison

class _Stats:
    def __init__(self):
        self.max_abs_diff, self.agree, self.total = 0.0, 0, 0
        self.max_prob_diff = None  # [precision/int8] classification: max |diff| of softmax

    def add(self, ref, got, seq_len):
        key = "logits" if "logits" in ref else "emissions"
        a, b = ref[key], got[key]
        if a.shape != b.shape:
            raise ValueError(f"{key} shape {b.shape} != reference {a.shape}")
        if key == "logits":
            self.max_abs_diff = max(self.max_abs_diff, float(np.abs(a - b).max()))
            prob_diff = float(np.abs(_softmax(a) - _softmax(b)).max())  # [precision/int8]
            self.max_prob_diff = max(self.max_prob_diff or 0.0, prob_diff)
            self.agree += int((a.argmax(-1) == b.argmax(-1)).sum())
            self.total += a.shape[0]
            return
        real = np.arange(a.shape[1])[None, :] < seq_len[:, None]
        self.max_abs_diff = max(self.max_abs_diff, float(np.abs(a - b)[real].max()))
        ref_tags, got_tags = ref.get("tags"), got.get("tags")
        if ref_tags is None or got_tags is None:  # argmax taggers without in-graph decode
            ref_tags, got_tags = a.argmax(-1), b.argmax(-1)
        width = min(ref_tags.shape[1], got_tags.shape[1])
        real = real[:, :width]
        self.agree += int((ref_tags[:, :width] == got_tags[:, :width])[real].sum())
        self.total += int(real.sum())

    def as_dict(self):
        out = {"max_abs_diff": self.max_abs_diff,
               "agreement": self.agree / self.total if self.total else None,
               "compared": self.total}
        if self.max_prob_diff is not None:  # [precision/int8]
            out["max_prob_diff"] = self.max_prob_diff
        return out


def _softmax(logits):  # [precision/int8]
    z = np.exp(logits - logits.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


def compare(reference, backends, batches, validate=None):
    """{backend: stats} over ``batches`` [(input_ids, seq_len)], reference = the eager model."""
    stats = {name: _Stats() for name in backends}
    for input_ids, seq_len in batches:
        if validate:
            validate(input_ids, seq_len)
        ref = reference(input_ids, seq_len)
        for name, run in backends.items():
            stats[name].add(ref, run(input_ids, seq_len), seq_len)
    return {name: s.as_dict() for name, s in stats.items()}


def check(results, precisions_of):
    """Failures (list of str) of the parity gates; ``precisions_of[backend]`` -> fp32|bf16|fp16|int8."""
    failures = []
    for part, per_backend in results.items():
        for name, r in per_backend.items():
            if r["agreement"] is None:
                continue
            if precisions_of[name] == "fp32":
                if r["max_abs_diff"] > FP32_TOL:
                    failures.append(f"{part}/{name}: max |diff| {r['max_abs_diff']:.3g} > {FP32_TOL}")
                if r["agreement"] < 1.0:
                    failures.append(f"{part}/{name}: agreement {r['agreement']:.4%} < 100%")
            elif part == "test" and r["agreement"] < LOW_PRECISION_AGREEMENT:
                failures.append(f"{part}/{name}: agreement {r['agreement']:.4%} < "
                                f"{LOW_PRECISION_AGREEMENT:.1%}")
    return failures


def format_table(results):
    lines = [f"{'batches':<6} {'backend':<28} {'max|diff|':>11} {'agreement':>10} {'compared':>9}"]
    for part, per_backend in results.items():
        for name, r in per_backend.items():
            agree = "-" if r["agreement"] is None else f"{r['agreement']:.4%}"
            lines.append(f"{part:<6} {name:<28} {r['max_abs_diff']:>11.3g} {agree:>10} "
                         f"{r['compared']:>9}")
    return "\n".join(lines)


def run_parity(reference, backends, precisions_of, grid, test_batches=None, validate=None):
    """Compare every backend with the reference; returns the parity.json dict."""
    results = {"grid": compare(reference, backends, [(ids, sl) for _, _, ids, sl in grid], validate)}
    if test_batches is not None:
        results["test"] = compare(reference, backends, test_batches, validate)
    failures = check(results, precisions_of)
    return {"results": results, "precision": precisions_of, "failures": failures,
            "passed": not failures,
            "thresholds": {"fp32_max_abs_diff": FP32_TOL, "fp32_agreement": 1.0,
                           "low_precision_test_agreement": LOW_PRECISION_AGREEMENT},
            "grid": {"lengths": sorted({n for n, _, _, _ in grid}),
                     "batch_sizes": sorted({b for _, b, _, _ in grid}), "batches": len(grid)},
            "test_batches": None if test_batches is None else len(test_batches)}

