"""Encoded datasets: tokenised once, specials and -100 labels, long texts, lengths, DataLoader."""
import json

import numpy as np
import pytest

from ppvarlen.config import ConfigError, load_config
from ppvarlen.data.loader import BatchLoader, FixedBatches, make_collator, train_loader
from ppvarlen.data.order import length_sorted_batches
from ppvarlen.store_build import build_datasets
from ppvarlen.data.errors import DataError


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), "utf-8")
    return str(path)


def data_cfg(**data):
    return load_config(data={"Data": data}).Data


@pytest.fixture
def cls_files(tmp_path):
    rows = [{"text": "好" * n + "坏", "label": "pos" if n % 2 else "neg"} for n in range(1, 30)]
    rows.append({"text": "长" * 50, "label": "pos"})  # 50 chars: longer than max_len below
    train = write_jsonl(tmp_path / "train.jsonl", rows)
    dev = write_jsonl(tmp_path / "dev.jsonl", [{"text": "好新", "label": "pos"},
                                               {"text": "新" * 30, "label": "neg"}])
    return train, dev


def test_classification_items_specials_lengths_and_truncation(cls_files):
    train, dev = cls_files
    cfg = data_cfg(corpus="jsonl", train_file=train, dev_file=dev, test_file=dev, max_len=20)
    b = build_datasets(cfg)
    enc = b.encoder
    assert b.task == "classification" and b.label_names == ["neg", "pos"]
    item = b.train[0]
    assert set(item) == {"input_ids", "label", "doc_id"}
    assert item["input_ids"][0] == enc.cls_id and item["input_ids"][-1] == enc.sep_id
    assert b.train.lengths.dtype == np.int64
    assert [b.train.num_tokens(i) for i in range(len(b.train))] == \
        [len(b.train[i]["input_ids"]) for i in range(len(b.train))]
    assert b.train.lengths.max() == 20
    lt = b.train.long_text_stats
    # texts of n+1 chars (n = 1..29) + one of 50: those over 18 content tokens are truncated
    over = [n + 1 for n in range(1, 30) if n + 1 > 18] + [50]
    assert (lt["truncated"], lt["tokens_lost"]) == (len(over), sum(n - 18 for n in over))
    assert b.dev.stats["unk_rate"] > 0  # "新" never occurs in train: the vocab is train-only
    assert b.train.stats["unk_rate"] == 0


def test_window_policy_keeps_doc_ids(cls_files):
    train, dev = cls_files
    cfg = data_cfg(corpus="jsonl", train_file=train, dev_file=dev, test_file=dev, max_len=20,
                   long_text="window", stride=4)
    ds = build_datasets(cfg).train
    windows = [ds[i] for i in range(len(ds)) if ds[i]["doc_id"] == 29]  # the 50-char text
    # 18 content tokens per window, step 18 - 4: starts 0, 14, 28 and 32 (aligned to the end)
    assert len(windows) == 4 and all(len(w["input_ids"]) == 20 for w in windows)
    assert len({w["label"] for w in windows}) == 1
    assert ds.long_text_stats["truncated"] == 0 and ds.doc_lengths[29] == 52


def test_error_policy_names_the_example(cls_files):
    train, dev = cls_files
    cfg = data_cfg(corpus="jsonl", train_file=train, dev_file=dev, test_file=dev, max_len=40,
                   long_text="error")
    with pytest.raises(DataError, match=r"train example 29 \(from .*train.jsonl\): 50 tokens"):
        build_datasets(cfg)


def test_stride_too_large_is_a_config_error(cls_files):
    train, _ = cls_files
    with pytest.raises(ConfigError, match="Data.stride"):
        build_datasets(data_cfg(corpus="jsonl", train_file=train, max_len=20, long_text="window",
                                stride=18))


def test_tagging_no_specials_by_default_and_windows_with_offsets(tmp_path):
    rows = [{"tokens": list("江泽民在北京"), "tags": ["B-PER", "I-PER", "I-PER", "O", "B-LOC",
                                                     "I-LOC"]}] * 3
    rows.append({"tokens": list("今天天气很好") * 3, "tags": ["O"] * 18})
    train = write_jsonl(tmp_path / "t.jsonl", rows)
    b = build_datasets(data_cfg(corpus="jsonl", train_file=train, dev_file=train,
                                test_file=train, max_len=8, long_text="window", stride=2))
    assert b.task == "tagging"
    item = b.train[0]
    assert set(item) == {"input_ids", "labels", "doc_id", "offset"}
    assert item["labels"].tolist() == [b.label_names.index(t) for t in rows[0]["tags"]]
    long_doc = [b.train[i] for i in range(len(b.train)) if b.train[i]["doc_id"] == 3]
    assert [w["offset"] for w in long_doc] == [0, 6, 10]
    with_specials = build_datasets(data_cfg(corpus="jsonl", train_file=train, dev_file=train,
                                            test_file=train, add_special_tokens=True)).train[0]
    assert with_specials["labels"][0] == with_specials["labels"][-1] == -100
    assert len(with_specials["labels"]) == len(with_specials["input_ids"]) == 8


def test_seq2seq_items_and_budget_lengths(tmp_path):
    rows = [{"source": "中国", "target": "zhong guo"}, {"source": "人民", "target": "ren min"},
            {"source": "中国人民", "target": "zhong guo ren min"}]
    path = write_jsonl(tmp_path / "s.jsonl", rows)
    b = build_datasets(data_cfg(corpus="jsonl", train_file=path, dev_file=path, test_file=path))
    enc, item = b.encoder, b.train[0]
    assert set(item) == {"src_ids", "tgt_ids", "doc_id"}
    assert item["tgt_ids"][0] == enc.bos_id and item["tgt_ids"][-1] == enc.eos_id
    assert enc.unk_id not in item["tgt_ids"]  # one vocabulary over sources and targets
    np.testing.assert_array_equal(b.train.lengths, b.train.src_lengths + b.train.tgt_lengths)
    assert b.train.tgt_lengths.tolist() == [len(r["target"]) + 2 for r in rows]
    with pytest.raises(ConfigError, match="window"):
        build_datasets(data_cfg(corpus="jsonl", train_file=path, long_text="window"))


def test_task_hint_mismatch(cls_files):
    train, _ = cls_files
    with pytest.raises(ConfigError, match="tagging task is expected"):
        build_datasets(data_cfg(corpus="jsonl", train_file=train), task_hint="tagging")


def test_dataloader_train_and_eval_sentiment(tmp_path):
    cfg = data_cfg(corpus="sentiment", limit=600, max_len=128, max_tokens=1024,
                   cache_dir=str(tmp_path))
    b = build_datasets(cfg)
    assert len(b.train) == 600
    train = train_loader(b.train, cfg, seed=1)
    seen = []
    for batch in train:
        ids = batch["input_ids"]
        assert isinstance(ids, np.ndarray) and ids.shape[0] * ids.shape[1] <= 1024
        seen += batch["doc_id"].tolist()
    assert sorted(seen) == list(range(600)) and len(train) == len(train.sampler)
    # evaluation's loader (engine.evaluate): the length-sorted batches of data.order, as given
    batches = length_sorted_batches(b.dev.lengths, cfg.eval_max_tokens)
    evaluation = BatchLoader(b.dev, FixedBatches(batches), make_collator(cfg, b.dev))
    got = [batch["doc_id"].tolist() for batch in evaluation]
    assert got == [[int(b.dev[i]["doc_id"]) for i in batch] for batch in batches]
    assert got == [batch["doc_id"].tolist() for batch in evaluation]  # deterministic


def test_loader_workers_give_the_same_batches(tmp_path):
    """Data.num_workers > 0: paddle.io.DataLoader processes read the store (memmaps reopened
    in each worker) and the batches equal the in-process ones, in the same order."""
    base = dict(corpus="sentiment", limit=300, max_len=64, max_tokens=512, cache_dir=str(tmp_path))
    b = build_datasets(data_cfg(**base))
    runs = []
    for workers in (0, 2):
        loader = train_loader(b.train, data_cfg(**base, num_workers=workers), seed=3)
        loader.sampler.set_epoch(1)
        runs.append([{k: v.copy() for k, v in batch.items()} for batch in loader])
    assert len(runs[0]) == len(runs[1]) > 1
    for a, c in zip(*runs):
        assert a.keys() == c.keys()
        for k in a:
            assert a[k].dtype == c[k].dtype and np.array_equal(a[k], c[k]), k
