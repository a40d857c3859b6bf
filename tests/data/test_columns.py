"""Columns by name: a table's header (or Data.columns, or the Data.*_field keys) says which column
is which field; a layout the reader cannot tell is refused naming the columns and the key."""
import pytest

import ppvarlen.tasks  # noqa: F401  (task modules register their formats: text_pair)

from ppvarlen.data.errors import DataError
from ppvarlen.data.sources import load_corpus, read_file


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


ROWS = [("这本书很好看", "pos"), ("物流太慢了", "neg"), ("质量不错", "pos"), ("不推荐", "neg")]


def test_label_before_text_with_a_header(tmp_path):
    path = _write(tmp_path, "a.tsv", "label\ttext\n" + "".join(f"{l}\t{t}\n" for t, l in ROWS))
    fd = read_file(path, "tsv")
    assert fd.header and fd.line_numbers == [2, 3, 4, 5]
    assert fd.examples == [{"text": t, "label": l} for t, l in ROWS]


def test_paddlenlp_headers_text_a_and_a_pair(tmp_path):
    single = _write(tmp_path, "s.tsv", "text_a\tlabel\n" + "".join(f"{t}\t{l}\n" for t, l in ROWS))
    c = load_corpus({"corpus": "tsv", "train_file": single})
    assert c.task == "classification" and c.label_names == ["neg", "pos"]  # no class "label"
    pair = _write(tmp_path, "p.tsv", "text_a\ttext_b\tlabel\n" +
                  "".join(f"{t}\t{t[::-1]}\t{l}\n" for t, l in ROWS * 3))
    c = load_corpus({"corpus": "tsv", "train_file": pair})
    assert c.task == "text_pair"  # told by the header
    rows = [ex for s in c.splits.values() for ex in s]
    assert {"text_a": "不推荐", "text_b": "荐推不", "label": 0} in rows


def test_csv_with_quotes_commas_and_line_ends_inside_fields(tmp_path):
    path = _write(tmp_path, "r.csv", 'review,label\n"好,很好",pos\n"他说""不行""",neg\n'
                  '"两行\n的评论",pos\nplain text,neg\n')
    fd = read_file(path, "csv")
    assert fd.examples == [{"text": "好,很好", "label": "pos"},
                           {"text": '他说"不行"', "label": "neg"},
                           {"text": "两行\n的评论", "label": "pos"},
                           {"text": "plain text", "label": "neg"}]
    assert fd.line_numbers == [2, 3, 4, 6]  # a record's first line


def test_headerless_file_in_the_order_given_once(tmp_path):
    path = _write(tmp_path, "h.tsv", "".join(f"{l}\t{t}\n" for t, l in ROWS))
    fd = read_file(path, "tsv", keys={"columns": ["label", "text"]})
    assert not fd.header and fd.examples == [{"text": t, "label": l} for t, l in ROWS]
    named = read_file(path, "tsv", keys={"columns": ["polarity", "body"],
                                         "text_field": "body", "label_field": "polarity"})
    assert named.examples == fd.examples
    # the same file in the default order would read the reviews as labels: a first line whose
    # "label" is on no other line is taken for a header the reader does not know
    with pytest.raises(DataError, match=r"h\.tsv:1: the first line looks like a header"):
        load_corpus({"corpus": "tsv", "train_file": path})


def test_unknown_or_ambiguous_header_refused_naming_columns_and_key(tmp_path):
    path = _write(tmp_path, "u.tsv", "review_body\tlabel\n" +
                  "".join(f"{t}\t{l}\n" for t, l in ROWS))
    with pytest.raises(DataError, match=r"u\.tsv header: no column is the 'text' \(found: "
                                        r"\['review_body', 'label'\].*Data\.text_field"):
        read_file(path, "tsv")
    assert read_file(path, "tsv", keys={"text_field": "review_body"}).examples[0] == \
        {"text": "这本书很好看", "label": "pos"}
    both = _write(tmp_path, "b.tsv", "sentence\treview\tlabel\n" +
                  "".join(f"{t}\t{t}\t{l}\n" for t, l in ROWS))
    with pytest.raises(DataError, match=r"\['sentence', 'review'\] could each be the 'text'; "
                                        r"name it with Data\.text_field"):
        read_file(both, "tsv")
    with pytest.raises(DataError, match=r"Data\.label_field is 'polarity', but there is no such "
                                        r"column"):
        read_file(path, "tsv", keys={"text_field": "review_body", "label_field": "polarity"})


def test_jsonl_fields_by_the_same_keys(tmp_path):
    lines = "".join(f'{{"sentence": "{t}", "polarity": "{l}"}}\n' for t, l in ROWS)
    path = _write(tmp_path, "j.jsonl", lines)
    fd = read_file(path, "jsonl", keys={"label_field": "polarity"})
    assert fd.task == "classification"
    assert fd.examples == [{"text": t, "label": l} for t, l in ROWS]
    tags = _write(tmp_path, "t.jsonl",
                  '{"words": ["北", "京"], "ner_tags": ["B-LOC", "I-LOC"]}\n')
    assert read_file(tags, "jsonl").examples == [{"tokens": ["北", "京"],
                                                  "tags": ["B-LOC", "I-LOC"]}]


def test_trailing_blank_lines_tolerated_blank_lines_inside_refused(tmp_path):
    for fmt, body in (("tsv", "".join(f"{t}\t{l}\n" for t, l in ROWS)),
                      ("jsonl", "".join(f'{{"text": "{t}", "label": "{l}"}}\n' for t, l in ROWS)),
                      ("csv", "text,label\n" + "".join(f"{t},{l}\n" for t, l in ROWS))):
        fd = read_file(_write(tmp_path, f"end.{fmt}", body + "\n\n  \n"), fmt)
        assert len(fd.examples) == 4, fmt
        lines = body.splitlines(keepends=True)
        inside = "".join(lines[:2]) + "\n" + "".join(lines[2:])
        with pytest.raises(DataError, match=r"inside\.\w+:3: blank line"):
            read_file(_write(tmp_path, f"inside.{fmt}", inside), fmt)


def test_label_column_holding_texts_refused(tmp_path):
    """A header that names the columns the wrong way round: the labels are the reviews."""
    rows = "".join(f"{'pos' if i % 2 else 'neg'}\t第{i}条评论很长\n" for i in range(40))
    path = _write(tmp_path, "swapped.tsv", "text\tlabel\n" + rows)
    with pytest.raises(DataError, match=r"swapped\.tsv:\d+: the label column looks like text: "
                                        r"40 classes for 40 train examples.*Data\.columns"):
        load_corpus({"corpus": "tsv", "train_file": path})


@pytest.mark.parametrize("fmt", ["csv", "tsv", "jsonl"])
def test_records_read_the_same_whatever_the_chunk_boundaries(tmp_path, monkeypatch, fmt):
    from ppvarlen.data import chunks

    texts = [f'第{i}条,"引号"\n换行' if fmt == "csv" else f"第{i}条评论" for i in range(60)]
    if fmt == "csv":
        body = "text,label\n" + "".join('"' + t.replace('"', '""') + f'",l{i % 3}\n'
                                        for i, t in enumerate(texts))
    elif fmt == "tsv":
        body = "".join(f"{t}\tl{i % 3}\n" for i, t in enumerate(texts))
    else:
        body = "".join(f'{{"text": "{t}", "label": "l{i % 3}"}}\n' for i, t in enumerate(texts))
    path = _write(tmp_path, f"c.{fmt}", body + "\n\n")
    whole = read_file(path, fmt)
    for size in (7, 16, 33, 100):
        monkeypatch.setattr(chunks, "CHUNK_BYTES", size)
        small = read_file(path, fmt)
        assert small.examples == whole.examples and small.line_numbers == whole.line_numbers
    assert [ex["text"] for ex in whole.examples] == texts
    # a blank line inside the file is refused wherever a chunk ends
    lines = body.splitlines(keepends=True)
    inside = _write(tmp_path, f"i.{fmt}", "".join(lines[:31]) + "\n" + "".join(lines[31:]))
    for size in (7, 16, 33, 100, 1 << 20):
        monkeypatch.setattr(chunks, "CHUNK_BYTES", size)
        with pytest.raises(DataError, match=r"i\.\w+:\d+: blank line"):
            read_file(inside, fmt)


def test_a_column_key_the_format_does_not_read_is_refused(tmp_path):
    from ppvarlen.config import ConfigError

    path = _write(tmp_path, "j.jsonl", '{"text": "好", "label": "pos"}\n')
    with pytest.raises(ConfigError, match=r"Data\.columns names columns of a table.*jsonl"):
        load_corpus({"corpus": "jsonl", "train_file": path, "columns": ["text", "label"]})


def test_a_file_without_labels_trains_refused_but_gives_a_requests_texts(tmp_path):
    """Training needs the label column (refused naming it); inference reads the texts alone
    from the same file (``request_records``), the label column neither required nor read."""
    from ppvarlen.data.sources import request_records

    texts = [t for t, _ in ROWS]
    path = _write(tmp_path, "t.csv", "id,text\n" + "".join(f"{k},{t}\n"
                                                           for k, t in enumerate(texts)))
    with pytest.raises(DataError, match=r"t\.csv header: no column is the 'label' \(found: "
                                        r"\['id', 'text'\].*Data\.label_field"):
        load_corpus({"corpus": "csv", "train_file": path})
    with pytest.raises(DataError, match=r"no column is the 'label'"):
        read_file(path, "csv")
    assert list(request_records(path, ("text",))) == [(k + 2, (t,)) for k, t in enumerate(texts)]
    # a headerless file of one column: training reads text<TAB>label, so each line is refused
    one = _write(tmp_path, "one.tsv", "".join(f"{t}\n" for t in texts))
    with pytest.raises(DataError, match=r"one\.tsv:1: expected 2 tab-separated columns"):
        load_corpus({"corpus": "tsv", "train_file": one})
    assert list(request_records(one, ("text",))) == [(k + 1, (t,)) for k, t in enumerate(texts)]
