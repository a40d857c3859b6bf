"""``Data.corpus: jsonl`` / ``tsv`` / ``parquet``: the user's own files (a file, a directory or
a glob of shards; ``.gz`` read through gzip), read by ``data.readers``."""
from ...config import ConfigError
from .. import readers
from ..splits import SPLITS, example_key, split_method, stable_split
from .base import Corpus, label_counts, logger


def user_corpus(cfg, fmt):
    if not cfg.train_file:
        raise ConfigError(f"Data.train_file: Data.corpus: {fmt} reads your own files; set "
                          f"Data.train_file (and optionally dev_file / test_file)")
    scheme = cfg.get("tag_scheme", "auto")
    limits = readers.ReadLimits.of(cfg)
    files = {"train": readers.read_files(cfg.train_file, fmt, cfg.task, cfg.skip_invalid, scheme,
                                         limits)}
    task = files["train"].task
    for split in ("dev", "test"):
        path = cfg.get(f"{split}_file")
        if path:  # read with the train file's task: a file of another task fails on its line 1
            files[split] = readers.read_files(path, fmt, task, cfg.skip_invalid, scheme, limits)
    labels = readers.map_labels(list(files.values()), cfg.get("label_names"), cfg.skip_invalid,
                                scheme)
    splits, how = _assign_splits(files, cfg.split_seed)
    stats = {
        "corpus": fmt, "task": task, "task_from": "Data.task" if cfg.task else "fields of the first line",
        "files": {s: {"path": fd.path, **fd.stats()} for s, fd in files.items()},
        "split": {"sizes": {s: len(splits[s]) for s in SPLITS}, "from": how},
        "skipped_total": sum(sum(fd.skipped.values()) for fd in files.values()),
        **labels.stats,
    }
    if len(files) < 3:
        stats["split"]["method"] = split_method(cfg.split_seed)
    overlap = _cross_split_overlap(splits)
    if overlap:
        stats["split"]["texts_in_two_splits"] = overlap
        logger.warning("the same text appears in two splits %s: evaluation on it is optimistic; "
                       "remove the duplicates from your files", overlap)
    if labels.count_per_label:
        stats["per_label"] = {s: label_counts(splits[s], labels.names) for s in SPLITS}
    return Corpus(task, splits, labels.names, stats)


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
