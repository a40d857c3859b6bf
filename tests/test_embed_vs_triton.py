"""benchmarks/embed_vs_triton.py, benchmarks/closed_loop.py and the embedding mode of
benchmarks/triton_anchor.py without timing: the benchmark's own export, the anchor's ids and
embeddings equal to ppvarlen's, the closed-loop client's bodies accepted by a real ppvarlen
server (answers checked, numbers' structure), the answer check and its refusal, the
interleaved plan, the summary and table; benchmarks/machine.py.  No Triton, no perf_analyzer."""
import asyncio

import httpx
import numpy as np
import pytest
from script_loader import load_script
from test_server import RunningServer

from ppvarlen.runtime.predictor import Predictor
from ppvarlen.serve.server import create_app, deploy_settings

TRAIN = ["这部电影真好看", "质量 太差了", "物流\u3000很快\t包装完好", "反斜杠\\也是字", "好评",
         "江泽民主席在北京会见了客人，双方进行了友好的交谈"]
PROBES = TRAIN + ["好看吗", "[CLS] 真好", "这部电影真好看，质量太差了，物流很快，包装完好"]
TINY = {"hidden_size": 16, "num_layers": 1, "num_heads": 2, "ffn_size": 32, "max_position": 64}
MAX_LEN = 16


@pytest.fixture(scope="module")
def bench():
    return load_script("benchmarks/embed_vs_triton.py")


@pytest.fixture(scope="module")
def anchor():
    return load_script("benchmarks/triton_anchor.py")


@pytest.fixture(scope="module")
def client():
    return load_script("benchmarks/closed_loop.py")


@pytest.fixture(scope="module")
def export(bench, tmp_path_factory):
    """The benchmark's own export function, at test size."""
    out = str(tmp_path_factory.mktemp("embed_bench") / "export")
    manifest = bench.make_export(out, TRAIN, model_keys=TINY, max_len=MAX_LEN)
    return out, manifest


@pytest.fixture(scope="module")
def server(export):
    app = create_app(Predictor(export[0], "onnx"),
                     deploy=deploy_settings(max_wait_ms=2, max_texts_per_request=64))
    with RunningServer(app) as srv:
        yield srv


def test_the_benchmarks_export_is_a_random_init_embedding_model_of_the_asked_size(export, bench):
    _, manifest = export
    assert manifest["task"] == "embedding" and manifest["model_name"] == bench.MODEL_NAME
    assert manifest["embedding"] == {"dim": 16, "pooling": "mean", "normalize": True}
    assert [o["name"] for o in manifest["outputs"]] == ["embedding"]
    assert manifest["max_len"] == MAX_LEN


def test_the_anchor_tokenizes_an_embedding_export_as_ppvarlen_does(export, bench, anchor):
    tokenizer = anchor.AnchorTokenizer(export[0])
    assert (tokenizer.model_kind, tokenizer.dim) == ("embedding", 16)
    theirs = [tokenizer.encode(t)[0] for t in PROBES]
    ours = bench.svt.ppvarlen_ids(export[0], PROBES, bench.EMBED_OUTPUTS, bench.EMBED_WHAT)
    assert bench.svt.check_tokenization(PROBES, ours, theirs) == len(PROBES)
    assert max(map(len, theirs)) == MAX_LEN  # the long probe was cut


def test_the_classifier_benchmark_refuses_an_embedding_export(export, bench):
    with pytest.raises(bench.svt.SetupError, match="text classifier"):
        bench.svt.ppvarlen_ids(export[0], PROBES)


def test_the_anchors_batch_function_gives_ppvarlens_embeddings_in_a_mixed_length_batch(
        export, anchor):
    tokenizer = anchor.AnchorTokenizer(export[0])
    infer = anchor.make_infer(tokenizer, anchor.OnnxModel(export[0], threads=1))
    out = infer(np.array([[t.encode("utf-8")] for t in PROBES], dtype=object))
    assert out["embedding"].dtype == np.float32 and out["embedding"].shape == (len(PROBES), 16)
    ours = Predictor(export[0], "onnx").predict(PROBES)
    expected = np.array([r["embedding"] for r in ours], dtype=np.float32)
    assert np.max(np.abs(out["embedding"] - expected)) <= 1e-5
    assert out["num_tokens"].ravel().tolist() == [r["num_tokens"] for r in ours]
    assert out["truncated"].ravel().tolist() == [r["truncated"] for r in ours]
    assert out["truncated"].ravel().tolist()[-1] is True


def test_the_closed_loop_client_gets_checked_answers_from_both_ppvarlen_routes(
        export, server, bench, client):
    texts = PROBES[:5]
    for target in ("ppvarlen_openai", "ppvarlen_oip"):
        spec = bench.client_spec(target, {"ppvarlen": server.url}, bench.MODEL_NAME, texts,
                                 concurrency=2, warmup_s=0.1, duration_s=0.5, dim=16)
        out = client.run_spec(spec)
        assert out["errors"] == 0, (target, out["first_errors"])
        assert out["requests_total"] >= out["requests_in_window"] > 0
        assert out["p50_ms"] <= out["p99_ms"] and out["qps"] > 0
        assert out["concurrency"] == 2 and out["client_cpu_ms_per_request"] > 0
    wrong = bench.client_spec("ppvarlen_openai", {"ppvarlen": server.url}, bench.MODEL_NAME,
                              texts, concurrency=1, warmup_s=0.0, duration_s=0.3, dim=17)
    out = client.run_spec(wrong)  # an answer of another width is an error, never a sample
    assert out["errors"] == out["requests_total"] > 0 and out["requests_in_window"] == 0
    assert "17 floats" in out["first_errors"][0] and out["p99_ms"] is None


def test_the_client_speaks_triton_oip_with_the_batch_dim(bench):
    spec = bench.client_spec("triton_oip", {"triton": "http://t"}, "m", ["a", "b"], 8, 1, 2, 4)
    assert spec["url"] == "http://t/v2/models/m/infer" and spec["answer"] == "oip"
    assert spec["bodies"][1]["inputs"][0]["shape"] == [1, 1]
    assert spec["bodies"][1]["inputs"][0]["data"] == ["b"]
    spec = bench.client_spec("ppvarlen_openai", {"ppvarlen": "http://p"}, "m", ["a"], 8, 1, 2, 4)
    assert spec["bodies"] == [{"input": "a", "model": "m", "encoding_format": "float"}]


def test_a_server_that_does_not_answer_is_an_error_not_a_crash(client):
    out = asyncio.run(client.closed_loop("http://127.0.0.1:9/v1/embeddings", [{"input": "a"}],
                                         2, 0.0, 0.2, "openai", 4))
    assert out["errors"] == out["requests_total"] > 0
    assert out["first_errors"][0].startswith("no answer")


def test_the_answer_check_compares_all_three_routes(export, server, bench):
    texts = PROBES
    openai_answer = httpx.post(f"{server.url}/v1/embeddings",
                               json=bench.openai_body(texts, bench.MODEL_NAME)).json()
    oip = httpx.post(f"{server.url}/v2/models/{bench.MODEL_NAME}/infer",
                     json=bench.svt.infer_body(texts, False)).json()
    out = bench.compare_embeddings(openai_answer, oip, oip)
    assert out["differ"] == [] and out["max_diff_oip_vs_triton"] == 0.0
    assert out["max_diff_openai_vs_triton"] <= 1e-6
    other = {"outputs": [dict(t, data=[x + 1 for x in t["data"]])
                         if t["name"] == "num_tokens" else t for t in oip["outputs"]]}
    assert bench.compare_embeddings(openai_answer, oip, other)["differ"] == ["num_tokens"]
    short = {"outputs": [t for t in oip["outputs"] if t["name"] != "embedding"]}
    assert bench.compare_embeddings(openai_answer, oip, short)["max_diff_oip_vs_triton"] == \
        float("inf")


def test_the_plan_interleaves_every_point_and_alternates_who_goes_first(bench):
    plan = bench.interleaved_plan((8, 32), rounds=2)
    assert plan[:5] == [(0, 8, "client", "ppvarlen_openai"), (0, 8, "client", "ppvarlen_oip"),
                        (0, 8, "client", "triton_oip"), (0, 8, "perf_analyzer", "ppvarlen"),
                        (0, 8, "perf_analyzer", "triton")]
    assert [p[1] for p in plan[5:10]] == [32] * 5
    assert plan[10:13] == [(1, 8, "client", "triton_oip"), (1, 8, "client", "ppvarlen_oip"),
                           (1, 8, "client", "ppvarlen_openai")]
    assert len(plan) == 20 and len(set(plan)) == 20


def test_the_summary_takes_medians_and_the_table_pairs_ppvarlen_with_triton(bench):
    def m(view, target, qps, p99, r, errors=0):
        return {"view": view, "target": target, "concurrency": 8, "round": r, "qps": qps,
                "p50_ms": p99 / 2, "p99_ms": p99, "server_cpu_ms_per_text": 2.0,
                "client_cpu_ms_per_request": 0.5, "errors": errors}
    ms = [m("client", "ppvarlen_openai", 300, 20, 0), m("client", "ppvarlen_openai", 500, 40, 1),
          m("client", "ppvarlen_openai", 400, 30, 2), m("client", "triton_oip", 200, 20, 0),
          m("client", "triton_oip", 200, 30, 1), m("client", "triton_oip", 999, 1, 2, errors=3),
          m("perf_analyzer", "ppvarlen", 450, 25, 0), m("perf_analyzer", "triton", 150, 50, 0),
          {"view": "perf_analyzer", "target": "triton", "concurrency": 8, "round": 1,
           "error": "x"}]
    (row,) = bench.summarize(ms, (8,))
    assert row["client:ppvarlen_openai:qps"] == 400 and row["client:triton_oip:qps"] == 200
    assert row["client:ppvarlen_openai/triton_oip:qps_ratio"] == 2.0  # the failed point is out
    assert row["client:ppvarlen_openai/triton_oip:p99_ms_ratio"] == 1.2
    assert row["client:ppvarlen_oip:qps"] is None
    assert row["client:ppvarlen_oip/triton_oip:qps_ratio"] is None
    assert row["perf_analyzer:ppvarlen/triton:qps_ratio"] == 3.0
    table = bench.format_table([row]).splitlines()
    assert table[2] == ("| client: ppvarlen /v1/embeddings vs Triton OIP | 8 | 400.0 | 200.0 "
                        "| 2.0x | 15.0 / 12.5 | 30.0 / 25.0 | 2.0 / 2.0 | 0.5 / 0.5 |")
    assert table[3].startswith("| client: ppvarlen OIP vs Triton OIP | 8 | — | 200.0 | — |")
    assert table[4].startswith("| perf_analyzer: OIP REST, both | 8 | 450.0 | 150.0 | 3.0x |")


def test_percentiles_and_embeddings_read_from_either_api(client):
    assert client.percentile([1, 2, 3, 4], 50) == 2 and client.percentile([1, 2, 3, 4], 99) == 4
    assert client.percentile([], 50) is None
    assert client.embedding_of("openai", {"data": [{"embedding": [1.0]}]}) == [1.0]
    assert client.embedding_of("oip", {"outputs": [{"name": "num_tokens", "data": [3]},
                                                   {"name": "embedding", "data": [0.5]}]}) == [0.5]
    assert client.embedding_of("oip", {"error": "x"}) is None


def test_machine_reads_the_model_and_simd_flags(tmp_path):
    machine = load_script("benchmarks/machine.py")
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: AMD EPYC 7B13\n"
                       "flags\t\t: fpu sse4_1 sse4_2 fma avx avx2 avx512f amx_tile aes\n"
                       "processor\t: 1\nflags\t\t: fpu\n", encoding="utf-8")
    info = machine.machine(str(cpuinfo))
    assert info["cpu_model"] == "AMD EPYC 7B13"
    assert info["cpu_simd_flags"] == ["amx_tile", "avx", "avx2", "avx512f", "fma", "sse4_1",
                                      "sse4_2"]
    assert info["cpu_count"] >= 1 and len(info["loadavg"]) == 3
    missing = machine.machine(str(tmp_path / "none"))
    assert missing["cpu_model"] is None and missing["cpu_simd_flags"] == []
