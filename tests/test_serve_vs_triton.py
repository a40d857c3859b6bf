"""benchmarks/serve_vs_triton.py and benchmarks/triton_anchor.py without timing: perf_analyzer's
output parsed, the interleaved order, the token-id check and its refusal, the how-to message,
the PyTriton patch, the target verdicts.  No server, no perf_analyzer, no PyTriton needed."""
import ast
import json
import os

import pytest
from script_loader import load_script

from ppvarlen.data.vocab import TextEncoder
from ppvarlen.runtime.predictor import Predictor
from ppvarlen.tasks import get_task

# perf_analyzer 2.41's `-f out.csv --verbose-csv` and its printed report, as it writes them
CSV = ("Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,"
       "Server Compute Input,Server Compute Infer,Server Compute Output,Client Recv,p50 latency,"
       "p90 latency,p95 latency,p99 latency,request/response,response wait\n"
       "8,673.78,53,5779,3760,18,2172,68,0,11182,13898,15702,21231,53,11790\n")
STDOUT = """Request concurrency: 8
  Client: 
    Request count: 4860
    Throughput: 673.78 infer/sec
    p99 latency: 21231 usec
  Server: 
    Inference count: 4865
    Execution count: 627
    Successful request count: 4865
    Avg request latency: 7788 usec (overhead 1769 usec + queue 3760 usec + compute input 18 usec + compute infer 2172 usec + compute output 68 usec)
"""


@pytest.fixture(scope="module")
def bench():
    return load_script("benchmarks/serve_vs_triton.py")


@pytest.fixture(scope="module")
def anchor():
    return load_script("benchmarks/triton_anchor.py")


def test_the_csv_row_becomes_qps_and_latencies_in_ms(bench):
    rows = bench.parse_perf_csv(CSV)
    assert len(rows) == 1 and rows[0]["Concurrency"] == 8
    m = bench.measurement_from_row(rows[0])
    assert m["qps"] == 673.78
    assert (m["p50_ms"], m["p99_ms"]) == (11.182, 21.231)
    assert (m["server_queue_us"], m["server_compute_infer_us"]) == (3760, 2172)


def test_the_printed_report_gives_the_server_side_counts_and_mean_batch(bench):
    out = bench.parse_perf_stdout(STDOUT)
    assert out["client_requests"] == 4860
    assert (out["server_inference_count"], out["server_execution_count"]) == (4865, 627)
    assert out["server_mean_batch"] == 7.76
    assert out["server_avg_request_latency_us"] == 7788


def test_a_report_without_server_statistics_gives_none_not_zero(bench):
    client_only = STDOUT.split("  Server:")[0]
    out = bench.parse_perf_stdout(client_only)
    assert out["client_requests"] == 4860
    assert out["server_inference_count"] is None and out["server_mean_batch"] is None


def test_the_plan_interleaves_the_servers_at_every_point_and_alternates_who_goes_first(bench):
    plan = bench.interleaved_plan((1, 8), ("http", "grpc"), ("ppvarlen", "triton"), rounds=2)
    assert plan[:4] == [(0, 1, "http", "ppvarlen"), (0, 1, "http", "triton"),
                        (0, 1, "grpc", "ppvarlen"), (0, 1, "grpc", "triton")]
    assert plan[4:8] == [(0, 8, "http", "ppvarlen"), (0, 8, "http", "triton"),
                         (0, 8, "grpc", "ppvarlen"), (0, 8, "grpc", "triton")]
    assert plan[8:10] == [(1, 1, "http", "triton"), (1, 1, "http", "ppvarlen")]
    assert len(plan) == 16 and len(set(plan)) == 16
    for a, b in zip(plan[::2], plan[1::2]):  # each point's two servers run back to back
        assert a[:3] == b[:3] and a[3] != b[3]


def test_the_perf_analyzer_command_fixes_the_window_count_and_reads_p99(bench):
    cmd = bench.perf_analyzer_command("/pa", "m", "127.0.0.1:9", "grpc", 32, "in.json", 3000,
                                      "out.csv")
    joined = " ".join(cmd)
    assert "-i grpc" in joined and "--concurrency-range 32:32" in joined
    assert "--percentile=99" in cmd and "--shape text:1" in joined
    assert cmd[cmd.index("--max-trials") + 1] == str(bench.WINDOWS)
    assert cmd[cmd.index("--measurement-interval") + 1] == "3000"


def _tiny_export(path, texts, lowercase=False, max_len=8, kind="char"):
    """vocab.txt + encoder.json as ppvarlen saves them, and the manifest keys the anchor reads."""
    enc = TextEncoder.build(texts, kind, lowercase=lowercase)
    enc.save(str(path))
    manifest = {"task": "classification", "label_names": ["negative", "positive"],
                "inputs": [{"name": "input_ids"}, {"name": "seq_len"}],
                "outputs": [{"name": "logits"}],
                "tokenizer": {"kind": kind, "lowercase": lowercase,
                              "add_special_tokens": True},
                "max_len": max_len, "long_text": {"policy": "truncate", "max_len": max_len}}
    (path / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    return TextEncoder.load(str(path))


def _ppvarlen_encode(encoder, max_len, texts):
    """ids from ppvarlen's own Predictor.encode (the serving path), given its encoder."""
    predictor = Predictor(None, _shared={"encoder": encoder, "add_special_tokens": True,
                                         "max_len": max_len, "long_text": "truncate",
                                         "stride": 0, "split_long_sources": False,
                                         "task": get_task("classification")})
    return [predictor.encode(t).windows[0] for t in texts]


# spaces, U+3000, a tab and a backslash are escaped in vocab.txt; "[CLS]" typed in a text is
# not the special token; 好看吗 holds an unseen character; the long one is cut at max_len
TRAIN = ["这部电影真好看", "质量 太差了", "物流\u3000很快\t包装完好", "反斜杠\\也是字", "[CLS]"]
PROBES = TRAIN + ["好看吗", "[CLS] 真好", "这部电影真好看，质量太差了，物流很快"]


def test_the_anchor_tokenizer_gives_ppvarlens_ids_on_escapes_specials_unknowns_and_long_text(
        tmp_path, anchor, bench):
    encoder = _tiny_export(tmp_path, TRAIN)
    theirs = [anchor.AnchorTokenizer(str(tmp_path)).encode(t)[0] for t in PROBES]
    ours = _ppvarlen_encode(encoder, 8, PROBES)
    assert bench.check_tokenization(PROBES, ours, theirs) == len(PROBES)
    assert max(map(len, theirs)) == 8  # the long probe really was cut
    assert anchor.AnchorTokenizer(str(tmp_path)).encode(PROBES[-1])[1] is True


def test_a_special_token_typed_as_a_word_is_unknown_to_both(tmp_path, anchor, bench):
    texts = ["[CLS] good film", "bad [SEP] film [PAD]", "good"]
    encoder = _tiny_export(tmp_path, texts, kind="word")
    theirs = [anchor.AnchorTokenizer(str(tmp_path)).encode(t)[0] for t in texts]
    assert bench.check_tokenization(texts, _ppvarlen_encode(encoder, 8, texts), theirs) == 3
    assert theirs[0][1] == 1  # [UNK], not [CLS]


def test_the_anchor_lowercases_when_the_export_says_so(tmp_path, anchor, bench):
    texts = ["ABC good", "abc GOOD"]
    encoder = _tiny_export(tmp_path, texts, lowercase=True)
    theirs = [anchor.AnchorTokenizer(str(tmp_path)).encode(t)[0] for t in texts]
    assert bench.check_tokenization(texts, _ppvarlen_encode(encoder, 8, texts), theirs) == 2


def test_the_run_is_refused_when_the_anchor_tokenizes_differently(tmp_path, anchor, bench):
    texts = ["ABC good", "好看"]
    encoder = _tiny_export(tmp_path, texts, lowercase=True)
    tokenizer = anchor.AnchorTokenizer(str(tmp_path))
    tokenizer.lowercase = False  # an anchor that forgot the export's lowercasing
    theirs = [tokenizer.encode(t)[0] for t in texts]
    with pytest.raises(bench.TokenizationMismatch, match=r"1 of 2 texts.*text 0 'ABC good'"):
        bench.check_tokenization(texts, _ppvarlen_encode(encoder, 8, texts), theirs)
    with pytest.raises(bench.TokenizationMismatch, match="Refusing to measure"):
        bench.check_tokenization(texts, [[2, 3]], theirs)  # a missing id list is a mismatch


def test_the_anchor_refuses_exports_it_cannot_tokenize_like_ppvarlen(tmp_path, anchor):
    _tiny_export(tmp_path, TRAIN)
    manifest = json.loads((tmp_path / "manifest.json").read_text(encoding="utf-8"))
    manifest["long_text"] = {"policy": "window", "stride": 4}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    with pytest.raises(anchor.UnsupportedExport, match="only truncates"):
        anchor.AnchorTokenizer(str(tmp_path))
    manifest["long_text"] = "truncate"
    manifest["outputs"] = [{"name": "emissions"}]  # a tagger: logits per token, not per text
    (tmp_path / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    with pytest.raises(anchor.UnsupportedExport, match="text classifier"):
        anchor.AnchorTokenizer(str(tmp_path))


def test_the_anchor_pads_a_batch_to_its_longest_text(anchor):
    ids, lengths = anchor.pad_batch([[2, 7, 3], [2, 3]])
    assert ids.tolist() == [[2, 7, 3], [2, 3, 0]] and lengths.tolist() == [3, 2]


def test_answers_must_be_equal_but_for_float_noise_in_the_probabilities(bench):
    def body(labels, probs, tokens=(9, 4)):
        return {"outputs": [{"name": "label", "data": labels}, {"name": "probs", "data": probs},
                            {"name": "num_tokens", "data": list(tokens)}]}
    diff, differ = bench.compare_answers(body(["a", "b"], [0.9, 0.1, 0.2, 0.8]),
                                         body(["a", "b"], [0.9000004, 0.0999996, 0.2, 0.8]))
    assert differ == [] and diff < 1e-6
    diff, differ = bench.compare_answers(body(["a", "b"], [0.9, 0.1, 0.2, 0.8]),
                                         body(["a", "a"], [0.9, 0.1, 0.6, 0.4], (9, 5)))
    assert differ == ["label", "num_tokens"] and diff == pytest.approx(0.4)
    short = {"outputs": [{"name": "label", "data": ["a", "b"]}]}  # no probs at all
    assert bench.compare_answers(body(["a", "b"], [0.9, 0.1, 0.2, 0.8]), short) == \
        (float("inf"), ["num_tokens", "probs"])


def test_missing_perf_analyzer_prints_how_to_get_it(bench, monkeypatch, capsys):
    monkeypatch.setattr(bench, "DEFAULT_PERF_ANALYZER", "/nonexistent/perf_analyzer")
    path, looked = bench.find_perf_analyzer(environ={}, which=lambda name: None)
    assert path is None and "/nonexistent/perf_analyzer" in looked
    monkeypatch.setattr(bench, "find_perf_analyzer", lambda: (None, looked))
    assert bench.main(["--model-dir", "unused"]) == 2
    err = capsys.readouterr().err
    for step in ("bash tools/get_perf_analyzer.sh", "tritonclient 2.41.0", "libb64-0d",
                 "nvidia-cuda-runtime-cu12", "$PERF_ANALYZER"):
        assert step in err, step


def test_perf_analyzer_is_found_from_the_environment_and_its_cuda_runtime_beside_it(
        tmp_path, bench):
    binary = tmp_path / "tritonclient-2.41.0.data" / "data" / "bin" / "perf_analyzer"
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    lib = tmp_path / "nvidia" / "cuda_runtime" / "lib"
    lib.mkdir(parents=True)
    (lib / "libcudart.so.12").write_text("")
    path, _ = bench.find_perf_analyzer(environ={"PERF_ANALYZER": str(binary)},
                                       which=lambda name: None)
    assert path == str(binary)
    assert bench.cuda_runtime_dir(str(binary), environ={}) == str(lib)
    assert bench.cuda_runtime_dir(str(binary), environ={"PERF_ANALYZER_LIBS": "/x"}) == "/x"


DATA_PY = '''class _Popen:
    def _launch(self, process_obj):
        from multiprocessing import context, resource_tracker, spawn, util

        tracker_fd = resource_tracker.getfd()
        self._fds.append(tracker_fd)
'''


def test_the_pytriton_patch_goes_before_getfd_once_and_refuses_another_file(bench):
    patched, changed = bench.patch_resource_tracker_source(DATA_PY)
    assert changed and bench.PATCH_MARK in patched
    ast.parse(patched)  # indented like the line it precedes
    lines = patched.split("\n")
    fix = next(i for i, line in enumerate(lines) if "_PyRLock()" in line)
    assert lines[fix + 1].strip() == bench.PATCH_BEFORE
    assert bench.patch_resource_tracker_source(patched) == (patched, False)
    with pytest.raises(bench.PatchError, match="0.7"):
        bench.patch_resource_tracker_source("def f():\n    pass\n")


def _row(c, ratio_qps, p99_pp, p99_tr, protocol="http", qps_pp=None):
    qps_tr = 100.0
    return {"protocol": protocol, "concurrency": c, "ppvarlen_qps": qps_pp or qps_tr * ratio_qps,
            "triton_qps": qps_tr, "qps_ratio": ratio_qps, "ppvarlen_p99_ms": p99_pp,
            "triton_p99_ms": p99_tr, "p99_ratio": round(p99_pp / p99_tr, 2)}


def test_targets_met_only_when_every_point_from_8_up_is_2x_with_p99_no_worse(bench):
    rows = [_row(1, 0.5, 50, 10), _row(8, 2.1, 9, 10), _row(64, 2.0, 10, 10, qps_pp=700)]
    t = bench.evaluate_targets(rows, offline_texts_per_s=1000)
    assert t["qps_and_p99"]["met"] and t["qps_and_p99"]["points"] == 2  # c=1 is not judged
    assert t["offline_share"]["share"] == {"http": 0.7} and t["offline_share"]["met"]
    rows = [_row(8, 1.5, 9, 10), _row(64, 2.5, 12, 10, qps_pp=500)]
    t = bench.evaluate_targets(rows, offline_texts_per_s=1000)
    assert not t["qps_and_p99"]["met"]
    assert t["qps_and_p99"]["misses"][0].startswith("c=8 http: QPS 1.5x") and \
        "25.0% short" in t["qps_and_p99"]["misses"][0]
    assert "p99 12 vs 10 ms" in t["qps_and_p99"]["misses"][1]
    assert t["offline_share"]["share"] == {"http": 0.5} and not t["offline_share"]["met"]


def test_the_summary_takes_each_servers_median_over_rounds(bench):
    def m(server, qps, p99, r):
        return {"server": server, "protocol": "http", "concurrency": 8, "round": r, "qps": qps,
                "p99_ms": p99, "server_cpu_ms_per_text": 2.0 if server == "ppvarlen" else 3.0}
    ms = [m("ppvarlen", 300, 20, 0), m("ppvarlen", 500, 40, 1), m("ppvarlen", 400, 30, 2),
          m("triton", 200, 20, 0), m("triton", 200, 30, 1), m("triton", 200, 25, 2),
          {"server": "triton", "protocol": "http", "concurrency": 8, "round": 3, "error": "x"}]
    (row,) = bench.summarize(ms, (8,), ("http",))
    assert (row["ppvarlen_qps"], row["triton_qps"], row["qps_ratio"]) == (400, 200, 2.0)
    assert (row["ppvarlen_p99_ms"], row["triton_p99_ms"], row["p99_ratio"]) == (30, 25, 1.2)
    assert row["cpu_ratio"] == 0.67
    table = bench.format_table([row])
    assert "| HTTP | 8 | 400 | 200 | 2.0x | 30 | 25 | 1.2x | 2.0 / 3.0 |" in table


def test_cpu_per_text_and_the_statistics_count(bench):
    assert bench.cpu_ms_per_text(1.0, 3.0, 100, 1100) == 2.0
    assert bench.cpu_ms_per_text(1.0, 3.0, 100, 100) is None
    assert bench.cpu_ms_per_text(None, 3.0, 0, 10) is None
    stats = {"model_stats": [{"name": "m", "inference_count": 12}, {"inference_count": 3}]}
    assert bench.inference_count(stats) == 15


def test_the_anchor_runs_without_pytriton_installed_for_its_tokenizer(tmp_path, anchor):
    """--encode (the start-up check) imports neither PyTriton nor onnxruntime."""
    _tiny_export(tmp_path, TRAIN)
    src, dst = tmp_path / "texts.json", tmp_path / "ids.json"
    src.write_text(json.dumps(PROBES[:2], ensure_ascii=False), encoding="utf-8")
    assert anchor.main(["--model-dir", str(tmp_path), "--encode", str(src),
                        "--ids-out", str(dst)]) == 0
    ids = json.loads(dst.read_text(encoding="utf-8"))
    assert len(ids) == 2 and all(i[0] == 2 and i[-1] == 3 for i in ids)
    assert os.path.getsize(dst) > 0


def test_only_an_export_served_with_the_anchors_input_and_outputs_is_measured(bench):
    task = get_task("classification")
    inputs, outputs = bench.served_outputs(
        Predictor(None, _shared={"task": task, "label_names": ["negative", "positive"]}))
    assert (inputs, outputs) == (["text"], list(bench.ANCHOR_OUTPUTS))
    bench.check_anchor_can_mirror(inputs, outputs)
    tagger = Predictor(None, _shared={"task": get_task("tagging"), "label_names": ["B", "O"]})
    with pytest.raises(bench.SetupError, match="text classifier"):
        bench.check_anchor_can_mirror(*bench.served_outputs(tagger))
