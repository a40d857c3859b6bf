"""ppvarlen-eval's report, and what train and eval write on the terminal.

A 3-class corpus with Chinese label words is trained for a few steps (random-init tiny
Transformer, progress bar on) and evaluated through the commands themselves:

* the per-class table (precision, recall, F1, support) is printed, and metrics.json,
  confusion_matrix.json and confusion_matrix.png are written beside the run; the matrix and the
  table are the same counts as ``ppvarlen.metrics`` computes (one rule: macro-F1 included);
* train and eval log in one format (``[HH:MM:SS] LEVEL ppvarlen...``, never PaddleNLP's
  ``[date time,ms] [    INFO] file.py:line -``), and no log line is written into the progress
  bar's line (each starts a line, or follows the bar's own clearing ``\\r``).
"""
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import yaml

from ppvarlen.cli import main_eval, main_train
from ppvarlen.metrics import class_report, confusion_matrix, macro_f1, per_class_prf

LABELS = ["正面", "负面", "中性"]
WORDS = {"正面": "好棒喜欢满意推荐", "负面": "差坏讨厌失望糟糕", "中性": "一般还行普通凑合"}
PPVARLEN_LINE = re.compile(r"^\[\d\d:\d\d:\d\d\] (DEBUG|INFO|WARNING|ERROR) ppvarlen[.\w]*: ")
PADDLENLP_LINE = re.compile(r"\[\d{4}-\d\d-\d\d [\d:,]+\] \[ *[A-Z]+\] \S+\.py:\d+ - ")
# a log line glued to text on its own line (after the bar's text, not after a newline or the
# carriage return tqdm.write clears the bar with)
LOG_INSIDE_A_LINE = re.compile(r"[^\r\n]\[\d\d:\d\d:\d\d\] (DEBUG|INFO|WARNING|ERROR) ppvarlen")


def _corpus(directory, n, seed):
    rng = np.random.RandomState(seed)
    rows = []
    for k in range(n):
        label = LABELS[k % 3]
        chars = rng.choice(list(WORDS[label] + "的了是我这个"), size=rng.randint(3, 12))
        rows.append({"text": "".join(chars), "label": label})
    path = os.path.join(directory, f"split{seed}.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """(run dir, config path, the train command's stderr)."""
    base = str(tmp_path_factory.mktemp("eval_report"))
    config = {
        "Global": {"output_dir": os.path.join(base, "run"), "seed": 3},
        "Data": {"corpus": "jsonl", "train_file": _corpus(base, 60, 0),
                 "dev_file": _corpus(base, 21, 1), "test_file": _corpus(base, 30, 2),
                 "max_len": 16, "max_tokens": 128},
        "Model": {"name": "transformer_cls", "hidden_size": 16, "num_layers": 1, "num_heads": 2,
                  "ffn_size": 32, "dropout": 0.0, "max_position": 16},
        "Optimizer": {"lr": 1e-2, "warmup_steps": 1},
        "Train": {"max_steps": 12, "log_every": 2, "eval_every": 6, "keep_last": 1,
                  "progress_bar": True},
    }
    path = os.path.join(base, "config.yaml")
    with open(path, "w", encoding="utf-8") as f:
        yaml.safe_dump(config, f, allow_unicode=True)
    return os.path.join(base, "run"), path


def test_train_logs_in_one_format_on_lines_of_their_own(run, capfd):
    out, config = run
    # the eval test may have trained into the module's run first (pytest-randomly's order)
    assert main_train(["-c", config, "-o", "Global.overwrite_output_dir=true"]) == 0
    err = capfd.readouterr().err
    assert "train:" in err  # the bar was drawn
    assert not LOG_INSIDE_A_LINE.search(err), err[-2000:]
    logs = [line.split("\r")[-1] for line in err.splitlines() if "ppvarlen" in line]
    assert logs and all(PPVARLEN_LINE.match(line) for line in logs), logs[:5]
    assert not PADDLENLP_LINE.search(err)


def test_eval_prints_the_per_class_report_and_writes_the_confusion_matrix(run, capfd):
    out, config = run
    if not os.path.isdir(os.path.join(out, "best")):  # run alone (-k): train first
        assert main_train(["-c", config]) == 0
        capfd.readouterr()
    assert main_eval(["-c", config, "--checkpoint", os.path.join(out, "best")]) == 0
    captured = capfd.readouterr()
    result, err = json.loads(captured.out), captured.err
    report_dir = os.path.join(out, "eval", "best-test")

    # the numbers: one rule (ppvarlen.metrics) for the matrix, the table and macro-F1
    matrix = result["confusion_matrix"]
    assert sorted(matrix["label_names"]) == sorted(LABELS)  # the label words, as written
    counts = np.array(matrix["matrix"])
    assert counts.shape == (3, 3) and counts.sum() == result["num_examples"] == 30
    for k, name in enumerate(matrix["label_names"]):
        c = result["per_class"][name]
        assert c["support"] == counts[k].sum() == 10
        assert c["precision"] == pytest.approx(counts[k, k] / max(counts[:, k].sum(), 1))
        assert c["recall"] == pytest.approx(counts[k, k] / 10)
    assert result["accuracy"] == pytest.approx(np.trace(counts) / 30)
    assert result["macro_f1"] == pytest.approx(
        np.mean([result["per_class"][n]["f1"] for n in matrix["label_names"]]))

    # printed: a row per label with its support, then the averages
    for name in matrix["label_names"]:
        row = next(line for line in err.splitlines() if line.startswith(name))
        c = result["per_class"][name]
        assert row.split()[1:] == [f"{c['precision']:.4f}", f"{c['recall']:.4f}",
                                   f"{c['f1']:.4f}", "10"]
    assert re.search(r"^macro avg .* 30$", err, re.M) and re.search(r"^accuracy .* 30$", err, re.M)

    # written beside the run, whole
    with open(os.path.join(report_dir, "confusion_matrix.json"), encoding="utf-8") as f:
        assert json.load(f) == matrix
    with open(os.path.join(report_dir, "metrics.json"), encoding="utf-8") as f:
        assert json.load(f)["per_class"] == result["per_class"]
    with open(os.path.join(report_dir, "confusion_matrix.png"), "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert not [n for n in os.listdir(report_dir) if n.startswith(".")]  # no temp files left

    # one log format, and no third-party noise on the way
    logs = [line for line in err.splitlines() if "ppvarlen" in line and "] " in line
            and not line.startswith("report:")]
    assert logs and all(PPVARLEN_LINE.match(line.split("\r")[-1]) for line in logs), logs
    assert not PADDLENLP_LINE.search(err) and "Glyph" not in err


def test_eval_logs_in_ppvarlen_format_in_its_own_process(run, tmp_path):
    """As a user runs it (a process of its own, where PaddleNLP's import configures logging)."""
    out, config = run
    if not os.path.isdir(os.path.join(out, "best")):
        assert main_train(["-c", config]) == 0
    code = "import sys; from ppvarlen.cli import main_eval; sys.exit(main_eval(sys.argv[1:]))"
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    done = subprocess.run([sys.executable, "-c", code, "-c", config, "--checkpoint",
                           os.path.join(out, "best"), "--output-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=repo))
    assert done.returncode == 0, done.stderr[-2000:]
    assert not PADDLENLP_LINE.search(done.stderr), done.stderr[:1000]
    assert any(PPVARLEN_LINE.match(line) and "store cache" in line
               for line in done.stderr.splitlines()), done.stderr[:1000]


def test_eval_output_dir_is_a_flag(run, tmp_path, capfd):
    out, config = run
    if not os.path.isdir(os.path.join(out, "best")):
        assert main_train(["-c", config]) == 0
    target = tmp_path / "report"
    assert main_eval(["-c", config, "--checkpoint", os.path.join(out, "best"), "--split", "dev",
                      "--output-dir", str(target)]) == 0
    assert sorted(os.listdir(target)) == ["confusion_matrix.json", "confusion_matrix.png",
                                          "metrics.json"]
    assert f"report: {target}" in capfd.readouterr().err


def test_per_class_numbers_by_hand_and_macro_f1_from_the_same_counts():
    preds, gold = [0, 0, 1, 2, 2, 2], [0, 1, 1, 2, 2, 0]
    assert confusion_matrix(preds, gold, 3).tolist() == [[1, 0, 1], [1, 1, 0], [0, 0, 2]]
    per = per_class_prf(preds, gold, 3)
    assert [round(c["precision"], 4) for c in per] == [0.5, 1.0, round(2 / 3, 4)]
    assert [c["recall"] for c in per] == [0.5, 0.5, 1.0]
    assert [c["support"] for c in per] == [2, 2, 2]
    assert macro_f1(preds, gold, 3) == pytest.approx(np.mean([c["f1"] for c in per]))
    report = class_report(preds, gold, ["a", "b", "c"])
    assert report["per_class"]["c"] == {"precision": pytest.approx(2 / 3), "recall": 1.0,
                                        "f1": pytest.approx(0.8), "support": 2}
    with pytest.raises(ValueError, match=r"labels hold ids outside \[0, 2\)"):
        confusion_matrix([0, 1], [0, 2], 2)
