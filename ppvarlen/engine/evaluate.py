"""Deterministic evaluation: length-sorted batches, outputs back in input order, un-padded per example.

With N data-parallel ranks each rank runs every N-th batch and the per-batch
outputs are all-gathered, so every rank computes the metrics on the full split.
"""
import sys
import time

import paddle
from tqdm import tqdm

from ..data.loader import BatchLoader, FixedBatches, make_collator
from ..data.order import length_sorted_batches, restore_order
from ..store_build import build_datasets
from ..tasks import get_task
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

    Besides the metrics: ``items`` (examples run, each window counted), ``long_text`` (what the
    policy did: truncated / windowed documents; a warning when any were truncated) and
    ``predict_seconds`` / ``items_per_s`` over the prediction pass only (batching and
    the model; reading and encoding the split not included).
    """
    outputs, dataset, meta, encoder, seconds = _timed_checkpoint_outputs(cfg, ckpt_dir, split,
                                                                         progress)
    out = get_task(meta["task"]).report(dataset, outputs, meta["label_names"], encoder)
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
