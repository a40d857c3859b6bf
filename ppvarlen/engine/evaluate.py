"""Deterministic evaluation: length-sorted batches, outputs back in input order, un-padded per example.

With N data-parallel ranks each rank runs every N-th batch and the per-batch
outputs are all-gathered, so every rank computes the metrics on the full split.
"""
import numpy as np
import paddle

from ..data.longtext import aggregate_classification, aggregate_tokens
from ..data.order import length_sorted_batches, restore_order
from . import metrics
from .distributed import all_gather_objects
from .steps import to_tensors


def _unpad(rows, seq_len, padding_side):
    L = rows.shape[1]
    if padding_side == "left":
        return [rows[j, L - n:] for j, n in enumerate(seq_len)]
    return [rows[j, :n] for j, n in enumerate(seq_len)]


def _decode(model, batch, decoding):
    """Generated ids per source (no BOS/EOS): greedy, or beam search when beam_size > 1."""
    src_ids, src_len = paddle.to_tensor(batch["src_ids"]), paddle.to_tensor(batch["src_len"])
    if decoding.get("beam_size", 1) > 1:
        return model.beam_search(src_ids, src_len, beam_size=decoding["beam_size"],
                                 length_penalty=decoding.get("length_penalty", 1.0))
    return model.greedy_decode(src_ids, src_len)


@paddle.no_grad()
def predict(model, dataset, task, collate, max_tokens, padding_side="right", world_size=1, rank=0,
            decoding=None):
    """Per-example model outputs in dataset order.

    classification: float32 logits ``[C]``; tagging: predicted tag ids ``[len]``
    (the example's real tokens only); seq2seq: generated ids (no BOS/EOS), decoded per
    ``decoding`` ({"beam_size", "length_penalty"}; default greedy).
    """
    was_training = model.training
    model.eval()
    batches = length_sorted_batches(dataset.lengths, max_tokens)
    mine = []
    for k in range(rank, len(batches), world_size):
        batch = collate([dataset[i] for i in batches[k]])
        if task == "seq2seq":
            mine.append(_decode(model, batch, decoding or {}))
            continue
        out = model(*to_tensors(batch))
        if task == "classification":
            mine.append(list(out.astype("float32").numpy()))
        elif task == "tagging":
            mine.append(_unpad(out[1].numpy(), batch["seq_len"], padding_side))
        else:
            raise ValueError(f"evaluation of task {task!r} is not supported by the trainer")
    if was_training:
        model.train()
    per_rank = all_gather_objects(mine, world_size)
    per_batch = [per_rank[k % world_size][k // world_size] for k in range(len(batches))]
    return restore_order(batches, per_batch)


def classification_report(dataset, logits, label_names):
    """Accuracy/macro-F1 per document (windows of one long text: mean of their logits)."""
    doc_ids = [dataset[i]["doc_id"] for i in range(len(dataset))]
    gold = {}
    for i, d in enumerate(doc_ids):
        gold.setdefault(d, dataset[i]["label"])
    docs, doc_logits = aggregate_classification(doc_ids, np.stack(logits))
    preds = doc_logits.argmax(axis=-1)
    out = metrics.classification_metrics(preds, [gold[int(d)] for d in docs], len(label_names))
    out["num_examples"] = int(len(docs))
    return out


def tagging_report(dataset, tag_ids, label_names):
    """Entity P/R/F1 per document (windows stitched back by their token offsets)."""
    doc_ids, offsets, pred_rows, gold_rows = [], [], [], []
    for i, tags in enumerate(tag_ids):
        item = dataset[i]
        labels = np.asarray(item["labels"])
        content = labels != -100  # special tokens carry -100
        doc_ids.append(item["doc_id"])
        offsets.append(item.get("offset", 0))
        pred_rows.append(np.asarray(tags)[content])
        gold_rows.append(labels[content])
    _, pred_docs = aggregate_tokens(doc_ids, offsets, pred_rows)
    _, gold_docs = aggregate_tokens(doc_ids, offsets, gold_rows)
    names = lambda ids: [label_names[int(t)] for t in ids]  # noqa: E731
    out = metrics.tagging_metrics([names(p) for p in pred_docs], [names(g) for g in gold_docs], label_names)
    out["num_examples"] = len(gold_docs)
    return out


def seq2seq_report(dataset, hyp_ids, encoder):
    """Sequence accuracy and token (syllable) error rate of decoded outputs vs references."""
    from ..models.seq2seq_metrics import seq2seq_metrics

    refs = [encoder.decode_target(dataset[i]["tgt_ids"][1:-1]) for i in range(len(dataset))]
    return seq2seq_metrics([encoder.decode_target(h) for h in hyp_ids], refs)


def evaluate(model, dataset, task, collate, label_names, max_tokens, padding_side="right",
             world_size=1, rank=0, encoder=None, decoding=None):
    """Metrics of ``model`` on ``dataset`` (seq2seq needs the ``encoder`` to compare texts)."""
    outputs = predict(model, dataset, task, collate, max_tokens, padding_side, world_size, rank,
                      decoding)
    return report(task, dataset, outputs, label_names, encoder)


def report(task, dataset, outputs, label_names, encoder=None):
    """Metrics of ``predict`` outputs on ``dataset``."""
    if task == "classification":
        return classification_report(dataset, outputs, label_names)
    if task == "seq2seq":
        return seq2seq_report(dataset, outputs, encoder)
    return tagging_report(dataset, outputs, label_names)


def main_metric(task):
    """The dev metric that picks the best checkpoint (higher is better)."""
    return {"classification": "accuracy", "tagging": "f1", "seq2seq": "seq_acc"}[task]


def decoding_of(model_cfg):
    """The decoding settings evaluation uses (seq2seq), from the Model section."""
    return {"beam_size": model_cfg.beam_size, "length_penalty": model_cfg.length_penalty}


def checkpoint_outputs(cfg, ckpt_dir, split="test"):
    """``predict`` outputs of the checkpoint in ``ckpt_dir`` on ``split`` of the data ``cfg.Data``
    describes -> (outputs, dataset, checkpoint meta, encoder)."""
    from ..data.collate import Collator
    from ..data.dataset import build_datasets
    from .checkpoint import load_for_inference

    model, meta, encoder, _ = load_for_inference(ckpt_dir)
    dataset = getattr(build_datasets(cfg.Data, task_hint=meta["task"], encoder=encoder,
                                     splits=(split,)), split)
    collate = Collator(encoder.pad_id, cfg.Data.pad_to_multiple_of, cfg.Data.padding_side)
    outputs = predict(model, dataset, meta["task"], collate, cfg.Data.eval_max_tokens,
                      cfg.Data.padding_side, decoding=decoding_of(cfg.Model))
    return outputs, dataset, meta, encoder


def evaluate_checkpoint(cfg, ckpt_dir, split="test"):
    """Metrics of the checkpoint in ``ckpt_dir`` on ``split`` of the data ``cfg.Data`` describes."""
    outputs, dataset, meta, encoder = checkpoint_outputs(cfg, ckpt_dir, split)
    out = report(meta["task"], dataset, outputs, meta["label_names"], encoder)
    return {"checkpoint": ckpt_dir, "split": split, "step": meta["step"], **out}
