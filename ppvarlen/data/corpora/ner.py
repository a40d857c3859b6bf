"""``Data.corpus: people_daily_ner``: the People's Daily paragraphs (``people_daily.py``) as
character-level BIO tags: nr -> PER (consecutive nr words merged), ns -> LOC, nt -> ORG."""
from collections import Counter

from ..splits import SPLITS, example_key, split_examples
from .base import Corpus, logger, split_stats
from .people_daily import parse_line, people_daily

NER_LABELS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG"]
NER_POS_TO_TYPE = {"nr": "PER", "ns": "LOC", "nt": "ORG"}


def _name_list_pairs(words):
    """Split a run of >= 4 ``nr`` words into (surname, given name) pairs, or None.

    The corpus tags a Chinese name as two ``nr`` words (江/nr 泽民/nr), and lists of
    people are written with no separator: 江/nr 泽民/nr 李/nr 鹏/nr ... (up to 20 words).
    Read literally as "consecutive nr words = one PER", such a list would be one
    20-character person.  A run that reads exactly as 1-char surname + 1-2 char given
    name pairs (310 of the 315 runs of >= 4 words) is split into one PER per pair;
    any other run (陈/nr 方/nr 安生/nr) stays one PER.
    """
    if len(words) < 4 or len(words) % 2:
        return None
    pairs = [words[i:i + 2] for i in range(0, len(words), 2)]
    return pairs if all(len(s) == 1 and 1 <= len(g) <= 2 for s, g in pairs) else None


def ner_tags(paragraph):
    """Paragraph -> (chars, BIO tags, name lists split); an entity is its one B- tag."""
    tags = ["O"] * len(paragraph.text)
    name_lists = 0
    if NER_POS_TO_TYPE.keys().isdisjoint(paragraph.pos):
        return list(paragraph.text), tags, name_lists  # no entity word (a third of the paragraphs)
    words = paragraph.words()
    types = [NER_POS_TO_TYPE.get(pos) for pos in paragraph.pos]
    offsets = [0, *paragraph.ends]  # character offset of each word
    for i in (k for k, t in enumerate(types) if t is not None):
        if i and types[i] == "PER" and types[i - 1] == "PER":
            continue  # inside a run of nr words, handled at its first word
        etype = types[i]
        j = i + 1
        if etype == "PER":  # consecutive nr words are one person (surname + given name)
            while j < len(words) and types[j] == "PER":
                j += 1
        groups = _name_list_pairs(words[i:j]) if etype == "PER" else None
        if groups:
            name_lists += 1
        else:
            groups = [words[i:j]]
        start = offsets[i]
        for group in groups:
            n = sum(map(len, group))
            tags[start] = "B-" + etype
            tags[start + 1:start + n] = ["I-" + etype] * (n - 1)
            start += n
    return list(paragraph.text), tags, name_lists


def parse_ner_line(line, path="199801.txt", lineno=0):
    """``江/nr  泽民/nr  发表/v ...`` -> (chars, BIO tags, name lists split)."""
    return ner_tags(parse_line(line, path, lineno))


def ner_corpus(split_seed):
    source = people_daily()
    examples, name_lists = [], 0
    for paragraph in source.paragraphs:
        chars, tags, lists = ner_tags(paragraph)
        examples.append({"tokens": chars, "tags": tags})
        name_lists += lists
    splits = split_examples(examples, split_seed)
    stats = {
        "corpus": "people_daily_ner", "lines": source.lines, "empty_lines": source.empty_lines,
        "sentences": len(examples),
        "duplicate_sentences": len(examples) - len({example_key(ex) for ex in examples}),
        "characters": sum(len(ex["tokens"]) for ex in examples),
        "entities": _entities(examples),
        "person_name_lists_split": name_lists,
        "mapping": "nr->PER (consecutive nr words merged), ns->LOC, nt->ORG, other->O; "
                   "character-level BIO",
        "tag_scheme": {"scheme": "bio", "from": "built-in corpus"},
        "split": {**split_stats(splits, split_seed),
                  "entities": {s: _entities(splits[s]) for s in SPLITS}},
    }
    logger.info("people_daily_ner: %d sentences, entities %s, split %s", len(examples),
                stats["entities"], stats["split"]["sizes"])
    return Corpus("tagging", splits, list(NER_LABELS), stats)


def _entities(examples):
    """Entities by type: each begins at its one B- tag."""
    counts = Counter(tag[2:] for ex in examples for tag in ex["tags"] if tag[0] == "B")
    return {t: counts[t] for t in ("PER", "LOC", "ORG")}
