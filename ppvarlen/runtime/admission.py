"""Admission: prove that an export serves before it takes traffic.

One check, run by ``ppvarlen-export --verify`` (on the directory being written, every backend),
by the model repository before a version takes traffic, by single-export start-up, and by
``ppvarlen-infer`` and Ray batch inference's driver before they read their input
(``precision_choice.load_admitted``).  On a
loaded ``Predictor`` it runs, in order, and refuses with the first failure
(``AdmissionError``: which check failed, and why):

1. ``graph``: the graph takes exactly the inputs the manifest declares.
2. ``smoke``: one batch whose rows hold every special id, the vocabulary's largest id and the
   export's longest length runs; its outputs have the shape the manifest's labels need
   (``Task.output_problems``: e.g. one logit per label name) and are finite on every real
   position.  A row of the largest id fails here when the vocabulary outgrew the embedding
   table; a corrupted special-token row shows up as non-finite outputs.
3. ``padding``: each length of the manifest's grid (``data.order.grid_lengths``) gives the same
   output alone as batched with other lengths.
4. ``render``: the task's example request answered as strict JSON (no NaN) valid against the
   task's prediction model, then through each response path the caller names (``renderers``:
   the server passes its protocols' answer forms, ``ppvarlen.serve.protocols.render_checks``).

``admit`` returns the evidence of each check (the repository index and export logs show it).
Anything the predictor raises during a check is a refusal naming the check, never an
exception out of the caller's loop.

The finite-output, alone-vs-batched and vocabulary-vs-embedding judgements are those of
``ppvarlen.runtime.row_checks``, which ``ppvarlen-doctor`` runs on any model; ``PredictorRows``
is a loaded predictor seen through that module's row-runner interface (the doctor runs a
ppvarlen export through it too).
"""
import json

import numpy as np

from ppvarlen.data.collate import pad_sequences
from ppvarlen.data.order import grid_lengths
from ppvarlen.utils.inputs import validate_batch

from ppvarlen.runtime.manifest import UnservableExportError
# first_line and nonfinite_rows are read from here too (the repository, earlier callers)
from ppvarlen.runtime.row_checks import (InputRefused, ModelRaised, batch_difference, first_line,  # noqa: F401
                         nonfinite_outputs, nonfinite_rows, split_rows, vocabulary_problem)

GRID_BATCH = 4  # a grid row is checked alone and with this many rows in all
CHECKS = ("graph", "smoke", "padding", "render")


class AdmissionError(UnservableExportError):
    """An export failed one admission check; ``check`` names it (one of ``CHECKS``)."""

    def __init__(self, check, message):
        super().__init__(f"{check} check: {message}")
        self.check = check


def admit(predictor, seed=0, renderers=()):
    """Run every check on ``predictor`` -> {check: evidence}; AdmissionError on the first
    failure.  ``renderers``: (name, render(predictor, results) -> None, raising on an answer
    that cannot be sent) for the render check.  The predictor's token counters are reset
    afterwards (checks are not traffic)."""
    report = {}
    try:
        for name, check in (("graph", check_graph), ("smoke", check_smoke),
                            ("padding", check_padding), ("render", check_render)):
            try:
                report[name] = check(predictor, seed) if name in ("smoke", "padding") \
                    else check_render(predictor, renderers) if name == "render" \
                    else check(predictor)
            except AdmissionError:
                raise
            except (InputRefused, ModelRaised) as e:
                raise AdmissionError(name, str(e)) from None
            except Exception as e:  # noqa: BLE001 - whatever a broken artifact raises refuses it
                raise AdmissionError(name, f"{type(e).__name__}: {first_line(e)}") from None
    finally:
        predictor._reset_counters()
    return report


class PredictorRows:
    """A loaded ``Predictor`` as a row runner (``ppvarlen.runtime.row_checks``):
    ``run(id_rows, width=None)`` -> one ``{output name: array}`` per row.

    ``answers=False``: the engine's named outputs, per-token outputs (the manifest's
    ``per: token``) cut to each row's length; ``answers=True``: the task's row per input row
    (``Task.engine_rows``: logits, tag ids, generated ids) under the name ``answer``.  Rows the
    predictor's input validation refuses (empty rows, ids outside the vocabulary, lengths past
    ``max_position``) raise ``InputRefused``; anything the engine raises, ``ModelRaised``.
    ``last`` holds the last batch's (named outputs, seq_len)."""

    def __init__(self, predictor, answers=False):
        self.predictor, self.answers, self.last = predictor, answers, None
        specs = predictor.manifest.get("outputs") or predictor.task.output_specs
        self.per_token = {s["name"] for s in specs
                          if isinstance(s, dict) and s.get("per") == "token"}

    def run(self, id_rows, width=None):
        p = self.predictor
        seq_len = np.array([len(r) for r in id_rows], dtype=np.int64)
        longest = max(int(seq_len.max()) if len(seq_len) else 0, int(width or 0))
        try:  # the predictor's own validation, before the engine: a refusal, not a failure
            validate_batch(pad_sequences(id_rows, p.encoder.pad_id, longest), seq_len,
                           max_position=p.max_position, vocab_size=p.encoder.vocab_size)
        except ValueError as e:
            raise InputRefused(f"the predictor refuses these rows: {first_line(e)}") from None
        try:
            out, seq_len = p.run_engine(id_rows, width=width)
            self.last = (out, seq_len)
            if self.answers:
                return [{"answer": np.asarray(r)}
                        for r in p.task.engine_rows(p, out, seq_len)]
        except Exception as e:  # noqa: BLE001 - the engine's own words name the broken part
            raise ModelRaised(f"{type(e).__name__}: {first_line(e)}") from None
        return split_rows(out, seq_len, self.per_token)

    __call__ = run


# ---------------------------------------------------------------- 1. graph

def check_graph(predictor):
    declared = [spec["name"] for spec in predictor.task.input_specs]
    graph = list(predictor.engine.graph_inputs())
    if sorted(graph) != sorted(declared):
        raise AdmissionError("graph", f"the graph's inputs are {graph} but the manifest "
                             f"declares {declared}; the model files come from another export "
                             f"— re-export instead of mixing files")
    return {"inputs": graph}


# ---------------------------------------------------------------- 2. smoke

def id_range(predictor):
    """(first, stop) of the ordinary token ids: above every special id, below the vocabulary's
    size (rows of random text for checks and timings)."""
    special = [int(v) for v in (predictor.manifest.get("special_ids") or {}).values()
               if v is not None]
    first = max(special) + 1 if special else 0
    return first, max(first + 1, predictor.encoder.vocab_size)


def smoke_rows(predictor, seed=0):
    """Id rows the way requests reach the graph (special tokens around when the export adds
    them): every special id with the largest vocabulary id, the longest length the export
    takes, and a single token."""
    m, enc = predictor.manifest, predictor.encoder
    rng = np.random.RandomState(seed)
    wrap = 2 if predictor.add_special_tokens else 0
    room = max(1, predictor.max_len - wrap)
    special = sorted({int(v) for v in (m.get("special_ids") or {}).values() if v is not None})
    largest = enc.vocab_size - 1
    first, high = id_range(predictor)
    bodies = [(special + [largest])[:room],
              list(rng.randint(first, high, size=room - 1)) + [largest],
              [largest]]
    if wrap:
        bodies = [[enc.cls_id] + b + [enc.sep_id] for b in bodies]
    return [[int(i) for i in b] for b in bodies]


def check_smoke(predictor, seed=0):
    rows = smoke_rows(predictor, seed)
    runner = PredictorRows(predictor)
    try:
        outputs = runner.run(rows)
    except (InputRefused, ModelRaised) as e:
        raise AdmissionError("smoke", vocabulary_problem(
            predictor.encoder.vocab_size, run_error=str(e), max_len=predictor.max_len)) from None
    out, seq_len = runner.last
    problems = predictor.task.output_problems(predictor, out, seq_len)
    if problems:
        raise AdmissionError("smoke", problems[0])
    for name, bad in nonfinite_outputs(outputs).items():
        raise AdmissionError("smoke", f"output {name!r} is not finite for the row(s) "
                             f"{bad} of {rows} (a special-token or embedding row of the "
                             f"weights holds NaN/inf?)")
    predictor.task.engine_rows(predictor, out, seq_len)  # the task reads them without error
    return {"rows": len(rows), "lengths": [int(n) for n in seq_len],
            "outputs": {k: list(v.shape) if isinstance(v, np.ndarray) else [len(v)]
                        for k, v in out.items()}}  # a list: ids of different lengths per row


# ---------------------------------------------------------------- 3. padding

def padding_batches(predictor, seed=0):
    """[(length, rows)] per length of the export's grid: a row of that length first, then
    ``GRID_BATCH - 1`` rows of random lengths.  The padding check runs the first row alone and
    the whole batch; ``precision auto`` times the batches again (precision_choice)."""
    rng = np.random.RandomState(seed)
    first, high = id_range(predictor)
    out = []
    for n in grid_lengths(predictor.max_len, predictor.manifest.get("buckets")):
        lengths = [n] + list(rng.randint(1, predictor.max_len + 1, GRID_BATCH - 1))
        out.append((n, [[int(i) for i in rng.randint(first, high, size=k)] for k in lengths]))
    return out


def check_padding(predictor, seed=0):
    run = PredictorRows(predictor, answers=True)
    lengths = []
    for n, rows in padding_batches(predictor, seed):
        lengths.append(n)
        alone, difference = batch_difference(run, rows[0], rows[1:])
        if nonfinite_outputs([alone]):
            raise AdmissionError("padding", f"length {n}: non-finite outputs")
        if not difference["same"]:
            raise AdmissionError("padding", f"length {n}: the output alone differs from the "
                                 f"output batched with other lengths (padding changes the "
                                 f"answer)")
    return {"lengths": lengths}


# ---------------------------------------------------------------- 4. render

def strict_json(raw, where):
    """``raw`` parsed as JSON that holds no NaN/Infinity; AdmissionError naming ``where``."""
    def refuse(constant):
        raise AdmissionError("render", f"{where} holds {constant}, which is not JSON")

    return json.loads(raw, parse_constant=refuse)


def check_render(predictor, renderers=()):
    task = predictor.task
    example = list(task.examples[:1])
    if not example:
        return {"paths": []}
    results = predictor.predict(example)
    try:
        body = json.dumps(results, ensure_ascii=False, allow_nan=False)
    except ValueError:
        raise AdmissionError("render", "the answer to the example holds NaN or Infinity, "
                             "which is not JSON") from None
    prediction = task.prediction_model(predictor.label_names)
    for k, r in enumerate(strict_json(body, "the answer")):
        try:
            prediction.model_validate(r)
        except ValueError as e:
            raise AdmissionError("render", f"the answer to the example {example[k]!r} does "
                                 f"not fit the task's prediction model: "
                                 f"{first_line(e)}") from None
    for _, render in renderers:
        render(predictor, results)
    return {"paths": ["predictions"] + [name for name, _ in renderers], "example": example}
