"""ppvarlen-doctor passes every export family ppvarlen builds, and says why where it warns.

Each family is a random-init model of the registered architecture (``build_model``), small,
exported with the exporter itself (``export_model``, no parity run: the doctor is what is
tested here), then diagnosed as a user would (``diagnose`` = ``ppvarlen-doctor EXPORT``):
classification (transformer_cls, rnn_cls, the wide & deep transformer_cls), text pairs,
extractive QA, tagging with a CRF (bigru_crf: tags decoded in the graph under Paddle, in numpy
under ONNX Runtime), embeddings and seq2seq.  No check may fail on any of them.  The masked-LM
task exports nothing (its checkpoint is fine-tuned, not served), so it has no export here.

A BiGRU-CRF export's decoded tags [B, L] are per token although its manifest does not say so:
the doctor measures that, cuts them to each row's length and compares them as tags (the
same or not), never as a |delta| of label ids.  A long-text policy the manifest records
(``long_text: truncate``) is a deliberate choice: check 8 warns (exit 0), it does not fail.
"""
import json
import os
import re

import numpy as np
import paddle
import pytest

from ppvarlen.cli import main_doctor
from ppvarlen.config import load_config
from ppvarlen.data.vocab import TextEncoder, TokenCounting, count_fields
from ppvarlen.doctor.diagnose import diagnose
from ppvarlen.export.exporter import export_model
from ppvarlen.models import build_model

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TEXTS = ["这部电影真好看", "服务很差，再也不来了", "江泽民主席在北京会见了客人", "今天天气不错",
         "质量一般般", "上海和广州都是大城市", "房间干净，早餐丰富，推荐！"]
NER_TAGS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG"]
MAX_LEN, MAX_POSITION = 24, 32
TRANSFORMER = ["Model.hidden_size=16", "Model.num_layers=1", "Model.num_heads=2",
               "Model.ffn_size=32", f"Model.max_position={MAX_POSITION}"]
RNN = ["Model.emb_size=16", "Model.hidden_size=16"]
PROFILE = {"p50": 8, "p95": 16, "p99": 20, "max": MAX_LEN}

# name -> (its config, task, overrides making it small, labels, formats exported, extra meta);
# ONNX where a family is usually served through it or its graph differs there (the CRF's tags
# decoded in numpy, the QA file for the runtime-error test): each ONNX conversion is a process
FAMILIES = {
    "transformer_cls": ("sentiment/transformer", "classification", TRANSFORMER,
                        ["negative", "positive"], ("paddle",), {}),
    "rnn_cls": ("sentiment/bilstm", "classification", RNN + ["Model.ngram_buckets=64"],
                ["negative", "positive"], ("paddle",), {}),
    "wide_deep": ("sentiment/wide_deep", "classification", TRANSFORMER + ["Model.wide_buckets=64"],
                  ["negative", "positive"], ("paddle",), {}),
    "text_pair": ("pairs/transformer", "text_pair", TRANSFORMER, ["different", "same"],
                  ("paddle",), {}),
    "extractive_qa": ("qa/transformer", "extractive_qa", TRANSFORMER, ["start", "end"],
                      ("onnx",), {"max_answer_tokens": 8}),
    "bigru_crf": ("ner/bigru_crf", "tagging", RNN, NER_TAGS, ("paddle", "onnx"), {}),
    "transformer_embed": ("embedding/transformer", "embedding", TRANSFORMER, [], ("onnx",),
                          {"embedding": {"dim": 16, "pooling": "mean", "normalize": True}}),
    "seq2seq": ("g2p/transformer", "seq2seq", TRANSFORMER + ["Model.num_decoder_layers=1",
                                                            f"Data.max_source_len={MAX_LEN}"],
                [], ("paddle",), {"max_source_len": MAX_LEN}),
}


def _encoder(task):
    if task != "seq2seq":
        return TextEncoder.build(TEXTS, kind="char")
    targets = ["zhe bu dian ying", "fu wu hen cha", "jin tian tian qi"]
    src = TokenCounting("char", False, ((("source",), None),))
    tgt = TokenCounting("char", False, ((("target",), "word"),))
    return TextEncoder.build_seq2seq(count_fields([{"source": t} for t in TEXTS], src)[0],
                                     count_fields([{"target": t} for t in targets], tgt)[0],
                                     kind="char", target_kind="word")


def make_export(family, out_dir, long_text="truncate"):
    config, task, overrides, labels, formats, extra = FAMILIES[family]
    cfg = load_config(os.path.join(REPO, "configs", config + ".yaml"), overrides + [
        f"Data.max_len={MAX_LEN}", f"Data.long_text={long_text}", "Data.stride=8"])
    encoder = _encoder(task)
    paddle.seed(0)
    model = build_model(cfg.Model, encoder.vocab_size, len(labels), encoder.pad_id, task)
    if family == "bigru_crf":  # a CRF whose transitions matter: Viterbi differs from argmax
        crf = next(p for n, p in model.named_parameters() if "transition" in n)
        with paddle.no_grad():
            crf.set_value(paddle.randn(crf.shape) * 2)
    model.eval()
    meta = dict({"task": task, "model_name": cfg.Model.name, "label_names": labels,
                 "num_labels": len(labels), "special_ids": encoder.special_ids,
                 "max_len": MAX_LEN, "max_position": MAX_POSITION, "long_text": long_text,
                 "length_profile": PROFILE}, **extra)
    export_model(model, meta, encoder, cfg, out_dir, formats, ("fp32",), verify=False)
    return out_dir


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    base = tmp_path_factory.mktemp("own_exports")
    return {family: make_export(family, str(base / family)) for family in FAMILIES}


def _diagnosed(exports, family, backend=None, texts=None):
    model, results = diagnose(exports[family], texts_file=texts, backend=backend)
    return model, {r.number: r for r in results}


CASES = [(f, None) for f in FAMILIES] + [("bigru_crf", "onnx")]


@pytest.mark.parametrize("family,backend", CASES, ids=[f"{f}-{b or 'default'}" for f, b in CASES])
def test_every_export_family_passes_every_applicable_check(exports, family, backend):
    _, checks = _diagnosed(exports, family, backend)
    failed = {n: r.summary for n, r in checks.items() if r.status not in ("pass", "n/a")}
    assert failed == {}
    assert {n for n, r in checks.items() if r.status == "pass"} >= {1, 2, 3, 4, 7}


@pytest.mark.parametrize("backend", ["paddle", "onnx"])
def test_crf_tags_are_cut_to_each_row_and_compared_as_tags(exports, backend):
    model, checks = _diagnosed(exports, "bigru_crf", backend)
    if backend == "paddle":  # tags from the graph [B, L]: measured per token (the manifest
        assert "tags" in model.run.per_token  # marks only the emissions)
    else:  # tags decoded in numpy from the ONNX emissions, as the server decodes them
        assert model.run.decodes_outside
    padding = checks[2]
    assert padding.evidence["label_outputs"] == {"tags": 0}  # identical in every padded run
    assert "tags" not in padding.evidence["max_abs_delta"]
    assert f"tags identical in all {padding.evidence['runs']} runs" in padding.summary
    assert "inf" not in padding.summary
    # the tags checked are what a user gets: ONNX's are decoded in numpy (Viterbi)
    rows = model.run([model.random_row(np.random.RandomState(0), 5)])
    assert rows[0]["tags"].dtype.kind == "i" and rows[0]["tags"].shape == (5,)


def test_a_recorded_truncation_policy_warns_and_exits_0(exports, tmp_path, capsys):
    texts = tmp_path / "texts.txt"
    texts.write_text(f"{TEXTS[0]}\n{TEXTS[2] * 4}\n", encoding="utf-8")
    report = tmp_path / "report.json"
    assert main_doctor([exports["transformer_cls"], "--texts", str(texts),
                        "--json", str(report)]) == 0
    out = capsys.readouterr().out
    assert "warnings (deliberate, still worth a look):" in out
    assert "0 of 8 checks failed, 1 warned (8); exit 0" in out
    doc = json.loads(report.read_text("utf-8"))
    assert doc["failed"] == [] and doc["warnings"] == [8] and doc["exit_code"] == 0
    check = next(c for c in doc["checks"] if c["number"] == 8)
    assert check["status"] == "warn" and check["evidence"]["longer"] == 1
    assert "as its manifest records (long_text: truncate)" in check["summary"]
    assert "Data.long_text=window" in check["fix"]


def test_a_check_that_provokes_a_runtime_error_prints_nothing_of_it(exports, capfd):
    """Check 6 runs a row past the position table on purpose; ONNX Runtime's red
    "[E:onnxruntime ...] Non-zero status code ... Gather" line must not reach the terminal
    (the check reports what the exception said)."""
    graph_file = os.path.join(exports["extractive_qa"], "onnx", "model.onnx")
    capfd.readouterr()
    main_doctor([graph_file])  # a bare graph file: its -3.4e38 mask fails check 5 in fp16
    captured = capfd.readouterr()
    assert re.search(r"6  position limits +pass +length 32 runs; 33: the model raises",
                     captured.out), captured.out
    assert "Gather" in captured.out  # the runtime's words are the check's evidence
    assert "[E:onnxruntime" not in captured.err and "Gather" not in captured.err, captured.err
