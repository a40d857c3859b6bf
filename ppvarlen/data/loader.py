"""Loaders: ``build_loader`` (a split's batches from its length-aware batch sampler: the
trainer's train loader, tests, the corpus-scale benchmark) and ``BatchLoader`` over any batch
sampler, e.g. ``FixedBatches`` of a given batch list (``engine.evaluate`` reads its rank's share
of the length-sorted eval batches, ``data.order``, that way).

A ``BatchLoader`` iterates the batch sampler's index lists, reads the items from the dataset
(a store view: token ids memory-mapped) and collates them into dicts of int64 numpy arrays.
``Data.num_workers`` = 0 does this in the calling process; > 0 hands it to
``paddle.io.DataLoader`` worker processes (each reopens the store's memmaps, see
``data.store.StoreSplit``) and turns the loader's tensors back into numpy, so a step sees the
same batch either way.  The order is always the batch sampler's: with workers the batches
are prefetched, never reordered, so the sampler's position (``state_dict``) and exact resume
are unchanged.

``build_loader``'s train split: shuffled ``Data.sampler`` batches (seed + epoch;
``loader.sampler.set_epoch(e)`` each epoch); dev/test: the token-budget sampler unshuffled under
``Data.eval_max_tokens`` (a global stable sort by length).
"""
import numpy as np
import paddle
from paddle.io import BatchSampler

from .collate import Collator
from .samplers import TokenBudgetBatchSampler, build_batch_sampler

SPLITS = ("train", "dev", "test")


class FixedBatches(BatchSampler):
    """A given list of index lists as a batch sampler (what ``paddle.io.DataLoader`` takes)."""

    def __init__(self, batches):
        self.batches = [list(b) for b in batches]

    def __iter__(self):
        return iter(self.batches)

    def __len__(self):
        return len(self.batches)


class BatchLoader:
    """Collated batches of ``dataset`` in ``sampler`` order, on ``num_workers`` processes."""

    def __init__(self, dataset, sampler, collate, num_workers=0):
        if num_workers < 0:
            raise ValueError(f"Data.num_workers must be >= 0, got {num_workers}")
        self.dataset, self.sampler, self.collate = dataset, sampler, collate
        self.num_workers = int(num_workers)

    def __len__(self):
        return len(self.sampler)

    def __iter__(self):
        if self.num_workers == 0:
            for idxs in self.sampler:
                yield self.collate([self.dataset[i] for i in idxs])
            return
        loader = paddle.io.DataLoader(self.dataset, batch_sampler=self.sampler,
                                      collate_fn=self.collate, num_workers=self.num_workers,
                                      return_list=True)
        for batch in loader:
            yield {k: v.numpy() if hasattr(v, "numpy") else np.asarray(v)
                   for k, v in batch.items()}


def dataset_fields(dataset):
    """The field declarations of a store-backed dataset (None for a plain list of items)."""
    store = getattr(dataset, "store", None)
    return getattr(store, "fields", None)


def make_collator(data_cfg, pad_id, sampler=None, fields=None):
    """The batches' collator; ``fields``: the items' declarations (a dataset's store fields)."""
    bounds = getattr(sampler, "boundaries", None) if data_cfg.pad_to_bucket else None
    return Collator(pad_id, data_cfg.pad_to_multiple_of, data_cfg.padding_side,
                    bucket_boundaries=bounds, **({"fields": fields} if fields else {}))


def build_loader(dataset, data_cfg, split, num_replicas=1, rank=0, seed=0, collate=None):
    """``BatchLoader`` over ``dataset`` with the split's length-aware batch sampler.

    ``loader.sampler`` (set_epoch / state_dict for the trainer) and ``loader.collate``
    (the batches' collator) are exposed; ``collate`` overrides the default collator."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if split == "train":
        sampler = build_batch_sampler(dataset, data_cfg, shuffle=True, num_replicas=num_replicas,
                                      rank=rank, seed=seed)
    else:
        sampler = TokenBudgetBatchSampler(eval_cost(dataset), data_cfg.eval_max_tokens,
                                          shuffle=False, max_sentences=data_cfg.max_sentences,
                                          num_replicas=num_replicas, rank=rank, seed=seed)
    collate = collate or make_collator(data_cfg, dataset.pad_id, sampler, dataset_fields(dataset))
    return BatchLoader(dataset, sampler, collate, data_cfg.num_workers)


def eval_cost(dataset):
    return dataset.lengths if dataset.src_lengths is None else \
        np.stack([dataset.src_lengths, dataset.tgt_lengths], axis=1)
