"""The encoded-corpus store and its cache: fields, memmaps, reuse/invalidation, atomic builds,
worker-count independence, errors naming file and line, PaddleNLP indexed corpora."""
import json
import os
import pickle
import signal
import struct
import subprocess
import sys
import time

import numpy as np
import pytest

from ppvarlen.config import load_config
from ppvarlen.data.errors import DataError
from ppvarlen.data.store import StoreField, IndexedTokens, StoreSplit, StoreWriter, is_complete
from ppvarlen.store_build import build_datasets

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REVIEWS = ["质量很好，物流也快", "太差了，不推荐", "一般般吧", "非常满意！！", "包装破损，客服不理人"]


def write_reviews(path, n, seed=0, tail=""):
    rng = np.random.default_rng(seed)
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            k = int(rng.integers(1, 4))
            text = "".join(REVIEWS[int(j)] for j in rng.integers(0, len(REVIEWS), k)) + str(i)
            f.write(json.dumps({"text": text, "label": ["neg", "pos"][i % 2]},
                               ensure_ascii=False) + "\n")
        f.write(tail)
    return str(path)


def data_cfg(**data):
    return load_config(data={"Data": data}).Data


def test_store_round_trip_of_declared_fields(tmp_path):
    fields = [StoreField("input_ids", "int32", ragged=True, length=True),
              StoreField("tags", "int16", ragged=True), StoreField("label", "int64")]
    rows = [[2, 7, 3], [2, 9, 9, 9, 3], [2, 3]]
    with StoreWriter(tmp_path / "s", fields) as w:
        w.add_columns({"input_ids": rows[:2], "tags": [[0, 1, 0], [1, 1, 1, 1, 0]],
                       "label": [1, 0]})
        w.add_columns({"input_ids": rows[2:], "tags": [[0, 0]], "label": [1]})
        w.set_extra("doc_lengths", np.array([3, 7, 2]))
        w.set_meta({"stats": {"note": "kept"}})
    s = StoreSplit(tmp_path / "s")
    assert len(s) == 3 and s.lengths.tolist() == [3, 5, 2]
    assert isinstance(s._rows("input_ids"), np.memmap)  # token ids stay on disk
    item = s[1]
    assert item["input_ids"].tolist() == rows[1] and item["input_ids"].dtype == np.int32
    assert item["tags"].tolist() == [1, 1, 1, 1, 0] and item["label"] == 0
    assert s.extra("doc_lengths").tolist() == [3, 7, 2] and s.meta["stats"] == {"note": "kept"}
    clone = pickle.loads(pickle.dumps(s))  # a DataLoader worker: memmaps reopened, not copied
    assert clone._maps == {} and clone[2]["input_ids"].tolist() == rows[2]
    with pytest.raises(ValueError, match="only a ragged field"):
        StoreField("label", "int64", length=True)


def test_failed_write_leaves_nothing(tmp_path):
    fields = [StoreField("input_ids", "int32", ragged=True, length=True)]
    with pytest.raises(RuntimeError):
        with StoreWriter(tmp_path / "s", fields) as w:
            w.add_columns({"input_ids": [[1, 2]]})
            raise RuntimeError("stop")
    assert os.listdir(tmp_path) == [] and not is_complete(tmp_path / "s")
    with pytest.raises(DataError, match="not a complete ppvarlen store"):
        StoreSplit(tmp_path / "s")


def test_cache_reuse_and_each_kind_of_invalidation(tmp_path, caplog):
    train = write_reviews(tmp_path / "train.jsonl", 300)
    base = dict(corpus="jsonl", train_file=train, cache_dir=str(tmp_path / "cache"), max_len=32)
    first = build_datasets(data_cfg(**base))
    assert first.stats["store"]["cache"].startswith("built (no store of this corpus")
    again = build_datasets(data_cfg(**base))
    assert again.stats["store"]["cache"] == "reused"
    assert again.encoder.tokens == first.encoder.tokens
    for i in (0, len(first.train) - 1):
        a, b = first.train[i], again.train[i]
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    changed = build_datasets(data_cfg(**dict(base, max_len=16)))
    assert "Data.max_len 32 -> 16" in changed.stats["store"]["cache"]
    vocab = build_datasets(data_cfg(**dict(base, min_freq=60)))
    assert "Data.min_freq 1 -> 60" in vocab.stats["store"]["cache"]
    assert vocab.encoder.vocab_size < first.encoder.vocab_size
    write_reviews(tmp_path / "train.jsonl", 300, seed=1)  # same size class, other content
    edited = build_datasets(data_cfg(**base))
    assert f"{os.path.abspath(train)} changed" in edited.stats["store"]["cache"]
    forced = build_datasets(data_cfg(**dict(base, rebuild_cache=True)))
    assert "Data.rebuild_cache" in forced.stats["store"]["cache"]
    # a checkpoint's vocabulary equal to the built one reads the same store (eval, parity)
    # (a checkpoint names its task: the store built for the corpus's own task is the same)
    test_only = build_datasets(data_cfg(**base), task_hint="classification",
                               encoder=forced.encoder, splits=("test",))
    assert test_only.stats["store"]["dir"] == forced.stats["store"]["dir"]
    assert test_only.stats["store"]["cache"] == "reused"
    other = build_datasets(data_cfg(**base), task_hint="masked_lm", splits=("test",))
    assert other.stats["store"]["dir"] != forced.stats["store"]["dir"] and other.task == "masked_lm"


def test_a_named_pipe_as_a_corpus_is_refused_naming_it_not_read_or_waited_on(tmp_path):
    """A corpus is read more than once (hashed for the cache, then encoded): a pipe would be
    consumed by the hash, and one without a writer would block the build forever."""
    fifo = tmp_path / "train.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(DataError, match=rf"{fifo}: cannot read data file \(a FIFO \(named pipe"
                                        rf"\), not a regular file\); .*save what a pipe gives"):
        build_datasets(data_cfg(corpus="jsonl", train_file=str(fifo), max_len=32,
                                cache_dir=str(tmp_path / "cache")))


def _split_bytes(bundle, split):
    d = getattr(bundle, split).store.path
    return {name: open(os.path.join(d, name), "rb").read() for name in sorted(os.listdir(d))}


def test_one_and_two_workers_write_identical_stores(tmp_path):
    train = write_reviews(tmp_path / "train.jsonl", 5000)  # several encoding chunks
    stores = [build_datasets(data_cfg(corpus="jsonl", train_file=train, num_proc=n,
                                      cache_dir=str(tmp_path / f"c{n}")))
              for n in (1, 2)]
    assert stores[0].encoder.tokens == stores[1].encoder.tokens
    for split in ("train", "dev", "test"):
        one, two = _split_bytes(stores[0], split), _split_bytes(stores[1], split)
        assert one.keys() == two.keys() and "input_ids.bin" in one
        assert all(one[k] == two[k] for k in one), split


def test_malformed_row_at_the_end_of_a_large_shard_names_file_and_line(tmp_path):
    train = write_reviews(tmp_path / "big.jsonl", 20000, tail='{"text": "坏", "label": \n')
    with pytest.raises(DataError, match=r"big\.jsonl:20001: "):
        build_datasets(data_cfg(corpus="jsonl", train_file=train, num_proc=2,
                                cache_dir=str(tmp_path / "c")))
    assert not os.path.isdir(tmp_path / "c") or not any(
        is_complete(os.path.join(root, d)) for root, dirs, _ in os.walk(tmp_path / "c")
        for d in dirs)
    skipped = build_datasets(data_cfg(corpus="jsonl", train_file=train, num_proc=2,
                                      skip_invalid=True, cache_dir=str(tmp_path / "c")))
    assert skipped.stats["corpus"]["skipped_total"] == 1


BUILD = """
import sys
from ppvarlen.config import load_config
from ppvarlen.store_build import build_datasets
build_datasets(load_config(data={"Data": {"corpus": "jsonl", "train_file": sys.argv[1],
                                          "cache_dir": sys.argv[2], "num_proc": 1}}).Data)
"""


def test_a_build_killed_mid_way_leaves_no_store_a_later_run_takes(tmp_path):
    train = write_reviews(tmp_path / "train.jsonl", 60000)
    cache = tmp_path / "cache"
    proc = subprocess.Popen([sys.executable, "-c", BUILD, train, str(cache)],
                            env=dict(os.environ, PYTHONPATH=REPO))
    deadline = time.time() + 120
    killed_in = None
    while time.time() < deadline and proc.poll() is None:
        partial = [d for root, dirs, _ in os.walk(cache) for d in dirs if d.startswith(".tmp-")]
        if partial:  # a split (or the entry) is being written: kill it there
            proc.send_signal(signal.SIGKILL)
            killed_in = partial
            break
        time.sleep(0.005)
    proc.wait()
    assert killed_in, "the build finished before a temp directory was seen"
    complete = [os.path.join(root, d) for root, dirs, _ in os.walk(cache) for d in dirs
                if is_complete(os.path.join(root, d))]
    entries = [os.path.join(root, d) for root, dirs, _ in os.walk(cache) for d in dirs
               if os.path.isfile(os.path.join(root, d, "entry.json"))]
    assert not complete or len(complete) < 3  # never all three splits
    bundle = build_datasets(data_cfg(corpus="jsonl", train_file=train, cache_dir=str(cache)))
    assert bundle.stats["store"]["cache"].startswith("built")  # not taken as complete
    assert len(bundle.train) + len(bundle.dev) + len(bundle.test) == 60000
    assert entries is not None


def test_a_damaged_record_of_the_last_store_only_loses_the_reason(tmp_path):
    """The cache's record of a slot's last store (last/<slot>.json) says why a build misses;
    damaged, the build goes on and says it cannot tell."""
    train, cache = write_reviews(tmp_path / "a.jsonl", 300), tmp_path / "cache"
    cfg = dict(corpus="jsonl", train_file=train, cache_dir=str(cache))
    build_datasets(data_cfg(**cfg))
    (record,) = (cache / "last").iterdir()
    for min_freq, damaged in zip((2, 3, 4), ('{"parts": 1}', "[]",
                                             '{"parts": {"data": {}, "files": 3}}')):
        record.write_text(damaged, encoding="utf-8")
        bundle = build_datasets(data_cfg(**cfg, min_freq=min_freq))  # another key: a miss
        assert bundle.stats["store"]["cache"] == f"built ({record} is damaged, so what " \
                                                 f"changed is not known)"


def test_reads_a_paddlenlp_indexed_corpus(tmp_path):
    from paddlenlp.data.indexed_dataset import make_builder

    prefix = str(tmp_path / "corpus")
    docs = [[[5, 6, 7], [8]], [[9, 10, 11, 12]]]
    builder = make_builder(prefix + ".bin", "mmap", np.uint16)
    for doc in docs:
        for sentence in doc:
            builder.add_item(np.array(sentence))
        builder.end_document()
    builder.finalize(prefix + ".idx")
    tokens = IndexedTokens(prefix)
    assert len(tokens) == 3 and tokens.lengths.tolist() == [3, 1, 4]
    assert tokens.dtype == np.uint16 and [tokens[i].tolist() for i in range(3)] == \
        [s for d in docs for s in d]
    assert tokens.doc_idx.tolist() == [0, 2, 3]
    (tmp_path / "bad.idx").write_bytes(b"TNTIDX\x00\x00" + b"\x00" * 40)
    with pytest.raises(DataError, match="not a memory-mapped indexed corpus"):
        IndexedTokens(str(tmp_path / "bad"))


def test_a_broken_indexed_corpus_is_refused_naming_its_file(tmp_path):
    """Cut-short, missing or mismatched .idx / .bin files: a DataError naming the file, never
    a struct / numpy error from deep inside the reader."""
    from ppvarlen.data.store import _IDX_MAGIC

    def corpus(name, idx_body, bin_bytes=b"\0" * 16):
        (tmp_path / f"{name}.idx").write_bytes(_IDX_MAGIC + idx_body)
        if bin_bytes is not None:
            (tmp_path / f"{name}.bin").write_bytes(bin_bytes)
        return str(tmp_path / name)

    one_item = struct.pack("<QBQQ", 1, 4, 1, 2) + struct.pack("<iqqq", 4, 0, 0, 1)
    with pytest.raises(DataError, match=r"short\.idx.*paddlenlp"):
        IndexedTokens(corpus("short", struct.pack("<QB", 1, 4)))  # header cut short
    with pytest.raises(DataError, match=r"huge\.idx: .*10000 items.*cut short"):
        IndexedTokens(corpus("huge", struct.pack("<QBQQ", 1, 4, 10_000, 2)))
    with pytest.raises(DataError, match=r"nobin\.bin"):
        IndexedTokens(corpus("nobin", one_item, None))
    with pytest.raises(DataError, match=r"past\.bin: the index places items outside its 16"):
        IndexedTokens(corpus("past", one_item.replace(struct.pack("<i", 4),
                                                      struct.pack("<i", 400))))
    assert IndexedTokens(corpus("fits", one_item))[0].tolist() == [0, 0, 0, 0]


def test_a_relative_glob_and_its_absolute_form_share_the_store(tmp_path, monkeypatch):
    """Training on 'shards/*.jsonl' writes an absolute glob into config.yaml; eval and export
    read that config and must reuse the training run's store rather than encode again."""
    (tmp_path / "shards").mkdir()
    for k in range(2):
        write_reviews(tmp_path / "shards" / f"part-{k}.jsonl", 60, seed=k)
    monkeypatch.chdir(tmp_path)
    cache_dir = str(tmp_path / "cache")
    first = build_datasets(data_cfg(corpus="jsonl", train_file="shards/*.jsonl", cache_dir=cache_dir))
    again = build_datasets(data_cfg(corpus="jsonl", train_file=str(tmp_path / "shards/*.jsonl"),
                                    cache_dir=cache_dir))
    assert first.stats["store"]["cache"].startswith("built")
    assert again.stats["store"]["cache"] == "reused"


def test_input_formats_gzip_parquet_and_shards_give_the_same_store(tmp_path):
    import gzip
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    plain = write_reviews(tmp_path / "all.jsonl", 400)
    lines = open(plain, encoding="utf-8").read().splitlines(keepends=True)
    with open(plain, "rb") as src, gzip.open(tmp_path / "all.jsonl.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    rows = [json.loads(line) for line in lines]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "all.parquet", row_group_size=150)
    shards = tmp_path / "shards"
    shards.mkdir()
    for k in range(3):  # sorted names keep the file order
        (shards / f"part-{k}.jsonl").write_text("".join(lines[k * 150:(k + 1) * 150]), "utf-8")

    def build(corpus, train_file, **kw):
        return build_datasets(data_cfg(corpus=corpus, train_file=str(train_file),
                                       cache_dir=str(tmp_path / "cache"), **kw))

    ref = build("jsonl", plain)
    for corpus, path in (("jsonl", tmp_path / "all.jsonl.gz"), ("parquet", tmp_path / "all.parquet"),
                         ("jsonl", shards), ("jsonl", shards / "part-*.jsonl")):
        got = build(corpus, path)
        assert got.stats["store"]["cache"].startswith("built"), path
        assert got.encoder.tokens == ref.encoder.tokens and got.label_names == ref.label_names
        for split in ("train", "dev", "test"):
            assert _split_bytes(got, split)["input_ids.bin"] == _split_bytes(ref, split)["input_ids.bin"]
            assert np.array_equal(getattr(got, split).store.column("label"),
                                  getattr(ref, split).store.column("label")), (path, split)
    assert build("jsonl", shards / "part-*.jsonl").stats["store"]["cache"] == "reused"
    (shards / "part-2.jsonl").write_text("".join(lines[300:399]) + '{"text": 1, "label": "pos"}\n',
                                         "utf-8")
    with pytest.raises(DataError, match=r"part-2\.jsonl:100: field 'text' must be a string"):
        build("jsonl", shards / "part-*.jsonl", num_proc=2)
    with pytest.raises(DataError, match="no data files match"):
        build("jsonl", tmp_path / "nothing-*.jsonl")
