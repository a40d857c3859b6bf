"""What every corpus reader returns (``Corpus``) and the helpers they share.

Imports nothing from the rest of the package, so every reader can import it without a cycle.
"""
import copy
from collections import Counter
from dataclasses import dataclass, field

from ...config import ConfigError
from ...utils.log import get_logger
from ..splits import SPLITS, split_method

logger = get_logger("data.corpora")


@dataclass
class Corpus:
    task: str
    splits: dict  # "train" / "dev" / "test" -> list of example dicts
    label_names: list
    stats: dict = field(default_factory=dict)


def fresh_copy(cached):
    """A copy of a cached corpus that callers may mutate freely (examples hold only
    strings, ints and lists of strings; strings are immutable, so copying lists suffices)."""
    splits = {s: [{k: list(v) if isinstance(v, list) else v for k, v in ex.items()}
                  for ex in exs] for s, exs in cached.splits.items()}
    return Corpus(cached.task, splits, list(cached.label_names or []), copy.deepcopy(cached.stats))


def check_limit(limit):
    """``Data.limit`` keeps at least one example of each split, or is null."""
    if limit is not None and limit < 1:
        raise ConfigError(f"Data.limit: {limit} keeps nothing; use a positive number or null")


def record_limit(stats, sizes, limit):
    """``Data.limit`` keeps the first ``limit`` examples of each split of ``sizes`` -> the sizes
    kept, recorded in ``stats`` and logged."""
    after = {s: min(n, limit) for s, n in sizes.items()}
    stats["limit"] = {"limit": limit, "before": dict(sizes), "after": after}
    logger.info("Data.limit=%d: kept %s of %s examples per split", limit, after, sizes)
    return dict(after)


def apply_limit(corpus, limit):
    """``Data.limit`` applied to a corpus in memory (``record_limit``)."""
    if limit is None:
        return
    check_limit(limit)
    record_limit(corpus.stats, {s: len(corpus.splits[s]) for s in SPLITS}, limit)
    for s in SPLITS:
        del corpus.splits[s][limit:]


def check_tag_scheme_key(wanted, corpus_name, corpus):
    """``Data.tag_scheme`` (``wanted``) must be the corpus's own (it is never silently ignored)."""
    found = corpus.stats.get("tag_scheme", {}).get("scheme")
    if wanted in ("auto", found):
        return
    if found is None:
        raise ConfigError(f"Data.tag_scheme: {wanted!r} applies to tagging data, but corpus "
                          f"{corpus_name!r} is a {corpus.task} corpus; remove Data.tag_scheme")
    raise ConfigError(f"Data.tag_scheme: {wanted!r}, but corpus {corpus_name!r} uses {found} "
                      f"tags; remove Data.tag_scheme or set it to {found}")


def label_counts(examples, names):
    c = Counter(ex["label"] for ex in examples)
    return {name: c.get(i, 0) for i, name in enumerate(names)}


def split_stats(splits, split_seed):
    return {"method": split_method(split_seed), "sizes": {s: len(splits[s]) for s in SPLITS}}
