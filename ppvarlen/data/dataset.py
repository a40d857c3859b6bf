"""Encoded datasets: views on a split's store (``data.store``), which ``ppvarlen.store_build``
writes once (the task encoding the corpus the ingestion path reads) and a second run with the
same inputs reads from the cache.  The datasets: ``lengths`` (and
``src_lengths``/``tgt_lengths`` for a two-sided task) are small in-memory arrays, token ids stay
memory-mapped on disk and ``dataset[i]`` is a dict of numpy arrays / numpy scalars.  Padding
happens per batch in ``data.collate`` — never here (pitfalls 6 and 8).

``EncodedDataset`` subclasses ``paddle.io.Dataset`` rather than PaddleNLP's ``MapDataset``:
MapDataset's in-place ``map``/``filter`` would silently invalidate the precomputed ``lengths``
the samplers batch by.  ``paddle.io.DataLoader`` takes it as is (``data.loader``).
"""
from dataclasses import dataclass, field

import paddle


class EncodedDataset(paddle.io.Dataset):
    """A split's encoded items (a ``StoreSplit``) plus their lengths, known without touching
    the items.

    ``lengths[i]``: tokens of item i incl. special tokens; for a task with two length fields
    (seq2seq) their sum, with ``src_lengths`` / ``tgt_lengths`` beside it (the token-budget
    sampler budgets B*max_src + B*max_tgt).  ``doc_lengths``: tokens per source document BEFORE
    the long-text policy (length analysis).  ``subset(n)``: a view on the first n items.
    """

    def __init__(self, store, split, task, pad_id, count=None):
        super().__init__()
        self.store, self.split, self.task, self.pad_id = store, split, task, pad_id
        n = len(store) if count is None else count
        self._count = n
        length_fields = [f.name for f in store.fields if f.length]
        self.lengths = store.lengths[:n]
        if len(length_fields) == 2:
            self.src_lengths, self.tgt_lengths = (store.row_lengths(f)[:n] for f in length_fields)
        else:
            self.src_lengths = self.tgt_lengths = None
        doc_lengths = store.extra("doc_lengths")
        self.doc_lengths = self.lengths if doc_lengths is None or count is not None \
            else doc_lengths
        self.long_text_stats = store.meta.get("long_text", {})
        self.stats = dict(store.meta.get("stats", {}))

    def __getitem__(self, i):
        if not -self._count <= i < self._count:
            raise IndexError(f"item {i} of a {self._count}-item {self.split} split")
        return self.store[i % self._count]

    def __len__(self):
        return self._count

    def num_tokens(self, i):
        return int(self.lengths[i])

    def subset(self, n):
        """The first ``n`` items (same store, no copy)."""
        return EncodedDataset(self.store, self.split, self.task, self.pad_id, min(n, self._count))


@dataclass
class DataBundle:
    task: str
    train: EncodedDataset  # None for a split not asked for (open_datasets(splits=...))
    dev: EncodedDataset
    test: EncodedDataset
    encoder: object
    label_names: list
    stats: dict = field(default_factory=dict)
