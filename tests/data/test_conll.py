"""CoNLL: a token per line with its tag in the last column, a blank line between sentences,
-DOCSTART- skipped, blank lines at the end tolerated; the tagging task trains, evaluates, exports
and infers on it, and a CoNLL file given as another format is told which it looks like."""
import json
import os

import pytest

from ppvarlen.cli import main_eval, main_export, main_infer, main_train
from ppvarlen.config import ConfigError
from ppvarlen.data.errors import DataError
from ppvarlen.data.sources import load_corpus, read_file

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PEOPLE = ["张三", "李四", "王小明", "赵六"]
PLACES = ["北京", "上海", "广州", "南京", "杭州"]


def _sentences(n, start=0):
    """Character-tagged sentences 'PERSON在PLACE工作' in BIO."""
    rows = []
    for i in range(start, start + n):
        person, place = PEOPLE[i % len(PEOPLE)], PLACES[(i * 3) % len(PLACES)]
        chars = list(person) + ["在"] + list(place) + list("工作了" [:1 + i % 3])
        tags = (["B-PER"] + ["I-PER"] * (len(person) - 1) + ["O"] + ["B-LOC"] +
                ["I-LOC"] * (len(place) - 1) + ["O"] * (1 + i % 3))
        rows.append((chars, tags))
    return rows


def _conll(path, rows, sep="\t", docstart=True, trailing="\n\n"):
    lines = ["-DOCSTART- -X- O O", ""] if docstart else []
    for chars, tags in rows:
        lines += [f"{c}{sep}{t}" for c, t in zip(chars, tags)] + [""]
    path.write_text("\n".join(lines[:-1]) + trailing, encoding="utf-8")
    return str(path)


def test_conll_sentences_docstart_columns_and_trailing_blank_lines(tmp_path):
    path = tmp_path / "a.conll"
    path.write_text("-DOCSTART- -X- -X- O\n\nEU NNP B-NP B-ORG\nrejects VBZ B-VP O\n\n\n"
                    "Peter NNP B-NP B-PER\n\n\n\n", encoding="utf-8")
    fd = read_file(str(path), "conll")
    assert fd.task == "tagging"
    assert fd.examples == [{"tokens": ["EU", "rejects"], "tags": ["B-ORG", "O"]},
                           {"tokens": ["Peter"], "tags": ["B-PER"]}]
    assert fd.line_numbers == [3, 7]  # a sentence's first token line
    bad = tmp_path / "b.conll"
    bad.write_text("北\tB-LOC\n京\n\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"b\.conll:2: a token line holds the token and its tag"):
        read_file(str(bad), "conll")


def test_a_conll_file_given_as_jsonl_or_tsv_says_what_it_looks_like(tmp_path):
    path = _conll(tmp_path / "ner.txt", _sentences(6))
    with pytest.raises(DataError, match=r"ner\.txt: read as jsonl .* looks like conll.*"
                                        r"Data\.corpus: conll"):
        load_corpus({"corpus": "jsonl", "train_file": path})
    with pytest.raises(DataError, match=r"looks like conll"):
        load_corpus({"corpus": "tsv", "train_file": path})
    with pytest.raises(DataError, match=r"no table form.*looks like CoNLL"):
        load_corpus({"corpus": "tsv", "train_file": path, "task": "tagging"})
    with pytest.raises(ConfigError, match=r"CoNLL files hold tagging data"):
        load_corpus({"corpus": "conll", "train_file": path, "task": "classification"})


def _ok(code, capsys):
    out = capsys.readouterr()
    assert code == 0, out.err[-3000:]
    return out.out


def test_tagging_trains_evaluates_exports_and_infers_on_conll(tmp_path, capsys):
    train = _conll(tmp_path / "train.conll", _sentences(60), sep=" ")
    dev = _conll(tmp_path / "dev.conll", _sentences(12, 60), docstart=False, trailing="\n")
    test = _conll(tmp_path / "test.conll", _sentences(12, 72))
    run = tmp_path / "run"
    overrides = ["Data.corpus=conll", f"Data.train_file={train}", f"Data.dev_file={dev}",
                 f"Data.test_file={test}", f"Global.output_dir={run}",
                 f"Data.cache_dir={tmp_path / 'cache'}", "Train.max_steps=3", "Train.epochs=1",
                 "Train.progress_bar=false", "Model.emb_size=16", "Model.hidden_size=16",
                 "Data.max_tokens=1024"]
    args = ["-c", os.path.join(REPO, "configs/ner/bigru_crf.yaml")]
    for o in overrides:
        args += ["-o", o]
    printed = json.loads(_ok(main_train(args), capsys))
    assert printed["test"]["num_examples"] == 12
    meta = json.load(open(run / "best" / "meta.json", encoding="utf-8"))
    assert meta["label_names"] == ["O", "B-LOC", "I-LOC", "B-PER", "I-PER"]
    evaluated = json.loads(_ok(main_eval(args + ["--checkpoint", str(run / "best"),
                                                 "--split", "dev"]), capsys))
    assert evaluated["num_examples"] == 12
    export = tmp_path / "export"
    _ok(main_export(args + ["--checkpoint", str(run / "best"), "--output", str(export),
                            "--format", "paddle", "--no-verify"]), capsys)
    out = tmp_path / "pred.jsonl"
    _ok(main_infer(["--model-dir", str(export), "--input", test, "--output", str(out),
                    "--no-progress"]), capsys)
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    first = _sentences(1, 72)[0]
    assert len(records) == 12 and records[0]["line"] == 3  # after -DOCSTART- and its blank
    assert len(records[0]["tags"]) == len(first[0])  # one tag per CoNLL token


def test_sentences_read_the_same_whatever_the_chunk_boundaries(tmp_path, monkeypatch):
    from ppvarlen.data import chunks

    path = _conll(tmp_path / "c.conll", _sentences(30))
    whole = read_file(path, "conll")
    assert len(whole.examples) == 30
    for size in (5, 16, 40, 333):
        monkeypatch.setattr(chunks, "CHUNK_BYTES", size)
        small = read_file(path, "conll")
        assert small.examples == whole.examples and small.line_numbers == whole.line_numbers
