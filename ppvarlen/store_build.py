"""Encoded datasets of a Data section: the task drives the encoding, above both tasks and data.

``build_datasets(data_cfg, task_hint, encoder, splits, extra_corpora)`` -> ``DataBundle``.  The
corpus is read by the one ingestion path (``data.sources``: every corpus as ordered chunks,
pass 1 parsing and checking them once); this module takes the Task (``tasks.get_task``: its
store fields and ``encode_example``), builds or takes the encoder, encodes pass 2's chunks on
``Data.num_proc`` worker processes (``utils.parallel``: same bytes for any count), and writes one
store directory per split (``data.store``) into the cache entry the inputs key
(``data.cache``): a second run with the same inputs reads the store and never touches the raw
files.  The datasets are views on the store (``data.dataset.EncodedDataset``).
"""
import contextlib
import json
import os
import time
from typing import NamedTuple

import numpy as np
from tqdm.auto import tqdm

from .config import ConfigError
from .data import cache, sources
from .data.chunks import CHUNK_BYTES
from .data.corpora.registry import BUILT_IN
from .data.dataset import DataBundle, EncodedDataset
from .data.lengths import length_stats
from .data.longtext import LongTextStats
from .utils.parallel import ordered_map_in_rooms, resolve_num_proc
from .data.readers import FORMATS
from .data.splits import SPLITS
from .data.store import StoreDamagedError, StoreSplit, StoreWriter, is_complete
from .data.vocab import TextEncoder, TokenCounting, build_encoder, vocab_sha256
from .tasks import get_task
from .tasks.base import EncodeContext
from .utils.io import atomic_write_json, disk_full_named
from .utils.log import get_logger

log = get_logger("store_build")

ENTRY = "entry.json"
# a pass-2 job's room for its token rows (int32): a chunk of lines encoded char by char, with
# room to spare; rows that do not fit (e.g. overlapping windows) go back through the pipe
ROOM_BYTES = 5 * CHUNK_BYTES


def build_datasets(data_cfg, task_hint=None, encoder=None, splits=SPLITS, extra_corpora=()):
    """Corpus + encoder -> ``DataBundle`` with the encoded ``splits`` (the others are None).

    ``task_hint``: the task the items are encoded for; it must read the corpus's task
    (masked-LM reads any text corpus); None = the corpus's own task.  ``extra_corpora``:
    corpora whose train split the task adds to the train split (``Pretrain.extra_corpora``;
    masked-LM only).  Callers that bring the checkpoint's encoder and need one split (export
    parity, eval) pass ``splits=("test",)``: a cached store of the same inputs and vocabulary
    is read, else only that split is encoded."""
    unknown = set(splits) - set(SPLITS)
    if unknown:
        raise ValueError(f"build_datasets: unknown split(s) {sorted(unknown)}; use {SPLITS}")
    t0 = time.time()
    root = cache.cache_dir(data_cfg)
    builtin = data_cfg.corpus in BUILT_IN
    given_sha = vocab_sha256(encoder) if encoder is not None else None
    parts, key = _pick_entry(root, data_cfg, task_hint, builtin, given_sha, extra_corpora)
    with cache.locked(root, key):
        entry, generation, opened, how = _open_or_build(data_cfg, root, key, parts, task_hint,
                                                        encoder, splits, extra_corpora)
        cache.remove_unheld(root, key)
        task = get_task(entry["task"])
        if encoder is None:
            encoder = _entry_encoder(data_cfg, entry, generation)
        _check(data_cfg, task, encoder, builds_encoder=given_sha is None)
        datasets = {s: EncodedDataset(store, s, task.name, encoder.pad_id)
                    for s, store in opened.items()}
    stats = {"corpus": entry["corpus_stats"], "encoder": dict(getattr(encoder, "stats", {})),
             "store": {"dir": os.path.join(root, key), "generation": generation, "cache": how,
                       "seconds": round(time.time() - t0, 2)}}
    stats.update({s: ds.stats for s, ds in datasets.items()})
    return DataBundle(task.name, datasets.get("train"), datasets.get("dev"), datasets.get("test"),
                      encoder, list(entry["label_names"]), stats)


def _open_or_build(data_cfg, root, key, parts, task_hint, encoder, splits, extra_corpora):
    """The key's entry opened (under its lock), built first when it is missing, incomplete,
    damaged or asked to be -> (entry, generation directory, {split: StoreSplit}, how)."""
    entry_path = os.path.join(root, key)
    verify = "always" if data_cfg.get("verify_store") else "once"
    cache.reap(root)
    generation = cache.current_generation(root, key)
    entry = _read_entry(generation) if generation else None
    missing = [s for s in splits if not is_complete(os.path.join(generation, s))] \
        if entry is not None else list(splits)
    if data_cfg.get("rebuild_cache"):
        reason = "Data.rebuild_cache is set"
    elif entry is None:
        reason = cache.explain_miss(root, parts)
    elif missing:
        reason = f"split(s) {missing} not encoded yet"
    else:
        try:
            opened = _open_splits(generation, splits, verify)
            log.info("store cache: reusing %s (same input files, vocabulary and encoding keys)",
                     entry_path)
            return entry, generation, opened, "reused"
        except StoreDamagedError as e:  # its inputs are here: encoded again
            log.warning("store cache: %s: %s; building it again", e.file, e.problem)
            reason, entry = f"{e.file} was damaged: {e.problem}", None
    log.info("store cache: building %s (%s)", entry_path, reason)
    if entry is None or data_cfg.get("rebuild_cache"):  # a new generation
        with cache.new_generation(root, key) as tmp:
            entry = _build(data_cfg, task_hint, encoder, splits, extra_corpora, tmp, None, root)
    else:  # the splits it lacks, added to the generation (no reader reads them)
        _build(data_cfg, task_hint, encoder, missing, extra_corpora, generation, entry, root)
    generation = cache.current_generation(root, key)
    cache.remember(root, parts, key)
    return entry, generation, _open_splits(generation, splits, verify), f"built ({reason})"


def _open_splits(generation, splits, verify):
    """{split: ``StoreSplit``} of a generation, each checked (``verify``: ``data.store``) and
    holding the generation's lease (``cache.Lease``) while it lives."""
    lease = cache.Lease(generation)
    opened = {}
    for s in splits:
        opened[s] = StoreSplit(os.path.join(generation, s), verify,
                               cache.verification_stamp(generation, s))
        opened[s].lease = lease
    return opened


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
        return build_encoder(data_cfg)
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


def _plan(data_cfg):
    if data_cfg.corpus in BUILT_IN:
        return sources.MemoryPlan(sources.load_corpus(data_cfg))
    return sources.plan(data_cfg)


def _build(data_cfg, task_hint, encoder, splits, extra_corpora, entry_dir, entry, root):
    """Read the corpus, make the encoder, encode ``splits`` into ``entry_dir`` -> entry dict
    (``entry``: the one already there, whose vocabulary the missing splits are encoded with).
    The parsed examples are spilled in ``root`` (the system's /tmp may be RAM)."""
    num_proc = resolve_num_proc(data_cfg.get("num_proc"))
    plan = _plan(data_cfg)
    task = get_task(plan.task if task_hint is None else task_hint)
    if plan.task not in task.corpus_tasks():
        raise ConfigError(f"Data.corpus {data_cfg.corpus!r} gives a {plan.task} task but a "
                          f"{task.name} task is expected here (model / checkpoint); pick a "
                          f"matching corpus")
    task.check_data_config(data_cfg, encoder is None)
    counting = None
    if entry is None and encoder is None and data_cfg.tokenizer != "pretrained":
        counting = TokenCounting.of(data_cfg, FORMATS[plan.task].text_fields, task.pairs)
    with disk_full_named(root, what="spilling the parsed corpus (pass 1 of the store build)"):
        scanned = sources.scan(plan, counting, num_proc, root)
    try:
        corpus = scanned.corpus
        if entry is None:
            if encoder is None:
                encoder = build_encoder(data_cfg, scanned.counts, task.pairs)
            entry = {"task": task.name, "label_names": list(corpus.label_names),
                     "corpus_stats": corpus.stats, "vocab_sha256": vocab_sha256(encoder),
                     "encoder_stats": dict(getattr(encoder, "stats", {}))}
            if data_cfg.tokenizer != "pretrained":  # entry_dir: a new generation, not read yet
                encoder.save(os.path.join(entry_dir, "vocab"))
            atomic_write_json(os.path.join(entry_dir, ENTRY), entry)
        elif encoder is None:
            encoder = _entry_encoder(data_cfg, entry, entry_dir)
        task.check_encoder(encoder)
        specials = _specials(data_cfg, task)
        _check_lengths_config(data_cfg, specials)
        ctx = EncodeContext(encoder, data_cfg.max_len, data_cfg.long_text, data_cfg.stride,
                            specials, {name: k for k, name in enumerate(corpus.label_names)},
                            data_cfg.get("max_source_len"), data_cfg.get("max_target_len"))
        _encode(scanned, splits, task, ctx, data_cfg, extra_corpora, entry_dir, num_proc)
        return entry
    finally:
        scanned.close()


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


class _ChunkEncoder:
    """Pass 2 on a worker: a job's examples (``sources.ChunkReader``) -> {split: the task's
    ``EncodedSlice`` of them}, the rows of its ragged fields written into ``room`` (memory
    shared with the parent, ``ordered_map_in_rooms``) as far as they fit, named by ``InRoom``."""

    def __init__(self, reader, task, ctx, cfg):
        self.reader, self.task, self.ctx = reader, task, ctx
        self.where_suffix = {s: _where_suffix(s, cfg) for s in SPLITS}  # once, not per item

    def __call__(self, job, room=None):
        out, at = {}, 0
        for split, (base, rows) in self.reader(job).items():
            where = _Where(split, self.where_suffix[split])
            encoded = self.task.encode_examples(self.ctx, rows, base, where)
            if room is not None:
                for name, column in encoded.columns.items():
                    if isinstance(column, tuple) and at + column[0].nbytes <= len(room):
                        flat = column[0]
                        np.frombuffer(room, flat.dtype, len(flat), at)[:] = flat
                        encoded.columns[name] = (InRoom(at, len(flat), flat.dtype.str), column[1])
                        at += flat.nbytes
            out[split] = encoded
        return out


class InRoom(NamedTuple):
    """A ragged field's rows, written into the job's room at byte ``at``."""

    at: int
    count: int
    dtype: str


class _Where:
    """An example's name in an error: its split, doc id and source."""

    def __init__(self, split, suffix):
        self.split, self.suffix = split, suffix

    def __call__(self, i):
        return f"{self.split} example {i}{self.suffix}"


class SplitSink:
    """One split's store being written: takes ``EncodedSlice``s in input order, sums
    their counts, and on ``finish`` writes the extras, stats and manifest."""

    def __init__(self, split, task, ctx, cfg, path, total):
        self.split, self.task, self.ctx, self.cfg = split, task, ctx, cfg
        self.fields = task.store_fields()
        self.writer = StoreWriter(path, self.fields)
        self.unk = self.real = 0
        self.doc_lengths, self.long_text = [], {}
        self.bar = tqdm(total=total, desc=f"encode {split}", unit="ex", mininterval=2,
                        disable=total < 50_000)

    def add(self, result, room=None):
        columns, u, r, docs, lts = result
        for name, column in columns.items():
            if isinstance(column, tuple) and isinstance(column[0], InRoom):
                at, count, dtype = column[0]
                columns[name] = (np.frombuffer(room, dtype, count, at), column[1])
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
        extra_items, sources_count = extra
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
        if sources_count is not None:  # items per source text (masked-LM)
            stats["sources"] = {f"{self.cfg.corpus}/{split}": n_items - len(extra_items),
                                **sources_count}
        writer.set_meta({"split": split, "task": self.task.name, "long_text": lt_stats,
                         "stats": stats})
        writer.close()


def _encode(scanned, splits, task, ctx, cfg, extra_corpora, entry_dir, num_proc):
    """Pass 2: every wanted split written at once, in input order."""
    sizes = scanned.corpus.splits
    sinks = {}
    try:
        for split in splits:
            sinks[split] = SplitSink(split, task, ctx, cfg, os.path.join(entry_dir, split),
                                     sizes[split])
        encoded = ordered_map_in_rooms(_ChunkEncoder(scanned.reader(), task, ctx, cfg),
                                       scanned.jobs(splits), num_proc, ROOM_BYTES)
        with contextlib.closing(encoded):  # a failed write here ends the pool now
            for out, room in encoded:
                for split, res in out.items():
                    sinks[split].add(res, room)
        for split in splits:
            extra = task.extra_train_items(extra_corpora, cfg, ctx.encoder, sizes[split]) \
                if split == "train" else ([], None)
            sinks.pop(split).finish(sizes[split], extra)
    except BaseException:
        for sink in sinks.values():
            sink.abort()
        raise
