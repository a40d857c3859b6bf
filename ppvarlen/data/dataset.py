"""Encoded datasets: corpus -> token ids ONCE at build time -> length-aware DataLoader.

``build_datasets(data_cfg)`` loads the corpus (``data.corpora``), builds the
encoder from the train split (or takes the one given, e.g. a checkpoint's),
tokenises every example once, applies the long-text policy (``data.longtext``)
and records per-split stats (UNK rate, truncation/window counts, lengths).
Items are plain dicts of python ints (DESIGN.md); padding happens per batch in
``data.collate`` — never here (pitfalls 6 and 8).

``EncodedDataset`` subclasses ``paddle.io.Dataset`` rather than PaddleNLP's
``MapDataset``: MapDataset's in-place ``map``/``filter`` would silently
invalidate the precomputed ``lengths`` the samplers batch by, and importing
``paddlenlp.datasets`` costs seconds.  ``paddle.io.DataLoader`` takes it as is.
"""
from dataclasses import dataclass, field

import numpy as np
import paddle

from ..config import ConfigError
from ..utils.log import get_logger
from ..tasks import get_task
from .collate import Collator
from .errors import DataError
from .lengths import length_stats
from .longtext import LongTextStats, plan_spans

log = get_logger("data.dataset")

SPLITS = ("train", "dev", "test")


class EncodedDataset(paddle.io.Dataset):
    """A split's encoded items plus their lengths (known without touching the items).

    ``lengths[i]``: tokens of item i incl. special tokens; for seq2seq the sum of
    source and target tokens, with ``src_lengths`` / ``tgt_lengths`` beside it
    (the token-budget sampler budgets B*max_src + B*max_tgt).  ``doc_lengths``:
    tokens per source document BEFORE the long-text policy (length analysis).
    """

    def __init__(self, items, split, task, pad_id, long_text_stats=None, stats=None,
                 doc_lengths=None):
        super().__init__()
        self.items = items
        self.split, self.task, self.pad_id = split, task, pad_id
        if get_task(task).pairs:
            self.src_lengths = np.asarray([len(it["src_ids"]) for it in items], dtype=np.int64)
            self.tgt_lengths = np.asarray([len(it["tgt_ids"]) for it in items], dtype=np.int64)
            self.lengths = self.src_lengths + self.tgt_lengths
        else:
            self.src_lengths = self.tgt_lengths = None
            self.lengths = np.asarray([len(it["input_ids"]) for it in items], dtype=np.int64)
        self.doc_lengths = self.lengths if doc_lengths is None else \
            np.asarray(doc_lengths, dtype=np.int64)
        self.long_text_stats = long_text_stats or {}
        self.stats = stats or {}

    def __getitem__(self, i):
        return self.items[i]

    def __len__(self):
        return len(self.items)

    def num_tokens(self, i):
        return int(self.lengths[i])


@dataclass
class DataBundle:
    task: str
    train: EncodedDataset  # None for a split not asked for (build_datasets(splits=...))
    dev: EncodedDataset
    test: EncodedDataset
    encoder: object
    label_names: list
    stats: dict = field(default_factory=dict)


def build_datasets(data_cfg, task_hint=None, encoder=None, splits=SPLITS, extra_corpora=()):
    """Corpus + encoder -> ``DataBundle`` with the encoded ``splits`` (the others are None).

    ``task_hint``: the task (name or Task) the items are encoded for; it must read the
    corpus's task (masked-LM reads any text corpus); None = the corpus's own task.
    ``extra_corpora``: corpora whose train split the task adds to the train split
    (``Pretrain.extra_corpora``; masked-LM only).  Callers that bring the checkpoint's
    encoder and need one split (export parity, eval) pass ``splits=("test",)`` and skip
    encoding the rest."""
    from .corpora import load_corpus
    from .vocab import build_encoder

    corpus = load_corpus(data_cfg)
    task = get_task(corpus.task if task_hint is None else task_hint)
    if corpus.task not in task.corpus_tasks():
        raise ConfigError(f"Data.corpus {data_cfg.corpus!r} gives a {corpus.task} task but a "
                          f"{task.name} task is expected here (model / checkpoint); pick a "
                          f"matching corpus")
    task.check_data_config(data_cfg, encoder is None)
    if encoder is None:
        encoder = build_encoder(data_cfg, corpus)  # seq2seq: one vocabulary, source + target
    specials = data_cfg.add_special_tokens
    if specials is None:
        specials = task.default_special_tokens
    task.check_encoder(encoder)
    _check_lengths_config(data_cfg, specials)
    unknown = set(splits) - set(SPLITS)
    if unknown:
        raise ValueError(f"build_datasets: unknown split(s) {sorted(unknown)}; use {SPLITS}")
    encoded, stats = {}, {"corpus": corpus.stats, "encoder": dict(getattr(encoder, "stats", {}))}
    for split in splits:
        examples = corpus.splits[split]
        extra = task.extra_train_items(extra_corpora, data_cfg, encoder, len(examples)) \
            if split == "train" else ([], None)
        ds = _encode_split(examples, split, task, encoder, data_cfg, specials, corpus.label_names,
                           extra)
        encoded[split] = ds
        stats[split] = ds.stats
    return DataBundle(task.name, encoded.get("train"), encoded.get("dev"), encoded.get("test"),
                      encoder, list(corpus.label_names), stats)


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


def _where(split, i, cfg):
    source = {"train": cfg.train_file, "dev": cfg.dev_file, "test": cfg.test_file}.get(split)
    return f"{split} example {i}" + (f" (from {source})" if source else f" of corpus {cfg.corpus}")


def _encode_split(examples, split, task, encoder, cfg, specials, label_names, extra=([], None)):
    encode = _encode_pairs if task.pairs else _encode_windows
    items, long_text, unk, real, doc_lengths = encode(examples, split, task, encoder, cfg,
                                                      specials, label_names)
    extra_items, sources = extra
    if extra_items:  # other corpora's text (masked-LM): counted as documents of their own
        items = items + extra_items
        doc_lengths = doc_lengths + [len(it["input_ids"]) for it in extra_items]
    ds = EncodedDataset(items, split, task.name, encoder.pad_id, long_text,
                        doc_lengths=doc_lengths)
    ds.stats = {"documents": len(examples), "items": len(items),
                "unk_rate": round(unk / real, 6) if real else 0.0, "long_text": long_text,
                "lengths": length_stats(ds.lengths) if items else {"count": 0}}
    if sources is not None:  # items per source text (masked-LM)
        ds.stats["sources"] = {f"{cfg.corpus}/{split}": len(items) - len(extra_items), **sources}
    return ds


def _encode_pairs(examples, split, task, encoder, cfg, specials, label_names):
    """Source/target pairs -> ``{src_ids, tgt_ids (BOS .. EOS), doc_id}`` items."""
    lt, lt_tgt = LongTextStats(split, cfg.long_text), LongTextStats(split, cfg.long_text)
    items, unk, real, doc_lengths = [], 0, 0, []
    for i, ex in enumerate(examples):
        src = encoder.encode(encoder.tokenize(ex["source"]))
        tgt = encoder.encode_target(ex["target"])
        unk += src.count(encoder.unk_id) + tgt.count(encoder.unk_id)
        real += len(src) + len(tgt)
        if not src or not tgt:
            raise DataError(f"{_where(split, i, cfg)}: empty source or target after "
                            f"tokenisation; remove the example")
        src_spans = plan_spans(len(src), cfg.max_source_len, cfg.long_text, 0,
                               _where(split, i, cfg) + " source")
        tgt_spans = plan_spans(len(tgt), cfg.max_target_len, cfg.long_text, 0,
                               _where(split, i, cfg) + " target")
        lt.add(len(src), src_spans)
        doc_lengths.append(len(src) + len(tgt) + 2)
        lt_tgt.add(len(tgt), tgt_spans)
        items.append({"src_ids": src[:src_spans[0][1]],
                      "tgt_ids": [encoder.bos_id] + tgt[:tgt_spans[0][1]] + [encoder.eos_id],
                      "doc_id": i})
    lt.log(), lt_tgt.log()
    return items, {"source": lt.as_dict(), "target": lt_tgt.as_dict()}, unk, real, doc_lengths


def _encode_windows(examples, split, task, encoder, cfg, specials, label_names):
    """Token rows under the long-text policy; the task adds each window's label fields."""
    lt = LongTextStats(split, cfg.long_text)
    items, unk, real, doc_lengths = [], 0, 0, []
    n_special = 2 if specials else 0
    tag_ids = {name: k for k, name in enumerate(label_names)}
    for i, ex in enumerate(examples):
        where = _where(split, i, cfg)
        ids, labels = task.example_ids(encoder, ex, where, tag_ids)
        unk += ids.count(encoder.unk_id)
        real += len(ids)
        if not ids:
            raise DataError(f"{where}: no tokens after tokenisation (empty or only spaces); "
                            f"remove it from the data")
        spans = plan_spans(len(ids), cfg.max_len - n_special, cfg.long_text, cfg.stride, where)
        lt.add(len(ids), spans)
        doc_lengths.append(len(ids) + n_special)
        for start, end in spans:
            body = ids[start:end]
            if specials:
                body = [encoder.cls_id] + body + [encoder.sep_id]
            items.append({"input_ids": body,
                          **task.window_item(ex, labels, start, end, specials, i)})
    lt.log()
    return items, lt.as_dict(), unk, real, doc_lengths


def build_dataloader(dataset, data_cfg, split, num_replicas=1, rank=0, seed=0):
    """``paddle.io.DataLoader`` over ``dataset`` with the length-aware sampler + collator.

    train: shuffled ``Data.sampler`` batches (seed + epoch; call
    ``loader.batch_sampler.set_epoch(e)`` each epoch).  dev/test: the
    deterministic length-sorted order under ``Data.eval_max_tokens`` — the order
    the trainer's eval, export parity and deploy use (``data.order``).  The
    loader turns the collator's numpy arrays into paddle Tensors.
    """
    from .samplers import TokenBudgetBatchSampler, build_batch_sampler

    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if split == "train":
        sampler = build_batch_sampler(dataset, data_cfg, shuffle=True, num_replicas=num_replicas,
                                      rank=rank, seed=seed)
    else:
        cost = dataset.lengths if dataset.src_lengths is None else \
            np.stack([dataset.src_lengths, dataset.tgt_lengths], axis=1)
        sampler = TokenBudgetBatchSampler(cost, data_cfg.eval_max_tokens, shuffle=False,
                                          max_sentences=data_cfg.max_sentences,
                                          num_replicas=num_replicas, rank=rank, seed=seed)
    bounds = getattr(sampler, "boundaries", None) if data_cfg.pad_to_bucket else None
    collate = Collator(dataset.pad_id, data_cfg.pad_to_multiple_of, data_cfg.padding_side,
                       bucket_boundaries=bounds)
    return paddle.io.DataLoader(dataset, batch_sampler=sampler, collate_fn=collate,
                                num_workers=data_cfg.num_workers)
