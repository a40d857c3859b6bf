"""ppvarlen-infer on a file in a training format (.tsv, .csv, .conll, .parquet): streamed in input
order, each record answered as the same text given as .jsonl is, a bad record answered by its
line's error record (the records after it still predicted), and the file read no further ahead
than the window being predicted."""
import gzip
import json
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from export_helpers import TEXTS, cls_export, tag_export  # noqa: F401

from ppvarlen.data import chunks
from ppvarlen.runtime import infer
from ppvarlen.runtime.predictor import Predictor

QUOTED = "质量一般, 但\n价格便宜"  # a CSV field holding a comma and a line end: quoted


def _lines_file(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def _tsv(path, texts, bad=None):
    lines, numbers = ["text\tlabel"], []
    for k, text in enumerate(texts):
        numbers.append(len(lines) + 1)
        lines.append("坏\t三\t列" if k == bad else f"{text}\tpos")
    return _lines_file(path, lines), numbers


def _csv(path, texts, bad=None):
    lines, numbers = ["text,label"], []
    for k, text in enumerate(texts):
        numbers.append(len(lines) + 1)
        cell = f'"{text}"' if any(c in text for c in ',"\n') else text
        lines += ("坏,三,列" if k == bad else f"{cell},pos").split("\n")
    return _lines_file(path, lines), numbers


def _conll(path, texts, bad=None):
    lines, numbers = [], []
    for k, text in enumerate(texts):
        if lines:
            lines.append("")
        tokens = [f"{c} O" for c in text]
        numbers.append(len(lines) + 1 + (k == bad))  # a sentence's error is on its bad line
        if k == bad:
            tokens[1] = text[1]  # a token without its tag
        lines += ["-DOCSTART- O", ""] if k == 0 else []
        numbers[-1] += 2 * (k == 0)
        lines += tokens
    return _lines_file(path, lines), numbers


def _parquet(path, texts, bad=None, row_group_size=3):
    column = [None if k == bad else t for k, t in enumerate(texts)]
    pq.write_table(pa.table({"label": ["pos"] * len(texts), "text": column}), str(path),
                   row_group_size=row_group_size)
    return path, list(range(1, len(texts) + 1))


def _gzip(writer):
    def write(path, texts, bad=None):
        plain, numbers = writer(path.with_suffix(""), texts, bad)
        path.write_bytes(gzip.compress(plain.read_bytes()))
        return path, numbers
    return write


WRITERS = {"tsv": _tsv, "csv": _csv, "conll": _conll, "parquet": _parquet, "csv.gz": _gzip(_csv)}
EXPORTS = {"conll": "tag_export"}  # the others: a classification export


def _texts(fmt):
    """Texts the format can hold: a CSV (and Parquet) cell also a comma and a line end."""
    texts = list(TEXTS)
    if fmt.startswith("csv") or fmt == "parquet":
        texts.insert(2, QUOTED)
    return texts


def _run(export_dir, src, tmp_path, window=2):
    out = tmp_path / f"{src.name}.out.jsonl"
    summary = infer.run_file(Predictor(export_dir, "onnx"), str(src), str(out), progress=False,
                             window=window)
    return [json.loads(x) for x in out.read_text(encoding="utf-8").splitlines()], summary


def _as_jsonl(export_dir, texts, tmp_path):
    """The predictions of ``texts`` given as .jsonl lines, without their line numbers."""
    src = tmp_path / "same.jsonl"
    src.write_text("".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in texts),
                   encoding="utf-8")
    records, _ = _run(export_dir, src, tmp_path)
    return [_answer(rec) for rec in records]


def _answer(record):
    return {k: v for k, v in record.items() if k != "line"}


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_records_are_predicted_as_the_same_texts_in_jsonl(fmt, request, tmp_path, monkeypatch):
    monkeypatch.setattr(chunks, "CHUNK_BYTES", 48)  # many chunks: numbering runs across them
    monkeypatch.setattr(chunks, "PARQUET_BATCH_ROWS", 2, raising=False)
    export_dir = request.getfixturevalue(EXPORTS.get(fmt, "cls_export"))[0]
    texts = _texts(fmt)
    src, numbers = WRITERS[fmt](tmp_path / f"in.{fmt}", texts)
    records, summary = _run(export_dir, src, tmp_path)
    assert [rec["line"] for rec in records] == numbers
    assert [_answer(rec) for rec in records] == _as_jsonl(export_dir, texts, tmp_path)
    assert summary["texts"] == summary["predicted"] == len(texts)


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_a_bad_record_is_its_lines_error_and_the_rest_are_predicted(fmt, request, tmp_path,
                                                                   capsys):
    export_dir = request.getfixturevalue(EXPORTS.get(fmt, "cls_export"))[0]
    texts = _texts(fmt)
    bad = 3
    src, numbers = WRITERS[fmt](tmp_path / f"in.{fmt}", texts, bad)
    records, summary = _run(export_dir, src, tmp_path)
    assert [rec["line"] for rec in records] == numbers
    error = records[bad].get("error", "")
    why = {"tsv": "expected 2 tab-separated columns", "csv": "expected 2 comma-separated columns",
           "conll": "a token line holds the token and its tag", "parquet": "field 'text' must be "
           "a string", "csv.gz": "expected 2 comma-separated columns"}[fmt]
    assert error.startswith(f"{src}:{numbers[bad]}: {why}"), error
    assert f"bad line: {src}:{numbers[bad]}:" in capsys.readouterr().err
    good = texts[:bad] + texts[bad + 1:]
    assert [_answer(r) for r in records[:bad] + records[bad + 1:]] == \
        _as_jsonl(export_dir, good, tmp_path)
    assert summary["failed"] == 1 and summary["predicted"] == len(good)


class _CountedFile:
    """A data file whose bytes read are added up in ``read``."""

    def __init__(self, f, read):
        self.f, self.read_bytes = f, read

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()

    def read(self, size=-1):
        data = self.f.read(size)
        self.read_bytes[0] += len(data)
        return data


class _FirstWrite:
    """stdout that notes how much of the input was read when the first record is written."""

    def __init__(self, read):
        self.read, self.at_first_write, self.text = read, None, []

    def write(self, text):
        if self.at_first_write is None and text:
            self.at_first_write = self.read[0]
        self.text.append(text)

    def flush(self):
        pass


def _count_parquet_rows(monkeypatch, read):
    """Every way of reading a Parquet file's rows adds the rows it hands out to ``read``."""
    for name in ("read", "read_row_group", "read_row_groups"):
        whole = getattr(pq.ParquetFile, name)

        def counted(self, *args, _whole=whole, **kwargs):
            table = _whole(self, *args, **kwargs)
            read[0] += table.num_rows
            return table
        monkeypatch.setattr(pq.ParquetFile, name, counted)
    batches = pq.ParquetFile.iter_batches

    def counted_batches(self, *args, **kwargs):
        for batch in batches(self, *args, **kwargs):
            read[0] += batch.num_rows
            yield batch
    monkeypatch.setattr(pq.ParquetFile, "iter_batches", counted_batches)


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_first_records_are_written_before_the_file_is_read_through(fmt, request, tmp_path,
                                                                   monkeypatch):
    """A whole-file read cannot pass: the first window's records must be out while most of the
    file (a Parquet file of one row group) is still unread."""
    monkeypatch.setattr(chunks, "CHUNK_BYTES", 64)
    monkeypatch.setattr(chunks, "PARQUET_BATCH_ROWS", 2, raising=False)
    export_dir = request.getfixturevalue(EXPORTS.get(fmt, "cls_export"))[0]
    texts = [TEXTS[k % len(TEXTS)] for k in range(40)]
    if fmt == "parquet":
        src, _ = _parquet(tmp_path / "in.parquet", texts, row_group_size=len(texts))
        assert pq.ParquetFile(str(src)).metadata.num_row_groups == 1
    else:
        src, _ = WRITERS[fmt](tmp_path / f"in.{fmt}", texts)
    read = [0]
    if fmt == "parquet":
        _count_parquet_rows(monkeypatch, read)
        total = len(texts)
    else:
        opened = chunks.open_data_file
        monkeypatch.setattr(chunks, "open_data_file",
                            lambda path, limits: _CountedFile(opened(path, limits), read))
        total = len(gzip.decompress(src.read_bytes()) if fmt.endswith(".gz") else
                    src.read_bytes())
    stdout = _FirstWrite(read)
    monkeypatch.setattr(sys, "stdout", stdout)
    summary = infer.run_file(Predictor(export_dir, "onnx"), str(src), None, progress=False,
                             window=2)
    assert summary["predicted"] == len(texts) and read[0] == total  # all of it, in the end
    assert stdout.at_first_write is not None and stdout.at_first_write < total / 2, \
        (stdout.at_first_write, total)
    assert len("".join(stdout.text).splitlines()) == len(texts)


def test_columns_are_named_by_the_data_keys_training_reads(cls_export, tmp_path,  # noqa: F811
                                                          capsys):
    """ppvarlen-infer -o Data.text_field=...: the fix the header error names can be applied."""
    from ppvarlen.cli import main_infer

    src = tmp_path / "in.csv"
    src.write_text("label,body\n" + "".join(f'pos,"{t}"\n' for t in TEXTS), encoding="utf-8")
    out = tmp_path / "out.jsonl"
    args = ["--no-progress", "--model-dir", cls_export[0], "--backend", "onnx", "--input",
            str(src), "--output", str(out)]
    assert main_infer(args) == 2
    err = capsys.readouterr().err
    assert f"{src} header: no column is the 'text' (found: ['label', 'body']" in err
    assert "name it with Data.text_field" in err and not out.exists()
    assert main_infer(args + ["-o", "Data.text_field=body"]) == 0
    records = [json.loads(x) for x in out.read_text(encoding="utf-8").splitlines()]
    assert [r["line"] for r in records] == list(range(2, len(TEXTS) + 2))
    assert [_answer(r) for r in records] == _as_jsonl(cls_export[0], TEXTS, tmp_path)
    # a .jsonl line is the request item itself: a column key there is refused, not ignored
    jsonl = tmp_path / "in.jsonl"
    jsonl.write_text(json.dumps({"body": TEXTS[0]}) + "\n", encoding="utf-8")
    assert main_infer(args[:6] + [str(jsonl), "-o", "Data.text_field=body"]) == 2
    assert f"{jsonl}: Data.text_field names a column of a training data file" in \
        capsys.readouterr().err


def _csv_cell(text):
    return '"' + text.replace('"', '""') + '"' if any(c in text for c in ',"\n') else text


def _unlabelled_table(separator, header, row):
    """A writer of a table without labels: ``header`` (None: headerless), each text's row."""
    def write(path, texts):
        lines = [] if header is None else [separator.join(header)]
        numbers = []
        for k, text in enumerate(texts):
            numbers.append(len(lines) + 1)
            cell = _csv_cell(text) if separator == "," else text
            lines += separator.join(row(k, cell)).split("\n")
        return _lines_file(path, lines), numbers
    return write


def _unlabelled_parquet(names):
    def write(path, texts):
        columns = {"id": list(range(len(texts))), "text": texts}
        pq.write_table(pa.table({n: columns[n] for n in names}), str(path), row_group_size=3)
        return path, list(range(1, len(texts) + 1))
    return write


def _conll_tokens(path, texts):
    """A CoNLL file of tokens only (no tags): a character per line, a blank line between."""
    lines, numbers = ["-DOCSTART-", ""], []
    for text in texts:
        numbers.append(len(lines) + 1)
        lines += list(text) + [""]
    return _lines_file(path, lines), numbers


UNLABELLED = {  # a file a user wants predictions for: no label column (no tags)
    "csv text": ("csv", _unlabelled_table(",", ["text"], lambda k, t: [t])),
    "csv id,text": ("csv", _unlabelled_table(",", ["id", "text"], lambda k, t: [str(k), t])),
    "csv headerless": ("csv", _unlabelled_table(",", None, lambda k, t: [t])),
    "tsv text": ("tsv", _unlabelled_table("\t", ["text"], lambda k, t: [t])),
    "tsv id,text": ("tsv", _unlabelled_table("\t", ["id", "text"], lambda k, t: [str(k), t])),
    "tsv headerless": ("tsv", _unlabelled_table("\t", None, lambda k, t: [t])),
    "parquet text": ("parquet", _unlabelled_parquet(["text"])),
    "parquet id,text": ("parquet", _unlabelled_parquet(["id", "text"])),
    "conll tokens": ("conll", _conll_tokens),
}


@pytest.mark.parametrize("kind", sorted(UNLABELLED))
def test_a_file_without_labels_is_predicted_as_the_same_texts_in_jsonl(kind, request, tmp_path,
                                                                      monkeypatch):
    """Inference never reads a label: a text-only table (a header of its texts, other columns
    not read, or one column without a header) is predicted, not refused for its label; so is
    a CoNLL file of tokens without tags (a tagging export)."""
    monkeypatch.setattr(chunks, "CHUNK_BYTES", 48)
    monkeypatch.setattr(chunks, "PARQUET_BATCH_ROWS", 2, raising=False)
    fmt, write = UNLABELLED[kind]
    export_dir = request.getfixturevalue(EXPORTS.get(fmt, "cls_export"))[0]
    texts = _texts(fmt)
    src, numbers = write(tmp_path / f"in.{fmt}", texts)
    records, summary = _run(export_dir, src, tmp_path)
    assert [rec["line"] for rec in records] == numbers
    assert [_answer(rec) for rec in records] == _as_jsonl(export_dir, texts, tmp_path)
    assert summary["texts"] == summary["predicted"] == len(texts)


def test_a_headerless_table_wider_than_text_and_label_is_refused_with_the_fix(  # noqa: F811
        cls_export, tmp_path, capsys):
    from ppvarlen.cli import main_infer

    src = tmp_path / "three.csv"
    src.write_text("".join(f"{k},{t},web\n" for k, t in enumerate(TEXTS)), encoding="utf-8")
    out = tmp_path / "out.jsonl"
    args = ["--no-progress", "--model-dir", cls_export[0], "--backend", "onnx", "--input",
            str(src), "--output", str(out)]
    assert main_infer(args) == 2
    err = capsys.readouterr().err
    assert f"{src}: no header, and its first line has 3 columns" in err, err
    assert "['text'] or ['text', 'label']" in err and "Add a header line" in err
    assert "-o Data.text_field=NAME" in err and "-o Data.columns=[...]" in err
    assert "Traceback" not in err and not out.exists()
    # the fix the message names: the columns' order given once
    assert main_infer(args + ["-o", "Data.columns=[id,text,source]"]) == 0
    records = [json.loads(x) for x in out.read_text(encoding="utf-8").splitlines()]
    assert [r["line"] for r in records] == list(range(1, len(TEXTS) + 1))
    assert [_answer(r) for r in records] == _as_jsonl(cls_export[0], TEXTS, tmp_path)


def test_pair_and_qa_files_without_labels_give_their_texts(tmp_path):
    """A request of several texts reads those columns only: a headerless text pair (its texts,
    or its texts then the label, the pair corpus's order) and a QA Parquet file without
    answers."""
    import ppvarlen.tasks  # noqa: F401  (the pair and QA corpus formats)
    from ppvarlen.data.sources import request_records

    pairs = _lines_file(tmp_path / "p.csv", ["物流很快,送货速度快", "质量差,不推荐"])
    assert list(request_records(str(pairs), ("text_a", "text_b"))) == \
        [(1, ("物流很快", "送货速度快")), (2, ("质量差", "不推荐"))]
    labelled = _lines_file(tmp_path / "pl.tsv", ["物流很快\t送货速度快\tsame"])
    assert list(request_records(str(labelled), ("text_a", "text_b"))) == \
        [(1, ("物流很快", "送货速度快"))]
    qa = tmp_path / "qa.parquet"
    pq.write_table(pa.table({"id": [7], "question": ["哪里？"], "context": ["他在北京。"]}),
                   str(qa))
    assert list(request_records(str(qa), ("question", "context"))) == \
        [(1, ("哪里？", "他在北京。"))]


def test_a_conll_file_of_tokens_only_refuses_a_line_with_a_tag(tag_export, tmp_path):  # noqa: F811
    """Its first token line says a CoNLL file holds tokens only (or tokens and tags): a line of
    the other kind is its sentence's error record, the other sentences predicted."""
    src = _lines_file(tmp_path / "mixed.conll", ["北", "京 B-LOC", "", "上", "海"])
    records, summary = _run(tag_export[0], src, tmp_path)
    assert records[0]["line"] == 2 and records[0]["error"].startswith(
        f"{src}:2: a CoNLL file of tokens only (its first token line has one column) holds one "
        f"token per line, found 2 columns")
    assert [_answer(records[1])] == _as_jsonl(tag_export[0], ["上海"], tmp_path)
    assert summary["failed"] == 1 and summary["predicted"] == 1
