"""Seq2seq export: Paddle Inference with the greedy loop in the graph, ONNX encoder + one cached
decoder step with the loop in numpy, and a parity report over greedy OUTPUTS.

* ``paddle/model.json``: ``GreedyProgram`` through to_static (``InputSpec([None, None])``,
  traced once): (src_ids, src_len) -> tokens, the whole loop a PIR while op with early exit.
* ``onnx/encoder.onnx`` (src_ids, src_len) -> (cross_k, cross_v) and ``onnx/decoder_step.onnx``
  (tokens, src_len, self_k, self_v, cross_k, cross_v) -> (logp, new_self_k, new_self_v):
  paddle2onnx cannot take the while op, so ``ppvarlen.utils.search.greedy_search`` runs the loop.
* parity: the greedy ids of every backend must be IDENTICAL to the eager
  ``model.greedy_decode`` for every example (shape grid + test split); the decoder step's
  log-probs are also compared with the eager step on a few test batches (fp32 tolerance).

Only fp32 (``check_precisions`` says why bf16 / fp16 are refused).  A paddle2onnx trap, checked:
the step's int position arithmetic (``tokens * 0 + cache_len - 1``) is exported through float32
Casts; exact for ints < 2**24, i.e. any position table (tests/test_export_seq2seq.py).
Called by ``exporter.export_model`` for ``task == "seq2seq"`` (one atomic directory, manifest
and parity gate for every task).
"""
import os
import time

import numpy as np

from ..config import ConfigError
from ..utils.search import greedy_search, length_limits, strip_eos
from . import parity, static

ENCODER_OUTPUTS = ["cross_k", "cross_v"]
STEP_OUTPUTS = ["logp", "new_self_k", "new_self_v"]  # ONNX: output names != input names
# Paddle Inference without oneDNN (not how it is served) runs the shape grid only: over a whole
# g2p test split each greedy loop costs minutes on 2 shared cores.
GRID_ONLY = ("paddle_inference",)
MISMATCHES_KEPT = 5     # examples of differing outputs written to parity.json


def check_precisions(precisions):
    extra = [p for p in precisions if p != "fp32"]
    if extra:
        raise ConfigError(
            f"--precision / Export.precision: {extra} not supported for seq2seq exports, only "
            f"fp32. bf16: Paddle Inference 3.3.1 crashes (SIGSEGV in an oneDNN bf16 pass) "
            f"creating a predictor for the greedy while-loop program. fp16: not exported; the "
            f"contract is greedy outputs identical to the model, and one rounding-flipped "
            f"argmax changes every later token. Use --precision fp32")


def decoding_of(model):
    """manifest ``decoding``: what the exported loops do (taken from the model, not the config)."""
    return {"strategy": "greedy", "max_len_a": float(model.max_len_a),
            "max_len_b": int(model.max_len_b), "max_position": int(model.max_position),
            "bos_id": int(model.bos_id), "eos_id": int(model.eos_id), "pad_id": int(model.pad_id)}


def save_program(program, prefix):
    """An export view (EncoderProgram, ...) saved with its own input spec."""
    return static.save_program(program, prefix, program.input_spec())


def write_backends(model, name, tmp, work, formats, opset):
    """Write paddle/ and onnx/ into ``tmp`` -> the manifest ``backends`` dict."""
    from ..models.seq2seq import DecoderStepProgram, EncoderProgram, GreedyProgram

    model.eval()
    backends = {}
    if "paddle" in formats:
        os.makedirs(os.path.join(tmp, "paddle"), exist_ok=True)
        save_program(GreedyProgram(model), os.path.join(tmp, "paddle", "model"))
        backends["paddle"] = {"model": "paddle/model.json", "params": "paddle/model.pdiparams",
                              "outputs": ["tokens"], "decode": "in_graph",
                              "settings": {"fp32": {"enable_onednn": True}}}
    if "onnx" in formats:
        from .onnx_export import export_onnx

        os.makedirs(os.path.join(tmp, "onnx"), exist_ok=True)
        for part, program, outputs in (("encoder", EncoderProgram(model), ENCODER_OUTPUTS),
                                       ("decoder_step", DecoderStepProgram(model), STEP_OUTPUTS)):
            prefix = os.path.join(work, part, "model")
            save_program(program, prefix)
            info = export_onnx(prefix, os.path.join(tmp, "onnx", part + ".onnx"),
                               f"{name} {part}", outputs, opset, fix_rnn=False)
        backends["onnx"] = {
            "encoder": "onnx/encoder.onnx", "decoder_step": "onnx/decoder_step.onnx",
            "decode": "greedy_numpy", "opset": info["opset"], "session": info["session"],
            "encoder_outputs": ENCODER_OUTPUTS, "decoder_step_outputs": STEP_OUTPUTS,
            "cache": {"layers": len(model.decoder.layers), "heads": model.num_heads,
                      "head_dim": model.head_dim,
                      "layout": "[layers, B, heads, len, head_dim]; the self cache starts as "
                                "ONE zero slot (masked), see ppvarlen.utils.search"}}
    return backends


# ---------------------------------------------------------------- runners: (ids, len) -> lists

def dygraph_runner(model):
    return lambda src_ids, src_len: model.greedy_decode(src_ids, src_len)


def paddle_inference_runner(export_dir, eos_id, onednn=True, threads=2):
    from paddle import inference

    from .precision import paddle_config

    predictor = inference.create_predictor(
        paddle_config(os.path.join(export_dir, "paddle"), "fp32", onednn, threads))

    def run(src_ids, src_len):
        predictor.get_input_handle("src_ids").copy_from_cpu(src_ids)
        predictor.get_input_handle("src_len").copy_from_cpu(src_len)
        predictor.run()
        tokens = predictor.get_output_handle(predictor.get_output_names()[0]).copy_to_cpu()
        return strip_eos(tokens, eos_id)
    return run


def onnx_sessions(export_dir, threads=2):
    """(run_encoder, run_step) numpy callables over the two ONNX Runtime sessions."""
    import onnxruntime as ort

    from .onnx_export import ORT_DISABLED_OPTIMIZERS

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


def onnx_runner(export_dir, decoding, threads=2):
    run_encoder, run_step = onnx_sessions(export_dir, threads)

    def run(src_ids, src_len):
        limits = length_limits(src_len, decoding["max_len_a"], decoding["max_len_b"],
                               decoding["max_position"])
        return greedy_search(run_encoder, run_step, src_ids, src_len, decoding["bos_id"],
                             decoding["eos_id"], limits)
    return run


# ---------------------------------------------------------------- comparison

def compare_outputs(reference, backends, batches, validate=None):
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
    import paddle

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


def verify_export(model, meta, encoder, cfg, export_dir, formats, test_examples=None):
    """Greedy-output parity of every exported backend against the eager model -> parity.json."""
    from ..data.collate import Collator
    from ..utils.inputs import validate_batch

    decoding = decoding_of(model)
    max_position = decoding["max_position"]
    backends = {}
    if "paddle" in formats:
        backends["paddle_inference"] = paddle_inference_runner(export_dir, model.eos_id, False)
        backends["paddle_inference_onednn"] = paddle_inference_runner(export_dir, model.eos_id)
    if "onnx" in formats:
        backends["onnx"] = onnx_runner(export_dir, decoding)

    def validate(ids, sl):
        validate_batch(ids, sl, max_position=max_position, vocab_size=encoder.vocab_size,
                       pad_id=encoder.pad_id)

    max_len = int(min(meta["max_len"], max_position))
    first_id = min(6, encoder.vocab_size - 1)  # skip the special ids ([PAD]..[EOS] = 0..5)
    grid = parity.grid_batches(max_len, meta.get("buckets"), encoder.vocab_size, first_id)
    results = {"grid": compare_outputs(dygraph_runner(model), backends,
                                       [(ids, sl) for _, _, ids, sl in grid], validate)}
    test_batches, step = None, None
    if test_examples is not None:
        limit = cfg.Export.parity_max_examples
        items = [{"input_ids": list(e["src_ids"])} for e in
                 (test_examples if limit is None else test_examples[:limit])]
        _, batches = parity.split_batches(items, Collator(encoder.pad_id), cfg.Data.eval_max_tokens)
        test_batches = [(b["input_ids"], b["seq_len"]) for b in batches]
        served = {k: v for k, v in backends.items() if k not in GRID_ONLY}
        results["test"] = compare_outputs(dygraph_runner(model), served, test_batches, validate)
        if "onnx" in formats:  # the shortest, a middle and the longest batch
            picked = sorted({0, len(test_batches) // 2, len(test_batches) - 1})
            step = {"onnx": step_logp_diff(model, *onnx_sessions(export_dir),
                                           [test_batches[i] for i in picked])}
    failures = check(results, step)
    return {"task": "seq2seq", "model_name": meta.get("model_name"),
            "reference": "dygraph eager model.greedy_decode", "results": results,
            "step_logp": step, "precision": dict.fromkeys(backends, "fp32"),
            "failures": failures, "passed": not failures,
            "thresholds": {"identical_rate": 1.0, "step_logp_max_abs_diff": parity.FP32_TOL},
            "grid": {"lengths": sorted({n for n, _, _, _ in grid}),
                     "batch_sizes": sorted({b for _, b, _, _ in grid}), "batches": len(grid)},
            "test_batches": None if test_batches is None else len(test_batches)}


def check(results, step):
    failures = []
    for part, per_backend in results.items():
        for name, r in per_backend.items():
            if name != "dygraph" and r["examples"] and r["identical"] < r["examples"]:
                failures.append(f"{part}/{name}: {r['examples'] - r['identical']} of "
                                f"{r['examples']} greedy outputs differ from the eager model "
                                f"(first: {r['mismatches'][:1]})")
    for name, s in (step or {}).items():
        for key in ("max_abs_diff", "encoder_max_abs_diff"):
            if s[key] > parity.FP32_TOL:
                failures.append(f"step_logp/{name}: {key} {s[key]:.3g} > {parity.FP32_TOL}")
    return failures


def format_table(report):
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
