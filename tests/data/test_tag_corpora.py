"""JSONL tagging corpora in every tag scheme: BMES word segmentation, BIOES NER and plain POS
tags, derived from People's Daily paragraphs; they load with their scheme, a tag that fits
none (or a file mixing schemes) fails at load time naming file and line, and each trains
through tools/train.py and reports chunk F1 / token accuracy."""
import hashlib
import json
import os
import subprocess
import sys

import pytest

from ppvarlen.config import ConfigError
from ppvarlen.data import tagschemes
from ppvarlen.data.sources import load_corpus
from ppvarlen.data.corpora.ner import ner_tags
from ppvarlen.data.corpora.people_daily import people_daily
from ppvarlen.data.errors import DataError
from ppvarlen.data.splits import SPLITS

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
N_LINES = 240


def bmes(words):
    """Character tags of a segmentation: S for a one-character word, else B M* E."""
    return [t for w in words for t in (["S"] if len(w) == 1 else ["B"] + ["M"] * (len(w) - 2) + ["E"])]


def bioes(bio):
    """BIO -> BIOES: a chunk's last tag becomes E- (S- for a one-token chunk)."""
    out = []
    for i, tag in enumerate(bio):
        last = i + 1 == len(bio) or bio[i + 1] != "I-" + tag[2:]
        out.append(tag if tag == "O" or not last else ("S-" if tag[0] == "B" else "E-") + tag[2:])
    return out


def _write(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for tokens, tags in rows:
            f.write(json.dumps({"tokens": tokens, "tags": tags}, ensure_ascii=False) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The first paragraphs of People's Daily (cut to 30 words) in three schemes."""
    tmp = tmp_path_factory.mktemp("tags")
    paragraphs = people_daily().paragraphs[:N_LINES]
    pairs = [p.pairs()[:30] for p in paragraphs]
    ner = [ner_tags(p) for p in paragraphs]
    return {
        "bmes": _write(tmp / "seg_bmes.jsonl",
                       [(list("".join(w for w, _ in ps)), bmes([w for w, _ in ps])) for ps in pairs]),
        "bioes": _write(tmp / "ner_bioes.jsonl", [(chars, bioes(tags)) for chars, tags, _ in ner]),
        "plain": _write(tmp / "pos_plain.jsonl", [([w for w, _ in ps], [t for _, t in ps])
                                                   for ps in pairs]),
    }


@pytest.mark.parametrize("scheme", ["bmes", "bioes", "plain"])
def test_corpus_loads_with_its_scheme(files, scheme):
    c = load_corpus({"corpus": "jsonl", "train_file": files[scheme]})
    assert c.task == "tagging"
    assert sum(len(c.splits[s]) for s in SPLITS) == N_LINES
    info = c.stats["tag_scheme"]
    assert info["scheme"] == scheme and info["from"].startswith("the tags (")
    # the label names alone say the scheme (what the trainer, export and report see)
    assert tagschemes.detect(c.label_names) == scheme
    assert set(c.label_names) == {t for s in SPLITS for ex in c.splits[s] for t in ex["tags"]}
    if scheme == "plain":
        assert {"n", "v", "w"} <= set(c.label_names)
    # explicit Data.tag_scheme: the same corpus
    again = load_corpus({"corpus": "jsonl", "train_file": files[scheme], "tag_scheme": scheme})
    assert again.label_names == c.label_names and again.splits == c.splits
    assert again.stats["tag_scheme"] == {"scheme": scheme, "from": "Data.tag_scheme"}


def _lines(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def _rewrite(tmp_path, name, rows, line, tags):
    rows = [dict(r) for r in rows]
    rows[line - 1]["tags"] = tags(rows[line - 1])
    return _write(tmp_path / name, [(r["tokens"], r["tags"]) for r in rows])


def test_tag_of_no_scheme_fails_at_load_naming_file_and_line(files, tmp_path):
    rows = _lines(files["bioes"])
    bad = _rewrite(tmp_path, "unknown.jsonl", rows, 7, lambda r: ["X-LOC"] + r["tags"][1:])
    with pytest.raises(DataError, match=r"unknown\.jsonl:7: tags \['X-LOC'\] do not fit the "
                                        r"BIOES tags of the lines before .*mixed"):
        load_corpus({"corpus": "jsonl", "train_file": bad})
    first = _rewrite(tmp_path, "first.jsonl", rows, 1, lambda r: ["B-PER", "NN"] + r["tags"][2:])
    with pytest.raises(DataError, match=r"first\.jsonl:1: the tags of this line mix schemes"):
        load_corpus({"corpus": "jsonl", "train_file": first})
    spaced = _rewrite(tmp_path, "space.jsonl", rows, 3, lambda r: ["B PER"] + r["tags"][1:])
    with pytest.raises(DataError, match=r"space\.jsonl:3: .*'B PER'"):
        load_corpus({"corpus": "jsonl", "train_file": spaced})
    # an explicit scheme names the tag that is not its own
    with pytest.raises(DataError, match=r"ner_bioes\.jsonl:\d+: tag \d+ '[ES]-\w+' is not a BIO tag"):
        load_corpus({"corpus": "jsonl", "train_file": files["bioes"], "tag_scheme": "bio"})


def test_file_mixing_schemes_fails_at_load_naming_file_and_line(files, tmp_path):
    seg = _lines(files["bmes"])
    # BMES "middle" and BIO "inside" in one file
    with_m = [i for i, r in enumerate(seg, 1) if "M" in r["tags"]]
    line = with_m[1]  # the lines before it have used M already
    mixed = _rewrite(tmp_path, "seg_mixed.jsonl", seg, line,
                     lambda r: [{"M": "I"}.get(t, t) for t in r["tags"]])
    with pytest.raises(DataError, match=rf"seg_mixed\.jsonl:{line}: .*inside tags .*middle tags"):
        load_corpus({"corpus": "jsonl", "train_file": mixed})
    # POS tags with a chunk tag
    pos = _lines(files["plain"])
    chunked = _rewrite(tmp_path, "pos_mixed.jsonl", pos, 4, lambda r: ["B-PER"] + r["tags"][1:])
    with pytest.raises(DataError, match=r"pos_mixed\.jsonl:4: .*chunk tags .* and plain tags"):
        load_corpus({"corpus": "jsonl", "train_file": chunked})
    # BIO lines in a BIOES file: the first BIO-style chunk is named, and what made it BIOES
    ner = _lines(files["bioes"])
    first_chunk = next(i for i, r in enumerate(ner, 1) if any(t[0] in "ES" for t in r["tags"]))
    bio_line = _rewrite(tmp_path, "ner_mixed.jsonl", ner, first_chunk,
                        lambda r: [t.replace("E-", "I-").replace("S-", "B-") for t in r["tags"]])
    with pytest.raises(DataError, match=rf"ner_mixed\.jsonl:{first_chunk}: .*not closed by E-/S-.*"
                                        r"reads as BIOES from the tags \("):
        load_corpus({"corpus": "jsonl", "train_file": bio_line})
    # with skip_invalid the line is skipped and counted
    c = load_corpus({"corpus": "jsonl", "train_file": bio_line, "skip_invalid": True})
    assert c.stats["files"]["train"]["skipped"] == {"bad_tag": 1}
    assert sum(len(c.splits[s]) for s in SPLITS) == N_LINES - 1
    # a dev file in another scheme than train
    dev = _write(tmp_path / "dev_bio.jsonl", [(["江", "泽", "民"], ["B-PER", "I-PER", "I-PER"])])
    with pytest.raises(DataError, match=r"dev_bio\.jsonl:1: .*not closed by E-/S-"):
        load_corpus({"corpus": "jsonl", "train_file": files["bioes"], "dev_file": dev})


def test_scheme_keys_are_checked(files, tmp_path):
    short = _write(tmp_path / "short_words.jsonl",
                   [(list("我们去北京"), ["B", "E", "S", "B", "E"]), (list("好"), ["S"])])
    c = load_corpus({"corpus": "jsonl", "train_file": short, "tag_scheme": "bmes"})
    # no three-character word: M is added so that the label names say BMES, not BIOES
    assert c.label_names == ["B", "M", "E", "S"]
    assert c.stats["tag_scheme"]["labels_added"] == ["M"]
    with pytest.raises(ConfigError, match=r"Data.label_names: a BMES tag set needs \['M'\]"):
        load_corpus({"corpus": "jsonl", "train_file": short, "label_names": ["B", "E", "S"],
                     "tag_scheme": "bmes"})
    with pytest.raises(ConfigError, match="Data.label_names: .*mixed"):
        load_corpus({"corpus": "jsonl", "train_file": short, "label_names": ["B", "I", "M", "E", "S"]})
    with pytest.raises(ConfigError, match="Data.tag_scheme: 'bio' applies to tagging data"):
        load_corpus({"corpus": "sentiment", "tag_scheme": "bio"})
    with pytest.raises(ConfigError, match="Data.tag_scheme: 'bioes', but corpus 'people_daily_ner' "
                                          "uses bio tags"):
        load_corpus({"corpus": "people_daily_ner", "tag_scheme": "bioes"})
    assert load_corpus({"corpus": "people_daily_ner", "tag_scheme": "bio", "limit": 1}).task == "tagging"
    with pytest.raises(ConfigError, match="tag_scheme"):
        load_corpus({"corpus": "jsonl", "train_file": short, "tag_scheme": "iob1"})
    # plain tags that read as chunks cannot be told apart from chunk tags by their names
    with pytest.raises(ConfigError, match="Data.tag_scheme: plain, but the tags .* read as BIOES"):
        load_corpus({"corpus": "jsonl", "train_file": short, "tag_scheme": "plain"})


@pytest.mark.parametrize("scheme", ["bmes", "bioes", "plain"])
def test_trains_through_tools_train_and_reports_its_scheme(files, scheme, tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "tools/train.py", "-c", "configs/ner/bigru_crf.yaml",
           "-o", "Data.corpus=jsonl", "-o", f"Data.train_file={files[scheme]}",
           "-o", f"Global.output_dir={out}", "-o", "Train.max_steps=4", "-o", "Train.epochs=1",
           "-o", "Train.progress_bar=false", "-o", "Data.max_tokens=1024",
           "-o", "Model.emb_size=16", "-o", "Model.hidden_size=16", "-o", "Data.max_len=64",
           "-o", "Data.stride=16"]
    env = dict(os.environ, PYTHONPATH=REPO)
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    printed = json.loads(r.stdout[r.stdout.index("{"):])
    metrics = json.load(open(out / "metrics.json", encoding="utf-8"))
    test = metrics["test"]
    assert printed["test"] == test
    expected = independent_test_report(out, files[scheme], scheme)
    assert test["num_examples"] == expected["num_examples"]
    assert test["token_accuracy"] == pytest.approx(expected["token_accuracy"], abs=1e-12)
    meta = json.load(open(out / "best" / "meta.json", encoding="utf-8"))
    assert tagschemes.detect(meta["label_names"]) == scheme  # the scheme travels with the model
    if scheme == "plain":
        # no chunks: f1 is the token-level micro F1, i.e. the token accuracy; per tag F1
        assert test["f1"] == test["token_accuracy"] and "precision" not in test
        assert set(metrics["test_per_type_f1"]) <= set(meta["label_names"])
    else:
        for key in ("precision", "recall", "f1"):
            assert test[key] == pytest.approx(expected[key], abs=1e-12), key
        types = {tagschemes.split_tag(t)[1] for t in meta["label_names"]} - {""}
        assert set(metrics["test_per_type_f1"]) <= types | {""}


def raw_test_tags(path):
    """The test split's gold tag rows, read from the raw JSONL file with the documented split rule
    (sha1 of the UTF-8 tokens joined by spaces, first 8 bytes as a fraction; >= 0.9 is test)."""
    rows = []
    for line in open(path, encoding="utf-8"):
        row = json.loads(line)
        digest = hashlib.sha1(" ".join(row["tokens"]).encode("utf-8")).digest()
        if int.from_bytes(digest[:8], "big") / 2.0**64 >= 0.9:
            rows.append(row["tags"])
    return rows


def independent_test_report(run_dir, raw_file, scheme):
    """Token accuracy and chunk P/R/F1 of the run's best checkpoint on the test split, computed
    here: the checkpoint's predicted tags per window, stitched by the documented rule (a
    position takes the window where it is most central, ties the earlier), against the raw
    file's gold tags, chunks read by seqeval (conlleval's rules; BMES as IOBES with M = I)."""
    from seqeval.metrics.sequence_labeling import get_entities

    from ppvarlen.config import load_config
    from ppvarlen.engine.evaluate import checkpoint_outputs

    cfg = load_config(str(run_dir / "config.yaml"))
    outputs, dataset, meta, _ = checkpoint_outputs(cfg, str(run_dir / "best"), "test")
    windows = {}
    for i, tags in enumerate(outputs):
        item = dataset[i]
        content = [int(t) for t, gold in zip(tags, item["labels"]) if gold != -100]
        windows.setdefault(int(item["doc_id"]), []).append((int(item.get("offset", 0)), content))
    pred = []
    for doc in sorted(windows):
        ws = windows[doc]
        row = []
        for p in range(max(off + len(rows) for off, rows in ws)):
            covering = [(min(p - off, off + len(rows) - 1 - p), -w, rows[p - off])
                        for w, (off, rows) in enumerate(ws) if off <= p < off + len(rows)]
            row.append(meta["label_names"][max(covering)[2]])
        pred.append(row)
    gold = raw_test_tags(raw_file)
    assert [len(r) for r in pred] == [len(r) for r in gold]  # every test token predicted
    pairs = [(p, g) for pr, gr in zip(pred, gold) for p, g in zip(pr, gr)]
    report = {"num_examples": len(gold),
              "token_accuracy": sum(p == g for p, g in pairs) / len(pairs)}
    if scheme != "plain":
        def chunks(rows):
            return {(d, *c) for d, r in enumerate(rows)
                    for c in get_entities([t.replace("M", "I", 1) if scheme == "bmes" else t
                                           for t in r])}
        found, true = chunks(pred), chunks(gold)
        hit = len(found & true)
        precision = hit / len(found) if found else 0.0
        recall = hit / len(true) if true else 0.0
        report.update(precision=precision, recall=recall,
                      f1=2 * precision * recall / (precision + recall) if hit else 0.0)
    return report
