"""Deploy of seq2seq exports: predictor (Paddle in-graph loop | ONNX + numpy loop) and server.

The export is a tiny random ``Seq2SeqTransformer`` whose EOS logit is biased so that outputs end
at different steps (some at EOS, some at their length limit, one empty), exported once per
session.  The reference is the dygraph model's ``greedy_decode`` of each source alone.
"""
import json
import os
import shutil

import httpx
import numpy as np
import pytest
from export_helpers import TEXTS, cls_export  # noqa: F401
from test_server import RunningServer, post, run_concurrently
from test_vocab import pair_counts

from ppvarlen.data.errors import DataError
from ppvarlen.runtime.manifest import UnservableExportError
from ppvarlen.runtime.predictor import Predictor
from ppvarlen.serve.server import create_app, deploy_settings

MAX_SOURCE = 16
LONG = "这是一段非常非常非常非常长的句子，超过了最大长度"  # > MAX_SOURCE chars
MIXED = TEXTS + ["好", "北京", "北京上海"]
PINYIN = ["zhe bu dian ying zhen hao kan", "bei jing shang hai", "jin tian tian qi bu cuo"]


def _tiny_model(vocab_size, output_size=None, seed=0):
    import paddle

    from ppvarlen.models.seq2seq import Seq2SeqTransformer

    paddle.seed(seed)
    model = Seq2SeqTransformer(vocab_size, hidden_size=16, num_heads=2, ffn_size=32, num_layers=1,
                               num_decoder_layers=1, dropout=0.0, max_position=32,
                               max_len_a=1.5, max_len_b=3, output_size=output_size)
    with paddle.no_grad():  # some rows end at EOS, others at their limit
        bias = np.zeros([output_size or vocab_size], dtype="float32")
        bias[model.eos_id] = 1.0
        model.out_proj.bias.set_value(bias)
    model.eval()
    return model


def make_seq2seq_export(out_dir, long_text="truncate"):
    """Export a tiny random seq2seq model with the exporter itself -> (out_dir, model, encoder)."""
    from ppvarlen.config import load_config
    from ppvarlen.data.vocab import TextEncoder
    from ppvarlen.export.exporter import export_model

    # targets of whole syllables ("word"): outputs join with spaces, as the trainer decodes them
    encoder = TextEncoder.build_seq2seq(*pair_counts(TEXTS + [LONG], PINYIN, "word"), kind="char",
                                        target_kind="word")
    # the decoder generates the target tokens only, as the trainer builds it
    model = _tiny_model(encoder.vocab_size, encoder.output_size)
    meta = {"task": "seq2seq", "model_name": "seq2seq", "label_names": [], "num_labels": 0,
            "special_ids": encoder.special_ids, "max_len": MAX_SOURCE,
            "max_source_len": MAX_SOURCE, "max_position": model.max_position,
            "long_text": long_text,
            "length_profile": {"p50": 6, "p95": 13, "p99": 16, "max": 16}}
    cfg = load_config(overrides=["Data.corpus=g2p", f"Data.max_source_len={MAX_SOURCE}",
                                 f"Data.long_text={long_text}"])
    export_model(model, meta, encoder, cfg, out_dir, ("paddle", "onnx"), ("fp32",), False)
    return out_dir, model, encoder


@pytest.fixture(scope="session")
def s2s_export(tmp_path_factory):
    return make_seq2seq_export(str(tmp_path_factory.mktemp("s2s") / "export"))


def reference(model, encoder, texts):
    """Dygraph greedy output of each source alone (truncated to MAX_SOURCE like the export)."""
    out = []
    for t in texts:
        ids = encoder.encode(encoder.tokenize(t))[:MAX_SOURCE]
        out.append(model.greedy_decode(np.array([ids], dtype="int64"),
                                       np.array([len(ids)], dtype="int64"))[0])
    return out


def _edit_manifest(src, dst, edit):
    """Copy an export and change its manifest (the manifest itself is not hashed)."""
    shutil.copytree(src, dst)
    path = os.path.join(dst, "manifest.json")
    with open(path, encoding="utf-8") as f:
        m = json.load(f)
    edit(m)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(m, f)
    return dst


@pytest.mark.parametrize("backend", ["paddle", "onnx", "paddle_without_onednn"])
def test_predictor_equals_dygraph_greedy_in_input_order(s2s_export, backend, tmp_path):
    export_dir, model, encoder = s2s_export
    if backend == "paddle_without_onednn":  # an exporter setting the engine must honour
        export_dir = _edit_manifest(export_dir, str(tmp_path / "x"), lambda m: m["backends"][
            "paddle"].update(settings={"fp32": {"enable_onednn": False}}))
        backend = "paddle"
    texts = MIXED + [LONG]
    want = reference(model, encoder, texts)
    assert len({len(w) for w in want}) > 3 and [] in want  # outputs really end at different steps
    # a small budget forces several length-sorted batches of mixed source lengths
    p = Predictor(export_dir, backend, max_batch_tokens=MAX_SOURCE * 3, max_batch_size=4)
    got = p.predict(texts)
    assert [g["output_ids"] for g in got] == want
    for t, g in zip(texts, got):
        assert g["output"] == encoder.decode_target(g["output_ids"])
        assert g["output"].count(" ") == max(len(g["output_ids"]) - 1, 0)  # target_kind kept
        assert g["num_tokens"] == min(len(t), MAX_SOURCE)
        assert g["truncated"] == (len(t) > MAX_SOURCE)
    assert 0 < p.real_tokens / p.padded_tokens < 1
    assert 0 < p.real_target_tokens / p.padded_target_tokens < 1


def _with_policy(src, dst, policy):
    return _edit_manifest(src, dst, lambda m: m["long_text"].update(policy=policy))


def test_error_policy_names_text_length_and_limit(s2s_export, tmp_path):
    p = Predictor(_with_policy(s2s_export[0], str(tmp_path / "e"), "error"), "onnx")
    with pytest.raises(DataError, match=rf"text 1: text has {len(LONG)} tokens .* at most "
                                        rf"{MAX_SOURCE} .*Deploy.split_long_sources=true"):
        p.predict(["好", LONG])
    with pytest.raises(DataError, match="text 0: text is empty"):
        p.predict([" "])
    with pytest.raises(UnservableExportError, match="'window' cannot be served for seq2seq"):
        Predictor(_with_policy(s2s_export[0], str(tmp_path / "w"), "window"), "onnx")


@pytest.mark.parametrize("backend", ["paddle", "onnx"])
def test_split_long_sources_decodes_each_clause_piece_and_joins_them(s2s_export, backend, tmp_path):
    from ppvarlen.data.longtext import clause_spans

    export_dir, model, encoder = s2s_export
    export_dir = _with_policy(export_dir, str(tmp_path / "e"), "error")  # split beats the policy
    long2 = "北京上海，" + LONG + "。好"  # 31 chars: "北京上海，" | 16 (no clause end) | the rest
    p = Predictor(export_dir, backend, split_long_sources=True, max_batch_tokens=MAX_SOURCE * 2)
    got = p.predict([long2, "好", LONG])
    for text, g in zip([long2, "好", LONG], got):
        tokens = encoder.tokenize(text)
        pieces = ["".join(tokens[s:e]) for s, e in clause_spans(tokens, MAX_SOURCE)]
        assert g["pieces"] == len(pieces) and g["num_tokens"] == len(text) and not g["truncated"]
        assert g["output_ids"] == [i for ids in reference(model, encoder, pieces) for i in ids]
        assert g["output"] == encoder.decode_target(g["output_ids"])
    assert [g["pieces"] for g in got] == [3, 1, 2]
    assert clause_spans(encoder.tokenize(long2), MAX_SOURCE)[0] == (0, 5)  # cut after "，"


def test_server_splits_long_sources_when_told_and_counts_them(s2s_export, tmp_path):
    export_dir = _with_policy(s2s_export[0], str(tmp_path / "e"), "error")
    want = Predictor(export_dir, "onnx", split_long_sources=True).predict(["好", LONG])
    app = create_app(Predictor(export_dir, "onnx", split_long_sources=True), deploy=deploy_settings(max_wait_ms=1))
    with RunningServer(app) as srv:
        r = post(srv.url, {"texts": ["好", LONG]})
        metrics = httpx.get(srv.url + "/metrics.json").json()
    assert r.status_code == 200, r.text
    assert r.json()["predictions"] == want and want[1]["pieces"] == 2
    assert metrics["split_texts"] == 1 and metrics["truncated_texts"] == 0


def test_split_long_sources_is_refused_for_other_tasks(cls_export):
    with pytest.raises(ValueError, match="split_long_sources is for seq2seq exports"):
        Predictor(cls_export[0], "onnx", split_long_sources=True)


def test_server_concurrent_requests_match_predictor(s2s_export):
    export_dir = s2s_export[0]
    pool = MIXED + [LONG]
    want = dict(zip(pool, Predictor(export_dir, "onnx").predict(pool)))
    app = create_app(Predictor(export_dir, "paddle"), deploy=deploy_settings(workers=2, max_wait_ms=20))
    requests = [[pool[(k + j) % len(pool)] for j in range(1 + k % 4)] for k in range(12)]
    with RunningServer(app) as srv:
        replies = run_concurrently(lambda texts: post(srv.url, {"texts": texts}),
                                   [(r,) for r in requests])
        metrics = httpx.get(srv.url + "/metrics.json").json()
        health = httpx.get(srv.url + "/health").json()
    for texts, reply in zip(requests, replies):
        assert reply.status_code == 200, reply.text
        assert reply.json()["predictions"] == [want[t] for t in texts]
    assert metrics["truncated_texts"] == sum(len(t) > MAX_SOURCE for r in requests for t in r) > 0
    assert 0 < metrics["decode_steps_efficiency"] <= 1
    assert health["task"] == "seq2seq"


def test_server_error_policy_answers_4xx_naming_the_field(s2s_export, tmp_path):
    export_dir = _with_policy(s2s_export[0], str(tmp_path / "e"), "error")
    app = create_app(Predictor(export_dir, "onnx"), deploy=deploy_settings(max_wait_ms=1))
    with RunningServer(app) as srv:
        r = post(srv.url, {"texts": ["好", LONG]})
        assert r.status_code == 422
        assert r.json()["field"] == "texts[1]"
        assert f"{len(LONG)} tokens" in r.json()["error"]
        assert post(srv.url, {"texts": ["好"]}).status_code == 200


def test_infer_script_reads_seq2seq_jsonl(s2s_export, tmp_path):
    import subprocess
    import sys

    from test_infer_file import INFER

    export_dir = s2s_export[0]
    lines = [json.dumps({"source": MIXED[0], "target": "x"}, ensure_ascii=False), "{oops",
             json.dumps({"text": MIXED[2]}, ensure_ascii=False),
             json.dumps({"source": LONG}, ensure_ascii=False)]
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    r = subprocess.run([sys.executable, INFER, "--no-progress", "--model-dir", export_dir,
                        "--backend", "paddle", "--input", str(src), "--output", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and f"{src}:2: not valid JSON" in r.stderr, r.stderr
    summary = json.loads(r.stderr.strip().splitlines()[-1])
    assert summary["predicted"] == 3 and 0 < summary["decode_steps_efficiency"] <= 1
    records = [json.loads(x) for x in out.read_text(encoding="utf-8").splitlines()]
    want = Predictor(export_dir, "onnx").predict([MIXED[0], MIXED[2], LONG])
    assert [records[i] for i in (0, 2, 3)] == [{"line": n, **w} for n, w in zip((1, 3, 4), want)]


def test_manifest_without_decoding_is_refused(s2s_export, tmp_path):
    dst = _edit_manifest(s2s_export[0], str(tmp_path / "x"), lambda m: m["decoding"].pop("eos_id"))
    with pytest.raises(UnservableExportError, match="decoding.eos_id is missing"):
        Predictor(dst, "paddle")


def test_bench_draws_g2p_sources_for_a_seq2seq_export(s2s_export):
    from ppvarlen.serve.bench import split_texts

    texts = split_texts(s2s_export[0])
    # clauses packed to the export's max_len
    assert len(texts) > 1000 and max(map(len, texts)) <= MAX_SOURCE
    chinese = sum(any("\u4e00" <= ch <= "\u9fff" for ch in t) for t in texts)
    assert chinese > len(texts) / 2  # g2p sources, not sentiment reviews (those exceed max_len)


class _TimedEngine:
    """A fake seq2seq engine whose run costs ``fixed + per_row x rows`` seconds of a fake clock
    (``clock``, patched over time.perf_counter): the timing is exact however loaded the host."""

    def __init__(self, fixed, per_row, clock):
        self.fixed, self.per_row, self.clock = fixed, per_row, clock

    def run(self, src_ids, src_len):
        self.clock[0] += self.fixed + self.per_row * len(src_len)
        return {"output_ids": [[7]] * len(src_len)}


def test_overhead_is_measured_in_rows_at_the_median_length(s2s_export, monkeypatch):
    import time

    clock = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    p = Predictor(s2s_export[0], "onnx", max_batch_tokens=512)
    median = min(p.manifest["length_profile"]["p50"], p.max_len)
    p.engine = _TimedEngine(0.06, 0.012, clock)  # a run costs as much as 5 rows
    # hand-worked: time = 0.06 + 0.012 x rows = 0.06 + (0.012 / median) x tokens, so the fixed
    # cost is 0.06 / (0.012 / median) = 5 x median tokens (int() may round 1 down)
    assert 5 * median - 1 <= p.measure_overhead_tokens() <= 5 * median
    p.engine = _TimedEngine(0.06, 0.0, clock)  # rows are free (Paddle's loop): merge whatever fits
    assert p.measure_overhead_tokens() == 512
    assert p.real_tokens == p.padded_target_tokens == 0  # timing runs are not counted
