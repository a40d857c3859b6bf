"""Seq2seq metrics on decoded text: sequence accuracy and token (pinyin syllable) error rate.

Pure Python, no paddle: the trainer's eval, the export parity check and deploy can all use it.
Tokens are whitespace-separated units (``"zhong guo"`` -> 2 syllables), so a wrong letter
costs one syllable substitution and a missing separator one substitution + one deletion.
"""


def edit_distance(hyp, ref):
    """Levenshtein distance between two token sequences (every edit costs 1)."""
    prev = list(range(len(ref) + 1))
    for i, h in enumerate(hyp, 1):
        cur = [i] + [0] * len(ref)
        for j, r in enumerate(ref, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (h != r))
        prev = cur
    return prev[-1]


def _check_pairs(hyps, refs):
    if len(hyps) != len(refs):
        raise ValueError(f"seq2seq metrics: {len(hyps)} predictions for {len(refs)} references; "
                         f"predictions must be restored to input order, one per example")


def sequence_accuracy(hyps, refs):
    """Fraction of predictions whose token sequence equals the reference exactly."""
    _check_pairs(hyps, refs)
    if not refs:
        return 0.0
    return sum(h.split() == r.split() for h, r in zip(hyps, refs)) / len(refs)


def token_error_rate(hyps, refs):
    """Total edit distance over total reference tokens (corpus-level, like WER)."""
    _check_pairs(hyps, refs)
    errors = sum(edit_distance(h.split(), r.split()) for h, r in zip(hyps, refs))
    total = sum(len(r.split()) for r in refs)
    return errors / max(total, 1)


def seq2seq_metrics(hyps, refs):
    """{"seq_acc", "ter", "num_examples"} for decoded strings in input order."""
    return {"seq_acc": sequence_accuracy(hyps, refs), "ter": token_error_rate(hyps, refs),
            "num_examples": len(refs)}
