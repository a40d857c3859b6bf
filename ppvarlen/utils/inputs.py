"""Check a model input batch before it reaches an exported graph (numpy only).

Shared by the export parity check and the deploy predictors: a bad batch gets
a ValueError naming the field and the fix, never an index error deep inside a
Paddle or ONNX Runtime kernel (PITFALLS 17: a length beyond the position table).
"""
import re

import numpy as np


def validate_batch(input_ids, seq_len, *, max_position=None, vocab_size=None, pad_id=None):
    """Validate right-padded ``input_ids`` [B, L] int64 and ``seq_len`` [B] int64.

    ``max_position``: longest sequence the graph accepts (position table size);
    longer inputs must be truncated or windowed first (the manifest's long_text
    policy).  ``pad_id``: when given, positions at or after ``seq_len`` must hold
    it and the last real position must not, so ``seq_len`` equals the real length.
    Returns the two arrays unchanged.
    """
    for name, arr, rank in (("input_ids", input_ids, 2), ("seq_len", seq_len, 1)):
        if not isinstance(arr, np.ndarray):
            raise ValueError(f"{name} must be a numpy array, got {type(arr).__name__}")
        if arr.dtype != np.int64:
            raise ValueError(f"{name} must be int64, got {arr.dtype}; convert with "
                             f"np.asarray({name}, dtype=np.int64)")
        if arr.ndim != rank:
            want = "[batch, length]" if rank == 2 else "[batch]"
            raise ValueError(f"{name} must have rank {rank} {want}, got shape {arr.shape}")
    batch, length = input_ids.shape
    if seq_len.shape[0] != batch:
        raise ValueError(f"seq_len has {seq_len.shape[0]} entries but input_ids has {batch} rows")
    if batch == 0 or length == 0:
        raise ValueError(f"empty batch: input_ids has shape {input_ids.shape}")
    if (seq_len < 1).any() or (seq_len > length).any():
        bad = int(np.flatnonzero((seq_len < 1) | (seq_len > length))[0])
        raise ValueError(f"seq_len[{bad}] = {int(seq_len[bad])} is outside [1, {length}] "
                         f"(the padded length of input_ids)")
    if max_position is not None and length > max_position:
        raise ValueError(f"input length {length} exceeds the model's max_position {max_position}; "
                         f"truncate or window longer texts (manifest long_text policy)")
    if vocab_size is not None and ((input_ids < 0).any() or (input_ids >= vocab_size).any()):
        bad = np.argwhere((input_ids < 0) | (input_ids >= vocab_size))[0]
        raise ValueError(f"input_ids[{bad[0]}, {bad[1]}] = {int(input_ids[tuple(bad)])} is outside "
                         f"the vocabulary [0, {vocab_size}); encode with the exported vocab.txt")
    if pad_id is not None:
        is_pad = input_ids == pad_id
        beyond = np.arange(length)[None, :] >= seq_len[:, None]
        wrong = np.flatnonzero((beyond & ~is_pad).any(axis=1))
        if wrong.size:
            b = int(wrong[0])
            raise ValueError(f"row {b}: seq_len {int(seq_len[b])} is shorter than the real length "
                             f"(non-pad tokens after it); seq_len must count every real token")
        last_is_pad = is_pad[np.arange(batch), seq_len - 1]
        if last_is_pad.any():
            b = int(np.flatnonzero(last_is_pad)[0])
            raise ValueError(f"row {b}: seq_len {int(seq_len[b])} is longer than the real length "
                             f"(position {int(seq_len[b]) - 1} is the pad id {pad_id})")
    return input_ids, seq_len


# A text is blank when it holds only these characters.  The pattern reads the same in
# Python's `re` and in ECMA-262 (JSON Schema's regex dialect): `\s` differs between the two
# (Python: \x1c-\x1f and \x85 too; ECMA: \ufeff too), so both differences are listed.
NON_BLANK_PATTERN = r"[^\s\x1c-\x1f\x85\ufeff]"
_NON_BLANK = re.compile(NON_BLANK_PATTERN)


def is_blank(text):
    """True when ``text`` has no character outside whitespace (in either regex dialect)."""
    return _NON_BLANK.search(text) is None
