"""ppvarlen-infer on the request items of every task (``Task.line_fields``): a text-pair JSONL
({"text_a", "text_b"}, the pair corpus's fields) and a QA JSONL ({"question", "context"}) give
the server's /predict answers for the same items, corpus lines read as they are (labels,
answers and ids ignored); bad lines get error records naming the line and the field, and
the lines after them are still predicted."""
import json
import os
import subprocess
import sys

import pytest
from fastapi.testclient import TestClient
from pair_qa_exports import pair_export, qa_export  # noqa: F401

from ppvarlen.data.errors import DataError
from ppvarlen.runtime import infer
from ppvarlen.runtime.predictor import Predictor
from ppvarlen.serve.server import create_app, deploy_settings
from ppvarlen.tasks import get_task

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INFER = os.path.join(REPO, "deploy", "python", "infer.py")
EXPORTS = {"text_pair": "pair_export", "extractive_qa": "qa_export"}


def corpus_lines(task_name, items):
    """Items as lines of the task's corpus format (with the fields infer ignores)."""
    if task_name == "text_pair":
        return [{"id": k, "text_a": a, "text_b": b, "label": "same"}
                for k, (a, b) in enumerate(items)]
    return [{"answers": [{"text": it["context"][:1], "start": 0}], **it, "id": k}
            for k, it in enumerate(items)]


def write_jsonl(path, objs):
    path.write_text("".join((o if isinstance(o, str) else json.dumps(o, ensure_ascii=False))
                            + "\n" for o in objs), encoding="utf-8")
    return str(path)


def server_answers(export_dir, task, items):
    with TestClient(create_app(Predictor(export_dir, "onnx"),
                               deploy=deploy_settings(max_wait_ms=1))) as client:
        r = client.post("/predict", json={task.request_key: items})
        assert r.status_code == 200, r.text
        return r.json()["predictions"]


def assert_same_answer(got, want):
    assert set(got) == set(want), (got, want)
    for key, value in want.items():
        if isinstance(value, float):  # other batches: float sums in another order
            assert got[key] == pytest.approx(value, abs=1e-5), (key, got, want)
        elif isinstance(value, dict):
            assert got[key] == pytest.approx(value, abs=1e-5), (key, got, want)
        else:
            assert got[key] == value, (key, got, want)


@pytest.mark.parametrize("task_name", sorted(EXPORTS))
def test_infer_on_a_jsonl_of_items_equals_the_servers_answers(task_name, request, tmp_path):
    export_dir, _, items = request.getfixturevalue(EXPORTS[task_name])
    task = get_task(task_name)
    src = write_jsonl(tmp_path / "in.jsonl", corpus_lines(task_name, items))
    out = tmp_path / "out.jsonl"
    r = subprocess.run([sys.executable, INFER, "--no-progress", "--model-dir", export_dir,
                        "--backend", "onnx", "--input", src, "--output", str(out),
                        "--window", "2"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    records = [json.loads(x) for x in out.read_text(encoding="utf-8").splitlines()]
    assert [rec.pop("line") for rec in records] == list(range(1, len(items) + 1))
    want = server_answers(export_dir, task, items)
    for got, answer in zip(records, want):
        assert_same_answer(got, answer)
    summary = json.loads(r.stderr.strip().splitlines()[-1])
    assert summary["texts"] == summary["predicted"] == len(items) and summary["failed"] == 0
    assert summary["truncated"] == sum(a["truncated"] for a in want)
    assert summary["windowed"] == sum(a.get("windows", 1) > 1 for a in want)
    if task_name == "text_pair":  # a pair cut longest-first: warned, with a fix that applies
        assert summary["truncated"] >= 1 and len(summary["warnings"]) == 1
        assert "Data.max_len" in summary["warnings"][0]
        assert "window does not apply to pairs" in summary["warnings"][0]
    else:  # long contexts are read in windows, as the server reads them
        assert summary["windowed"] >= 2 and summary["warnings"] == []


def _errors(export_dir, src, tmp_path, max_text_chars=1000):
    out = tmp_path / "out.jsonl"
    summary = infer.run_file(Predictor(export_dir, "onnx"), src, str(out), progress=False,
                             window=2, max_text_chars=max_text_chars)
    records = [json.loads(x) for x in out.read_text(encoding="utf-8").splitlines()]
    assert [rec["line"] for rec in records] == list(range(1, len(records) + 1))
    return records, summary


def test_bad_pair_lines_name_the_line_and_the_field(pair_export, tmp_path, capsys):  # noqa: F811
    export_dir, _, pairs = pair_export
    good = {"text_a": pairs[0][0], "text_b": pairs[0][1]}
    lines = [good,
             {"text_a": "物流很快"},                                    # 2
             {"text_a": 5, "text_b": "送货速度快"},                      # 3
             {"text_a": "物流很快", "text_b": None},                     # 4
             ["物流很快", "送货速度快"],                                  # 5
             "{oops",                                                   # 6
             {"text_a": "  ", "text_b": "送货速度快"},                    # 7
             {"text_a": "物流很快", "text_b": "好" * 1001},               # 8
             "[" * 100_000,                                             # 9
             {"text": "物流很快"},                                       # 10
             good]
    src = write_jsonl(tmp_path / "pairs.jsonl", lines)
    records, summary = _errors(export_dir, src, tmp_path)
    expected = {
        2: f'{src}:2: field "text_b" is missing; expected an object '
           f'{{"text_a": "...", "text_b": "..."}}',
        3: f'{src}:3: field "text_a" must be a string, got a number',
        4: f'{src}:4: field "text_b" must be a string, got null',
        5: f"{src}:5: expected an object {{\"text_a\": \"...\", \"text_b\": \"...\"}}, got an "
           f"array",
        6: f"{src}:6: not valid JSON",
        7: f"{src}:7: text_a is empty",
        8: f"{src}:8: text_b has 1,001 characters; at most 1,000 (Deploy.max_text_chars",
        9: f"{src}:9: not valid JSON here (nested too deeply)",
        10: f'{src}:10: field "text_a" is missing',
    }
    for line, words in expected.items():
        assert records[line - 1]["error"].startswith(words), (line, records[line - 1])
    want = Predictor(export_dir, "onnx").predict([pairs[0]])[0]
    for rec in (records[0], records[-1]):
        assert rec["label"] == want["label"] and "error" not in rec
    assert summary["failed"] == len(expected) and summary["predicted"] == 2
    err = capsys.readouterr().err
    assert f'bad line: {src}:3: field "text_a" must be a string' in err
    # a .txt line holds one text: refused before reading, naming the fields to write
    txt = tmp_path / "pairs.txt"
    txt.write_text("物流很快\n", encoding="utf-8")
    with pytest.raises(DataError, match=r'a text_pair request item has 2 texts \("text_a", '
                                        r'"text_b"\).*\.jsonl lines'):
        infer.run_file(Predictor(export_dir, "onnx"), str(txt), None, progress=False)


def test_bad_qa_lines_and_an_overlong_line_then_the_rest(qa_export, tmp_path):  # noqa: F811
    export_dir, _, items = qa_export
    item = items[0]
    bound = infer.line_bytes_bound(10, texts=2)  # two texts of Deploy.max_text_chars=10
    lines = [{"question": "哪里？", "context": "北京"},
             {"question": item["question"]},                                 # 2
             {"question": "哪里？", "context": ["北京"]},                     # 3
             {"context": "北京", "question": True},                           # 4
             json.dumps({"question": "哪里？", "context": "北" * bound}),     # 5 over the bound
             {"question": "这句话提到的第一个地名是什么？", "context": "北京"},  # 6 question: 15
             {"question": "哪里？", "context": "   "},                        # 7
             {"question": "哪里？", "context": "北京上海"}]
    src = write_jsonl(tmp_path / "qa.jsonl", lines)
    records, summary = _errors(export_dir, src, tmp_path, max_text_chars=10)
    expected = {
        2: f'{src}:2: field "context" is missing; expected an object '
           f'{{"question": "...", "context": "..."}}',
        3: f'{src}:3: field "context" must be a string, got an array',
        4: f'{src}:4: field "question" must be a string, got true/false',
        5: f"{src}:5: line is longer than {bound:,} bytes, more than 2 texts of "
           f"Deploy.max_text_chars (10) characters each take; not read",
        6: f"{src}:6: question has 15 characters; at most 10 (Deploy.max_text_chars",
        7: f"{src}:7: context is empty",
    }
    for line, words in expected.items():
        assert records[line - 1]["error"].startswith(words), (line, records[line - 1])
    want = Predictor(export_dir, "onnx").predict([lines[0], lines[-1]])
    for rec, answer in zip((records[0], records[-1]), want):
        assert {k: rec[k] for k in ("answer", "start", "end")} == \
            {k: answer[k] for k in ("answer", "start", "end")}
    assert summary["failed"] == len(expected) and summary["predicted"] == 2


def test_one_text_tasks_read_their_fields_as_before(tmp_path):
    """Classification / tagging read {"text"}; seq2seq {"source"} or {"text"} (its data
    format's field first); a .txt line is one text; the items are the texts themselves."""
    src = write_jsonl(tmp_path / "in.jsonl", [{"source": "a", "text": "x"}, {"text": "b"},
                                               {"src": "c"}])
    got = infer.read_texts(src, get_task("seq2seq"))
    assert got[:2] == [(1, "a"), (2, "b")]
    assert str(got[2][1]).startswith(f'{src}:3: field "source" (or "text") is missing')
    got = infer.read_texts(src, get_task("classification"))
    assert got[:2] == [(1, "x"), (2, "b")] and 'field "text" is missing' in str(got[2][1])
    assert [line.line_fields() for line in map(get_task, ("tagging", "text_pair",
                                                          "extractive_qa"))] == \
        [(("text",),), (("text_a",), ("text_b",)), (("question",), ("context",))]
    with pytest.raises(DataError, match=r"\.jsonl \(\{\"question\": \"...\", \"context\": "
                                        r"\"...\"\} per line\), or a training data file "
                                        r"\(.*\), got \.xml"):
        infer.check_input(str(tmp_path / "in.xml"), get_task("extractive_qa"))
