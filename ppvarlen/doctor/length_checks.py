"""Checks 1, 6 and 8: the lengths a model takes, its position limit, and the user's texts."""
import numpy as np

from ppvarlen.runtime.row_checks import InputRefused, ModelRaised, nonfinite_outputs

from .model import seeded
from .report import FAIL, NOT_APPLICABLE, PASS, WARN, CheckResult

LONG_TEXT_OPTIONS = ("Data.long_text: window (overlapping windows, Data.stride apart, their "
                     "outputs aggregated per text), error (refuse them, naming the text) or "
                     "truncate (keep the start, flagged in each result)")


def _token_lengths(model, texts):
    return [len(model.tokenizer.ids(t)) for t in texts]


# ---------------------------------------------------------------- 1. dynamic dimensions

def check_dimensions(model, texts=None):
    title = "dynamic dimensions"
    if model.dygraph:
        return CheckResult(1, title, PASS, "a dygraph model: every batch size and length runs "
                           "as given", pitfalls=[1, 20])
    if not model.inputs or all(i.shape is None for i in model.inputs):
        return CheckResult(1, title, NOT_APPLICABLE, "the graph does not declare its input "
                           "shapes", {"inputs": [i.as_dict() for i in model.inputs]})
    fixed = []
    for graph_input in model.inputs:
        axes = [(0, "batch")] + ([(1, "sequence")] if graph_input.shape and
                                 len(graph_input.shape) >= 2 else [])
        for axis, label in axes:
            size = graph_input.fixed(axis)
            if size:
                fixed.append((graph_input.name, label, size))
    shapes = ", ".join(f"{i.name} {i.shape_text()}" for i in model.inputs)
    evidence = {"inputs": [i.as_dict() for i in model.inputs],
                "fixed": [{"input": n, "axis": a, "size": s} for n, a, s in fixed]}
    if not fixed:
        return CheckResult(1, title, PASS, f"batch and sequence dynamic: {shapes}", evidence,
                           pitfalls=[1, 20])
    said = "; ".join(
        f"{label} fixed at {size} ({', '.join(n for n, a, s in fixed if (a, s) == (label, size))})"
        for label, size in dict.fromkeys((a, s) for _, a, s in fixed))
    summary = f"{said}: {shapes}"
    sequence = next((s for _, a, s in fixed if a == "sequence"), None)
    if sequence:
        summary += f"; every text is padded to {sequence}"
        if texts and model.tokenizer:
            lengths = np.array(_token_lengths(model, texts))
            real = np.minimum(lengths, sequence).sum()
            share = 1.0 - real / (len(lengths) * sequence)
            longer = int((lengths > sequence).sum())
            evidence["texts"] = {"count": len(lengths), "padding_share": round(float(share), 4),
                                 "longer_than_fixed": longer,
                                 "mean_tokens": round(float(lengths.mean()), 1)}
            summary += (f": on the {len(lengths)} texts {share:.0%} of the computed positions "
                        f"are padding (mean {lengths.mean():.1f} tokens)" +
                        (f", {longer} longer than {sequence}" if longer else ""))
    return CheckResult(1, title, FAIL, summary, evidence,
                       "export with dynamic batch and length: paddle.jit.save(model, path, "
                       "input_spec=[InputSpec([None, None], 'int64', 'input_ids'), ...]); "
                       "paddle2onnx keeps them dynamic. A fixed length makes every request pay "
                       "for it, and cuts longer texts", [1, 20])


# ---------------------------------------------------------------- 6. position limits

def _probe(model, length, rng):
    """What a row of ``length`` positions does: ("runs", outputs), ("refused", why) or
    ("raises", why)."""
    row = model.wrap([]) if length <= model.specials() else \
        model.random_row(rng, length - model.specials())
    try:
        return "runs", model.run([row])
    except InputRefused as e:
        return "refused", str(e)
    except ModelRaised as e:
        return "raises", str(e)


def check_positions(model, texts=None):
    title = "position limits"
    if model.run is None:
        return CheckResult(6, title, NOT_APPLICABLE, f"the graph's inputs {model.unmapped} "
                           f"cannot be mapped: the model is not run")
    limit, sources = model.max_position, dict(model.max_position_sources)
    evidence = {"max_position_sources": sources, "fixed_length": model.fixed_length}
    if model.fixed_length:
        if limit is None or model.fixed_length <= limit:
            return CheckResult(6, title, PASS if limit else NOT_APPLICABLE,
                               f"the graph takes only length {model.fixed_length}" +
                               (f", within the position table of {limit}" if limit else
                                "; no position limit known"), evidence, pitfalls=[17])
        return CheckResult(6, title, FAIL, f"the graph is fixed at length {model.fixed_length}, "
                           f"past its position table of {limit} ({sources})", evidence,
                           "re-export with a length within max_position_embeddings", [17])
    if limit is None:
        return CheckResult(6, title, NOT_APPLICABLE,
                           "no position limit known: no max_position_embeddings in a "
                           "config.json (pass --tokenizer DIR holding the model's config.json), "
                           "no manifest max_position, no position table found in the graph",
                           evidence, pitfalls=[17])
    rng = seeded(6)
    said_limit = f"{limit} ({', '.join(f'{k}: {v}' for k, v in sources.items())})"
    at, at_what = _probe(model, limit, rng)
    evidence["at_limit"] = at if at == "runs" else f"{at}: {at_what}"
    if at != "runs" or nonfinite_outputs(at_what):
        why = at_what if at != "runs" else "non-finite outputs"
        return CheckResult(6, title, FAIL, f"a row of {limit} positions, the limit {said_limit}, "
                           f"fails: {at}: {why}", evidence,
                           "the model cannot take the length its config promises: check "
                           "max_position_embeddings against the position table", [17])
    past, past_what = _probe(model, limit + 1, rng)
    evidence["past_limit"] = past if past == "runs" else f"{past}: {past_what}"
    if past == "runs":
        finite = "non-finite" if nonfinite_outputs(past_what) else "finite"
        return CheckResult(6, title, FAIL,
                           f"length {limit} runs; {limit + 1}, past the limit {said_limit}, runs "
                           f"too and answers ({finite} outputs): positions past the table wrap, "
                           f"are clipped or read outside it, silently",
                           evidence, f"cut or window inputs to {limit} tokens before the model "
                           f"(ppvarlen's Predictor refuses lengths past the manifest's "
                           f"max_position; {LONG_TEXT_OPTIONS})", [16, 17])
    said = "refused before the model" if past == "refused" else "the model raises"
    return CheckResult(6, title, PASS, f"length {limit} runs; {limit + 1}: {said} "
                       f"({past_what}); limit {said_limit}", evidence, pitfalls=[17])


# ---------------------------------------------------------------- 8. truncation

def check_truncation(model, texts=None, unreadable=0):
    title = "truncation on your texts"
    if texts is None:
        return CheckResult(8, title, NOT_APPLICABLE, "no --texts FILE given", pitfalls=[16])
    if model.tokenizer is None:
        return CheckResult(8, title, NOT_APPLICABLE, "no tokenizer to count tokens with (pass "
                           "--tokenizer DIR)", pitfalls=[16])
    limits = {"the export's max_len": model.max_len, "the graph's fixed length":
              model.fixed_length, "the position limit": model.max_position}
    limits = {k: v for k, v in limits.items() if v}
    if not limits or not texts:
        return CheckResult(8, title, NOT_APPLICABLE, "no length limit known" if not limits
                           else "the file holds no readable text", pitfalls=[16])
    where, limit = min(limits.items(), key=lambda kv: kv[1])
    lengths = np.array(_token_lengths(model, texts))
    over = lengths[lengths > limit] - limit
    evidence = {"texts": int(len(lengths)), "unreadable_lines": unreadable, "limit": int(limit),
                "limit_from": where, "longer": int(len(over)),
                "share_longer": round(float(len(over) / len(lengths)), 4),
                "max_tokens": int(lengths.max()), "p50_tokens": float(np.median(lengths)),
                "tokens_past_limit": int(over.sum()),
                "max_excess": int(over.max()) if len(over) else 0,
                "long_text_policy": model.long_text}
    spread = f"token lengths p50 {np.median(lengths):.0f}, max {lengths.max()} with special tokens"
    if not len(over):
        return CheckResult(8, title, PASS, f"none of {len(lengths)} texts is longer than the limit "
                           f"{limit} ({where}; {spread})", evidence, pitfalls=[16])
    summary = (f"{len(over)} of {len(lengths)} texts are longer than the limit {limit} ({where}), "
               f"by up to {over.max()} tokens ({over.sum()} tokens past it in all; {spread})")
    if model.long_text == "window":
        return CheckResult(8, title, PASS, summary + "; the export windows them (long_text: "
                           "window)", evidence, pitfalls=[16])
    happens = {"truncate": "the export truncates them (flagged in each result)",
               "error": "the export refuses them (long_text: error)"}.get(
        model.long_text, "your serving code decides: a tokenizer with max_length cuts them "
                         "silently, without it the model gets the whole text (check 6)")
    if model.long_text is not None:  # the export's manifest records the policy: a choice
        return CheckResult(8, title, WARN, f"{summary}; {happens}, as its manifest records "
                           f"(long_text: {model.long_text})", evidence,
                           f"if the tokens past {limit} matter, re-export with -o "
                           f"Data.long_text=window (Data.stride sets the overlap) so every token "
                           f"is read, or a larger Data.max_len (up to Model.max_position); "
                           f"ppvarlen offers {LONG_TEXT_OPTIONS}", [16])
    fix = (f"decide what long texts get: ppvarlen offers {LONG_TEXT_OPTIONS}; a PaddleNLP "
           f"directory gets them through ppvarlen-export --pretrained-dir")
    return CheckResult(8, title, FAIL, f"{summary}; {happens}", evidence, fix, [16])
