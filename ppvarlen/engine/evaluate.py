"""Deterministic evaluation: length-sorted batches, outputs back in input order, un-padded per example.

With N data-parallel ranks each rank runs every N-th batch and the per-batch
outputs are all-gathered, so every rank computes the metrics on the full split.
"""
import paddle

from ..data.loader import FixedBatches, BatchLoader
from ..data.order import length_sorted_batches, restore_order
from ..tasks import get_task
from .distributed import all_gather_objects


@paddle.no_grad()
def predict(model, dataset, task, collate, max_tokens, padding_side="right", world_size=1, rank=0,
            decoding=None, num_workers=0):
    """Per-example model outputs in dataset order (``task``: a Task or its name).

    classification: float32 logits ``[C]``; tagging: predicted tag ids ``[len]``
    (the example's real tokens only); seq2seq: generated ids (no BOS/EOS), decoded per
    ``decoding`` ({"beam_size", "length_penalty"}; default greedy); masked-LM: per example
    [loss sum, correct, masked] under a fixed mask.  ``num_workers``: loader processes
    reading the store (``data.loader``).
    """
    task = get_task(task)
    was_training = model.training
    model.eval()
    batches = length_sorted_batches(dataset.lengths, max_tokens)
    loader = BatchLoader(dataset, FixedBatches(batches[rank::world_size]), collate, num_workers)
    mine = [task.predict_batch(model, batch, decoding or {}, padding_side) for batch in loader]
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


def checkpoint_outputs(cfg, ckpt_dir, split="test"):
    """``predict`` outputs of the checkpoint in ``ckpt_dir`` on ``split`` of the data ``cfg.Data``
    describes -> (outputs, dataset, checkpoint meta, encoder)."""
    from ..data.collate import Collator
    from ..tasks import build_datasets
    from .checkpoint import load_for_inference

    model, meta, encoder, _ = load_for_inference(ckpt_dir)
    dataset = getattr(build_datasets(cfg.Data, task_hint=meta["task"], encoder=encoder,
                                     splits=(split,)), split)
    collate = Collator(encoder.pad_id, cfg.Data.pad_to_multiple_of, cfg.Data.padding_side,
                       fields=dataset.store.fields)
    outputs = predict(model, dataset, meta["task"], collate, cfg.Data.eval_max_tokens,
                      cfg.Data.padding_side, decoding=decoding_of(cfg.Model),
                      num_workers=cfg.Data.num_workers)
    return outputs, dataset, meta, encoder


def evaluate_checkpoint(cfg, ckpt_dir, split="test"):
    """Metrics of the checkpoint in ``ckpt_dir`` on ``split`` of the data ``cfg.Data`` describes."""
    outputs, dataset, meta, encoder = checkpoint_outputs(cfg, ckpt_dir, split)
    out = get_task(meta["task"]).report(dataset, outputs, meta["label_names"], encoder)
    return {"checkpoint": ckpt_dir, "split": split, "step": meta["step"], **out}
