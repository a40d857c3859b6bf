"""Dynamic padding: a list of encoded items -> a dict of int64 numpy arrays (DESIGN.md).

The task declares every field's pad value (``data.store.StoreField``; pitfall 7): ids get the
tokenizer's pad id, masks and token types 0, labels -100 (the loss's ignore
index); the collator applies the declarations and names no task field.  It pads each batch to its own longest item, rounded up to
``pad_to_multiple_of`` and, with ``bucket_boundaries``, up to the smallest
boundary that fits (fixed shapes per bucket; the same length
``BucketBatchSampler.pad_length`` reports).  It never tokenises (pitfall 6).

paddlenlp.data.Pad does the core padding job, but it pads only to the batch
max (no multiple-of or bucket target) and importing it pulls in all of
paddlenlp (seconds), which the deploy host would pay on every start,
so padding is done here with numpy (a dozen lines).
"""
import numpy as np

from .errors import DataError
from .store import StoreField

IGNORE_INDEX = -100

# the base contract every token-row task shares (``tasks.base.Task.store_fields``): what a
# collator holds when it is given no declaration (parity's and the predictor's id-only batches)
IDS_ONLY = (StoreField("input_ids", "int32", ragged=True, length=True, lengths="seq_len"),
            StoreField("doc_id", "int64"))


def pad_sequences(seqs, pad_value, length, side="right"):
    """Stack ``seqs`` (lists of ints) into an int64 [B, length] array filled with ``pad_value``."""
    out = np.full((len(seqs), length), pad_value, dtype=np.int64)
    for row, seq in enumerate(seqs):
        n = len(seq)
        if n > length:
            raise ValueError(f"pad_sequences: item {row} has {n} tokens > target length {length}")
        if side == "right":
            out[row, :n] = seq
        else:
            out[row, length - n:] = seq
    return out


def _scalar(name, i, item):
    """Item ``i``'s value of the declared-scalar field ``name`` as an int64, or a DataError.

    Checked one item at a time: a one-element list ``[5]`` would otherwise pass through
    numpy's reshape as the number 5, and a wrong shape must not turn into data.
    """
    value = item[name]
    if np.ndim(value) == 0:
        try:
            return np.int64(value)
        except (TypeError, ValueError, OverflowError):
            pass
    raise DataError(f"batch item {i} (doc_id {item.get('doc_id', '?')}): field {name!r} holds "
                    f"one number per item (declared scalar), got {value!r}")


class Collator:
    """``Collator(pad_id, fields=task.store_fields())(items) -> dict of numpy arrays``.

    Driven by the task's ``data.store.StoreField`` declarations, it names no field itself: a ragged
    field is padded with its ``pad`` ("pad_id" = the tokenizer's) to the batch's longest row
    under ``key`` (default its name), its row lengths go to ``lengths`` when declared; a
    ``shift`` field (teacher forcing) becomes ``<key>_in`` = row[:-1] (pad id) and
    ``<key>_out`` = row[1:] (-100) with lengths len - 1; a scalar field becomes a [B] array
    under ``key``; a field declared ``batch=False`` is left out.  Ragged batched fields that are
    not length fields align one-to-one with the (single)
    length field.  A declared non-length field may be absent from every item of a batch; an
    undeclared field, a missing length field or items with different fields are errors.
    """

    def __init__(self, pad_id, pad_to_multiple_of=1, padding_side="right", bucket_boundaries=None,
                 fields=IDS_ONLY):
        if padding_side not in ("right", "left"):
            raise ValueError(f"Data.padding_side must be right or left, got {padding_side!r}")
        if pad_to_multiple_of < 1:
            raise ValueError(f"Data.pad_to_multiple_of must be >= 1, got {pad_to_multiple_of}")
        self.pad_id = int(pad_id)
        self.multiple = int(pad_to_multiple_of)
        self.side = padding_side
        self.boundaries = sorted(int(b) for b in bucket_boundaries) if bucket_boundaries else None
        self.fields = {f.name: f for f in fields}
        self.length_fields = [f for f in self.fields.values() if f.length]
        if not self.length_fields:
            raise ValueError("Collator: the fields declare no length field (ragged, length=True)")

    def target_length(self, longest):
        """Padded length for a batch whose longest item has ``longest`` tokens."""
        length = -(-max(int(longest), 1) // self.multiple) * self.multiple
        # the smallest bucket boundary that fits (boundaries are sorted), else the length itself
        return next((b for b in self.boundaries or () if b >= length), length)

    def _pad(self, rows, pad_value):
        return pad_sequences(rows, pad_value, self.target_length(max(len(r) for r in rows)),
                             self.side)

    def __call__(self, items):
        if not items:
            raise ValueError("Collator got an empty batch")
        keys = set(items[0])
        for i, item in enumerate(items):
            if set(item) != keys:
                raise DataError(f"batch item {i} has fields {sorted(item)} but item 0 has "
                                f"{sorted(keys)}; all items of a dataset must have the same fields")
        unknown = keys - set(self.fields)
        missing = [f.name for f in self.length_fields if f.name not in keys]
        if unknown or missing:
            raise DataError(f"Collator: unexpected fields {sorted(unknown)}, missing "
                            f"{missing} (the task declares {sorted(self.fields)})")
        aligned = self.length_fields[0] if len(self.length_fields) == 1 else None
        batch = {}
        for f in self.fields.values():
            if f.name not in keys or not f.batch:
                continue
            if not f.ragged:
                batch[f.key or f.name] = np.array(
                    [_scalar(f.name, i, item) for i, item in enumerate(items)], dtype=np.int64)
                continue
            rows = [item[f.name] for item in items]
            if aligned is not None and not f.length:
                for i, (row, item) in enumerate(zip(rows, items)):
                    if len(row) != len(item[aligned.name]):
                        raise DataError(
                            f"batch item {i} (doc_id {item.get('doc_id', '?')}): {f.name} has "
                            f"{len(row)} entries but {aligned.name} has "
                            f"{len(item[aligned.name])}; {f.name} must align one-to-one with "
                            f"{aligned.name}")
            key = f.key or f.name
            pad = self.pad_id if f.pad == "pad_id" else int(f.pad)
            if f.shift:
                for i, row in enumerate(rows):
                    if len(row) < 2:
                        raise DataError(f"batch item {i} (doc_id {items[i].get('doc_id', '?')}): "
                                        f"{f.name} must hold at least BOS and EOS, got "
                                        f"{list(row)!r}")
                batch[key + "_in"] = self._pad([r[:-1] for r in rows], pad)
                batch[key + "_out"] = self._pad([r[1:] for r in rows], IGNORE_INDEX)
                lens = [len(r) - 1 for r in rows]
            else:
                batch[key] = self._pad(rows, pad)
                lens = [len(r) for r in rows]
            if f.lengths:
                batch[f.lengths] = np.asarray(lens, dtype=np.int64)
        return batch
