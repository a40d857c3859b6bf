"""Deterministic train/dev/test assignment by a stable hash of each example's text.

Python's ``hash()`` is salted per process (PYTHONHASHSEED), so a split built on it
changes from run to run and machine to machine; sha1 of the UTF-8 bytes does not.
Because the bucket depends only on the text, identical texts always land in the same
split: a duplicated text can never leak from train into test.  ``Data.split_seed`` (0 =
the standard split) hashes the text with a prefix, giving another 80/10/10 partition with
the same guarantees: repeated-split comparisons (benchmarks/sentiment_splits.py) use it.
"""
import hashlib

import numpy as np

SPLITS = ("train", "dev", "test")
SPLIT_METHOD = "sha1(utf-8 text) -> train 80% / dev 10% / test 10%"


DEV_FROM, TEST_FROM = 0.8, 0.9  # the fractions where dev and test begin


def _seed_prefix(seed):
    """What a key's UTF-8 bytes are hashed after: nothing for seed 0 (the default partition)."""
    return f"split-seed-{seed}\x00".encode() if seed else b""


def stable_fraction(key, seed=0):
    """A number in [0, 1) that depends only on ``key`` and ``seed`` (same in every process)."""
    # surrogatepass: JSON input may carry lone surrogate escapes; they still hash stably.
    digest = hashlib.sha1(_seed_prefix(seed) + key.encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def stable_split(key, seed=0):
    """``"train"`` (80%), ``"dev"`` (10%) or ``"test"`` (10%) for the text ``key``."""
    fraction = stable_fraction(key, seed)
    if fraction < DEV_FROM:
        return "train"
    return "dev" if fraction < TEST_FROM else "test"


def split_codes_and_hashes(keys_utf8, seed=0):
    """Keys given as their UTF-8 bytes (``surrogatepass``) -> (uint8 index into ``SPLITS`` of
    each one's ``stable_split``, uint64 hash of each: equal keys, equal hashes, for the overlap
    checks), from one sha1 per key: the split from its first 8 bytes, the hash from the next 8."""
    prefix = _seed_prefix(seed)
    sha1 = hashlib.sha1
    digests = np.frombuffer(b"".join([sha1(prefix + k).digest() for k in keys_utf8]),
                            np.uint8).reshape(-1, 20)
    head = digests[:, :8].copy().view(">u8").ravel()
    hashes = digests[:, 8:16].copy().view("<u8").ravel()
    codes = (head >= _DEV_HEAD).astype(np.uint8) + (head >= _TEST_HEAD)
    return codes, hashes


def _first_head(fraction):
    """The least 64-bit head whose ``stable_fraction`` (the float division ``stable_split``
    reads) is at least ``fraction``: the split boundaries as integers, so an array of heads is
    cut exactly as ``stable_split`` cuts each."""
    lo, hi = 0, 1 << 64
    while lo < hi:
        mid = (lo + hi) // 2
        if mid / 2.0**64 >= fraction:
            hi = mid
        else:
            lo = mid + 1
    return lo


_DEV_HEAD, _TEST_HEAD = np.uint64(_first_head(DEV_FROM)), np.uint64(_first_head(TEST_FROM))


def key_field(fields):
    """The field whose value is the split key of an example with ``fields``, or None when the
    key is made of more than one value (``example_key``)."""
    for name in ("text", "tokens", "source"):
        if name in fields:
            return None if name == "tokens" else name
    return None


def example_key(example, ignore=()):
    """The text an example is split by: its text, its tokens joined, or its source; for another
    task's format (a text pair) all its string fields in key order, joined, but those named in
    ``ignore``."""
    name = key_field(example)
    if name is not None:
        return example[name]
    if "tokens" in example:
        return " ".join(example["tokens"])
    texts = [example[k] for k in sorted(example) if k not in ignore and isinstance(example[k], str)]
    if not texts:
        raise ValueError(f"example has no text field: {sorted(example)}")
    return "\x1f".join(texts)


def split_method(seed):
    """How examples were split, for corpus stats."""
    return SPLIT_METHOD if not seed else f"{SPLIT_METHOD}, Data.split_seed={seed}"


def split_examples(examples, seed=0):
    """Group examples into ``{"train": [...], "dev": [...], "test": [...]}``, order kept."""
    out = {name: [] for name in SPLITS}
    for ex in examples:
        out[stable_split(example_key(ex), seed)].append(ex)
    return out
