"""Deterministic evaluation: length-sorted batches, outputs back in input order, un-padded per example.

With N data-parallel ranks each rank runs every N-th batch and the per-batch
outputs are all-gathered, so every rank computes the metrics on the full split.

``ppvarlen-eval``'s report: ``evaluate_checkpoint`` (the metrics; a single-label task adds
per-class precision/recall/F1/support and the confusion matrix), ``format_class_report`` (the
table it prints) and ``write_eval_report`` (metrics.json, confusion_matrix.json and .png in
``eval_dir``, each written atomically).
"""
import os
import sys
import time

import paddle
from tqdm import tqdm

from ..data.loader import BatchLoader, FixedBatches, make_collator
from ..data.order import length_sorted_batches, restore_order
from ..store_build import build_datasets
from ..tasks import get_task
from ..utils.io import atomic_binary_writer, atomic_write_json
from .checkpoint import load_for_inference
from .distributed import all_gather_objects


@paddle.no_grad()
def predict(model, dataset, task, collate, max_tokens, padding_side="right", world_size=1, rank=0,
            decoding=None, num_workers=0, progress=False):
    """Per-example model outputs in dataset order (``task``: a Task or its name).

    classification: float32 logits ``[C]``; tagging: predicted tag ids ``[len]``
    (the example's real tokens only); seq2seq: generated ids (no BOS/EOS), decoded per
    ``decoding`` ({"beam_size", "length_penalty"}; default greedy); masked-LM: per example
    [loss sum, correct, masked] under a fixed mask.  ``num_workers``: loader processes
    reading the store (``data.loader``).  ``progress``: a bar over this rank's batches on
    stderr.
    """
    task = get_task(task)
    was_training = model.training
    model.eval()
    batches = length_sorted_batches(dataset.lengths, max_tokens)
    mine = batches[rank::world_size]
    loader = BatchLoader(dataset, FixedBatches(mine), collate, num_workers)
    mine = [task.predict_batch(model, batch, decoding or {}, padding_side)
            for batch in tqdm(loader, total=len(mine), unit="batch", desc="eval",
                              disable=not progress, file=sys.stderr, smoothing=0)]
    if was_training:
        model.train()
    per_rank = all_gather_objects(mine, world_size)
    per_batch = [per_rank[k % world_size][k // world_size] for k in range(len(batches))]
    return restore_order(batches, per_batch)


def evaluate(model, dataset, task, collate, label_names, max_tokens, padding_side="right",
             world_size=1, rank=0, encoder=None, decoding=None, num_workers=0):
    """Metrics of ``model`` on ``dataset`` (seq2seq needs the ``encoder`` to compare texts)."""
    outputs = predict(model, dataset, task, collate, max_tokens, padding_side, world_size, rank,
                      decoding, num_workers)
    return get_task(task).report(dataset, outputs, label_names, encoder)


def decoding_of(model_cfg):
    """The decoding settings evaluation uses (seq2seq), from the Model section."""
    return {"beam_size": model_cfg.beam_size, "length_penalty": model_cfg.length_penalty}


def checkpoint_outputs(cfg, ckpt_dir, split="test", progress=False):
    """``predict`` outputs of the checkpoint in ``ckpt_dir`` on ``split`` of the data ``cfg.Data``
    describes -> (outputs, dataset, checkpoint meta, encoder)."""
    outputs, dataset, meta, encoder, _ = _timed_checkpoint_outputs(cfg, ckpt_dir, split, progress)
    return outputs, dataset, meta, encoder


def _timed_checkpoint_outputs(cfg, ckpt_dir, split, progress):
    model, meta, encoder, _ = load_for_inference(ckpt_dir)
    dataset = getattr(build_datasets(cfg.Data, task_hint=meta["task"], encoder=encoder,
                                     splits=(split,)), split)
    collate = make_collator(cfg.Data, dataset)
    start = time.perf_counter()
    outputs = predict(model, dataset, meta["task"], collate, cfg.Data.eval_max_tokens,
                      cfg.Data.padding_side, decoding=decoding_of(cfg.Model),
                      num_workers=cfg.Data.num_workers, progress=progress)
    return outputs, dataset, meta, encoder, time.perf_counter() - start


def evaluate_checkpoint(cfg, ckpt_dir, split="test", progress=False):
    """Metrics of the checkpoint in ``ckpt_dir`` on ``split`` of the data ``cfg.Data`` describes.

    Besides the metrics: ``per_class`` and ``confusion_matrix`` (single-label tasks,
    ``metrics.class_report``), ``items`` (examples run, each window counted), ``long_text`` (what the
    policy did: truncated / windowed documents; a warning when any were truncated) and
    ``predict_seconds`` / ``items_per_s`` over the prediction pass only (batching and
    the model; reading and encoding the split not included).
    """
    outputs, dataset, meta, encoder, seconds = _timed_checkpoint_outputs(cfg, ckpt_dir, split,
                                                                         progress)
    task = get_task(meta["task"])
    out = task.report(dataset, outputs, meta["label_names"], encoder)
    classes = task.class_report(dataset, outputs, meta["label_names"])
    if classes:
        out.update(classes)
    long_text = dict(getattr(dataset, "long_text_stats", None) or {})
    warnings = []
    if long_text.get("truncated"):
        warnings.append(f"{long_text['truncated']} of {long_text.get('documents')} {split} texts "
                        f"were truncated to Data.max_len {cfg.Data.max_len} (the metrics score "
                        f"the truncated texts); set Data.long_text: window to read them whole")
    return {"checkpoint": ckpt_dir, "split": split, "step": meta["step"], **out,
            "items": len(dataset), "long_text": long_text,
            "predict_seconds": round(seconds, 3),
            "items_per_s": round(len(dataset) / seconds, 1) if seconds > 0 else None,
            "warnings": warnings}


def eval_dir(ckpt_dir, split):
    """Where ``ppvarlen-eval`` writes its report by default: RUN/eval/CHECKPOINT-SPLIT, beside
    the run's own metrics.json (RUN: the checkpoint's parent directory)."""
    ckpt_dir = os.path.abspath(ckpt_dir)
    return os.path.join(os.path.dirname(ckpt_dir), "eval",
                        f"{os.path.basename(ckpt_dir)}-{split}")


def format_class_report(per_class, accuracy=None, macro_f1=None):
    """The per-class table: precision, recall, F1 and support of each label (scikit-learn's
    classification_report layout)."""
    width = max([len("macro avg")] + [len(name) for name in per_class])
    lines = [f"{'':<{width}}  precision  recall      f1  support"]
    for name, c in per_class.items():
        lines.append(f"{name:<{width}}  {c['precision']:9.4f}  {c['recall']:6.4f}  "
                     f"{c['f1']:6.4f}  {c['support']:7d}")
    total = sum(c["support"] for c in per_class.values())
    if macro_f1 is not None:
        mean = {k: sum(c[k] for c in per_class.values()) / max(len(per_class), 1)
                for k in ("precision", "recall")}
        lines.append(f"{'macro avg':<{width}}  {mean['precision']:9.4f}  {mean['recall']:6.4f}  "
                     f"{macro_f1:6.4f}  {total:7d}")
    if accuracy is not None:
        lines.append(f"{'accuracy':<{width}}  {'':9}  {'':6}  {accuracy:6.4f}  {total:7d}")
    return "\n".join(lines)


def write_eval_report(result, out_dir):
    """``result`` (``evaluate_checkpoint``'s) as OUT_DIR/metrics.json, and its confusion
    matrix, when it has one, as confusion_matrix.json and confusion_matrix.png; returns the
    paths written.  Each file is written atomically (a reader never sees half of one)."""
    os.makedirs(out_dir, exist_ok=True)
    written = [os.path.join(out_dir, "metrics.json")]
    atomic_write_json(written[0], result)
    matrix = result.get("confusion_matrix")
    if matrix:
        written.append(os.path.join(out_dir, "confusion_matrix.json"))
        atomic_write_json(written[-1], matrix)
        written.append(os.path.join(out_dir, "confusion_matrix.png"))
        plot_confusion_matrix(matrix, written[-1], f"{result['split']}: "
                                                   f"{result['checkpoint']}")
    return written


def plot_confusion_matrix(matrix, png_path, title):
    """Counts as a heat map (row = gold, column = predicted), each cell labelled with its
    count while the labels are few enough to read."""
    from matplotlib.figure import Figure  # no pyplot: the process's backend stays as it was

    counts, labels = matrix["matrix"], matrix["label_names"]
    n = len(labels)
    names = labels if _drawable(labels) else [str(i) for i in range(n)]
    if names is not labels:
        title += " (labels by id: their names are in confusion_matrix.json)"
    side = min(4 + 0.5 * n, 20)
    fig = Figure(figsize=(side, side))
    ax = fig.subplots()
    image = ax.imshow(counts, cmap="Blues", vmin=0)
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    if n <= 30:
        ax.set_xticks(range(n), names, rotation=45, ha="right")
        ax.set_yticks(range(n), names)
        top = max(max(row) for row in counts) if counts else 0
        for g in range(n):
            for p in range(n):
                ax.text(p, g, str(counts[g][p]), ha="center", va="center",
                        color="white" if counts[g][p] > top / 2 else "black")
    ax.set_xlabel("predicted")
    ax.set_ylabel("gold")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    with atomic_binary_writer(png_path) as f:
        fig.savefig(f, format="png", dpi=100)


def _drawable(texts):
    """Whether matplotlib's default font has a glyph for every character of ``texts`` (label
    names in Chinese need a CJK font; without one each character would be a box and a
    warning)."""
    from matplotlib import font_manager
    from matplotlib.ft2font import FT2Font

    font = FT2Font(font_manager.findfont(font_manager.FontProperties()))
    return all(font.get_char_index(ord(ch)) for text in texts for ch in text)
