"""User data files: every malformed line names file:line and a fix; skip_invalid counts."""
import json
import logging

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ppvarlen.config import ConfigError
from ppvarlen.data import readers
from ppvarlen.data.sources import load_corpus
from ppvarlen.data.errors import DataError
from ppvarlen.data.sources import read_file
from ppvarlen.data.splits import SPLITS, example_key, stable_split

GOOD_CLS = '{"text": "很好看", "label": "pos"}'
GOOD_TAG = '{"tokens": ["江", "泽", "民"], "tags": ["B-PER", "I-PER", "I-PER"]}'


def _write(tmp_path, name, lines):
    """``lines``: str lines (UTF-8) or bytes lines, written with \\n endings."""
    path = tmp_path / name
    path.write_bytes(b"".join((ln if isinstance(ln, bytes) else ln.encode("utf-8")) + b"\n"
                              for ln in lines))
    return str(path)


BAD_LINES = [
    # (format, task, bad line, reason, words the message must contain)
    ("jsonl", "classification", '{"text": "坏", "label": 1', "bad_json", "invalid JSON"),
    ("jsonl", "classification", '["text", "label"]', "not_an_object", "JSON object"),
    ("jsonl", "classification", '{"text": "没有标签"}', "missing_field", "missing field 'label'"),
    ("jsonl", "classification", '{"text": 12, "label": "pos"}', "wrong_type", "must be a string"),
    ("jsonl", "classification", '{"text": "  ", "label": "pos"}', "empty_text", "is empty"),
    ("jsonl", "classification", '{"text": "", "label": "pos"}', "empty_text", "is empty"),
    ("jsonl", "classification", '{"text": "好", "label": true}', "wrong_type", "class id"),
    ("jsonl", "classification", '{"text": "好", "label": -1}', "bad_label", "negative"),
    ("jsonl", "classification", '{"text": "好", "label": 1.5}', "wrong_type", "class id"),
    ("jsonl", "classification", "", "blank_line", "blank line"),
    ("jsonl", "classification", "很好".encode("gbk") + b'"', "not_utf8", "UTF-8"),
    ("jsonl", "classification", b'{"text": "\xff\xfe", "label": "pos"}', "not_utf8", "iconv"),
    ("jsonl", "tagging", '{"tokens": ["a", "b"], "tags": ["O"]}', "length_mismatch",
     "2 tokens but 1 tags"),
    ("jsonl", "tagging", '{"tokens": [], "tags": []}', "empty_text", "empty"),
    ("jsonl", "tagging", '{"tokens": ["a", ""], "tags": ["O", "O"]}', "empty_text", "empty string"),
    ("jsonl", "tagging", '{"tokens": "ab", "tags": ["O", "O"]}', "wrong_type", "list of strings"),
    ("jsonl", "tagging", '{"tokens": ["a"], "tags": ["PER"]}', "bad_tag", "BIO"),
    ("jsonl", "tagging", '{"tokens": ["a"]}', "missing_field", "missing field 'tags'"),
    ("jsonl", "seq2seq", '{"source": "中国", "target": ""}', "empty_text", "'target' is empty"),
    ("tsv", "classification", "只有一列", "column_count", "found 1"),
    ("tsv", "classification", "文本\t中间\tpos", "column_count", "found 3"),
    ("tsv", "classification", "\tpos", "empty_text", "'text' is empty"),
    ("tsv", "classification", "好看\t", "bad_label", "empty string"),
]
GOOD = {("jsonl", "classification"): GOOD_CLS, ("jsonl", "tagging"): GOOD_TAG,
        ("jsonl", "seq2seq"): '{"source": "中国", "target": "zhong guo"}',
        ("tsv", "classification"): "很好看\tpos"}


@pytest.mark.parametrize("fmt,task,bad,reason,words", BAD_LINES,
                         ids=[f"{c[0]}-{c[3]}-{i}" for i, c in enumerate(BAD_LINES)])
def test_bad_line_names_file_line_and_fix(tmp_path, fmt, task, bad, reason, words):
    good = GOOD[(fmt, task)]
    path = _write(tmp_path, "data." + fmt, [good, good, bad, good])
    with pytest.raises(DataError) as err:
        read_file(path, fmt, task)
    msg = str(err.value)
    assert msg.startswith(f"{path}:3: "), msg
    assert words in msg, msg
    assert "skip_invalid" in msg  # says how to get past it
    # the same file with skip_invalid: the line is skipped and counted under its reason
    fd = read_file(path, fmt, task, skip_invalid=True)
    assert len(fd.examples) == 3 and fd.line_numbers == [1, 2, 4]
    assert dict(fd.skipped) == {reason: 1}
    assert fd.first_skipped[reason][0] == 3


def test_missing_file_and_all_invalid(tmp_path):
    with pytest.raises(DataError, match="cannot open"):
        read_file(str(tmp_path / "nope.jsonl"), "jsonl", "classification")
    path = _write(tmp_path, "bad.jsonl", ["{", "{"])
    with pytest.raises(DataError, match="no valid examples"):
        read_file(path, "jsonl", "classification", skip_invalid=True)
    empty = _write(tmp_path, "empty.jsonl", [])
    with pytest.raises(DataError, match=r"empty\.jsonl: no valid examples"):
        read_file(empty, "jsonl", None)


def test_skip_invalid_counts_per_reason_in_corpus_stats(tmp_path, caplog):
    lines = [GOOD_CLS, "{bad", '{"text": "", "label": "pos"}', '{"text": "x"}', "{bad again",
             '{"text": "不错", "label": "neg"}', b"\xff", '{"text": "一般", "label": "weird"}']
    train = _write(tmp_path, "train.jsonl", lines)
    cfg = {"corpus": "jsonl", "train_file": train, "skip_invalid": True,
           "label_names": ["neg", "pos"]}
    with caplog.at_level(logging.WARNING, logger="ppvarlen"):
        c = load_corpus(cfg)
    skipped = c.stats["files"]["train"]["skipped"]
    assert skipped == {"bad_json": 2, "empty_text": 1, "missing_field": 1, "not_utf8": 1,
                       "unknown_label": 1}
    assert c.stats["skipped_total"] == 6
    assert c.stats["files"]["train"]["lines"] == 8
    assert sum(len(c.splits[s]) for s in SPLITS) == 2
    assert "skipped" in caplog.text and "train.jsonl" in caplog.text
    # without skip_invalid the first bad line stops the load
    with pytest.raises(DataError, match=r"train\.jsonl:2: invalid JSON"):
        load_corpus({**cfg, "skip_invalid": False})


def test_string_labels_map_to_sorted_names_across_files(tmp_path):
    train = _write(tmp_path, "train.jsonl", ['{"text": "a", "label": "pos"}',
                                             '{"text": "b", "label": "neg"}'])
    dev = _write(tmp_path, "dev.jsonl", ['{"text": "c", "label": "mid"}'])
    test = _write(tmp_path, "test.jsonl", ['{"text": "d", "label": "neg"}'])
    c = load_corpus({"corpus": "jsonl", "train_file": train, "dev_file": dev, "test_file": test,
                     "allow_eval_only_labels": True})  # "mid": a class train never shows
    assert c.label_names == ["mid", "neg", "pos"]
    assert [ex["label"] for ex in c.splits["train"]] == [2, 1]
    assert c.splits["dev"] == [{"text": "c", "label": 0}]
    assert c.stats["split"]["from"] == {s: "file" for s in SPLITS}
    assert c.stats["task_from"] == "fields of the first line"


def test_int_labels_and_configured_names(tmp_path):
    train = _write(tmp_path, "t.jsonl", ['{"text": "a", "label": 2}', '{"text": "b", "label": 0}'])
    c = load_corpus({"corpus": "jsonl", "train_file": train})
    assert c.label_names == ["0", "1", "2"]
    assert sorted(ex["label"] for s in SPLITS for ex in c.splits[s]) == [0, 2]
    c = load_corpus({"corpus": "jsonl", "train_file": train, "label_names": ["x", "y", "z"]})
    assert c.label_names == ["x", "y", "z"]
    with pytest.raises(DataError, match=r"t\.jsonl:1: label 2 is not one of the 2 classes"):
        load_corpus({"corpus": "jsonl", "train_file": train, "label_names": ["x", "y"]})


def test_mixed_label_kinds_is_an_error_on_its_line(tmp_path):
    train = _write(tmp_path, "m.jsonl", ['{"text": "a", "label": "pos"}',
                                         '{"text": "b", "label": "neg"}',
                                         '{"text": "c", "label": 1}'])
    with pytest.raises(DataError, match=r"m\.jsonl:3: label 1 is a class id"):
        load_corpus({"corpus": "jsonl", "train_file": train})


def test_tsv_header_crlf_bom_and_digit_labels(tmp_path):
    path = tmp_path / "d.tsv"
    path.write_bytes("\ufefftext\tlabel\r\n很好\t1\r\n很差\t0\r\n".encode("utf-8"))
    fd = read_file(str(path), "tsv")
    assert fd.header and fd.lines == 2
    assert fd.examples == [{"text": "很好", "label": 1}, {"text": "很差", "label": 0}]
    assert fd.line_numbers == [2, 3]
    with pytest.raises(DataError, match="TSV files hold text<TAB>label"):
        read_file(str(path), "tsv", "tagging")


def test_tagging_file_label_order_and_task_checks(tmp_path):
    train = _write(tmp_path, "tag.jsonl", [
        GOOD_TAG, '{"tokens": ["北", "京"], "tags": ["B-LOC", "I-LOC"]}',
        '{"tokens": ["在"], "tags": ["O"]}'])
    c = load_corpus({"corpus": "jsonl", "train_file": train})
    assert c.task == "tagging"
    assert c.label_names == ["O", "B-LOC", "I-LOC", "B-PER", "I-PER"]
    all_ex = [ex for s in SPLITS for ex in c.splits[s]]
    assert {"tokens": ["北", "京"], "tags": ["B-LOC", "I-LOC"]} in all_ex
    with pytest.raises(DataError, match=r"tag\.jsonl:2: tag 'B-LOC' is not in Data.label_names"):
        load_corpus({"corpus": "jsonl", "train_file": train,
                     "label_names": ["O", "B-PER", "I-PER"]})
    # Data.task given: a file of another task fails on its first line, with the fields it needs
    with pytest.raises(DataError, match=r"tag\.jsonl:1: missing field 'text' and 'label'"):
        load_corpus({"corpus": "jsonl", "train_file": train, "task": "classification"})
    # a dev file of another task than train
    dev = _write(tmp_path, "dev.jsonl", [GOOD_CLS])
    with pytest.raises(DataError, match=r"dev\.jsonl:1: missing field"):
        load_corpus({"corpus": "jsonl", "train_file": train, "dev_file": dev})
    unknown = _write(tmp_path, "u.jsonl", ['{"words": ["a"], "label": 1}'])
    with pytest.raises(DataError, match=r"u\.jsonl:1: cannot tell the task"):
        load_corpus({"corpus": "jsonl", "train_file": unknown})


def test_seq2seq_jsonl(tmp_path):
    train = _write(tmp_path, "s.jsonl", ['{"source": "中国", "target": "zhong guo"}'] * 3)
    c = load_corpus({"corpus": "jsonl", "train_file": train, "task": "seq2seq"})
    assert c.task == "seq2seq" and c.label_names == []
    assert sum(len(c.splits[s]) for s in SPLITS) == 3


def test_train_only_is_split_by_stable_hash(tmp_path):
    lines = [json.dumps({"text": f"第{i}条评论", "label": i % 2}, ensure_ascii=False)
             for i in range(400)]
    lines.append(lines[0])  # a duplicate must land with its twin
    train = _write(tmp_path, "train.jsonl", lines)
    c = load_corpus({"corpus": "jsonl", "train_file": train})
    st = c.stats["split"]
    assert st["from"]["dev"] == st["from"]["test"] == "train_file, by stable hash"
    assert "sha1" in st["method"]
    assert sum(st["sizes"].values()) == 401
    for s in SPLITS:
        assert all(stable_split(example_key(ex)) == s for ex in c.splits[s])
        assert c.stats["per_label"][s] == {
            "0": sum(ex["label"] == 0 for ex in c.splits[s]),
            "1": sum(ex["label"] == 1 for ex in c.splits[s])}
    assert "texts_in_two_splits" not in st
    # limit applies after splitting
    c2 = load_corpus({"corpus": "jsonl", "train_file": train, "limit": 5})
    assert c2.splits["train"] == c.splits["train"][:5]
    # another split seed: another partition, the duplicate still with its twin, same total
    c3 = load_corpus({"corpus": "jsonl", "train_file": train, "split_seed": 5})
    assert sum(len(c3.splits[s]) for s in SPLITS) == 401
    assert c3.splits["test"] != c.splits["test"]
    for s in SPLITS:
        assert all(stable_split(example_key(ex), 5) == s for ex in c3.splits[s])


def test_missing_split_carved_from_train_and_overlap_reported(tmp_path, caplog):
    lines = [json.dumps({"text": f"句子{i}", "label": "a"}, ensure_ascii=False) for i in range(200)]
    train = _write(tmp_path, "train.jsonl", lines)
    dev = _write(tmp_path, "dev.jsonl", lines[:3])  # overlaps train on purpose
    with caplog.at_level(logging.WARNING, logger="ppvarlen"):
        c = load_corpus({"corpus": "jsonl", "train_file": train, "dev_file": dev})
    assert c.stats["split"]["from"] == {"train": "file", "dev": "file",
                                        "test": "train_file, by stable hash"}
    assert len(c.splits["dev"]) == 3
    assert all(stable_split(ex["text"]) == "test" for ex in c.splits["test"])
    assert len(c.splits["train"]) + len(c.splits["test"]) == 200
    overlap = c.stats["split"]["texts_in_two_splits"]
    assert overlap.get("train&dev", 0) + overlap.get("dev&test", 0) == 3
    assert "two splits" in caplog.text


def test_tsv_corpus_rejects_other_task(tmp_path):
    path = _write(tmp_path, "d.tsv", ["好\tpos"])
    with pytest.raises(DataError, match="TSV"):
        load_corpus({"corpus": "tsv", "train_file": path, "task": "seq2seq"})
    with pytest.raises(ConfigError, match="Data.train_file"):
        load_corpus({"corpus": "tsv"})


RAW_LINES = [b'{"text": "\xe5\xa5\xbd", "label": "positive"}', b'{"text": "a", "label": 3}\r',
             b'\xef\xbb\xbf{"text": "bom", "label": 0}', b'{"text": "x", "label": 1e400}',
             b'{"text": "x", "label": 123456789012345678901234567890}',
             b'{"text": "x", "label": -9223372036854775809}', b'{"text": "x", "label": 1.0}',
             b'{"text": "x", "label": NaN}', b'{"text": "\\ud800 lone", "label": "a"}',
             b'{"text": "\\ud83d\\ude00", "label": "a"}', b'{"text": "\xff", "label": "a"}',
             b'{"text": "\xed\xa0\x80", "label": "a"}', b'', b'   \r', b'[1, 2.5]', b'"s"', b'7',
             b'{"text": "x", "text": "y", "label": true}', b'{"text": "", "label": "a"}',
             b'{"text": " \\u3000 ", "label": "a"}', b'{"text": "a\x01", "label": "a"}',
             b'{"text": "t"}', b'{"text": ["a"], "label": {"k": [0.5]}}', b'{"text": "x",',
             b'{"text": "a", "label": " b "} trailing', b'{"text": "\\u0000", "label": -1}',
             b'{"label": "b", "text": "a"}\t ', b'{"text": "a", "label": "b"}\x0c']


@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("raw", RAW_LINES)
def test_parse_json_bytes_is_decode_then_parse_json_line(raw, n):
    """The orjson path gives the examples and the BadLine reasons and messages of decoding
    the line and parsing it with ``json`` (a BOM counts on line 1 only)."""
    from ppvarlen.data.readers import BadLine, decode_line, parse_json_bytes, parse_json_line

    def outcome(parse):
        try:
            ex = parse()
            return ("ok", ex, [(k, type(v)) for k, v in ex.items()])
        except BadLine as bad:
            return ("bad", bad.reason, bad.message)

    def by_json():
        line = decode_line(raw, n)
        if isinstance(line, BadLine):
            raise line
        return parse_json_line(line, "classification")

    assert outcome(lambda: parse_json_bytes(raw, n, "classification")) == outcome(by_json)


FLAT_VALUES = st.one_of(st.text(max_size=6), st.sampled_from(["", " ", "\u3000", " pos ", "好"]),
                        st.integers(-2, 3), st.integers(2**63, 2**70), st.booleans(), st.none(),
                        st.floats(allow_nan=False), st.lists(st.integers(), max_size=2))


@pytest.mark.parametrize("task", ["classification", "seq2seq", "text_pair", "embedding"])
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_lines_made_at_once_are_the_line_parsers_examples(task, data):
    """A chunk of a flat format made into examples at once (``flat_examples``) gives what the
    line parser gives for each line; a chunk of plain texts and labels is always made at once;
    any other value sends the chunk to the line parser (None)."""
    import ppvarlen.tasks  # noqa: F401  (registers the text_pair and embedding formats)

    fields = readers.FORMATS[task].fields
    plain = data.draw(st.booleans())
    value = st.one_of(st.text(min_size=1).filter(lambda t: not t.isspace()),
                      st.integers(0, 9)) if plain else FLAT_VALUES
    rows = data.draw(st.lists(st.fixed_dictionaries(
        {f: (value if f == "label" or not plain else
             st.text(min_size=1).filter(lambda t: not t.isspace())) for f in fields},
        optional={} if plain else {"extra": FLAT_VALUES}), min_size=1, max_size=6))
    raws = [json.dumps(r, ensure_ascii=False).encode("utf-8") for r in rows]
    if not plain and data.draw(st.booleans()):
        raws[0] = b"{not json"
    made = readers.flat_examples(readers.load_lines(raws), fields)
    if plain:
        assert made is not None
    if made is None:
        return
    assert made == [readers.parse_json_bytes(raw, n, task) for n, raw in enumerate(raws, 1)]
