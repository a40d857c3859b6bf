"""Parity report: the exported graphs must compute what the dygraph model computes (PITFALLS 21).

What is compared follows the task's export view (``Task.export_view``):

* ``forward`` (classification, tagging): logits / emissions and argmax / tags
  (``verify_forward``);
* ``greedy`` (seq2seq): the decoded ids, which must be IDENTICAL to the eager
  ``model.greedy_decode`` for every example, plus the ONNX decoder step's log-probs
  against the eager step on a few test batches (``verify_greedy``).

Every backend (static program, Paddle Inference with oneDNN off/on, bf16,
ONNX Runtime fp32/fp16/int8) runs the same batches as the eager model, which is the
reference.  The served backends (Paddle Inference as served, bf16, every ONNX precision) are
built by the serving engine factory (``ppvarlen.runtime.backends.build_engine``) on the export
directory being written, with its manifest and ``Deploy.threads`` (``auto``: the usable
cores): what is checked is what
``serve`` and ``infer`` run, and ``parity.json["engines"]`` records each engine's settings.
Paddle Inference with oneDNN off (``paddle_inference``) is a diagnostic of the graph itself,
not a served setting.  Two batch sources:

* a shape grid - target lengths {1, 2, 7, each bucket boundary -1/0/+1,
  max_len} x batch sizes {1, 3, 32}; row 0 is the target, the other rows are
  neighbours of random lengths (shorter and longer), so padding is exercised;
* the real test split, batched with the shared length-sorted order helper.

Measured per backend: max |diff| of logits / emissions (real positions only)
and argmax / tag agreement; for a row vector the task marks ``"compare": "cosine"`` in its
output spec (an embedding: its argmax means nothing) the agreement is the share of rows whose
cosine with the eager row is >= ``COSINE_MIN``, and the lowest cosine is reported
(``min_cosine``).  fp32 backends must be within ``FP32_TOL`` with
100% agreement everywhere; bf16/fp16 need ``LOW_PRECISION_AGREEMENT`` on the
test split (their grid numbers are reported, not gated: random-id inputs have
near-tied logits that low precision may flip).
"""
import os
import time

import numpy as np
import paddle
from paddle import inference

from ..data.collate import Collator
from ..data.order import grid_lengths, length_sorted_batches
from ppvarlen.runtime import threads_choice
from ppvarlen.runtime.backends import build_engine
from ..tasks import get_task
from ..utils.inputs import validate_batch
from ..utils.search import greedy_search, length_limits, strip_eos
from ..utils.viterbi import crf_decode
from .onnx_export import ORT_DISABLED_OPTIMIZERS
from . import precision_gate
from .precision_gate import row_cosine
from .precision import paddle_config
from .precision_speed import measure

FP32_TOL = 1e-4
LOW_PRECISION_AGREEMENT = 0.995
COSINE_MIN = 0.9999  # a row vector compared by cosine (``compare: cosine``) agrees at or above
GRID_BATCH_SIZES = (1, 3, 32)
ENCODER_OUTPUTS = ["cross_k", "cross_v"]  # the seq2seq ONNX views' outputs
STEP_OUTPUTS = ["logp", "new_self_k", "new_self_v"]  # ONNX: output names != input names
# Paddle Inference without oneDNN (not how it is served) decodes the shape grid only: over a
# whole g2p test split each greedy loop costs minutes on 2 shared cores.
GREEDY_GRID_ONLY = ("paddle_inference",)
MISMATCHES_KEPT = 5     # examples of differing decoded outputs written to parity.json


# ---------------------------------------------------------------- backends

# A runner: ``run(*inputs) -> {output name: array}``; inputs in the task's ``input_specs`` order
# (the token-row contract: ids [B, L] first, their lengths [B] second, then the task's own).
# Outputs are named by the task's ``output_specs``, never guessed from their shapes.

def _names(specs):
    return [s if isinstance(s, str) else s["name"] for s in specs]


def dygraph_runner(model, outputs):
    """An eager ``paddle.nn.Layer`` (the model, or a loaded static program) as a runner."""
    model.eval()

    def run(*inputs):
        with paddle.no_grad():
            out = model(*(paddle.to_tensor(a) for a in inputs))
        return _named(out, outputs)
    return run


def static_runner(prefix, outputs):
    """The saved static program, run by ``paddle.jit.load`` (no inference passes)."""
    return dygraph_runner(paddle.jit.load(prefix), outputs)


def paddle_inference_runner(model_dir, outputs, precision="fp32", onednn=True, threads=2):
    predictor = inference.create_predictor(paddle_config(model_dir, precision, onednn, threads))

    def run(*inputs):
        for name, arr in zip(predictor.get_input_names(), inputs):
            predictor.get_input_handle(name).copy_from_cpu(np.ascontiguousarray(arr))
        predictor.run()
        return _named([predictor.get_output_handle(n).copy_to_cpu()
                       for n in predictor.get_output_names()], outputs)
    return run


def onnx_runner(path, outputs, crf=None, threads=2):
    """ONNX Runtime; with a ``crf`` matrix the last output (the tags) comes from the numpy
    Viterbi over the first (the emissions)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.log_severity_level = 3  # paddle2onnx graphs carry unused initializers
    session = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"],
                                   disabled_optimizers=ORT_DISABLED_OPTIMIZERS)
    names = _names(outputs)

    def run(*inputs):
        feed = {i.name: a for i, a in zip(session.get_inputs(), inputs)}
        arrays = session.run(None, feed)
        if crf is not None:
            arrays = arrays[:1] + [crf_decode(arrays[0], crf, inputs[1])]
        return _named(arrays, names)
    return run


def _named(out, outputs):
    """Model outputs -> {name: numpy array}, named in order by the task's ``output_specs``."""
    if not isinstance(out, (list, tuple)):
        out = [out]
    names = _names(outputs)
    # a graph may leave out trailing outputs (an emissions-only ONNX tagger: tags decoded aside)
    if not 1 <= len(out) <= len(names):
        raise ValueError(f"the graph gave {len(out)} outputs, the task declares {names}")
    return {n: o.numpy() if hasattr(o, "numpy") else np.asarray(o) for n, o in zip(names, out)}


def served_runner(export_dir, manifest, backend, precision, threads, outputs, crf=None):
    """(runner, engine settings) of ``backend``/``precision`` as the predictor serves it: the
    serving engine factory over the export directory and its manifest.  ONNX taggers decode
    their tags from the emissions with the CRF matrix, as the predictor does."""
    engine = build_engine(export_dir, manifest, backend, precision=precision, threads=threads)
    names = _names(outputs)

    def run(*inputs):
        out = engine.run(*inputs)
        if crf is not None and names[-1] not in out:
            out = dict(out, **{names[-1]: crf_decode(out[names[0]], crf, inputs[1])})
        return {n: out[n] for n in names}
    return run, engine.settings


# ---------------------------------------------------------------- greedy runners: -> id lists

def greedy_dygraph_runner(model):
    return lambda src_ids, src_len: model.greedy_decode(src_ids, src_len)


def greedy_paddle_runner(export_dir, eos_id, onednn=True, threads=2):
    """The exported greedy-loop program under Paddle Inference."""

    predictor = inference.create_predictor(
        paddle_config(os.path.join(export_dir, "paddle"), "fp32", onednn, threads))

    def run(src_ids, src_len):
        predictor.get_input_handle("src_ids").copy_from_cpu(src_ids)
        predictor.get_input_handle("src_len").copy_from_cpu(src_len)
        predictor.run()
        tokens = predictor.get_output_handle(predictor.get_output_names()[0]).copy_to_cpu()
        return strip_eos(tokens, eos_id)
    return run


def served_greedy_runner(export_dir, manifest, backend, threads):
    """(runner -> id lists, engine settings) of a seq2seq ``backend`` as the predictor serves
    it (the serving engine factory over the export directory)."""
    engine = build_engine(export_dir, manifest, backend, precision="fp32", threads=threads)
    eos_id = manifest["decoding"]["eos_id"]

    def run(src_ids, src_len):
        out = engine.run(src_ids, src_len)
        return out["output_ids"] if "output_ids" in out else strip_eos(out["tokens"], eos_id)
    return run, engine.settings


def onnx_step_sessions(export_dir, threads=2):
    """(run_encoder, run_step) numpy callables over the two ONNX Runtime sessions."""
    import onnxruntime as ort


    def session(part):
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.log_severity_level = 3  # paddle2onnx graphs carry unused initializers
        return ort.InferenceSession(os.path.join(export_dir, "onnx", part + ".onnx"), opts,
                                    providers=["CPUExecutionProvider"],
                                    disabled_optimizers=ORT_DISABLED_OPTIMIZERS)

    encoder, step = session("encoder"), session("decoder_step")
    step_inputs = [i.name for i in step.get_inputs()]

    def run_encoder(src_ids, src_len):
        return encoder.run(ENCODER_OUTPUTS, {"src_ids": src_ids, "src_len": src_len})

    def run_step(*arrays):
        return step.run(STEP_OUTPUTS, dict(zip(step_inputs, arrays)))
    return run_encoder, run_step


def onnx_greedy_runner(export_dir, decoding, threads=2):
    """ONNX encoder + decoder step with the greedy loop in numpy (ppvarlen.utils.search)."""
    run_encoder, run_step = onnx_step_sessions(export_dir, threads)

    def run(src_ids, src_len):
        limits = length_limits(src_len, decoding["max_len_a"], decoding["max_len_b"],
                               decoding["max_position"])
        return greedy_search(run_encoder, run_step, src_ids, src_len, decoding["bos_id"],
                             decoding["eos_id"], limits)
    return run


# ---------------------------------------------------------------- batches

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


def split_batches(examples, collate, max_tokens, max_batch_size=64, length_field="input_ids"):
    """Test-split batches in length-sorted order; ``examples`` are encoded dataset items."""
    lengths = np.array([len(e[length_field]) for e in examples], dtype=np.int64)
    order = length_sorted_batches(lengths, max_tokens, max_batch_size)
    return order, [collate([examples[i] for i in idx]) for idx in order]


# ---------------------------------------------------------------- comparison

class _Stats:
    """What is compared follows the output specs: every float output is a score (``"per":
    "row"``: one score vector per row, e.g. logits, label = argmax; ``"per": "token"``: one
    vector per real token, e.g. emissions, labels = the integer output decoded from them (tags)
    or their argmax; ``"per": "position"``: one score per real token [B, L], e.g. a span's start
    logits, label = the argmax position over the row's real tokens).  A ``"per": "row"`` output
    with ``"compare": "cosine"`` is a vector per row (an embedding): agreement = its cosine with
    the reference row >= ``COSINE_MIN``.  max |diff| and agreement are over all of them."""

    def __init__(self, outputs):
        self.max_abs_diff, self.agree, self.total = 0.0, 0, 0
        self.max_prob_diff = None  # per-row scores: max |diff| of softmax
        self.min_cosine = None  # per-row vectors compared by cosine: the lowest row's
        self.scores = [s for s in outputs if s["dtype"].startswith("float")]
        self.labels = next((s["name"] for s in outputs if s["dtype"].startswith("int")), None)

    def add(self, ref, got, seq_len):
        for spec in self.scores:
            key = spec["name"]
            a, b = ref[key], got[key]
            if a.shape != b.shape:
                raise ValueError(f"{key} shape {b.shape} != reference {a.shape}")
            getattr(self, "_add_" + spec.get("per", "row"))(ref, got, a, b, seq_len, spec)

    def _add_row(self, ref, got, a, b, seq_len, spec):
        self.max_abs_diff = max(self.max_abs_diff, float(np.abs(a - b).max()))
        if spec.get("compare") == "cosine":  # a vector per row (an embedding): no argmax
            cosine = row_cosine(a, b)
            self.min_cosine = min(1.0 if self.min_cosine is None else self.min_cosine,
                                  float(cosine.min()))
            self.agree += int((cosine >= COSINE_MIN).sum())
            self.total += a.shape[0]
            return
        prob_diff = float(np.abs(_softmax(a) - _softmax(b)).max())
        self.max_prob_diff = max(self.max_prob_diff or 0.0, prob_diff)
        self.agree += int((a.argmax(-1) == b.argmax(-1)).sum())
        self.total += a.shape[0]

    def _add_position(self, ref, got, a, b, seq_len, spec):
        real = np.arange(a.shape[1])[None, :] < seq_len[:, None]
        self.max_abs_diff = max(self.max_abs_diff, float(np.abs(a - b)[real].max()))
        low = np.finfo(np.float64).min  # pads never win the argmax
        self.agree += int((np.where(real, a, low).argmax(-1) ==
                           np.where(real, b, low).argmax(-1)).sum())
        self.total += a.shape[0]

    def _add_token(self, ref, got, a, b, seq_len, spec):
        real = np.arange(a.shape[1])[None, :] < seq_len[:, None]
        self.max_abs_diff = max(self.max_abs_diff, float(np.abs(a - b)[real].max()))
        ref_tags, got_tags = ref.get(self.labels), got.get(self.labels)
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
        if self.max_prob_diff is not None:
            out["max_prob_diff"] = self.max_prob_diff
        if self.min_cosine is not None:
            out["min_cosine"] = self.min_cosine
        return out


def _softmax(logits):
    z = np.exp(logits - logits.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


def compare(reference, backends, batches, outputs, validate=None, keep=None):
    """{backend: stats} over ``batches`` (tuples of the declared inputs: ids, lengths, ...),
    reference = the eager model; ``outputs``: the task's output specs.  ``keep``: a dict that
    receives {"dygraph" and each backend: [outputs per batch]} (for the task-metric gate)."""
    stats = {name: _Stats(outputs) for name in backends}
    for inputs in batches:
        if validate:
            validate(*inputs[:2])
        ref = reference(*inputs)
        if keep is not None:
            keep.setdefault("dygraph", []).append(ref)
        for name, run in backends.items():
            got = run(*inputs)
            stats[name].add(ref, got, inputs[1])
            if keep is not None:
                keep.setdefault(name, []).append(got)
    return {name: s.as_dict() for name, s in stats.items()}


def check(results, precisions_of):
    """Failures (list of str) of the parity gates; ``precisions_of[backend]`` -> fp32|bf16|fp16|int8."""
    return [message for _, message in check_each(results, precisions_of)]


def check_each(results, precisions_of):
    """[(backend, failure)] of the parity gates (``check``, with the backend each is about)."""
    failures = []
    for part, per_backend in results.items():
        for name, r in per_backend.items():
            if r["agreement"] is None:
                continue
            # vectors compared by cosine: agreement = the share of rows with cosine >= COSINE_MIN
            what = f"rows with cosine >= {COSINE_MIN} (lowest {r['min_cosine']:.6f})" \
                if "min_cosine" in r else "agreement"
            if precisions_of[name] == "fp32":
                if r["max_abs_diff"] > FP32_TOL:
                    failures.append((name, f"{part}/{name}: max |diff| {r['max_abs_diff']:.3g} "
                                           f"> {FP32_TOL}"))
                if r["agreement"] < 1.0:
                    failures.append((name, f"{part}/{name}: {what} {r['agreement']:.4%} < 100%"))
            elif part == "test" and r["agreement"] < LOW_PRECISION_AGREEMENT:
                failures.append((name, f"{part}/{name}: {what} {r['agreement']:.4%} < "
                                       f"{LOW_PRECISION_AGREEMENT:.1%}"))
    return failures


def format_table(results):
    cosine = any("min_cosine" in r for per_backend in results.values()
                 for r in per_backend.values())
    lines = [f"{'batches':<6} {'backend':<28} {'max|diff|':>11} {'agreement':>10} {'compared':>9}"
             + (f" {'min cosine':>12}" if cosine else "")]
    for part, per_backend in results.items():
        for name, r in per_backend.items():
            agree = "-" if r["agreement"] is None else f"{r['agreement']:.4%}"
            lines.append(f"{part:<6} {name:<28} {r['max_abs_diff']:>11.3g} {agree:>10} "
                         f"{r['compared']:>9}" + (f" {r['min_cosine']:>12.9f}"
                                                 if "min_cosine" in r else ""))
    return "\n".join(lines)


def run_parity(reference, backends, precisions_of, grid, outputs, test_batches=None,
               validate=None, grid_inputs=None, keep=None):
    """Compare every backend with the reference; returns the parity.json dict.  ``grid_inputs``
    (ids, lengths) -> the batch's full inputs (the task's ``synthetic_inputs`` added);
    ``keep``: receives each runner's outputs on the test batches (``compare``).

    ``failures`` (the export fails) are the fp32 backends'; a reduced precision that fails its
    gate is ``refused`` ({backend: reason}): left out of the export, the others written."""
    grid_inputs = grid_inputs or (lambda ids, sl: (ids, sl))
    results = {"grid": compare(reference, backends,
                               [grid_inputs(ids, sl) for _, _, ids, sl in grid], outputs,
                               validate)}
    if test_batches is not None:
        results["test"] = compare(reference, backends, test_batches, outputs, validate, keep)
    failures, refused = [], {}
    for name, message in check_each(results, precisions_of):
        if precisions_of[name] == "fp32":
            failures.append(message)
        else:
            refused.setdefault(name, message)
    return {"results": results, "precision": precisions_of, "failures": failures,
            "refused": refused, "passed": not failures,
            "thresholds": {"fp32_max_abs_diff": FP32_TOL, "fp32_agreement": 1.0,
                           "low_precision_test_agreement": LOW_PRECISION_AGREEMENT,
                           "cosine_min": COSINE_MIN},
            **batch_summary(grid, test_batches)}


def batch_summary(grid, test_batches):
    """The report's description of the batches it compared."""
    return {"grid": {"lengths": sorted({n for n, _, _, _ in grid}),
                     "batch_sizes": sorted({b for _, b, _, _ in grid}), "batches": len(grid)},
            "test_batches": None if test_batches is None else len(test_batches)}



# ---------------------------------------------------------------- greedy: decoded ids

def compare_decoded(reference, backends, batches, validate=None):
    """{name: identical count/rate, time, first mismatches} over ``batches`` [(ids, len)]."""
    names = ["dygraph"] + list(backends)
    runners = {"dygraph": reference, **backends}
    seconds = dict.fromkeys(names, 0.0)
    same = dict.fromkeys(backends, 0)
    mismatches = {n: [] for n in backends}
    examples = 0
    for src_ids, src_len in batches:
        if validate:
            validate(src_ids, src_len)
        outputs = {}
        for name in names:
            start = time.perf_counter()
            outputs[name] = runners[name](src_ids, src_len)
            seconds[name] += time.perf_counter() - start
        ref = outputs["dygraph"]
        for name in backends:
            for i, (want, got) in enumerate(zip(ref, outputs[name])):
                if want == got:
                    same[name] += 1
                elif len(mismatches[name]) < MISMATCHES_KEPT:
                    mismatches[name].append({"source_ids": src_ids[i, :src_len[i]].tolist(),
                                             "reference": want, "got": got})
        examples += len(ref)

    def timing(name):
        return {"seconds": round(seconds[name], 3),
                "sentences_per_s": round(examples / seconds[name], 1) if seconds[name] else None}

    results = {"dygraph": {"examples": examples, **timing("dygraph")}}
    for name in backends:
        results[name] = {"examples": examples, "identical": same[name],
                         "identical_rate": same[name] / examples if examples else None,
                         "mismatches": mismatches[name], **timing(name)}
    return results


def step_logp_diff(model, run_encoder, run_step, batches):
    """Max |log-prob diff| of the exported step vs the eager step, along the eager greedy path.

    Both get the same inputs at every step (the eager caches), so the number measures one step,
    not drift.  Columns the model never generates (-1e9: PAD, BOS) are left out.
    """
    worst_step, worst_memory, steps = 0.0, 0.0, 0
    with paddle.no_grad():
        for src_ids, src_len in batches:
            ids, lens = paddle.to_tensor(src_ids), paddle.to_tensor(src_len)
            cache = model.init_cache(model.encode(ids, lens))
            got_k, got_v = run_encoder(src_ids, src_len)
            worst_memory = max(worst_memory, float(np.abs(got_k - cache[2].numpy()).max()),
                               float(np.abs(got_v - cache[3].numpy()).max()))
            tokens = paddle.full([len(src_len), 1], model.bos_id, dtype="int64")
            finished = np.zeros(len(src_len), dtype=bool)
            for _ in range(int(model.length_limits(lens).max())):
                arrays = [tokens.numpy(), src_len] + [c.numpy() for c in cache]
                logp, self_k, self_v = model.decode_step(tokens, lens, *cache)
                got = run_step(*arrays)[0]
                ref = logp.numpy()
                real = ref > -1e8
                worst_step = max(worst_step, float(np.abs(got - ref)[real].max()))
                steps += 1
                tokens = logp.argmax(axis=-1, keepdim=True)
                cache = (self_k, self_v) + cache[2:]
                finished = np.logical_or(finished, tokens.numpy()[:, 0] == model.eos_id)
                if finished.all():
                    break
    return {"max_abs_diff": worst_step, "encoder_max_abs_diff": worst_memory, "steps": steps,
            "batches": len(batches)}


def check_decoded(results, step):
    """Failures of the greedy gates: any differing output, or a step beyond ``FP32_TOL``."""
    failures = []
    for part, per_backend in results.items():
        for name, r in per_backend.items():
            if name != "dygraph" and r["examples"] and r["identical"] < r["examples"]:
                failures.append(f"{part}/{name}: {r['examples'] - r['identical']} of "
                                f"{r['examples']} greedy outputs differ from the eager model "
                                f"(first: {r['mismatches'][:1]})")
    for name, s in (step or {}).items():
        for key in ("max_abs_diff", "encoder_max_abs_diff"):
            if s[key] > FP32_TOL:
                failures.append(f"step_logp/{name}: {key} {s[key]:.3g} > {FP32_TOL}")
    return failures


def format_decoded_table(report):
    lines = [f"{'batches':<6} {'backend':<26} {'examples':>8} {'identical':>10} {'sent/s':>8}"]
    for part, per_backend in report["results"].items():
        for name, r in per_backend.items():
            rate = "(ref)" if name == "dygraph" else f"{r['identical_rate']:.2%}"
            speed = "-" if r["sentences_per_s"] is None else f"{r['sentences_per_s']:.1f}"
            lines.append(f"{part:<6} {name:<26} {r['examples']:>8} {rate:>10} {speed:>8}")
    for name, s in (report.get("step_logp") or {}).items():
        lines.append(f"decoder step {name}: max |logp diff| {s['max_abs_diff']:.3g} over "
                     f"{s['steps']} steps of {s['batches']} test batches; encoder max |diff| "
                     f"{s['encoder_max_abs_diff']:.3g}")
    return "\n".join(lines)


# ---------------------------------------------------------------- the checks of an export

def parity_batches(meta, encoder, cfg, test_examples, field, max_position, task=None):
    """(validate, shape grid, test batches or None, (examples, order) or None) for an export's
    parity check; ``order`` holds the indices into ``examples`` of each test batch's rows.

    With a ``task``: test batches are the items collated by the task's field declarations, as
    tuples of its declared inputs.  Without: (ids, lengths) of the items' ``field`` (``src_ids``
    for seq2seq's decoded-ids check).
    """
    def validate(ids, sl):
        validate_batch(ids, sl, max_position=max_position, vocab_size=encoder.vocab_size,
                       pad_id=encoder.pad_id)

    max_len = int(min(meta["max_len"], max_position or meta["max_len"]))
    first_id = min(6, encoder.vocab_size - 1)  # skip the special ids ([PAD]..[EOS] = 0..5)
    grid = grid_batches(max_len, meta.get("buckets"), encoder.vocab_size, first_id)
    test_batches = picked = None
    if test_examples is not None:
        limit = cfg.Export.parity_max_examples
        examples = test_examples if limit is None else test_examples[:limit]
        if task is None:
            items, collate = [{"input_ids": list(e[field])} for e in examples], \
                Collator(encoder.pad_id)
            names = ["input_ids", "seq_len"]
        else:
            fields = task.store_fields()
            items = [{f.name: e[f.name] for f in fields if f.name in e} for e in examples]
            collate = Collator(encoder.pad_id, fields=fields)
            names = [s["name"] for s in task.input_specs]
        order, batches = split_batches(items, collate, cfg.Data.eval_max_tokens,
                                       length_field=next(f.name for f in collate.fields.values()
                                                         if f.length))
        test_batches = [tuple(b[n] for n in names) for b in batches]
        picked = (examples, order)
    return validate, grid, test_batches, picked


def verify_forward(model, meta, encoder, cfg, export_dir, manifest, paddle_prefix, formats,
                   precisions, crf=None, test_examples=None):
    """Parity of every exported backend/precision against the eager model -> parity.json dict
    (``engines``: the settings of each served engine checked)."""
    task = get_task(meta["task"])
    outputs = task.output_specs
    backends = {"static": static_runner(paddle_prefix, outputs)}
    precision_of = {"static": "fp32"}
    engines, threads = {}, threads_choice.count(cfg.Deploy.threads)

    def served(name, backend, precision, crf=None):
        backends[name], engines[name] = served_runner(export_dir, manifest, backend, precision,
                                                      threads, outputs, crf)
        precision_of[name] = precision

    if "paddle" in formats:
        # diagnostic only: the graph under Paddle Inference without oneDNN
        backends["paddle_inference"] = paddle_inference_runner(os.path.dirname(paddle_prefix),
                                                               outputs, onednn=False,
                                                               threads=threads)
        precision_of["paddle_inference"] = "fp32"
        served("paddle_inference_onednn", "paddle", "fp32")
        if "bf16" in precisions:
            served("paddle_inference_onednn_bf16", "paddle", "bf16")
    if "onnx" in formats:
        served("onnx", "onnx", "fp32", crf)
        for precision in ("fp16", "int8"):
            if precision in precisions:
                served(f"onnx_{precision}", "onnx", precision, crf)
    validate, grid, test_batches, picked = parity_batches(meta, encoder, cfg, test_examples,
                                                          None, meta.get("max_position"), task)
    rng = np.random.RandomState(0)

    def grid_inputs(ids, sl):
        return (ids, sl, *task.synthetic_inputs(ids, sl, rng))

    kept = {}
    report = run_parity(dygraph_runner(model, outputs), backends, precision_of, grid, outputs,
                        test_batches, validate, grid_inputs, kept)
    report["engines"] = engines
    if picked is not None:
        apply_metric_gate(report, task, meta["label_names"], picked, kept,
                          [b[1] for b in test_batches])
    # a short interleaved timing of every verified backend on the same batches (manifest
    # precision_measured: what --precision auto picks from)
    report["speed"] = measure(backends, test_batches or [grid_inputs(ids, sl)
                                                         for _, _, ids, sl in grid])
    report["speed"]["math_threads"] = threads  # every runner's (Deploy.threads, auto: cores)
    report["model_name"] = meta.get("model_name")
    return report


def apply_metric_gate(report, task, label_names, picked, kept, lengths):
    """The task's metric of every runner on the test examples, each reduced precision judged
    against the eager fp32 model's (``precision_gate``): ``report["metric_gate"]``, and a
    failed gate in ``report["refused"]``.  Where the task has a metric gate it replaces the
    agreement gate for reduced precisions (a user decides on the metric)."""
    examples, order = picked
    metrics = precision_gate.task_metrics(task, examples, label_names, order, kept, lengths)
    gates = precision_gate.judge(task, metrics)
    if not gates:
        return
    report["metric_gate"] = {"reference": "dygraph", "examples": len(examples),
                             "values": metrics,
                             "gates": {n: g for n, g in gates.items()
                                       if report["precision"].get(n) != "fp32"}}
    for name, gate in report["metric_gate"]["gates"].items():
        report["refused"].pop(name, None)
        if not gate["passed"]:
            report["refused"][name] = f"test/{name}: " + precision_gate.refusal(gate)


def verify_greedy(model, meta, encoder, cfg, export_dir, manifest, formats, decoding,
                  test_examples=None):
    """Greedy-output parity of every exported backend against the eager model -> parity.json
    (``engines``: the settings of each served engine checked)."""
    backends, engines, threads = {}, {}, threads_choice.count(cfg.Deploy.threads)
    if "paddle" in formats:  # oneDNN off: a diagnostic of the graph, decoded on the grid only
        backends["paddle_inference"] = greedy_paddle_runner(export_dir, model.eos_id, False,
                                                            threads)
        backends["paddle_inference_onednn"], engines["paddle_inference_onednn"] = \
            served_greedy_runner(export_dir, manifest, "paddle", threads)
    if "onnx" in formats:
        backends["onnx"], engines["onnx"] = served_greedy_runner(export_dir, manifest, "onnx",
                                                                 threads)
    validate, grid, test_batches, _ = parity_batches(meta, encoder, cfg, test_examples, "src_ids",
                                                  decoding["max_position"])
    reference = greedy_dygraph_runner(model)
    results = {"grid": compare_decoded(reference, backends, [(ids, sl) for _, _, ids, sl in grid],
                                       validate)}
    step = None
    if test_batches is not None:
        served = {k: v for k, v in backends.items() if k not in GREEDY_GRID_ONLY}
        results["test"] = compare_decoded(reference, served, test_batches, validate)
        if "onnx" in formats:  # the shortest, a middle and the longest batch
            picked = sorted({0, len(test_batches) // 2, len(test_batches) - 1})
            step = {"onnx": step_logp_diff(model, *onnx_step_sessions(export_dir),
                                           [test_batches[i] for i in picked])}
    failures = check_decoded(results, step)
    return {"task": meta["task"], "model_name": meta.get("model_name"),
            "reference": "dygraph eager model.greedy_decode", "results": results,
            "step_logp": step, "precision": dict.fromkeys(backends, "fp32"), "engines": engines,
            "failures": failures, "passed": not failures,
            "thresholds": {"identical_rate": 1.0, "step_logp_max_abs_diff": FP32_TOL},
            **batch_summary(grid, test_batches)}
