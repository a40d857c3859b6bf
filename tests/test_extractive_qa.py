"""Extractive QA (ppvarlen/tasks/extractive_qa.py): windows, char offsets, span decoding, EM/F1,
bad input, padding invariance (ppvarlen model and a PaddleNLP Auto QA directory) and train ->
export --verify -> serve on a small corpus DERIVED from People's Daily (a question naming an
entity type, the sentence as context, its first such entity as the answer)."""
import json
import os
import re

import numpy as np
import paddle
import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings, strategies as st
from test_api import assert_every_case_passed, schemathesis_run
from tiny_task import assert_exact_parity, tiny_model, tiny_task_cfg

from ppvarlen.config import load_config
from ppvarlen.data.collate import Collator
from ppvarlen.data.errors import DataError
from ppvarlen.data.vocab import TextEncoder
from ppvarlen.runtime.predictor import Predictor
from ppvarlen.serve.server import create_app, deploy_settings
from ppvarlen.engine import trainer as trainer_mod
from ppvarlen.engine.checkpoint import load_for_inference
from ppvarlen.export.exporter import export_checkpoint
from ppvarlen.models import build_model
from ppvarlen.store_build import build_datasets
from ppvarlen.tasks import get_task
from ppvarlen.tasks.extractive_qa import (QUESTIONS, best_span, context_positions,
                                          derive_people_daily_qa, encode_windows, exact_match,
                                          f1_score, qa_scores)

ALPHABET = "北京上海人民日报中国会见了客人 ab"
ENC = TextEncoder.build([ALPHABET + "这句话提到的第一个地名是什么？"])


def qa_cfg(out, paths, data=None, **model):
    return tiny_task_cfg(out, paths, {"max_len": 40, "long_text": "window", "stride": 8,
                                      "max_tokens": 1024, **(data or {})},
                         model or tiny_model("transformer_span"), log_every=2)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("qa")
    paths = derive_people_daily_qa(str(root / "corpus"), limit=60)
    out = root / "run"
    trainer_mod.train(qa_cfg(out, paths))
    return str(out), paths


# ------------------------------------------------------------ the derived corpus
def test_derived_examples_slice_back_and_name_the_first_entity():
    from ppvarlen.tasks.extractive_qa import people_daily_qa_examples

    tokens = list("李鹏在北京和上海会见客人。江泽民到广州。")
    tags = ["B-PER", "I-PER", "O", "B-LOC", "I-LOC", "O", "B-LOC", "I-LOC", "O", "O", "O", "O",
            "O", "B-PER", "I-PER", "I-PER", "O", "B-LOC", "I-LOC", "O"]
    got = people_daily_qa_examples(tokens, tags)
    assert [(e["question"], e["context"], e["answers"]) for e in got] == [
        (QUESTIONS["PER"], "李鹏在北京和上海会见客人。", [{"text": "李鹏", "start": 0}]),
        (QUESTIONS["LOC"], "李鹏在北京和上海会见客人。", [{"text": "北京", "start": 3}]),
        (QUESTIONS["PER"], "江泽民到广州。", [{"text": "江泽民", "start": 0}]),
        (QUESTIONS["LOC"], "江泽民到广州。", [{"text": "广州", "start": 4}])]


# ------------------------------------------------------------ windows and offsets
def test_answer_across_a_window_boundary_is_found_from_the_window_holding_it_whole():
    question = "这句话提到的第一个地名是什么？"  # 15 tokens: 40 - 15 - 3 = 22 context tokens
    context = "人民日报" * 5 + "人" + "上海" + "人民日报" * 5  # 上海: chars 21..23
    windows, _, _, planned = encode_windows(ENC, question, context, 40, 8, "window", "t",
                                            (21, 23))
    # 43 chars, 22 a window, overlap 8: [0, 22) cuts 上海 after 上, [14, 36) holds it whole
    assert planned == [(0, 22), (14, 36), (21, 43)]
    assert [int(w["start_token"]) for w in windows] == [0, 17 + 21 - 14, 17 + 21 - 21]
    assert [int(w["end_token"]) for w in windows] == [0, 17 + 22 - 14, 17 + 22 - 21]
    for w in windows[1:]:
        a, b = w["char_start"][w["start_token"]], w["char_end"][w["end_token"]]
        assert context[a:b] == "上海"


def test_best_span_over_windows_picks_the_whole_answer():
    """Decoding: the span score is start + end logit inside the context only; the best
    window wins even when another window's partial span has a high start logit."""
    question = "这句话提到的第一个地名是什么？"
    context = "人民日报" * 4 + "北京上海" + "人民日报" * 4
    answer = (16, 20)
    windows = encode_windows(ENC, question, context, 40, 6, "window", "t", answer)[0]
    assert len(windows) > 1
    best = None
    for w in windows:
        n = len(w["input_ids"])
        start, end = np.zeros(n), np.zeros(n)
        start[0] = end[0] = 50.0  # [CLS] and the question never win: masked out
        if w["start_token"]:
            start[w["start_token"]], end[w["end_token"]] = 3.0, 3.0
        else:  # a window without the whole answer: a strong start, a weak end
            start[w["char_start"] >= 0] = np.linspace(0, 4.0, int((w["char_start"] >= 0).sum()))
        found = best_span(start, end, context_positions(w["token_type_ids"]), 30)
        chars = (found[0], w["char_start"][found[1]], w["char_end"][found[2]])
        best = chars if best is None or chars[0] > best[0] else best
    assert context[best[1]:best[2]] == "北京上海"
    # start <= end and the answer-length limit
    assert best_span(np.array([0, 5, 0, 0.]), np.array([9, 0, 0, 1.]),
                     np.array([False, True, True, True]), 2) == (5.0, 1, 1)
    assert best_span(np.zeros(3), np.zeros(3), np.zeros(3, bool), 5) is None


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.text(ALPHABET, min_size=1, max_size=80), st.data(), st.integers(20, 48),
       st.integers(0, 20))
def test_char_offsets_slice_back_and_the_gold_span_is_recoverable(context, data, max_len,
                                                                    stride):
    question = "第一个地名"
    a = data.draw(st.integers(0, len(context) - 1))
    b = data.draw(st.integers(a + 1, len(context)))
    budget = max_len - len(question) - 3
    stride = min(stride, budget - 1)
    windows, _, ids, planned = encode_windows(ENC, question, context, max_len, stride,
                                              "window", "t", (a, b))
    tokens, head = ENC.tokenize(context), len(question) + 2
    covered = set()
    for w, (first, _) in zip(windows, planned):
        assert len(w["input_ids"]) <= max_len
        assert w["input_ids"][1:head - 1].tolist() == ENC.encode(list(question))  # whole
        for p in np.flatnonzero(w["char_start"] >= 0):
            s, e = w["char_start"][p], w["char_end"][p]
            assert context[s:e] == tokens[first + p - head]  # the token's own characters
            covered.add(int(s))
        if w["start_token"]:
            s, e = w["char_start"][w["start_token"]], w["char_end"][w["end_token"]]
            assert context[s:e] == context[a:b]
    assert covered == set(range(len(context)))  # the windows cover every character
    if b - a <= budget:  # the answer fits a window: some window holds it whole
        assert any(w["start_token"] for w in windows)


# ------------------------------------------------------------ metrics
def test_exact_match_and_f1_hand_worked():
    assert exact_match("北京。", "北京") == 1.0  # punctuation dropped
    assert exact_match("北京市", "北京") == 0.0
    # 北京市 vs 北京: 2 common chars, P = 2/3, R = 1, F1 = 2 * (2/3) / (5/3) = 0.8
    assert f1_score("北京市", "北京") == pytest.approx(0.8)
    assert f1_score("上海", "北京") == 0.0
    # English: the article and case go, tokens are words: "the Big Apple" vs "big apple pie":
    # 2 common of 2 predicted / 3 gold -> P 1, R 2/3, F1 0.8
    assert exact_match("The Cat!", "cat") == 1.0
    assert f1_score("the Big Apple", "big apple pie") == pytest.approx(0.8)
    # max over the gold answers, mean over questions: (1 + 0.8) / 2 and (1 + 0) / 2
    assert qa_scores(["北京", "北京市"], [["上海", "北京"], ["北京"]]) == \
        {"exact_match": 0.5, "f1": 0.9}


# ------------------------------------------------------------ bad input
def _write(path, lines):
    path.write_text("\n".join(json.dumps(x, ensure_ascii=False) for x in lines) + "\n",
                    encoding="utf-8")
    return str(path)


GOOD = {"question": "这句话提到的第一个地名是什么？", "context": "他在北京工作。",
        "answers": [{"text": "北京", "start": 2}]}


@pytest.mark.parametrize("bad, words", [
    ({"question": "问", "context": "他在北京工作。"}, "answers"),
    ({**GOOD, "answers": [{"text": "北京", "start": 3}]},
     r"answers\[0\]\.start 3: context\[3:5\] is '京工'.*occurs at start 2"),
    ({**GOOD, "answers": [{"text": "北京"}]}, r"answers\[0\] must be an object"),
])
def test_bad_lines_name_file_line_and_field(tmp_path, bad, words):
    path = _write(tmp_path / "train.jsonl", [GOOD, GOOD, bad])
    paths = {"train": path, "dev": _write(tmp_path / "dev.jsonl", [GOOD]),
             "test": _write(tmp_path / "test.jsonl", [GOOD])}
    with pytest.raises(DataError) as e:
        build_datasets(qa_cfg(tmp_path / "o", paths).Data)
    assert f"{path}:3" in str(e.value) and re.search(words, str(e.value)), str(e.value)


def test_a_question_that_cannot_fit_names_the_example_and_field(tmp_path):
    long_q = dict(GOOD, question="这句话提到的第一个地名是什么" * 3 + "？")
    paths = {"train": _write(tmp_path / "train.jsonl", [GOOD, long_q]),
             "dev": _write(tmp_path / "dev.jsonl", [GOOD]),
             "test": _write(tmp_path / "test.jsonl", [GOOD])}
    with pytest.raises(DataError, match=r"train example 1 \(from .*train.jsonl\): field "
                                        r"'question' has 43 tokens.*raise Data.max_len"):
        build_datasets(qa_cfg(tmp_path / "o", paths).Data)


def test_report_only_fields_stay_out_of_batches():
    fields = get_task("extractive_qa").store_fields()
    windows = encode_windows(ENC, "第一个地名", "北京上海人民", 20, 2, "window", "t", (0, 2))[0]
    for w in windows:
        w.update(doc_id=0, context_chars=np.zeros(0, np.int32), gold_spans=np.zeros(0, np.int32))
    batch = Collator(0, fields=fields)(windows)
    assert sorted(batch) == ["doc_id", "end_token", "input_ids", "seq_len", "start_token",
                             "token_type_ids"]


# ------------------------------------------------------------ padding invariance
def _padded(windows, pad_id, extra):
    batch = Collator(pad_id, fields=get_task("extractive_qa").store_fields())(windows)
    if extra:
        width = batch["input_ids"].shape[1] + extra
        for key, pad in (("input_ids", pad_id), ("token_type_ids", 0)):
            grown = np.full((len(windows), width), pad, np.int64)
            grown[:, :batch[key].shape[1]] = batch[key]
            batch[key] = grown
    return [paddle.to_tensor(batch[k]) for k in ("input_ids", "seq_len", "token_type_ids")]


def _random_windows(vocab_size, rng):
    class Enc:
        cls_id, sep_id, lowercase = 2, 3, False

        @staticmethod
        def encode_array(text):
            return rng.randint(5, vocab_size, len(text))

        @staticmethod
        def tokenize(text):
            return list(text)

        encode = encode_array

    out = []
    for q, c in ((3, 30), (6, 4), (1, 12)):
        ws = encode_windows(Enc, "q" * q, "c" * c, 24, 4, "window", "t", (0, 1))[0]
        for w in ws:
            w.update(doc_id=0, context_chars=np.zeros(0, np.int32),
                     gold_spans=np.zeros(0, np.int32))
        out += ws
    return out


def _check_invariance(model, windows, extra):
    model.eval()
    with paddle.no_grad():
        start, end = (t.numpy() for t in model(*_padded(windows, 0, extra)))
        for i, w in enumerate(windows):
            n = len(w["input_ids"])
            alone = [t.numpy()[0] for t in model(*_padded([w], 0, 0))]
            np.testing.assert_allclose(start[i, :n], alone[0], atol=1e-5)
            np.testing.assert_allclose(end[i, :n], alone[1], atol=1e-5)


@pytest.mark.parametrize("extra", [0, 5])
def test_a_question_window_alone_equals_it_in_any_padded_batch(extra):
    paddle.seed(0)
    model = build_model({"name": "transformer_span", "hidden_size": 16, "num_layers": 2,
                         "num_heads": 2, "ffn_size": 32, "dropout": 0.0, "max_position": 64,
                         "type_vocab_size": 2}, 50, 2, 0, "extractive_qa")
    _check_invariance(model, _random_windows(50, np.random.RandomState(1)), extra)


@pytest.fixture(scope="module")
def ernie_qa_dir(tmp_path_factory, trained):
    """A random-init ERNIE ``*ForQuestionAnswering`` + tokenizer, built offline
    (save_pretrained), over the characters of the derived corpus."""
    import paddlenlp.transformers as pt

    _, paths = trained
    chars = set()
    for split in ("train", "dev", "test"):
        for line in open(paths[split], encoding="utf-8"):
            ex = json.loads(line)
            chars.update(ex["question"] + ex["context"])
    chars = sorted(c for c in chars if not c.isspace() and c not in "[]")
    directory = tmp_path_factory.mktemp("ernie_qa")
    (directory / "vocab.txt").write_text(
        "\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + chars) + "\n", encoding="utf-8")
    config = pt.ErnieConfig(vocab_size=len(chars) + 5, hidden_size=32, num_hidden_layers=2,
                            num_attention_heads=2, intermediate_size=64,
                            max_position_embeddings=512, type_vocab_size=2, pad_token_id=0)
    paddle.seed(0)
    pt.ErnieForQuestionAnswering(config).save_pretrained(str(directory), safe_serialization=True)
    pt.ErnieTokenizer(vocab_file=str(directory / "vocab.txt")).save_pretrained(str(directory))
    return str(directory)


def test_paddlenlp_qa_matches_paddlenlp_eager_and_is_padding_invariant(ernie_qa_dir):
    import paddlenlp.transformers as pt

    from ppvarlen.models.paddlenlp_auto import read_config

    config = read_config(ernie_qa_dir)
    model = build_model({"name": "paddlenlp_qa", "pretrained_dir": ernie_qa_dir,
                         "max_position": 512}, config.vocab_size, 2, 0, "extractive_qa")
    windows = _random_windows(config.vocab_size, np.random.RandomState(2))
    _check_invariance(model, windows, 4)
    net = pt.AutoModelForQuestionAnswering.from_pretrained(ernie_qa_dir)
    net.eval()
    with paddle.no_grad():
        ids, lens, seg = _padded(windows[:1], 0, 0)
        ours = [t.numpy() for t in model(ids, lens, seg)]
        ref = net(input_ids=ids, token_type_ids=seg, return_dict=False)
        for got, want in zip(ours, ref[:2]):
            np.testing.assert_allclose(got, want.numpy(), atol=1e-5)


def test_paddlenlp_qa_trains_and_exports_with_verify(ernie_qa_dir, trained, tmp_path):
    _, paths = trained
    cfg = qa_cfg(tmp_path / "run", paths,
                 {"tokenizer": "pretrained", "vocab_file": os.path.join(ernie_qa_dir, "vocab.txt")},
                 name="paddlenlp_qa", pretrained_dir=ernie_qa_dir, max_position=64)
    trainer_mod.train(cfg)
    manifest = export_checkpoint(str(tmp_path / "run" / "best"), str(tmp_path / "export"),
                                 verify=True)
    assert [o["name"] for o in manifest["outputs"]] == ["start_logits", "end_logits"]
    with open(tmp_path / "export" / "parity.json") as f:
        report = json.load(f)
    assert report["passed"], report["failures"]
    for name in ("paddle_inference_onednn", "onnx"):
        r = report["results"]["test"][name]
        assert r["max_abs_diff"] <= 1e-4 and r["agreement"] == 1.0, (name, r)


# ------------------------------------------------------------ train -> export -> serve
def test_the_shipped_config_runs_on_the_derived_corpus(trained, tmp_path):
    _, paths = trained
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "configs", "qa", "transformer.yaml")
    first = open(path, encoding="utf-8").readline()
    assert first.startswith("# python -c \"from ppvarlen.tasks.extractive_qa import "
                            "derive_people_daily_qa") and "tools/train.py -c configs/qa/" in first
    cfg = load_config(path, [f"Global.output_dir={tmp_path}", "Train.max_steps=2",
                             "Train.eval_every=2", "Model.num_layers=1", "Model.hidden_size=16",
                             "Model.ffn_size=32"] +
                      [f"Data.{s}_file={paths[s]}" for s in ("train", "dev", "test")])
    assert trainer_mod.train(cfg)["steps"] == 2


def test_train_reports_exact_match_and_f1(trained):
    out, _ = trained
    with open(os.path.join(out, "metrics.json")) as f:
        metrics = json.load(f)
    for split in ("dev", "test"):
        assert set(metrics[split]) >= {"exact_match", "f1", "num_examples"}
        assert 0 <= metrics[split]["exact_match"] <= metrics[split]["f1"] <= 1
    _, meta, _, _ = load_for_inference(os.path.join(out, "best"))
    assert meta["task"] == "extractive_qa" and meta["max_answer_tokens"] == 30


@pytest.fixture(scope="module")
def exported(trained, tmp_path_factory):
    out, _ = trained
    export_dir = str(tmp_path_factory.mktemp("qa_export") / "export")
    manifest = export_checkpoint(os.path.join(out, "best"), export_dir, verify=True)
    return export_dir, manifest


def test_export_verify_paddle_and_onnx(exported):
    export_dir, manifest = exported
    assert [i["name"] for i in manifest["inputs"]] == ["input_ids", "seq_len", "token_type_ids"]
    assert [o["name"] for o in manifest["outputs"]] == ["start_logits", "end_logits"]
    assert_exact_parity(export_dir)


def test_serve_questions_over_http_windows_long_contexts(trained, exported):
    """The served answer of a long (windowed) context is the eager model's best span over the
    same windows; the HTTP API answers {"answer", "start", "end", "score"} per question."""
    out, paths = trained
    export_dir, _ = exported
    exs = [json.loads(x) for x in open(paths["test"], encoding="utf-8").readlines()[:3]]
    items = [{"question": ex["question"], "context": ex["context"] * 4} for ex in exs]
    got = Predictor(export_dir, backend="onnx").predict(items)
    model, _, encoder, cfg = load_for_inference(os.path.join(out, "best"))
    model.eval()
    for item, answer in zip(items, got):
        windows, _, _, _ = encode_windows(encoder, item["question"], item["context"],
                                          cfg.Data.max_len, cfg.Data.stride, "window", "t")
        assert answer["windows"] == len(windows)
        best = None
        with paddle.no_grad():
            for w in windows:
                ids = paddle.to_tensor([w["input_ids"].astype("int64")])
                seg = paddle.to_tensor([w["token_type_ids"].astype("int64")])
                n = paddle.to_tensor([len(w["input_ids"])])
                s, e = (t.numpy()[0] for t in model(ids, n, seg))
                found = best_span(s, e, context_positions(w["token_type_ids"]), 30)
                chars = (found[0], w["char_start"][found[1]], w["char_end"][found[2]])
                best = chars if best is None or chars[0] > best[0] else best
        assert (answer["start"], answer["end"]) == (best[1], best[2])
        assert answer["answer"] == item["context"][best[1]:best[2]]
        assert answer["score"] == pytest.approx(best[0], abs=1e-4)
    assert max(a["windows"] for a in got) > 1  # a long context was windowed at the server
    with TestClient(create_app(Predictor(export_dir, "onnx"), deploy=deploy_settings(max_wait_ms=1))) as client:
        r = client.post("/predict", json={"questions": items})
        assert r.status_code == 200, r.text
        assert [p["answer"] for p in r.json()["predictions"]] == [a["answer"] for a in got]
        bad = client.post("/predict", json={"questions": [{"question": "问"}]})
        assert bad.status_code == 422 and "questions[0]" in bad.text
        assert client.get("/health").json()["max_answer_tokens"] == 30


def test_schemathesis_finds_no_failure_on_the_qa_api(exported, tmp_path):
    """The OpenAPI contract of a QA export ({"questions": [{question, context}]}) under
    `schemathesis run --checks all`, as tests/test_api.py runs it for the other tasks."""
    export_dir, _ = exported
    assert_every_case_passed(schemathesis_run(export_dir, tmp_path))
