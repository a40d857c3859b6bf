"""Evaluation metrics in plain numpy/python (paddle-free, easy to test by hand).

Classification: accuracy and macro-F1 over the label set; per class (the eval's report)
precision, recall, F1 and support, and the confusion matrix they are read from.  Tagging: token accuracy, and
chunk-level precision/recall/F1 with exact span match in the tag scheme (BIO, BIOES, BMES;
``ppvarlen.data.tagschemes``), following conlleval / seqeval's default mode: an ``I-X`` that
does not continue an ``X`` chunk (after ``O``, or after another type) starts a new chunk
rather than being dropped.  Plain per-token tags (POS) have no chunks: token accuracy.
"""
import numpy as np

from .data import tagschemes


def accuracy(preds, labels):
    preds, labels = np.asarray(preds), np.asarray(labels)
    if preds.shape != labels.shape:
        raise ValueError(f"accuracy: preds shape {preds.shape} != labels shape {labels.shape}")
    return float((preds == labels).mean()) if labels.size else 0.0


def confusion_matrix(preds, labels, num_labels):
    """``[num_labels, num_labels]`` counts: row = gold label, column = predicted label."""
    preds, labels = np.asarray(preds, np.int64), np.asarray(labels, np.int64)
    if preds.shape != labels.shape:
        raise ValueError(f"confusion_matrix: preds shape {preds.shape} != labels shape "
                         f"{labels.shape}")
    for name, ids in (("preds", preds), ("labels", labels)):
        if ids.size and (ids.min() < 0 or ids.max() >= num_labels):
            raise ValueError(f"confusion_matrix: {name} hold ids outside [0, {num_labels})")
    flat = np.bincount(labels * num_labels + preds, minlength=num_labels * num_labels)
    return flat.reshape(num_labels, num_labels)


def per_class_prf(preds, labels, num_labels):
    """One {"precision", "recall", "f1", "support"} per class id, from the confusion matrix.
    F1 is 2tp / (2tp + fp + fn) (0 when the class is neither predicted nor gold)."""
    counts = confusion_matrix(preds, labels, num_labels)
    out = []
    for c in range(num_labels):
        tp, n_pred, n_gold = int(counts[c, c]), int(counts[:, c].sum()), int(counts[c].sum())
        out.append({"precision": tp / n_pred if n_pred else 0.0,
                    "recall": tp / n_gold if n_gold else 0.0,
                    "f1": 2 * tp / (n_pred + n_gold) if n_pred + n_gold else 0.0,
                    "support": n_gold, "predicted": n_pred})
    return out


def macro_f1(preds, labels, num_labels):
    """Unweighted mean of per-class F1 over all ``num_labels`` classes.

    A class absent from both preds and labels has no defined F1 and is left out
    of the mean (scikit-learn's ``labels=present`` behaviour).
    """
    f1s = [c["f1"] for c in per_class_prf(preds, labels, num_labels)
           if c["support"] or c["predicted"]]
    return float(np.mean(f1s)) if f1s else 0.0


def classification_metrics(preds, labels, num_labels):
    return {"accuracy": accuracy(preds, labels), "macro_f1": macro_f1(preds, labels, num_labels)}


def class_report(preds, labels, label_names):
    """The eval's per-class report of a single-label task: {"per_class": {label name:
    {precision, recall, f1, support}}, "confusion_matrix": {"label_names", "matrix" (row = gold,
    column = predicted)}}."""
    n = len(label_names)
    per_class = {name: {k: c[k] for k in ("precision", "recall", "f1", "support")}
                 for name, c in zip(label_names, per_class_prf(preds, labels, n))}
    return {"per_class": per_class,
            "confusion_matrix": {"label_names": list(label_names), "rows": "gold",
                                 "columns": "predicted",
                                 "matrix": confusion_matrix(preds, labels, n).tolist()}}


def bio_spans(tags):
    """Entities of one BIO sequence as a set of ``(type, start, end_exclusive)``."""
    return set(tagschemes.chunks(tags, "bio"))


def entity_prf(pred_seqs, gold_seqs, scheme="bio"):
    """Micro precision/recall/F1 over exact chunk spans of a chunk ``scheme``, plus per-type F1
    (conlleval's counts: a chunk is right when its type, start and end are right)."""
    _check_lengths("entity_prf", pred_seqs, gold_seqs)
    counts = {}  # type -> [tp, n_pred, n_gold]
    for p, g in zip(pred_seqs, gold_seqs):
        ps, gs = set(tagschemes.chunks(p, scheme)), set(tagschemes.chunks(g, scheme))
        for s in ps | gs:
            c = counts.setdefault(s[0], [0, 0, 0])
            c[0] += s in ps and s in gs
            c[1] += s in ps
            c[2] += s in gs
    tp, n_pred, n_gold = (sum(c[i] for c in counts.values()) for i in range(3))
    out = _prf(tp, n_pred, n_gold)
    out["per_type_f1"] = {t: _prf(*c)["f1"] for t, c in sorted(counts.items())}
    return out


def token_accuracy(pred_seqs, gold_seqs):
    """Share of tokens whose predicted tag is the gold tag (conlleval's "accuracy")."""
    _check_lengths("token_accuracy", pred_seqs, gold_seqs)
    total = sum(len(g) for g in gold_seqs)
    right = sum(p == g for ps, gs in zip(pred_seqs, gold_seqs) for p, g in zip(ps, gs))
    return right / total if total else 0.0


def tagging_metrics(pred_seqs, gold_seqs, label_names, scheme=None):
    """The tagging report: token accuracy, and chunk P/R/F1 + per-type F1 in the tag scheme
    (``scheme``, or the one ``label_names`` use, see ``data.tagschemes.detect``).

    Plain tags have no chunks: ``chunk_metrics`` says so, ``per_type_f1`` is per tag, and
    ``f1`` is the token-level micro F1, which equals the token accuracy (one gold and one
    predicted tag per token) -- the number checkpoints are selected by, never a made-up 0.
    """
    scheme = scheme or tagschemes.detect(label_names)
    out = {"token_accuracy": token_accuracy(pred_seqs, gold_seqs)}
    if tagschemes.SCHEME[scheme].has_chunks:
        out.update(entity_prf(pred_seqs, gold_seqs, scheme))
    else:
        pred = [t for seq in pred_seqs for t in seq]
        gold = [t for seq in gold_seqs for t in seq]
        index = {name: k for k, name in enumerate(label_names)}
        ids = lambda tags: [index[t] for t in tags]  # noqa: E731
        out.update(f1=out["token_accuracy"], macro_f1=macro_f1(ids(pred), ids(gold), len(index)),
                   per_type_f1={t: _tag_f1(pred, gold, t) for t in sorted(set(gold) | set(pred))},
                   chunk_metrics="not applicable: plain per-token tags have no chunks; f1 is "
                                 "token-level (= token_accuracy)")
    out["tag_scheme"] = scheme
    return out


def _tag_f1(pred, gold, tag):
    tp = sum(p == g == tag for p, g in zip(pred, gold))
    return _prf(tp, pred.count(tag), gold.count(tag))["f1"]


def _check_lengths(name, pred_seqs, gold_seqs):
    if len(pred_seqs) != len(gold_seqs):
        raise ValueError(f"{name}: {len(pred_seqs)} predicted vs {len(gold_seqs)} gold sequences")
    for k, (p, g) in enumerate(zip(pred_seqs, gold_seqs)):
        if len(p) != len(g):
            raise ValueError(f"{name}: sequence {k} has {len(p)} predicted vs {len(g)} gold tags")


def _prf(tp, n_pred, n_gold):
    p = tp / n_pred if n_pred else 0.0
    r = tp / n_gold if n_gold else 0.0
    f = 2 * p * r / (p + r) if p + r else 0.0
    return {"precision": p, "recall": r, "f1": f}
