"""Loaders: ``train_loader`` (the train split's batches from its length-aware batch sampler:
the trainer, tests, the corpus-scale benchmark) and ``BatchLoader`` over any batch sampler, e.g.
``FixedBatches`` of a given batch list (``engine.evaluate`` reads its rank's share of the
length-sorted eval batches, ``data.order.length_sorted_batches``, that way).

A ``BatchLoader`` iterates the batch sampler's index lists, reads the items from the dataset
(a store view: token ids memory-mapped) and collates them into dicts of int64 numpy arrays.
``Data.num_workers`` = 0 does this in the calling process; > 0 hands it to
``paddle.io.DataLoader`` worker processes (each reopens the store's memmaps, see
``data.store.StoreSplit``) and turns the loader's tensors back into numpy, so a step sees the
same batch either way.  The order is always the batch sampler's: with workers the batches
are prefetched, never reordered, so the sampler's position (``state_dict``) and exact resume
are unchanged.

``train_loader``: shuffled ``Data.sampler`` batches (``samplers.build_batch_sampler``; seed +
epoch: ``loader.sampler.set_epoch(e)`` each epoch) and the collator of ``make_collator``
(padded to the sampler's buckets under ``Data.pad_to_bucket``), which the trainer's evaluation
reuses; evaluating a checkpoint (``engine.evaluate.checkpoint_outputs``) takes
``make_collator``'s without buckets.
"""
import numpy as np
import paddle
from paddle.io import BatchSampler

from .collate import Collator
from .samplers import build_batch_sampler


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


def make_collator(data_cfg, dataset, sampler=None):
    """The collator of ``dataset``'s batches: its pad id and its store's field declarations."""
    bounds = getattr(sampler, "boundaries", None) if data_cfg.pad_to_bucket else None
    return Collator(dataset.pad_id, data_cfg.pad_to_multiple_of, data_cfg.padding_side,
                    bucket_boundaries=bounds, fields=dataset.store.fields)


def train_loader(dataset, data_cfg, num_replicas=1, rank=0, seed=0):
    """``BatchLoader`` over the train split ``dataset`` with its shuffled length-aware batch
    sampler (this rank's share of ``num_replicas``); ``loader.sampler`` (set_epoch /
    state_dict for the trainer) and ``loader.collate`` (the batches' collator) are exposed."""
    sampler = build_batch_sampler(dataset, data_cfg, shuffle=True, num_replicas=num_replicas,
                                  rank=rank, seed=seed)
    collate = make_collator(data_cfg, dataset, sampler)
    return BatchLoader(dataset, sampler, collate, data_cfg.num_workers)
