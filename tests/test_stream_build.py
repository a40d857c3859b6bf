"""The streaming store build (data/stream_build.py): workers read raw line chunks, and the store,
vocabulary and corpus stats are those of the in-memory path, file by file."""
import gzip
import json
import os

import pytest

from ppvarlen.config import load_config
from ppvarlen.data import corpora, stream_build
from ppvarlen.data.errors import DataError
from ppvarlen.tasks import build_datasets

from test_store import write_reviews


def data_cfg(**data):
    return load_config(data={"Data": data}).Data


def _tree(root):
    out = {}
    for d, _, files in os.walk(root):
        for name in files:
            path = os.path.join(d, name)
            out[os.path.relpath(path, root)] = open(path, "rb").read()
    return out


def _build_both(tmp_path, monkeypatch, **data):
    """(in-memory result, streamed result): each a built store tree, or the DataError text."""
    out = []
    for mode in ("memory", "stream"):
        cache = str(tmp_path / mode)
        with monkeypatch.context() as m:
            if mode == "memory":
                m.setattr(stream_build, "plan", lambda *a, **k: None)
            else:  # the parent must not read the corpus itself
                m.setattr(corpora, "load_corpus", lambda cfg: pytest.fail("parent read the corpus"))
            try:
                build_datasets(data_cfg(cache_dir=cache, num_proc=1 if mode == "memory" else 2,
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


def test_streamed_store_is_the_in_memory_one_file_by_file(tmp_path, monkeypatch):
    monkeypatch.setattr(stream_build, "CHUNK_BYTES", 4096)  # many chunks, split mid-file
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


def test_streamed_errors_name_the_same_file_and_line(tmp_path, monkeypatch):
    monkeypatch.setattr(stream_build, "CHUNK_BYTES", 4096)
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


def test_tsv_with_a_header_streams_to_the_same_store(tmp_path, monkeypatch):
    monkeypatch.setattr(stream_build, "CHUNK_BYTES", 2048)
    rows = [json.loads(x) for x in open(write_reviews(tmp_path / "r.jsonl", 1500), encoding="utf-8")]
    (tmp_path / "train.tsv").write_text(
        "text\tlabel\n" + "".join(f"{r['text']}\t{r['label']}\n" for r in rows), "utf-8")
    memory, streamed = _build_both(tmp_path, monkeypatch, corpus="tsv",
                                   train_file=str(tmp_path / "train.tsv"))
    assert isinstance(memory, dict) and memory == streamed


def test_chunks_cut_at_line_ends_and_number_lines(tmp_path, monkeypatch):
    monkeypatch.setattr(stream_build, "CHUNK_BYTES", 64)
    lines = [b"x" * 10, b"y" * 200, b"", b"z" * 63, b"w"]  # one longer than a chunk; no final \n
    path = tmp_path / "f.jsonl"
    path.write_bytes(b"\n".join(lines))
    chunks = list(stream_build._chunks_of("train", str(path)))
    assert len(chunks) > 2
    got = [(n, raw) for c in chunks for n, raw in enumerate(c.raw_lines(), c.first_line)]
    assert got == list(enumerate(lines, 1))


def test_every_line_is_parsed_once(tmp_path, monkeypatch):
    """Pass 2 encodes the examples pass 1 parsed (spilled as packed columns): no line is
    JSON-parsed twice (the bytes are the in-memory path's: the tests above and the gate)."""
    monkeypatch.setattr(stream_build, "CHUNK_BYTES", 4096)
    train = write_reviews(tmp_path / "train.jsonl", 800)
    parsed = []
    real = stream_build.parse_json_bytes
    monkeypatch.setattr(stream_build, "parse_json_bytes",
                        lambda raw, n, task: parsed.append(raw) or real(raw, n, task))
    monkeypatch.setattr(corpora, "load_corpus", lambda cfg: pytest.fail("parent read the corpus"))
    bundle = build_datasets(data_cfg(corpus="jsonl", train_file=train, num_proc=1,
                                     cache_dir=str(tmp_path / "c")))
    assert len(bundle.train) + len(bundle.dev) + len(bundle.test) == 800
    assert len(parsed) == 800  # the first line's task is read with json.loads, not parsed


def test_packed_examples_round_trip():
    rows = [{"text": "好\ud800 \u3000x", "label": 3, "answers": [{"text": "好", "start": 0}]},
            {"text": "", "label": -2, "answers": []}]
    assert stream_build.unpack_examples(stream_build.pack_examples(rows)) == rows
    mixed = [{"text": "a", "label": "pos"}, {"text": "b", "label": 1}]
    assert stream_build.unpack_examples(stream_build.pack_examples(mixed)) == mixed
    other_keys = [{"text": "a"}, {"source": "b", "target": "c"}]
    assert stream_build.unpack_examples(stream_build.pack_examples(other_keys)) == other_keys
    assert stream_build.unpack_examples(stream_build.pack_examples([])) == []
    big = [{"label": 1 << 70}]
    assert stream_build.unpack_examples(stream_build.pack_examples(big)) == big


def test_the_format_says_whether_it_streams():
    """``CorpusFormat.checked_line_by_line``: the chunked build asks the format, it compares no
    functions; tagging's tag scheme is checked over whole files, so it is read in order."""
    from ppvarlen.data.readers import FORMATS

    import ppvarlen.tasks  # noqa: F401  (the task modules register their formats)

    assert not FORMATS["tagging"].checked_line_by_line
    assert all(FORMATS[n].checked_line_by_line for n in ("classification", "seq2seq",
                                                          "text_pair", "extractive_qa"))
    assert FORMATS["classification"].labelled and FORMATS["text_pair"].labelled
    assert not FORMATS["seq2seq"].labelled and not FORMATS["extractive_qa"].labelled
