"""Evaluation metrics in plain numpy/python (paddle-free, easy to test by hand).

Classification: accuracy and macro-F1 over the label set.  Tagging: entity-level
precision/recall/F1 on BIO tags with exact span match, following conlleval /
seqeval's default mode: an ``I-X`` that does not continue an ``X`` entity (after
``O``, or after another type) starts a new entity rather than being dropped.
"""
import numpy as np


def accuracy(preds, labels):
    preds, labels = np.asarray(preds), np.asarray(labels)
    if preds.shape != labels.shape:
        raise ValueError(f"accuracy: preds shape {preds.shape} != labels shape {labels.shape}")
    return float((preds == labels).mean()) if labels.size else 0.0


def macro_f1(preds, labels, num_labels):
    """Unweighted mean of per-class F1 over all ``num_labels`` classes.

    A class absent from both preds and labels has no defined F1 and is left out
    of the mean (scikit-learn's ``labels=present`` behaviour).
    """
    preds, labels = np.asarray(preds), np.asarray(labels)
    f1s = []
    for c in range(num_labels):
        tp = int(((preds == c) & (labels == c)).sum())
        fp = int(((preds == c) & (labels != c)).sum())
        fn = int(((preds != c) & (labels == c)).sum())
        if tp + fp + fn == 0:
            continue
        f1s.append(2 * tp / (2 * tp + fp + fn))
    return float(np.mean(f1s)) if f1s else 0.0


def classification_metrics(preds, labels, num_labels):
    return {"accuracy": accuracy(preds, labels), "macro_f1": macro_f1(preds, labels, num_labels)}


def _split_tag(tag):
    if tag == "O" or not tag:
        return "O", None
    prefix, _, etype = tag.partition("-")
    if prefix not in ("B", "I") or not etype:
        raise ValueError(f"not a BIO tag: {tag!r}; expected O, B-TYPE or I-TYPE")
    return prefix, etype


def bio_spans(tags):
    """Entities of one sequence as a set of ``(type, start, end_exclusive)``."""
    spans, start, etype = set(), None, None
    for i, tag in enumerate(list(tags) + ["O"]):
        prefix, t = _split_tag(tag)
        continues = prefix == "I" and t == etype and start is not None
        if not continues and start is not None:
            spans.add((etype, start, i))
            start, etype = None, None
        if prefix == "B" or (prefix == "I" and not continues):
            start, etype = i, t
    return spans


def entity_prf(pred_seqs, gold_seqs):
    """Micro precision/recall/F1 over exact entity spans, plus per-type F1."""
    if len(pred_seqs) != len(gold_seqs):
        raise ValueError(f"entity_prf: {len(pred_seqs)} predicted vs {len(gold_seqs)} gold sequences")
    counts = {}  # type -> [tp, n_pred, n_gold]
    for k, (p, g) in enumerate(zip(pred_seqs, gold_seqs)):
        if len(p) != len(g):
            raise ValueError(f"entity_prf: sequence {k} has {len(p)} predicted vs {len(g)} gold tags")
        ps, gs = bio_spans(p), bio_spans(g)
        for s in ps | gs:
            c = counts.setdefault(s[0], [0, 0, 0])
            c[0] += s in ps and s in gs
            c[1] += s in ps
            c[2] += s in gs
    tp, n_pred, n_gold = (sum(c[i] for c in counts.values()) for i in range(3))
    out = _prf(tp, n_pred, n_gold)
    out["per_type_f1"] = {t: _prf(*c)["f1"] for t, c in sorted(counts.items())}
    return out


def _prf(tp, n_pred, n_gold):
    p = tp / n_pred if n_pred else 0.0
    r = tp / n_gold if n_gold else 0.0
    f = 2 * p * r / (p + r) if p + r else 0.0
    return {"precision": p, "recall": r, "f1": f}
