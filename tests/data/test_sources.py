"""The one ingestion path (data/sources.py): every corpus as ordered chunks read by workers; the
chunking and the worker count change no byte of a store (the bytes themselves: the store gate,
tests/data/test_store_gate.py)."""
import gzip
import json
import os
from types import SimpleNamespace

import pytest

from ppvarlen.config import load_config
from ppvarlen.data import chunks as record_chunks
from ppvarlen.data import readers, sources
from ppvarlen.data.cache import FINGERPRINTS
from ppvarlen.data.errors import DataError
from ppvarlen import store_build
from ppvarlen.store_build import build_datasets

from test_store import write_reviews


def data_cfg(**data):
    return load_config(data={"Data": data}).Data


def _tree(root):
    """Every file under a cache root but the fingerprint record, which holds a file only once it
    is older than ``data.cache.RACY_SECONDS``, and the stores' verification stamps (the files'
    stat): when a build ran, not what it built."""
    out = {}
    for d, _, files in os.walk(root):
        for name in files:
            if d == root and name == FINGERPRINTS or name.endswith(".verified.json"):
                continue
            path = os.path.join(d, name)
            out[os.path.relpath(path, root)] = open(path, "rb").read()
    return out


def _build_both(tmp_path, monkeypatch, **data):
    """(one chunk per file on one process, small chunks on two workers): each a built store
    tree, or the DataError text.  The parent never reads the corpus itself."""
    out = []
    monkeypatch.setattr(sources, "read_corpus", lambda cfg: pytest.fail("parent read the corpus"))
    for mode in ("whole", "chunked"):
        cache = str(tmp_path / mode)
        with monkeypatch.context() as m:
            m.setattr(record_chunks, "CHUNK_BYTES", 1 << 30 if mode == "whole" else 4096)
            try:
                build_datasets(data_cfg(cache_dir=cache, num_proc=1 if mode == "whole" else 2,
                                        **data))
                out.append(_tree(cache))
            except DataError as e:
                out.append(str(e))
    return out


def _shards(tmp_path):
    """Three shards of reviews: a plain one with bad lines, a gzip'd one, one with a BOM."""
    lines = open(write_reviews(tmp_path / "all.jsonl", 3000), encoding="utf-8").read().splitlines()
    d = tmp_path / "shards"
    d.mkdir()
    bad = ['{"text": "坏", "label": ', "", '{"text": "  ", "label": "pos"}',
           '{"text": "好", "label": "maybe"}']
    (d / "part-0.jsonl").write_text("\n".join(lines[:1000] + bad + lines[1000:2000]) + "\n",
                                    "utf-8")
    with gzip.open(d / "part-1.jsonl.gz", "wb") as f:
        f.write(("\n".join(lines[2000:2600]) + "\n").encode())
    (d / "part-2.jsonl").write_bytes(b"\xef\xbb\xbf" + "\n".join(lines[2600:]).encode()
                                     + b"\n\xff\xfe bad bytes\n" + lines[0].encode())
    return d


def test_chunks_and_workers_change_no_byte(tmp_path, monkeypatch):
    shards = _shards(tmp_path)
    memory, streamed = _build_both(tmp_path, monkeypatch, corpus="jsonl",
                                   train_file=str(shards / "part-*"), skip_invalid=True,
                                   label_names=["neg", "pos"])
    assert isinstance(memory, dict) and "input_ids.bin" in "".join(memory)
    assert streamed.keys() == memory.keys()
    assert [k for k in memory if memory[k] != streamed[k]] == []
    entry = json.loads(next(v for k, v in memory.items() if k.endswith("entry.json")))
    files = entry["corpus_stats"]["files"]["train"]
    assert files["skipped"] == {"bad_json": 1, "blank_line": 1, "empty_text": 1, "not_utf8": 1,
                                "unknown_label": 1}


def test_errors_name_the_same_file_and_line_whatever_the_chunks(tmp_path, monkeypatch):
    shards = _shards(tmp_path)
    memory, streamed = _build_both(tmp_path, monkeypatch, corpus="jsonl",
                                   train_file=str(shards / "part-*"))
    assert memory == streamed and "part-0.jsonl:1001: invalid JSON" in streamed
    (shards / "part-0.jsonl").write_text(
        "\n".join(json.dumps({"text": f"好{i}", "label": "pos" if i % 3 else 7}) for i in range(1, 900)),
        "utf-8")
    memory, streamed = _build_both(tmp_path, monkeypatch, corpus="jsonl",
                                   train_file=str(shards / "part-0.jsonl"))
    assert memory == streamed and "part-0.jsonl:3: label 7 is a class id" in streamed


def test_tsv_with_a_header_gives_the_same_store_in_chunks(tmp_path, monkeypatch):
    rows = [json.loads(x) for x in open(write_reviews(tmp_path / "r.jsonl", 1500), encoding="utf-8")]
    (tmp_path / "train.tsv").write_text(
        "text\tlabel\n" + "".join(f"{r['text']}\t{r['label']}\n" for r in rows), "utf-8")
    memory, streamed = _build_both(tmp_path, monkeypatch, corpus="tsv",
                                   train_file=str(tmp_path / "train.tsv"))
    assert isinstance(memory, dict) and memory == streamed


def test_chunks_cut_at_line_ends_and_number_lines(tmp_path, monkeypatch):
    monkeypatch.setattr(record_chunks, "CHUNK_BYTES", 64)
    lines = [b"x" * 10, b"y" * 200, b"", b"z" * 63, b"w"]  # one longer than a chunk; no final \n
    path = tmp_path / "f.jsonl"
    path.write_bytes(b"\n".join(lines))
    chunks = list(record_chunks._chunks_of("train", str(path)))
    assert len(chunks) > 2
    got = [(n, raw) for c in chunks for n, raw in enumerate(c.raw_lines(), c.first_line)]
    assert got == list(enumerate(lines, 1))


@pytest.mark.parametrize("uncommon", [False, True])
def test_every_line_is_parsed_once(tmp_path, monkeypatch, uncommon):
    """Pass 2 encodes the examples pass 1 parsed (spilled as packed columns): no line is
    JSON-parsed twice, whether a chunk's lines are all the common case (made into examples at
    once) or some are not (a float field, a label to strip: one line at a time, from the values
    loaded already).  The bytes are the in-memory path's: the tests above and the gate."""
    monkeypatch.setattr(record_chunks, "CHUNK_BYTES", 4096)
    train = write_reviews(tmp_path / "train.jsonl", 800)
    if uncommon:
        rows = [json.loads(line) for line in open(train, encoding="utf-8")]
        for k, row in enumerate(rows):
            if k % 7 == 0:
                row["score"] = 0.5
            if k % 11 == 0:
                row["label"] = f" {row['label']} "
        with open(train, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    loads = []
    real = readers.orjson
    monkeypatch.setattr(readers, "orjson", SimpleNamespace(
        loads=lambda raw: loads.append(raw) or real.loads(raw),
        JSONDecodeError=real.JSONDecodeError))
    monkeypatch.setattr(sources, "read_corpus", lambda cfg: pytest.fail("parent read the corpus"))
    bundle = build_datasets(data_cfg(corpus="jsonl", train_file=train, num_proc=1,
                                     cache_dir=str(tmp_path / "c")))
    assert len(bundle.train) + len(bundle.dev) + len(bundle.test) == 800
    assert len(loads) == 800  # the first line's task is read with json.loads, not parsed
    assert len(set(loads)) == 800


def test_packed_examples_round_trip():
    rows = [{"text": "好\ud800 \u3000x", "label": 3, "answers": [{"text": "好", "start": 0}]},
            {"text": "", "label": -2, "answers": []}]
    assert record_chunks.unpack_examples(record_chunks.pack_examples(rows)) == rows
    mixed = [{"text": "a", "label": "pos"}, {"text": "b", "label": 1}]
    assert record_chunks.unpack_examples(record_chunks.pack_examples(mixed)) == mixed
    other_keys = [{"text": "a"}, {"source": "b", "target": "c"}]
    assert record_chunks.unpack_examples(record_chunks.pack_examples(other_keys)) == other_keys
    assert record_chunks.unpack_examples(record_chunks.pack_examples([])) == []
    big = [{"label": 1 << 70}]
    assert record_chunks.unpack_examples(record_chunks.pack_examples(big)) == big


def test_the_format_declares_its_labels_and_texts():
    """``CorpusFormat``: the reader asks the format what its labels are and which fields a
    vocabulary counts; it compares no functions and no task names."""
    from ppvarlen.data.readers import FORMATS

    import ppvarlen.tasks  # noqa: F401  (the task modules register their formats)

    assert FORMATS["tagging"].labels == "tags"
    assert FORMATS["classification"].labels == FORMATS["text_pair"].labels == "class"
    assert FORMATS["seq2seq"].labels is None and FORMATS["extractive_qa"].labels is None
    assert FORMATS["extractive_qa"].text_fields == ("question", "context")


def _tagged(n, bad_every=0):
    rows = []
    for i in range(n):
        chars = list(f"张{i}在北京")
        tags = ["B-PER"] + ["I-PER"] * len(str(i)) + ["O", "B-LOC", "I-LOC"]
        if bad_every and i % bad_every == 3:
            tags[0] = "S-PER"  # a BIOES tag: not BIO
        rows.append({"tokens": chars, "tags": tags})
    return rows


def test_tagging_corpora_are_chunked_and_their_skips_hold_across_chunks(tmp_path, monkeypatch):
    """Tag-scheme checks run over the merged tags in chunk order: the lines they skip under
    Data.skip_invalid are dropped from pass 2 whatever the chunks."""
    path = tmp_path / "tags.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in _tagged(600, 7)),
                    "utf-8")
    whole, chunked = _build_both(tmp_path, monkeypatch, corpus="jsonl", train_file=str(path),
                                 skip_invalid=True, tag_scheme="bio")
    assert isinstance(whole, dict) and whole == chunked
    entry = json.loads(next(v for k, v in whole.items() if k.endswith("entry.json")))
    files = entry["corpus_stats"]["files"]["train"]
    assert files["skipped"] == {"bad_tag": 86} and files["examples"] == 600 - 86
    assert sum(entry["corpus_stats"]["split"]["sizes"].values()) == 600 - 86


def test_parquet_row_groups_and_a_limit_are_chunked(tmp_path, monkeypatch):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rows = [json.loads(x) for x in open(write_reviews(tmp_path / "r.jsonl", 900), encoding="utf-8")]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "r.parquet", row_group_size=100)
    whole, chunked = _build_both(tmp_path, monkeypatch, corpus="parquet",
                                 train_file=str(tmp_path / "r.parquet"), limit=50)
    assert isinstance(whole, dict) and whole == chunked
    entry = json.loads(next(v for k, v in whole.items() if k.endswith("entry.json")))
    assert entry["corpus_stats"]["limit"]["after"] == {"train": 50, "dev": 50, "test": 50}


def test_names_and_ids_mixed_under_skip_invalid_skip_the_other_kind(tmp_path):
    path = tmp_path / "mixed.jsonl"
    rows = [{"text": f"好{i}", "label": "pos" if i % 4 else 1} for i in range(1, 200)]
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), "utf-8")
    corpus = sources.read_corpus(data_cfg(corpus="jsonl", train_file=str(path),
                                          skip_invalid=True))
    files = corpus.stats["files"]["train"]
    assert files["skipped"] == {"mixed_label_kinds": 49} and files["examples"] == 150
    assert files["first_skipped"]["mixed_label_kinds"].startswith(
        "line 4: label 1 is a class id but the first label ('pos') is a name")
    assert corpus.label_names == ["pos"]
    assert sum(map(len, corpus.splits.values())) == 150
    assert sum(n for s in corpus.stats["per_label"].values() for n in s.values()) == 150


def test_workers_write_their_packed_examples_and_a_chunk_that_does_not_fit_comes_back(
        tmp_path, monkeypatch):
    """Pass 1's workers write each chunk's packed examples into the temp file, in room kept for
    the chunk; a chunk whose packed examples do not fit (here: tags packed as JSON with spaces,
    no slack) is sent back and written by the parent.  The stores are the same either way."""
    log = tmp_path / "writes.log"
    real = sources.BlockFile.write_at

    def logged(self, data, at):
        with open(log, "a") as f:
            f.write(f"{os.getpid()}\n")
        return real(self, data, at)

    monkeypatch.setattr(sources.BlockFile, "write_at", logged)
    monkeypatch.setattr(record_chunks, "CHUNK_BYTES", 4096)

    def writers(**data):
        log.write_text("")
        cache = str(tmp_path / f"c{len(list(tmp_path.iterdir()))}")
        build_datasets(data_cfg(cache_dir=cache, num_proc=2, **data))
        pids = log.read_text().split()
        return pids.count(str(os.getpid())), len(pids), _tree(cache)

    reviews = write_reviews(tmp_path / "reviews.jsonl", 800)
    parent, total, _ = writers(corpus="jsonl", train_file=reviews)
    assert parent == 0 and total > 5  # every chunk written by a worker
    tags = tmp_path / "tags.jsonl"
    tags.write_text("".join(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n"
                            for r in _tagged(600)), "utf-8")
    parent, total, roomy = writers(corpus="jsonl", train_file=str(tags))
    assert parent == 0
    monkeypatch.setattr(sources, "SPILL_SLACK", 0)
    parent, total, tight = writers(corpus="jsonl", train_file=str(tags))
    assert parent == total > 5  # none fits: all sent back
    assert roomy == tight


def test_pass_two_rows_come_back_in_shared_rooms_or_with_the_result_when_they_do_not_fit(
        tmp_path, monkeypatch):
    """Pass 2's workers write each job's token rows into a room of memory shared with the parent;
    rows that do not fit come back with the result.  The stores are the same either way, and
    the same as one process's."""
    reviews = write_reviews(tmp_path / "reviews.jsonl", 800)
    monkeypatch.setattr(record_chunks, "CHUNK_BYTES", 4096)
    real = store_build.SplitSink.add

    def build(num_proc, room_bytes):
        placed = []

        def add(self, result, room=None):
            placed.extend(isinstance(c[0], store_build.InRoom)
                          for c in result.columns.values() if isinstance(c, tuple))
            return real(self, result, room)

        cache = str(tmp_path / f"c{num_proc}-{room_bytes}")
        with monkeypatch.context() as m:
            m.setattr(store_build.SplitSink, "add", add)
            m.setattr(store_build, "ROOM_BYTES", room_bytes)
            build_datasets(data_cfg(corpus="jsonl", train_file=reviews, cache_dir=cache,
                                    num_proc=num_proc))
        return set(placed), _tree(cache)

    one, alone = build(1, store_build.ROOM_BYTES)
    roomy, in_rooms = build(2, store_build.ROOM_BYTES)
    tight, sent = build(2, 0)
    some, mixed = build(2, 2000)  # a 4 KB chunk: its train rows do not fit, its dev rows do
    assert one == {False} and roomy == {True} and tight == {False} and some == {True, False}
    assert alone == in_rooms == sent == mixed


@pytest.mark.timeout(120)  # a pool left waiting for a room would hang here
def test_an_encoding_error_in_pass_two_stops_the_build_with_many_chunks_in_flight(
        tmp_path, monkeypatch):
    """An example pass 2 refuses (longer than Data.max_len under long_text: error) is raised in
    input order while more chunks wait for a room than there are rooms; the pool ends."""
    reviews = write_reviews(tmp_path / "reviews.jsonl", 800)
    monkeypatch.setattr(record_chunks, "CHUNK_BYTES", 4096)
    with pytest.raises(DataError) as e:
        build_datasets(data_cfg(corpus="jsonl", train_file=reviews, num_proc=2, max_len=8,
                                long_text="error", cache_dir=str(tmp_path / "c")))
    assert str(e.value).startswith("train example 0 (from ") and "Data.long_text" in str(e.value)
