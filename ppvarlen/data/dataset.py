"""Encoded datasets: corpus -> token ids ONCE into a cached on-disk store -> length-aware loader.

``open_datasets(data_cfg, resolve_task, ...)`` is task-agnostic: the task (from
``resolve_task(name)``, which ``ppvarlen.tasks.build_datasets`` passes in: data never imports
tasks) declares its ``StoreField``s and an ``encode_example(ctx, example, doc_id, where)`` ->
(items, record) function.  The builder reads the corpus (``data.corpora``), builds or takes the
encoder, encodes every split on ``Data.num_proc`` worker processes (``data.parallel``: same
bytes for any count), applies the long-text policy the task's encode function plans
(``data.longtext``) and writes one store directory per split (``data.store``), keyed by content
in the cache (``data.cache``): a second run with the same inputs reads the store and never
touches the raw files.  The datasets are views on the store: ``lengths`` (and
``src_lengths``/``tgt_lengths`` for a two-sided task) are small in-memory arrays, token ids stay
memory-mapped on disk and ``dataset[i]`` is a dict of numpy arrays / numpy scalars.  Padding
happens per batch in ``data.collate`` — never here (pitfalls 6 and 8).

``EncodedDataset`` subclasses ``paddle.io.Dataset`` rather than PaddleNLP's ``MapDataset``:
MapDataset's in-place ``map``/``filter`` would silently invalidate the precomputed ``lengths``
the samplers batch by.  ``paddle.io.DataLoader`` takes it as is (``data.loader``).
"""
import json
import os
import time
from dataclasses import dataclass, field

import numpy as np
import paddle
from tqdm.auto import tqdm

from ..config import ConfigError
from ..utils.io import atomic_dir, atomic_write_json
from ..utils.log import get_logger
from . import cache, stream_build
from .corpora import load_corpus
from .corpora.registry import BUILT_IN
from .errors import DataError
from .lengths import length_stats
from .longtext import LongTextStats
from .parallel import chunk_map, resolve_num_proc
from .store import StoreSplit, StoreWriter, is_complete
from .vocab import TextEncoder, build_encoder, vocab_sha256

log = get_logger("data.dataset")

SPLITS = ("train", "dev", "test")
ENTRY = "entry.json"


class EncodedDataset(paddle.io.Dataset):
    """A split's encoded items (a ``StoreSplit``) plus their lengths, known without touching
    the items.

    ``lengths[i]``: tokens of item i incl. special tokens; for a task with two length fields
    (seq2seq) their sum, with ``src_lengths`` / ``tgt_lengths`` beside it (the token-budget
    sampler budgets B*max_src + B*max_tgt).  ``doc_lengths``: tokens per source document BEFORE
    the long-text policy (length analysis).  ``subset(n)``: a view on the first n items.
    """

    def __init__(self, store, split, task, pad_id, count=None):
        super().__init__()
        self.store, self.split, self.task, self.pad_id = store, split, task, pad_id
        n = len(store) if count is None else count
        self._count = n
        length_fields = [f.name for f in store.fields if f.length]
        self.lengths = store.lengths[:n]
        if len(length_fields) == 2:
            self.src_lengths, self.tgt_lengths = (store.row_lengths(f)[:n] for f in length_fields)
        else:
            self.src_lengths = self.tgt_lengths = None
        doc_lengths = store.extra("doc_lengths")
        self.doc_lengths = self.lengths if doc_lengths is None or count is not None \
            else doc_lengths
        self.long_text_stats = store.meta.get("long_text", {})
        self.stats = dict(store.meta.get("stats", {}))

    def __getitem__(self, i):
        if not -self._count <= i < self._count:
            raise IndexError(f"item {i} of a {self._count}-item {self.split} split")
        return self.store[i % self._count]

    def __len__(self):
        return self._count

    def num_tokens(self, i):
        return int(self.lengths[i])

    def subset(self, n):
        """The first ``n`` items (same store, no copy)."""
        return EncodedDataset(self.store, self.split, self.task, self.pad_id, min(n, self._count))


@dataclass
class DataBundle:
    task: str
    train: EncodedDataset  # None for a split not asked for (open_datasets(splits=...))
    dev: EncodedDataset
    test: EncodedDataset
    encoder: object
    label_names: list
    stats: dict = field(default_factory=dict)


@dataclass
class EncodeContext:
    """What a task's ``encode_example`` reads besides the example (picklable, plain values)."""
    encoder: object
    max_len: int
    long_text: str
    stride: int
    specials: bool
    tag_ids: dict
    max_source_len: int = None
    max_target_len: int = None


def open_datasets(data_cfg, resolve_task, task_hint=None, encoder=None, splits=SPLITS,
                   extra_corpora=()):
    """Corpus + encoder -> ``DataBundle`` with the encoded ``splits`` (the others are None).

    ``resolve_task(name)`` -> the Task object (its store fields and encode function);
    ``task_hint``: the task the items are encoded for; it must read the corpus's task
    (masked-LM reads any text corpus); None = the corpus's own task.  ``extra_corpora``:
    corpora whose train split the task adds to the train split (``Pretrain.extra_corpora``;
    masked-LM only).  Callers that bring the checkpoint's encoder and need one split (export
    parity, eval) pass ``splits=("test",)``: a cached store of the same inputs and vocabulary
    is read, else only that split is encoded."""

    unknown = set(splits) - set(SPLITS)
    if unknown:
        raise ValueError(f"open_datasets: unknown split(s) {sorted(unknown)}; use {SPLITS}")
    t0 = time.time()
    root = cache.cache_dir(data_cfg)
    builtin = data_cfg.corpus in BUILT_IN
    given_sha = vocab_sha256(encoder) if encoder is not None else None
    parts, key = _pick_entry(root, data_cfg, task_hint, builtin, given_sha, extra_corpora)
    entry_dir = os.path.join(root, key)
    with cache.locked(root, key):
        entry = _read_entry(entry_dir)
        rebuild = bool(data_cfg.get("rebuild_cache"))
        missing = [s for s in splits if not is_complete(os.path.join(entry_dir, s))]
        if entry is not None and not rebuild and not missing:
            log.info("store cache: reusing %s (same input files, vocabulary and encoding keys)",
                     entry_dir)
            how = "reused"
        else:
            if rebuild:
                reason = "Data.rebuild_cache is set"
            elif entry is None:
                reason = cache.explain_miss(root, parts)
            else:
                reason = f"split(s) {missing} not encoded yet"
            log.info("store cache: building %s (%s)", entry_dir, reason)
            entry = _build(data_cfg, resolve_task, task_hint, encoder, splits if entry is None
                           or rebuild else missing, extra_corpora, entry_dir, entry, rebuild)
            cache.remember(root, parts, key)
            how = f"built ({reason})"
        task = resolve_task(entry["task"])
        if encoder is None:
            encoder = _entry_encoder(data_cfg, entry, entry_dir)
        _check(data_cfg, task, encoder, builds_encoder=given_sha is None)
        datasets = {s: EncodedDataset(StoreSplit(os.path.join(entry_dir, s)), s, task.name,
                                      encoder.pad_id) for s in splits}
    stats = {"corpus": entry["corpus_stats"], "encoder": dict(getattr(encoder, "stats", {})),
             "store": {"dir": entry_dir, "cache": how, "seconds": round(time.time() - t0, 2)}}
    stats.update({s: ds.stats for s, ds in datasets.items()})
    return DataBundle(task.name, datasets.get("train"), datasets.get("dev"), datasets.get("test"),
                      encoder, list(entry["label_names"]), stats)


def _pick_entry(root, data_cfg, task_hint, builtin, given_sha, extra_corpora):
    """(key parts, key) of the entry to use.  An existing entry built for the corpus's own task
    (no hint) or with a vocabulary equal to the given one is reused: a checkpoint's eval or
    export parity reads the store its training run wrote.  Otherwise the most specific key."""
    hints = [task_hint, None] if task_hint is not None else [None]
    vocabs = [None, given_sha] if given_sha is not None else [None]
    prints = cache.Fingerprints(root)
    try:
        for hint in hints:
            for vocab in vocabs:
                parts = cache.key_parts(data_cfg, hint, builtin, vocab, extra_corpora, prints)
                key = cache.key_of(parts)
                entry = _read_entry(os.path.join(root, key))
                if entry is not None and (hint == task_hint or entry["task"] == task_hint) and \
                        (given_sha is None or entry["vocab_sha256"] == given_sha):
                    return parts, key
        parts = cache.key_parts(data_cfg, task_hint, builtin, given_sha, extra_corpora, prints)
        return parts, cache.key_of(parts)
    finally:
        prints.save()


def _read_entry(entry_dir):

    try:
        with open(os.path.join(entry_dir, ENTRY), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _entry_encoder(data_cfg, entry, entry_dir):

    if data_cfg.tokenizer == "pretrained":  # the user's vocab.txt, loaded as on a first run
        return build_encoder(data_cfg, None, pairs=False)
    enc = TextEncoder.load(os.path.join(entry_dir, "vocab"))
    enc.stats = entry.get("encoder_stats", {})
    return enc


def _check(data_cfg, task, encoder, builds_encoder):
    task.check_data_config(data_cfg, builds_encoder)
    task.check_encoder(encoder)
    _check_lengths_config(data_cfg, _specials(data_cfg, task))


def _specials(data_cfg, task):
    return task.default_special_tokens if data_cfg.add_special_tokens is None \
        else data_cfg.add_special_tokens


def _build(data_cfg, resolve_task, task_hint, encoder, splits, extra_corpora, entry_dir, entry,
           rebuild):
    """Read the corpus, make the encoder, encode ``splits`` into ``entry_dir`` -> entry dict."""

    num_proc = resolve_num_proc(data_cfg.get("num_proc"))
    stream = stream_build.plan(data_cfg, extra_corpora)
    if stream is not None:  # line files: workers read the raw lines, the parent holds counts
        task = resolve_task(stream.task if task_hint is None else task_hint)
        if task.pairs:
            stream = None
    if stream is not None:
        stream.count_vocab = (entry is None or rebuild) and encoder is None and \
            data_cfg.tokenizer != "pretrained"
        stream.kind, stream.lowercase = data_cfg.tokenizer, data_cfg.lowercase
        stream.texts_of = task.example_texts
        try:  # the parsed examples are spilled next to the entry (the system's /tmp may be RAM)
            scanned = stream_build.scan(stream, data_cfg, num_proc, os.path.dirname(entry_dir))
        except stream_build.NotStreamable as why:
            log.info("reading the corpus in one process: %s", why)
            stream = None
    if stream is None:
        return _build_read(data_cfg, resolve_task, task_hint, encoder, splits, extra_corpora,
                           entry_dir, entry, rebuild, num_proc, load_corpus(data_cfg), None)
    try:
        return _build_read(data_cfg, resolve_task, task_hint, encoder, splits, extra_corpora,
                           entry_dir, entry, rebuild, num_proc, scanned.corpus, scanned, stream)
    finally:
        scanned.close()


def _build_read(data_cfg, resolve_task, task_hint, encoder, splits, extra_corpora, entry_dir,
                entry, rebuild, num_proc, corpus, scanned, stream=None):
    """``_build`` once the corpus is read (``scanned``: pass 1 of the streamed build, or None)."""
    task = resolve_task(corpus.task if task_hint is None else task_hint)
    if corpus.task not in task.corpus_tasks():
        raise ConfigError(f"Data.corpus {data_cfg.corpus!r} gives a {corpus.task} task but a "
                          f"{task.name} task is expected here (model / checkpoint); pick a "
                          f"matching corpus")
    task.check_data_config(data_cfg, encoder is None)
    if entry is None or rebuild:
        if encoder is None:  # seq2seq: one vocabulary, source + target
            encoder = build_encoder(data_cfg, corpus, pairs=task.pairs, num_proc=num_proc,
                                    texts_of=task.example_texts,
                                    counts=scanned.counts if stream is not None else None)
        entry = {"task": task.name, "label_names": list(corpus.label_names),
                 "corpus_stats": corpus.stats, "vocab_sha256": vocab_sha256(encoder),
                 "encoder_stats": dict(getattr(encoder, "stats", {}))}
        with atomic_dir(entry_dir) as tmp:
            if data_cfg.tokenizer != "pretrained":
                encoder.save(os.path.join(tmp, "vocab"))
            atomic_write_json(os.path.join(tmp, ENTRY), entry)
    elif encoder is None:
        encoder = _entry_encoder(data_cfg, entry, entry_dir)
    task.check_encoder(encoder)
    specials = _specials(data_cfg, task)
    _check_lengths_config(data_cfg, specials)
    ctx = EncodeContext(encoder, data_cfg.max_len, data_cfg.long_text, data_cfg.stride, specials,
                        {name: k for k, name in enumerate(corpus.label_names)},
                        data_cfg.get("max_source_len"), data_cfg.get("max_target_len"))
    if stream is not None:
        _encode_streamed(stream, scanned, splits, task, ctx, data_cfg, entry_dir, num_proc)
        return entry
    for split in splits:
        extra = task.extra_train_items(extra_corpora, data_cfg, encoder, len(corpus.splits[split])) \
            if split == "train" else ([], None)
        _encode_split(corpus.splits[split], split, task, ctx, data_cfg, extra,
                      os.path.join(entry_dir, split), num_proc)
    return entry


def _check_lengths_config(cfg, specials):
    if cfg.max_len < 1 + 2 * bool(specials):
        raise ConfigError(f"Data.max_len={cfg.max_len} leaves no room for text after the special "
                          f"tokens; use a larger value (e.g. 512)")
    if cfg.long_text == "window":
        content = cfg.max_len - 2 * bool(specials)
        if not 0 <= cfg.stride < content:
            raise ConfigError(f"Data.stride={cfg.stride} must be smaller than the {content} "
                              f"content tokens of a window (Data.max_len {cfg.max_len} minus "
                              f"special tokens); lower Data.stride")


def _where_suffix(split, cfg):
    source = {"train": cfg.train_file, "dev": cfg.dev_file, "test": cfg.test_file}.get(split)
    return f" (from {source})" if source else f" of corpus {cfg.corpus}"


class _SliceEncoder:
    """Encodes examples[start:end] with the task's ``encode_examples`` -> its ``EncodedSlice``
    (columns + summed counts)."""

    def __init__(self, task, ctx, split, cfg):
        self.task, self.ctx, self.split, self.cfg = task, ctx, split, cfg
        self.where_suffix = _where_suffix(split, cfg)  # once: a per-item format is not free

    def __call__(self, examples, start, end):
        return self.task.encode_examples(self.ctx, [examples[i] for i in range(start, end)],
                                         start, self.where)

    def where(self, i):
        return f"{self.split} example {i}{self.where_suffix}"


class SplitSink:
    """One split's store being written: takes ``_SliceEncoder`` results in input order, sums
    their counts, and on ``finish`` writes the extras, stats and manifest."""

    def __init__(self, split, task, ctx, cfg, path, total):

        self.split, self.task, self.ctx, self.cfg = split, task, ctx, cfg
        self.fields = task.store_fields()
        self.writer = StoreWriter(path, self.fields)
        self.unk = self.real = 0
        self.doc_lengths, self.long_text = [], {}
        self.bar = tqdm(total=total, desc=f"encode {split}", unit="ex", mininterval=2,
                        disable=total < 50_000)

    def add(self, result):
        columns, u, r, docs, lts = result
        self.writer.add_packed(columns)
        self.unk, self.real = self.unk + u, self.real + r
        self.doc_lengths.append(docs)
        for name, lt in lts.items():
            total = self.long_text.setdefault(name, LongTextStats(self.split, self.ctx.long_text))
            for k in ("documents", "long_documents", "truncated", "tokens_lost", "windows"):
                setattr(total, k, getattr(total, k) + getattr(lt, k))
        self.bar.update(len(docs))

    def abort(self):
        self.bar.close()
        self.writer.abort()

    def finish(self, n_docs, extra=([], None)):
        split, writer, long_text, fields = self.split, self.writer, self.long_text, self.fields
        self.bar.close()
        for lt in long_text.values():
            lt.log()
        if not long_text:
            long_text[""] = LongTextStats(split, self.ctx.long_text)
        lt_stats = long_text[""].as_dict() if "" in long_text else \
            {name: lt.as_dict() for name, lt in long_text.items()}
        extra_items, sources = extra
        doc_lengths = self.doc_lengths
        if extra_items:  # other corpora's text (masked-LM): counted as documents of their own
            writer.add_columns({f.name: [it[f.name] for it in extra_items] for f in fields})
            doc_lengths.append(np.asarray([len(it["input_ids"]) for it in extra_items], np.int64))
        writer.set_extra("doc_lengths", np.concatenate(doc_lengths) if doc_lengths
                         else np.zeros(0, np.int64))
        n_items = writer.count
        lengths = writer.lengths()
        stats = {"documents": n_docs, "items": n_items,
                 "unk_rate": round(self.unk / self.real, 6) if self.real else 0.0,
                 "long_text": lt_stats,
                 "lengths": length_stats(lengths) if n_items else {"count": 0}}
        if sources is not None:  # items per source text (masked-LM)
            stats["sources"] = {f"{self.cfg.corpus}/{split}": n_items - len(extra_items),
                                **sources}
        writer.set_meta({"split": split, "task": self.task.name, "long_text": lt_stats,
                         "stats": stats})
        writer.close()


def _encode_split(examples, split, task, ctx, cfg, extra, path, num_proc):
    sink = SplitSink(split, task, ctx, cfg, path, len(examples))
    try:
        for result in chunk_map(_SliceEncoder(task, ctx, split, cfg), examples, num_proc):
            sink.add(result)
        sink.finish(len(examples), extra)
    except BaseException:
        sink.abort()
        raise


def _encode_streamed(stream, scanned, splits, task, ctx, cfg, entry_dir, num_proc):
    """Pass 2 of ``data.stream_build``: every wanted split written at once, in input order."""

    sizes = scanned.corpus.splits
    sinks = {}
    try:
        for split in splits:
            sinks[split] = SplitSink(split, task, ctx, cfg, os.path.join(entry_dir, split),
                                     sizes[split])
        encoders = {s: _SliceEncoder(task, ctx, s, cfg) for s in splits}
        stream_build.encode(stream, scanned, encoders, sinks, num_proc)
        for split in splits:
            sinks.pop(split).finish(sizes[split])
    except BaseException:
        for sink in sinks.values():
            sink.abort()
        raise
