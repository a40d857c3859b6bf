"""Checks over a model seen only as id rows in, one output dict per row out.

A *row runner* is ``run(id_rows, width=None) -> [{output name: np.ndarray}, ...]``: the id
rows (special tokens already in place) are padded to their longest row, or to ``width``, run
as one batch, and each row's outputs come back on their own, a per-token output cut to the
row's real length.  The serving admission check (``ppvarlen.runtime.admission``, over a loaded
``Predictor``) and ``ppvarlen-doctor`` (``ppvarlen.doctor``, over any model it can load) call
the functions here, so "finite", "the same alone as batched", "the same padded further" and
"the vocabulary fits the embedding table" mean one thing in both.

A runner raises ``InputRefused`` when the serving path refuses rows before the model sees
them (e.g. the predictor's input validation), and ``ModelRaised`` when the model itself
fails on them; the message is the runtime's first meaningful line (``first_line``).
"""
import numpy as np

# Two float outputs of one row agree when |delta| <= ATOL + RTOL * (the reference's largest
# |value|): fp32 kernels over different shapes reorder sums, a padding or batching bug moves
# outputs by far more.  Admission guards a served export with these; the doctor hunts bugs in
# models whose outputs may be tiny (random init), so it passes a smaller ATOL.
ATOL, RTOL = 1e-4, 1e-4


class InputRefused(Exception):
    """The serving path refused the rows before they reached the model."""


class ModelRaised(Exception):
    """The model (its runtime) raised on the rows; the message says what it said."""


def first_line(error):
    """The first meaningful line of an error message: Paddle's run several screens long and
    start with "In user code:"."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    lines = [line for line in lines if line != "In user code:"] or lines
    return lines[0][:300] if lines else type(error).__name__


def split_rows(outputs, seq_len, per_token):
    """A batch's named outputs -> one ``{name: array}`` per row; the outputs named in
    ``per_token`` are cut to each row's real length (``seq_len``).  Lists (e.g. generated ids
    of different lengths per row) are taken row by row."""
    rows = [{} for _ in range(len(seq_len))]
    for name, value in outputs.items():
        for r, row in enumerate(rows):
            item = np.asarray(value[r])
            if name in per_token and item.ndim >= 1:
                item = item[:int(seq_len[r])]
            row[name] = item
    return rows


def nonfinite_rows(value, seq_len, per_token=False):
    """Rows of a float output [B, ...] with a NaN or inf (per-token outputs: real positions
    only); [] for integer outputs or lists of ids."""
    if not isinstance(value, np.ndarray) or value.dtype.kind not in "fc":
        return []
    return [r for r, row in enumerate(split_rows({"v": value[:len(seq_len)]}, seq_len,
                                                 ("v",) if per_token and value.ndim >= 2 else ()))
            if not np.all(np.isfinite(row["v"]))]


def nonfinite_outputs(rows):
    """{output name: [row indices]} of the per-row outputs holding a NaN or inf."""
    bad = {}
    for r, row in enumerate(rows):
        for name, value in row.items():
            if value.dtype.kind in "fc" and not np.all(np.isfinite(value)):
                bad.setdefault(name, []).append(r)
    return bad


def answer(value):
    """What a user reads off an output: the argmax over the last axis of a float output with
    more than one entry there (a label, a tag per token, a span end), the values themselves for
    integer outputs (decoded tags, ids); None for a float score."""
    if value.dtype.kind in "iub":
        return value
    if value.ndim >= 1 and value.shape[-1] > 1:
        return np.argmax(value, axis=-1)
    return None


def compare_outputs(reference, other, atol=ATOL, rtol=RTOL):
    """Two output dicts of one row -> {"max_abs_delta": {name: float | None (shapes differ)},
    "scale": {name: the reference's largest |value|}, "changed_answers": [names whose answer
    differs], "same": every delta within ``atol + rtol * scale``}.  Non-finite values count as
    an infinite difference."""
    deltas, scales, changed = {}, {}, []
    for name, ref in reference.items():
        got = other.get(name)
        scales[name] = float(np.max(np.abs(ref))) if ref.size and ref.dtype.kind in "fciu" \
            and np.all(np.isfinite(ref)) else 0.0
        if got is None or np.shape(got) != np.shape(ref):
            deltas[name] = None
            changed.append(name)
            continue
        with np.errstate(invalid="ignore"):
            diff = np.abs(ref.astype(np.float64) - got.astype(np.float64))
        deltas[name] = 0.0 if not diff.size else \
            (float(np.max(diff)) if np.all(np.isfinite(diff)) else float("inf"))
        ref_answer, got_answer = answer(ref), answer(got)
        if ref_answer is not None and not np.array_equal(ref_answer, got_answer):
            changed.append(name)
    # an argmax flipped by less than the tolerance is a near-tie, not a bug: "same" is the deltas
    same = all(d is not None and d <= atol + rtol * scales[n] for n, d in deltas.items())
    return {"max_abs_delta": deltas, "scale": scales, "changed_answers": changed, "same": same}


def batch_difference(run, row, companions, width=None, atol=ATOL, rtol=RTOL):
    """``row`` alone vs beside ``companions`` in one batch (both padded to ``width`` when
    given, so only the company differs) -> (its outputs alone, ``compare_outputs``)."""
    alone = run([row], width=width)[0]
    batched = run([row] + list(companions), width=width)[0]
    return alone, compare_outputs(alone, batched, atol, rtol)


def padding_difference(run, row, extra_pads, atol=ATOL, rtol=RTOL):
    """``row`` alone at its own length vs alone padded ``extra_pads`` positions further ->
    (its outputs unpadded, ``compare_outputs``)."""
    alone = run([row])[0]
    padded = run([row], width=len(row) + int(extra_pads))[0]
    return alone, compare_outputs(alone, padded, atol, rtol)


def vocabulary_problem(vocab_size, embedding_rows=None, run_error=None, max_len=None):
    """Why a tokenizer of ``vocab_size`` ids does not fit the model, or None: more ids than the
    embedding table has rows (when known), or a row holding the largest id failed to run
    (``run_error``: the model's own words)."""
    if embedding_rows is not None and vocab_size > embedding_rows:
        return (f"the tokenizer has {vocab_size} ids but the model's embedding table has "
                f"{embedding_rows} rows: ids {embedding_rows}..{vocab_size - 1} fail or read "
                f"outside the table")
    if run_error is not None:
        longest = f", up to {max_len} tokens," if max_len else ""
        return (f"rows holding every special id and the largest vocabulary id "
                f"{vocab_size - 1} (vocab_size {vocab_size}){longest} fail to run: "
                f"{run_error} (is the vocabulary larger than the model's embedding table?)")
    return None
