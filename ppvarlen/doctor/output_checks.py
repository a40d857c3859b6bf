"""Checks 2-5: what the model's outputs do under padding, batching, empty rows and float16.

Each runs the loaded model's row runner on controlled rows (random ordinary ids, special
tokens where the serving path adds them) and judges with ``ppvarlen.runtime.row_checks``, the
functions the serving admission check uses.
"""
import numpy as np

from ppvarlen.runtime.row_checks import (RTOL, InputRefused, ModelRaised, batch_difference,
                                        nonfinite_outputs, padding_difference)

from .model import seeded
from .report import FAIL, NOT_APPLICABLE, PASS, CheckResult

CONTENT_LENGTHS = (3, 7, 12)  # tokens of text in the rows checked (special tokens added)
EXTRA_PADS = (1, 8, 32)  # positions of padding added beyond a row's own length
COMPANION_LENGTHS = (1, 40)  # a one-token and a long text beside the row checked
# an fp16 answer counts as flipped only where fp32's top two differ by more than this (a
# closer call is rounding, not a broken mask)
FLIP_MARGIN = 0.1
# absolute part of the "same output" tolerance (row_checks): a random-init model's logits are
# small, and padding that leaks into them can move them by less than serving's ATOL
ATOL = 1e-6


def _fits(model, room):
    """Content lengths whose rows, with special tokens and ``room`` more positions, fit."""
    longest = model.longest_run()
    lengths = [n for n in CONTENT_LENGTHS
               if longest is None or n + model.specials() + room <= longest]
    return lengths or [1]


def _unmapped(number, title, model):
    return CheckResult(number, title, NOT_APPLICABLE,
                       f"the graph's inputs {model.unmapped} cannot be mapped to token ids, "
                       f"mask, lengths, segments or positions: the model is not run",
                       {"inputs": [i.as_dict() for i in model.inputs]},
                       "rename the inputs (input_ids, attention_mask, token_type_ids, seq_len, "
                       "position_ids) or check the model through its PaddleNLP directory")


def _deltas_text(totals):
    """Float outputs by their largest |delta|; integer outputs (decoded tags, ids) as labels:
    the same or not, since a difference of label ids is no distance."""
    deltas, scales = totals["max_abs_delta"], totals["scale"]
    shown = [f"{d:.2g} ({name}" + (f", relative {d / scales[name]:.1g})"
                                   if scales.get(name) and 0 < d < float("inf") else ")")
             for name, d in sorted(deltas.items(), key=lambda kv: -kv[1])
             if name not in totals["label_outputs"]]
    runs = totals["runs"]
    said = [f"{name} " + (f"identical in all {runs} runs" if not differ else
                          f"differ in {differ} of {runs} runs")
            for name, differ in sorted(totals["label_outputs"].items())]
    return "; ".join(([f"max |delta| {', '.join(shown[:3])} over {runs} runs"] if shown else [])
                     + said) or "no outputs compared"


def _merge(into, reference, difference):
    """Add one comparison (``reference``: the row's outputs it was compared from) to ``into``."""
    for name, delta in difference["max_abs_delta"].items():
        if reference[name].dtype.kind in "iub":
            into["label_outputs"][name] = into["label_outputs"].get(name, 0) + int(delta != 0)
            continue
        value = float("inf") if delta is None else delta
        into["max_abs_delta"][name] = max(into["max_abs_delta"].get(name, 0.0), value)
        into["scale"][name] = max(into["scale"].get(name, 0.0), difference["scale"][name])
    for name in difference["changed_answers"]:
        into["changed_answers"][name] = into["changed_answers"].get(name, 0) + 1
    into["runs"] += 1
    into["differing_runs"] += 0 if difference["same"] else 1


def _totals():
    return {"max_abs_delta": {}, "scale": {}, "label_outputs": {}, "changed_answers": {},
            "runs": 0, "differing_runs": 0, "tolerance": f"|delta| <= {ATOL:g} + {RTOL:g} x scale; "
                                              f"integer outputs (labels, tags) must be equal"}


# ---------------------------------------------------------------- 2. padding invariance

def check_padding(model, texts=None):
    title = "padding invariance"
    if model.run is None:
        return _unmapped(2, title, model)
    if model.fixed_length:
        return CheckResult(2, title, NOT_APPLICABLE,
                           f"the graph takes only length {model.fixed_length}: every row is "
                           f"padded to it, so its padding cannot vary (check 1)")
    longest = model.longest_run()
    rng, totals, extras = seeded(2), _totals(), set()
    try:
        for n in _fits(model, 1):
            row = model.random_row(rng, n)
            for k in [k for k in EXTRA_PADS if longest is None or len(row) + k <= longest] or [1]:
                extras.add(k)
                _merge(totals, *padding_difference(model.run, row, k, ATOL))
    except InputRefused as e:
        return CheckResult(2, title, NOT_APPLICABLE, f"the serving path refuses padded rows: {e}")
    except ModelRaised as e:
        return CheckResult(2, title, FAIL, f"a row padded further makes the model raise: {e}",
                           totals, "the model must take any padded length up to its limit",
                           [9, 20])
    extras = sorted(extras)
    evidence = dict(totals, extra_pads=extras, rows=len(_fits(model, 1)))
    deltas = _deltas_text(totals)
    changed = sum(totals["changed_answers"].values())
    if not totals["differing_runs"]:
        return CheckResult(2, title, PASS, f"{deltas} (each row alone vs padded "
                           f"{'/'.join(map(str, extras))} further); no "
                           f"answer changed", evidence, pitfalls=[9, 15])
    return CheckResult(2, title, FAIL,
                       f"padding changes the outputs: {deltas}; "
                       f"{totals['differing_runs']} of {totals['runs']} padded runs differ, "
                       f"{changed} answer(s) changed (extra pads {'/'.join(map(str, extras))})",
                       evidence, _padding_fix(model), [7, 9, 15])


def _padding_fix(model):
    config_pad = model.config.get("pad_token_id")
    if model.dygraph and "mask" not in model.roles.values() and config_pad is not None and \
            int(config_pad) != model.pad_id:
        return (f"the model masks input_ids == pad_token_id ({config_pad} in config.json) but "
                f"the tokenizer pads with {model.pad_id}, so no pad is ever masked: set "
                f"pad_token_id to {model.pad_id} in config.json, or pass attention_mask "
                f"(tokenizer(..., return_attention_mask=True))")
    return ("pads reach the output: pass the attention mask (or seq_len) to every attention "
            "layer, and pool with a masked mean that divides by the real length "
            "(ppvarlen.models.masks: masked_mean, key_padding_mask)")


# ---------------------------------------------------------------- 3. batch invariance

def check_batch(model, texts=None):
    title = "batch invariance"
    if model.run is None:
        return _unmapped(3, title, model)
    if model.fixed_batch == 1:
        return CheckResult(3, title, NOT_APPLICABLE, "the graph's batch is fixed at 1: every "
                           "row runs alone (check 1)")
    rng, totals = seeded(3), _totals()
    longest = model.longest_run()
    companions = [model.random_row(rng, n if longest is None else
                                   max(1, min(n, longest - model.specials())))
                  for n in COMPANION_LENGTHS]
    width = model.fixed_length or max(len(r) for r in companions)
    try:
        for n in _fits(model, 0):
            row = model.random_row(rng, n)
            _merge(totals, *batch_difference(model.run, row, companions,
                                             width=max(width, len(row)), atol=ATOL))
    except InputRefused as e:
        return CheckResult(3, title, NOT_APPLICABLE, f"the serving path refuses the batch: {e}")
    except ModelRaised as e:
        return CheckResult(3, title, FAIL, f"a batch of several rows makes the model raise: {e}",
                           totals, "the model must take a batch of rows of any lengths", [9])
    evidence = dict(totals, companion_lengths=[len(r) for r in companions], width=width)
    deltas = _deltas_text(totals)
    if not totals["differing_runs"]:
        return CheckResult(3, title, PASS, f"{deltas}: each row alone vs beside "
                           f"rows of {'/'.join(str(len(r)) for r in companions)} tokens, all "
                           f"padded to {width}", evidence, pitfalls=[9])
    return CheckResult(3, title, FAIL,
                       f"a row's outputs depend on the other rows of its batch (same padded "
                       f"width {width}): {deltas}; "
                       f"{sum(totals['changed_answers'].values())} answer(s) changed",
                       evidence, "rows must not see each other: look for ops over the batch "
                       "axis (batch statistics, a reshape that merges rows, a mean over axis "
                       "0)", [9])


# ---------------------------------------------------------------- 4. empty and 1-token rows

def check_edge_rows(model, texts=None):
    title = "empty and 1-token rows"
    if model.run is None:
        return _unmapped(4, title, model)
    rng = seeded(4)
    low, _ = model.id_range()
    normal = model.random_row(rng, min(_fits(model, 0)))
    probes = [("a fully padded row (0 tokens) beside a real one", [normal, []], 1)]
    if model.specials():
        probes.append(("the empty text ([CLS] [SEP])", [model.wrap([])], 0))
    probes.append(("a 1-token text" + (" ([CLS] x [SEP])" if model.specials() else ""),
                   [model.wrap([low])], 0))
    if model.specials():
        probes.append(("a 1-position row", [[low]], 0))
    results, failed = {}, False
    for what, rows, index in probes:
        try:
            outputs = model.run(rows)
        except InputRefused as e:
            results[what] = f"refused before the model ({e})"
            continue
        except ModelRaised as e:
            results[what], failed = f"the model raises: {e}", True
            continue
        bad = {name: bad_rows for name, bad_rows in nonfinite_outputs(outputs).items()
               if index in bad_rows}
        if bad:
            results[what], failed = f"non-finite {', '.join(sorted(bad))}", True
        else:
            results[what] = "finite"
    summary = "; ".join(f"{what}: {result}" for what, result in results.items())
    if failed:
        return CheckResult(4, title, FAIL, summary, results,
                           "a row without real tokens divides by a zero length or takes a "
                           "softmax over masked keys only: divide by max(length, 1) "
                           "(ppvarlen.models.masks.masked_mean) and fill masks with the most "
                           "negative finite value, never -inf", [11, 15])
    return CheckResult(4, title, PASS, summary, results, pitfalls=[11, 15])


# ---------------------------------------------------------------- 5. float16 masks

def _flips(reference, half):
    """Positions (over all rows and outputs) whose fp16 answer differs where fp32 is sure."""
    flips = 0
    for ref_row, half_row in zip(reference, half):
        for name, ref in ref_row.items():
            got = half_row.get(name)
            if got is None or ref.dtype.kind != "f" or ref.ndim < 1 or ref.shape[-1] < 2 or \
                    got.shape != ref.shape:
                continue
            top2 = np.sort(ref, axis=-1)[..., -2:]
            sure = (top2[..., 1] - top2[..., 0]) > FLIP_MARGIN
            flips += int(np.sum(sure & (np.argmax(ref, -1) != np.argmax(got, -1))))
    return flips


def check_precision(model, texts=None):
    title = "float16 masks"
    if model.graph is None:
        why = ("a dygraph model has no graph file to scan and Paddle has no CPU float16 "
               "kernels; run the doctor on its export (ONNX or Paddle inference model)"
               if model.dygraph else "no single graph file to scan (use --backend paddle)")
        return CheckResult(5, title, NOT_APPLICABLE, why, pitfalls=[11, 30])
    constants = model.graph.mask_constants()
    evidence = {"mask_constants": constants}
    said = [f"{c['value']:.3g} ({c['op']}) reaches {c['softmax']} through {c['ops_between']} "
            f"op(s)" for c in constants]
    found = "; ".join(f"{text}" + (f" (x{said.count(text)})" if said.count(text) > 1 else "")
                      for text in list(dict.fromkeys(said))[:3])
    fp16_text, fp16_bad, shipped_clean = None, False, False
    if model.fp16 is not None and model.run is not None:
        try:
            runner, what, shipped = model.fp16()
            rng = seeded(5)
            rows = [model.random_row(rng, n) for n in sorted(_fits(model, 0), reverse=True)]
            reference, half = model.run(rows), runner(rows)
            nonfinite = nonfinite_outputs(half)
            flips = _flips(reference, half)
            evidence["fp16"] = {"variant": what, "nonfinite": nonfinite, "flipped": flips,
                                "rows": [len(r) for r in rows]}
            fp16_bad = bool(nonfinite or flips)
            shipped_clean = shipped and not fp16_bad
            fp16_text = (f"{what}: " + (f"non-finite {', '.join(sorted(nonfinite))} in "
                                        f"{max(len(v) for v in nonfinite.values())} of "
                                        f"{len(rows)} rows" if nonfinite else "finite") +
                         f", {flips} confident answer(s) flipped")
        except Exception as e:  # noqa: BLE001 - a variant that cannot run here is evidence
            fp16_text = f"the float16 copy does not run here ({type(e).__name__}: {e})"
            evidence["fp16"] = {"error": fp16_text}
    elif model.run is not None and not model.float32_only:
        fp16_text = "no float16 run here (Paddle Inference has no CPU float16 kernels)"
    parts = [f"mask constant(s) below float16's -65504: {found}" if constants else
             "no constant <= -65504 reaches a softmax"] + ([fp16_text] if fp16_text else [])
    summary = "; ".join(parts)
    if constants and model.float32_only and not fp16_bad:
        return CheckResult(5, title, NOT_APPLICABLE, f"{summary}; {model.float32_only}",
                           evidence, pitfalls=[11, 36])
    if fp16_bad or (constants and not shipped_clean):
        return CheckResult(5, title, FAIL, summary, evidence,
                           "build additive masks with the compute dtype's most negative finite "
                           "value (float16: -65504; ppvarlen.models.masks.masked_fill_value) or "
                           "mask with Where; or convert to float16 clamping constants "
                           "(onnxconverter-common's default, +-1e4) and verify the fp16 file "
                           "against fp32 (ppvarlen-export --precision fp32,fp16 does both)",
                           [11, 14, 30])
    return CheckResult(5, title, PASS, summary, evidence, pitfalls=[11, 30])
