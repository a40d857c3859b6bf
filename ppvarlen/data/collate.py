"""Dynamic padding: a list of encoded items -> a dict of int64 numpy arrays (DESIGN.md).

The collator owns the pad value of every field (pitfall 7): ids get the
tokenizer's pad id, masks and token types 0, labels -100 (the loss's ignore
index).  It pads each batch to its own longest item, rounded up to
``pad_to_multiple_of`` and, with ``bucket_boundaries``, up to the smallest
boundary that fits (fixed shapes per bucket; the same length
``BucketBatchSampler.pad_length`` reports).  It never tokenises (pitfall 6).

paddlenlp.data.Pad does the core padding job, but it pads only to the batch
max (no multiple-of or bucket target) and importing it pulls in all of
paddlenlp (~3.8 s measured), which the deploy host would pay on every start,
so padding is done here with numpy (a dozen lines).
"""
import numpy as np

from .errors import DataError

IGNORE_INDEX = -100

# field -> (output key, pad value or "pad_id")
_SEQUENCE_FIELDS = {
    "input_ids": "pad_id",
    "attention_mask": 0,
    "token_type_ids": 0,
    "labels": IGNORE_INDEX,
}
_SCALAR_FIELDS = {"label": "labels", "doc_id": "doc_id", "offset": "offset"}


def pad_sequences(seqs, pad_value, length, side="right"):
    """Stack ``seqs`` (lists of ints) into an int64 [B, length] array filled with ``pad_value``."""
    out = np.full((len(seqs), length), pad_value, dtype=np.int64)
    for row, seq in enumerate(seqs):
        n = len(seq)
        if n > length:
            raise ValueError(f"pad_sequences: item {row} has {n} tokens > target length {length}")
        if n:
            if side == "right":
                out[row, :n] = seq
            else:
                out[row, length - n:] = seq
    return out


class Collator:
    """``Collator(pad_id)(items) -> dict of numpy arrays``.

    Classification items ``{input_ids, label, doc_id}`` -> ``input_ids`` [B, L],
    ``seq_len`` [B], ``labels`` [B], ``doc_id`` [B].  Tagging items add a
    ``labels`` list aligned with ``input_ids`` (-> [B, L], -100 on pads) and
    ``offset``.  Seq2seq items ``{src_ids, tgt_ids, doc_id}`` -> ``src_ids``,
    ``src_len``, ``tgt_in`` = tgt[:-1] (pad id), ``tgt_out`` = tgt[1:] (-100),
    ``tgt_len`` (= len(tgt) - 1).  Unknown fields are an error, not dropped.
    """

    def __init__(self, pad_id, pad_to_multiple_of=1, padding_side="right", bucket_boundaries=None):
        if padding_side not in ("right", "left"):
            raise ValueError(f"Data.padding_side must be right or left, got {padding_side!r}")
        if pad_to_multiple_of < 1:
            raise ValueError(f"Data.pad_to_multiple_of must be >= 1, got {pad_to_multiple_of}")
        self.pad_id = int(pad_id)
        self.multiple = int(pad_to_multiple_of)
        self.side = padding_side
        self.boundaries = sorted(int(b) for b in bucket_boundaries) if bucket_boundaries else None

    def target_length(self, longest):
        """Padded length for a batch whose longest item has ``longest`` tokens."""
        length = -(-max(int(longest), 1) // self.multiple) * self.multiple
        if self.boundaries:
            fits = [b for b in self.boundaries if b >= length]
            length = fits[0] if fits else length
        return length

    def _pad_field(self, items, key, pad_value):
        seqs = [item[key] for item in items]
        return pad_sequences(seqs, pad_value, self.target_length(max(len(s) for s in seqs)),
                             self.side)

    def __call__(self, items):
        if not items:
            raise ValueError("Collator got an empty batch")
        if "src_ids" in items[0]:
            return self._seq2seq(items)
        keys = set(items[0])
        for i, item in enumerate(items):
            if set(item) != keys:
                raise DataError(f"batch item {i} has fields {sorted(item)} but item 0 has "
                                f"{sorted(keys)}; all items of a dataset must have the same fields")
        unknown = keys - set(_SEQUENCE_FIELDS) - set(_SCALAR_FIELDS)
        if unknown or "input_ids" not in keys:
            raise DataError(f"Collator: unexpected fields {sorted(unknown)} (need input_ids; "
                            f"known: {sorted(set(_SEQUENCE_FIELDS) | set(_SCALAR_FIELDS))})")
        lens = [len(item["input_ids"]) for item in items]
        seq_fields = [k for k in _SEQUENCE_FIELDS if k in keys]
        if "labels" in keys and not isinstance(items[0]["labels"], (list, tuple, np.ndarray)):
            raise DataError("Collator: 'labels' must be a per-token list (tagging); use 'label' "
                            "for one class per example")
        for key in seq_fields:
            for i, item in enumerate(items):
                if len(item[key]) != lens[i]:
                    raise DataError(f"batch item {i} (doc_id {item.get('doc_id', '?')}): "
                                    f"{key} has {len(item[key])} entries but input_ids has "
                                    f"{lens[i]}; {key} must align one-to-one with input_ids")
        length = self.target_length(max(lens))
        batch = {}
        for key in seq_fields:
            pad = self.pad_id if _SEQUENCE_FIELDS[key] == "pad_id" else _SEQUENCE_FIELDS[key]
            batch[key] = pad_sequences([item[key] for item in items], pad, length, self.side)
        batch["seq_len"] = np.asarray(lens, dtype=np.int64)
        for key, out_key in _SCALAR_FIELDS.items():
            if key in keys:
                batch[out_key] = np.asarray([item[key] for item in items], dtype=np.int64)
        return batch

    def _seq2seq(self, items):
        for i, item in enumerate(items):
            if len(item.get("tgt_ids", ())) < 2:
                raise DataError(f"batch item {i} (doc_id {item.get('doc_id', '?')}): tgt_ids "
                                f"must hold at least BOS and EOS, got {item.get('tgt_ids')!r}")
        tgt_in = [item["tgt_ids"][:-1] for item in items]
        tgt_out = [item["tgt_ids"][1:] for item in items]
        tgt_length = self.target_length(max(len(t) for t in tgt_in))
        batch = {
            "src_ids": self._pad_field(items, "src_ids", self.pad_id),
            "src_len": np.asarray([len(item["src_ids"]) for item in items], dtype=np.int64),
            "tgt_in": pad_sequences(tgt_in, self.pad_id, tgt_length, self.side),
            "tgt_out": pad_sequences(tgt_out, IGNORE_INDEX, tgt_length, self.side),
            "tgt_len": np.asarray([len(t) for t in tgt_in], dtype=np.int64),
        }
        if "doc_id" in items[0]:
            batch["doc_id"] = np.asarray([item["doc_id"] for item in items], dtype=np.int64)
        return batch
