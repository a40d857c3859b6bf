"""The registry of built-in corpora and their cache: ``load_built_in(data_cfg)`` (every corpus,
user files too: ``data.sources.load_corpus``).

A built-in corpus is a function of a few Data keys (its cache key); adding one means writing
its reader module and one ``BUILT_IN`` entry.  ``Data.limit`` is applied to a fresh copy, so
the cached corpus is never changed by a caller.
"""
import functools
from dataclasses import dataclass
from typing import Callable

from ...config import Config, ConfigError, load_config
from .base import apply_limit, check_tag_scheme_key, fresh_copy
from .g2p_corpus import g2p_corpus
from .ner import ner_corpus
from .sentiment import sentiment_corpus


@dataclass(frozen=True)
class BuiltInCorpus:
    task: str
    build: Callable  # build(**{key: Data.key for key in keys}) -> Corpus
    keys: tuple = ("split_seed",)  # the Data keys the corpus depends on


BUILT_IN = {
    "sentiment": BuiltInCorpus("classification", sentiment_corpus),
    "people_daily_ner": BuiltInCorpus("tagging", ner_corpus),
    "g2p": BuiltInCorpus("seq2seq", g2p_corpus, ("max_source_len", "max_target_len", "split_seed")),
}
USER_FORMATS = ("jsonl", "tsv", "csv", "conll", "parquet")
# Keys only user files read: a built-in corpus would silently ignore them.
USER_FILE_KEYS = ("train_file", "dev_file", "test_file", "label_names", "text_field",
                  "text_pair_field", "label_field", "tokens_field", "tags_field", "columns")


def load_built_in(cfg):
    """The built-in corpus the Data section ``cfg`` names (a fresh copy, ``Data.limit`` applied)."""
    name = cfg.corpus
    built_in = BUILT_IN[name]
    if cfg.task not in (None, built_in.task):
        raise ConfigError(f"Data.task: corpus {name!r} is a {built_in.task} corpus, but "
                          f"Data.task is {cfg.task!r}; remove Data.task or pick another corpus")
    for key in USER_FILE_KEYS:
        if cfg.get(key) is not None:
            raise ConfigError(f"Data.{key} is only read for Data.corpus: jsonl, tsv, csv, conll "
                              f"or parquet (your files), but the corpus is the built-in {name!r}; remove Data.{key} or set "
                              f"Data.corpus to your files' format")
    corpus = fresh_copy(_built(name, **{k: cfg.get(k) for k in built_in.keys}))
    check_tag_scheme_key(cfg.get("tag_scheme", "auto"), name, corpus)
    apply_limit(corpus, cfg.limit)
    return corpus


@functools.lru_cache(maxsize=6)
def _built(name, **values):
    """The built corpus for ``name`` and the values of its keys (never handed out: copy it)."""
    return BUILT_IN[name].build(**values)


def data_section(data_cfg):
    """The Data section a caller passed: a Config, or a dict (tests), validated with defaults."""
    if isinstance(data_cfg, dict):  # convenience for tests: validate and fill defaults
        return load_config(data={"Data": data_cfg}).Data
    if isinstance(data_cfg, Config) and "corpus" not in data_cfg and "Data" in data_cfg:
        raise ConfigError("load_corpus takes the Data section: call load_corpus(cfg.Data)")
    return data_cfg
