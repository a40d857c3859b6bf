"""Streaming batch inference (deploy/infer.py): windows, input order, counts, warnings, atomicity."""
import json

import pytest
from test_deploy_helpers import TEXTS, cls_export, make_tiny_export, tag_export  # noqa: F401

from ppvarlen.data.errors import DataError
from ppvarlen.runtime import infer
from ppvarlen.runtime.predictor import Predictor

LONG = "".join(TEXTS)  # longer than the tiny exports' max_len of 16


def _mixed_lines(n):
    """n lines of varied length with a blank and a long text now and then."""
    out = []
    for i in range(n):
        if i % 11 == 4:
            out.append("  ")
        elif i % 7 == 3:
            out.append(LONG[i % 5:])
        else:
            out.append(TEXTS[i % len(TEXTS)] * (1 + i % 3))
    return out


def _run(predictor, src, tmp_path, window, name):
    out = tmp_path / name
    summary = infer.run_file(predictor, str(src), str(out), progress=False, window=window)
    return out.read_text(encoding="utf-8").splitlines(), summary


@pytest.mark.parametrize("backend", ["paddle", "onnx"])
def test_streamed_output_equals_whole_file_output(tag_export, tmp_path, backend):  # noqa: F811
    lines = _mixed_lines(53)
    src = tmp_path / "in.txt"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    predictor = Predictor(tag_export[0], backend)
    whole, s_whole = _run(predictor, src, tmp_path, 10_000, "whole.jsonl")
    assert s_whole["texts"] == 53 and len(whole) == 53
    for window in (1, 3, 7, 52):  # cuts between and inside runs of long / blank lines
        got, s = _run(predictor, src, tmp_path, window, f"w{window}.jsonl")
        assert got == whole, window
        assert {k: s[k] for k in ("texts", "predicted", "failed", "truncated")} == \
            {k: s_whole[k] for k in ("texts", "predicted", "failed", "truncated")}
    records = [json.loads(x) for x in whole]
    assert [r["line"] for r in records] == list(range(1, 54))
    good = [i for i, t in enumerate(lines) if t.strip()]
    want = predictor.predict([lines[i] for i in good])  # one call, the predictor's own order
    assert [records[i]["tags"] for i in good] == [w["tags"] for w in want]
    assert all("error" in records[i] for i in range(53) if i not in good)


def test_truncation_is_counted_and_warned(cls_export, tmp_path, capsys):  # noqa: F811
    lines = [TEXTS[0], LONG, TEXTS[1], LONG[3:], TEXTS[2]]
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in lines),
                   encoding="utf-8")
    got, summary = _run(Predictor(cls_export[0], "onnx"), src, tmp_path, 2, "out.jsonl")
    flags = [json.loads(x)["truncated"] for x in got]
    assert flags == [False, True, False, True, False] and flags.count(True) == 2
    assert summary["truncated"] == 2 and summary["windowed"] == 0
    assert len(summary["warnings"]) == 1 and "2 of 5 texts" in summary["warnings"][0]
    err = capsys.readouterr().err
    assert "warning: 2 of 5 texts were longer than the export's max_len (16 tokens)" in err
    assert "long_text: window" in err


def test_no_warning_without_truncation(cls_export, tmp_path, capsys):  # noqa: F811
    src = tmp_path / "in.txt"
    src.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    _, summary = _run(Predictor(cls_export[0], "onnx"), src, tmp_path, 3, "out.jsonl")
    assert summary["truncated"] == 0 and summary["warnings"] == []
    assert "warning" not in capsys.readouterr().err
    # "seconds" is rounded to 4 decimals: a run of a few milliseconds moves the ratio by more
    # than 1%, so the rate must lie between texts / (seconds +- 0.00005)
    low = summary["texts"] / (summary["seconds"] + 5e-5)
    high = summary["texts"] / max(summary["seconds"] - 5e-5, 1e-9)
    assert low * 0.999 <= summary["texts_per_s"] <= high * 1.001
    assert 0 < summary["model_seconds"] <= summary["seconds"]


def test_windowed_texts_are_counted(tmp_path):
    export_dir = make_tiny_export(str(tmp_path / "export"), "classification", long_text="window")[0]
    src = tmp_path / "in.txt"
    src.write_text("\n".join([TEXTS[0], LONG, TEXTS[3], LONG[2:]]) + "\n", encoding="utf-8")
    predictor = Predictor(export_dir, "onnx")
    got, summary = _run(predictor, src, tmp_path, 3, "out.jsonl")
    assert summary["windowed"] == 2 and summary["truncated"] == 0 and summary["warnings"] == []
    whole, _ = _run(predictor, src, tmp_path, 100, "whole.jsonl")
    assert got == whole


def test_line_breaks_are_read_as_text_mode_reads_them(tmp_path):
    src = tmp_path / "in.txt"
    data = "a\r\nb\rc\n\nd\r\re"
    src.write_bytes(data.encode("utf-8"))
    with open(src, encoding="utf-8") as f:  # what the whole-file reader split on
        want = f.read().split("\n")
    assert [t for _, t in infer.read_texts(str(src))] == want
    assert [n for n, _ in infer.read_texts(str(src))] == list(range(1, len(want) + 1))
    assert infer.count_lines(str(src)) == 4  # \n-ends + the unterminated last: the bar's total


def test_bad_utf8_names_the_line_and_keeps_the_old_output(cls_export, tmp_path):  # noqa: F811
    src = tmp_path / "in.txt"
    src.write_bytes("好\n".encode("utf-8") * 5 + b"\xff\xfe bad\n" + "好\n".encode("utf-8"))
    out = tmp_path / "out.jsonl"
    out.write_text("previous run\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"in.txt:6: not valid UTF-8"):
        infer.run_file(Predictor(cls_export[0], "onnx"), str(src), str(out), progress=False,
                       window=2)
    assert out.read_text(encoding="utf-8") == "previous run\n"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp-")] == []


def test_windows_count_usable_texts_and_characters(cls_export, tmp_path, capsys):  # noqa: F811
    predictor = Predictor(cls_export[0], "onnx")
    rows = [(1, "好" * 3), (2, DataError("bad")), (3, "好" * 3), (4, "  "), (5, "好" * 3),
            (6, "好" * 10), (7, "好"), (8, "好")]
    cut = [[n for n, _, _ in w] for w in
           infer.encoded_windows(predictor, "f.txt", iter(rows), size=2, max_chars=7)]
    # bad lines 2 and 4 do not count towards a window's 2 texts (4 is found bad only after
    # the window of 1 and 3 closed); 10 chars alone exceed 7
    assert cut == [[1, 2, 3], [4, 5], [6], [7, 8]]
    assert "bad line: f.txt:4: text is empty" in capsys.readouterr().err
    only_bad = [(n, DataError("x")) for n in range(1, 8)]
    cut = [[n for n, _, _ in w] for w in
           infer.encoded_windows(predictor, "f.txt", iter(only_bad), size=1)]
    assert cut == [[1, 2, 3], [4, 5, 6], [7]]  # at most 3 x size waiting bad lines
    with pytest.raises(ValueError):
        next(infer.encoded_windows(predictor, "f.txt", iter(rows), size=0))
