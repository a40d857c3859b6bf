"""Serving an embedding export (ppvarlen/serve/protocols/openai/routes.py, the OIP's FP32 embedding):
the OFFICIAL ``openai`` client's ``embeddings.create`` gets float and base64 embeddings equal
to the eager model's; bad input gets the OpenAI error object with a 4xx (the client raises its
own error types); ``dimensions`` refused or cut per the manifest; auth, metrics, repository
model selection; tritonclient over REST and gRPC gets ``embedding`` as FP32 [-1, D] equal to
/v1/embeddings; and the schemathesis fuzzer finds nothing on the documented API.

The model is a tiny random-init ``transformer_embed`` exported by the exporter itself (ONNX);
one copy of the export is edited to the 'error' long-text policy and marked truncatable.
"""
import base64
import json
import os
import shutil
import sys

import httpx
import numpy as np
import openai
import paddle
import pyarrow.parquet as pq
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from fastapi.testclient import TestClient
from test_api import assert_every_case_passed, schemathesis_run
from export_helpers import TEXTS, cls_export  # noqa: F401
from test_prometheus import samples, value
from test_server import RunningServer

from ppvarlen.cli import main_infer
from ppvarlen.config import load_config
from ppvarlen.data.errors import DataError
from ppvarlen.data.vocab import TextEncoder
from ppvarlen.runtime import embedding_files
from ppvarlen.serve.protocols.openai import routes as routes_openai
from ppvarlen.runtime.infer import run_file
from ppvarlen.runtime.predictor import Predictor
from ppvarlen.serve.server import create_app, deploy_settings
from ppvarlen.export.exporter import export_model
from ppvarlen.models import build_model

DIM, MAX_LEN = 16, 16
TOKEN = "t0k3n-" + "y" * 26
MIXED = ["好", "这部电影真好看", "江泽民主席在北京会见了客人，双方进行了友好的交谈", "质量一般般"]
LIMITS = dict(max_texts_per_request=8, max_text_chars=120, max_body_bytes=4096,
              batch_overhead_tokens=8, max_wait_ms=2)


def make_embed_export(out_dir, seed=0):
    """A random-init transformer_embed (mean pooling, L2-normalised) exported to ONNX ->
    (export dir, eager model, encoder)."""
    paddle.seed(seed)
    encoder = TextEncoder.build(TEXTS + MIXED, kind="char")
    model = build_model({"name": "transformer_embed", "hidden_size": DIM, "num_layers": 1,
                         "num_heads": 2, "ffn_size": 32, "dropout": 0.0, "max_position": 64},
                        encoder.vocab_size, 0, encoder.pad_id, "embedding")
    model.eval()
    meta = {"task": "embedding", "model_name": "tiny_embed", "label_names": [],
            "special_ids": encoder.special_ids, "max_len": MAX_LEN, "max_position": 64,
            "long_text": "truncate", "length_profile": {"p50": 8, "p95": 12, "p99": 14,
                                                        "max": 16},
            "embedding": {"dim": DIM, "pooling": "mean", "normalize": True}}
    cfg = load_config(overrides=["Data.corpus=sentiment", f"Data.max_len={MAX_LEN}"])
    export_model(model, meta, encoder, cfg, out_dir, ("onnx",), ("fp32",), verify=False)
    return out_dir, model, encoder


def edited_copy(export_dir, out_dir, **embedding):
    """A copy of ``export_dir`` under the 'error' long-text policy with ``embedding`` keys
    over the manifest's (manifest.json is the export's description, not hashed)."""
    shutil.copytree(export_dir, out_dir)
    path = os.path.join(out_dir, "manifest.json")
    with open(path, encoding="utf-8") as f:
        manifest = json.load(f)
    manifest["long_text"]["policy"] = "error"
    manifest["embedding"].update(embedding)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(manifest, f)
    return out_dir


def eager(model, encoder, texts):
    """The eager model on each text alone, as the export encodes it ([CLS] text [SEP])."""
    out = []
    for t in texts:
        ids = [encoder.cls_id] + list(encoder.encode_array(t))[:MAX_LEN - 2] + [encoder.sep_id]
        with paddle.no_grad():
            out.append(model(paddle.to_tensor([ids]), paddle.to_tensor([len(ids)])).numpy()[0])
    return np.stack(out)


@pytest.fixture(scope="module")
def embed_export(tmp_path_factory):
    return make_embed_export(str(tmp_path_factory.mktemp("embed") / "export"))


@pytest.fixture(scope="module")
def served(embed_export):
    """One export, behind a bearer token on every route, with gRPC."""
    app = create_app(Predictor(embed_export[0], "onnx"), auth_token=TOKEN, grpc_port=0,
                     deploy=deploy_settings(auth_all_routes=True, **LIMITS))
    with RunningServer(app) as srv:
        srv.grpc_port = app.state.grpc.port
        yield srv


@pytest.fixture(scope="module")
def repository(embed_export, cls_export, tmp_path_factory):  # noqa: F811
    """A repository: embed (the export), strict (error policy, truncatable), sentiment (a
    classifier)."""
    root = tmp_path_factory.mktemp("repo")
    shutil.copytree(embed_export[0], root / "embed" / "1")
    edited_copy(embed_export[0], str(root / "strict" / "1"), truncatable=True)
    shutil.copytree(cls_export[0], root / "sentiment" / "1")
    app = create_app(repository=str(root), load_predictor=lambda d: Predictor(d, "onnx"),
                     deploy=deploy_settings(repository_poll_s=None, **LIMITS))
    with RunningServer(app) as srv:
        yield srv


def client(srv, key=TOKEN):
    return openai.OpenAI(base_url=f"{srv.url}/v1", api_key=key, max_retries=0, timeout=60)


def post(srv, body, token=TOKEN, **kw):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if isinstance(body, (bytes, str)):
        kw["content"] = body
    else:
        kw["json"] = body
    return httpx.post(srv.url + "/v1/embeddings", headers=headers, timeout=60, **kw)


def embeddings_of(answer):
    return np.array([d.embedding for d in answer.data], np.float32)


# ------------------------------------------------------------ the official client
def test_openai_client_gets_float_and_base64_equal_to_eager(served, embed_export):
    _, model, encoder = embed_export
    want = eager(model, encoder, MIXED)
    api = client(served)
    as_float = api.embeddings.create(model="tiny_embed", input=MIXED, encoding_format="float")
    assert as_float.object == "list" and as_float.model == "tiny_embed"
    assert [d.index for d in as_float.data] == list(range(len(MIXED)))
    assert all(d.object == "embedding" for d in as_float.data)
    np.testing.assert_allclose(embeddings_of(as_float), want, atol=1e-5, rtol=0)
    # the client's default: it asks for base64 and decodes it (numpy, float32) itself
    default = api.embeddings.create(model="tiny_embed", input=MIXED)
    assert np.array_equal(embeddings_of(default), embeddings_of(as_float))
    raw = api.embeddings.create(model="tiny_embed", input=MIXED, encoding_format="base64")
    decoded = np.stack([np.frombuffer(base64.b64decode(d.embedding), "<f4") for d in raw.data])
    assert np.array_equal(decoded, embeddings_of(as_float))
    one = api.embeddings.create(model="tiny_embed", input=MIXED[1], user="someone")
    assert len(one.data) == 1  # alone, it equals itself in the mixed-length batch
    np.testing.assert_allclose(embeddings_of(one)[0], want[1], atol=1e-5, rtol=0)
    # usage: the tokens the model read (special tokens excluded), as /predict counts them
    predict = httpx.post(served.url + "/predict", json={"texts": MIXED}, timeout=60,
                         headers={"Authorization": f"Bearer {TOKEN}"}).json()["predictions"]
    tokens = sum(p["num_tokens"] for p in predict)
    assert as_float.usage.prompt_tokens == as_float.usage.total_tokens == tokens
    assert tokens == sum(min(len(t), MAX_LEN - 2) for t in MIXED)  # one token a character
    np.testing.assert_allclose(embeddings_of(as_float), [p["embedding"] for p in predict],
                               atol=1e-6, rtol=0)


@pytest.mark.parametrize("body, status, param, code", [
    ({"model": "tiny_embed", "input": []}, 400, "input", None),
    ({"model": "tiny_embed", "input": ""}, 400, "input[0]", None),
    ({"model": "tiny_embed", "input": ["ok", " \t"]}, 400, "input[1]", None),
    ({"model": "tiny_embed", "input": [1, 2, 3]}, 400, "input", "unsupported_input"),
    ({"model": "tiny_embed", "input": [[1, 2], [3]]}, 400, "input", "unsupported_input"),
    ({"model": "tiny_embed", "input": ["ok", 3]}, 400, "input[1]", None),
    ({"model": "tiny_embed", "input": {"text": "x"}}, 400, "input", None),
    ({"model": "tiny_embed", "input": ["长" * 121]}, 400, "input[0]", None),
    ({"model": "tiny_embed"}, 400, "input", None),
    ({"input": "x"}, 400, "model", None),
    ({"input": "x", "model": 7}, 400, "model", None),
    ({"input": "x", "model": "tiny_embed", "encoding_format": "fp16"}, 400,
     "encoding_format", None),
    ({"input": "x", "model": "tiny_embed", "dimensions": True}, 400, "dimensions", None),
    ({"input": "x", "model": "tiny_embed", "dimensions": 0}, 400, "dimensions", None),
    ({"input": "x", "model": "tiny_embed", "dimensions": 8}, 400, "dimensions", None),
    ({"input": "x", "model": "tiny_embed", "dimensions": DIM + 1}, 400, "dimensions", None),
    ({"input": "x", "model": "tiny_embed", "user": "u" * 257}, 400, "user", None),
    ({"input": "x", "model": "tiny_embed", "temperature": 1}, 400, "temperature", None),
    ({"input": "x", "model": "gpt-9"}, 404, "model", "model_not_found"),
    (["x"], 400, None, None),
    (b"{not json", 400, "body", None),
    ('{"input": "\\ud800", "model": "tiny_embed"}', 400, "body.input", None),
    ('{"input": "x", "model": "tiny_embed", "dimensions": NaN}', 400, "body", None),
    (b"[" * 100000 + b"]" * 100000, 413, "body", None),
])
def test_bad_input_gets_the_openai_error_object(served, body, status, param, code):
    r = post(served, body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert error["type"] == "invalid_request_error" and error["message"]
    assert (error["param"], error["code"]) == (param, code), error


def test_the_client_raises_its_own_error_types(served):
    api = client(served)
    with pytest.raises(openai.BadRequestError) as e:
        api.embeddings.create(model="tiny_embed", input=[])
    assert e.value.param == "input" and e.value.type == "invalid_request_error"
    with pytest.raises(openai.BadRequestError, match="token-id inputs"):
        api.embeddings.create(model="tiny_embed", input=[[5, 6, 7]])
    with pytest.raises(openai.BadRequestError, match="not trained to be truncated"):
        api.embeddings.create(model="tiny_embed", input="x", dimensions=4)
    with pytest.raises(openai.NotFoundError) as e:
        api.embeddings.create(model="text-embedding-3-small", input="x")
    assert e.value.code == "model_not_found"
    with pytest.raises(openai.AuthenticationError) as e:
        client(served, key="wrong").embeddings.create(model="tiny_embed", input="x")
    assert e.value.code == "invalid_api_key" and e.value.param == "Authorization"


def test_auth_is_the_other_routes_and_probes_stay_open(embed_export):
    for all_routes in (False, True):
        app = create_app(Predictor(embed_export[0], "onnx"), auth_token=TOKEN,
                         deploy=deploy_settings(auth_all_routes=all_routes, **LIMITS))
        with TestClient(app) as http:
            body = {"model": "tiny_embed", "input": "x"}
            for headers in ({}, {"Authorization": "Bearer wrong"}):
                r = http.post("/v1/embeddings", json=body, headers=headers)
                assert r.status_code == (401 if all_routes else 200), r.text
                if all_routes:
                    assert r.json()["error"]["code"] == "invalid_api_key"
            r = http.post("/v1/embeddings", json=body,
                          headers={"Authorization": f"Bearer {TOKEN}"})
            assert r.status_code == 200, r.text
            assert http.get("/v2/health/ready").status_code == 200


def test_metrics_and_version_stats_count_the_route(served):
    auth = {"Authorization": f"Bearer {TOKEN}"}
    before = samples(httpx.get(served.url + "/metrics", headers=auth).text)
    stats0 = httpx.get(served.url + "/v2/models/tiny_embed/stats", headers=auth).json()
    for texts in (["好"], MIXED[:3]):
        assert post(served, {"model": "tiny_embed", "input": texts}).status_code == 200
    assert post(served, {"model": "tiny_embed", "input": []}).status_code == 400
    after = samples(httpx.get(served.url + "/metrics", headers=auth).text)

    def delta(name, **labels):
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("ppvarlen_requests_total", route="/v1/embeddings", status="200") == 2
    assert delta("ppvarlen_requests_total", route="/v1/embeddings", status="400") == 1
    stats = httpx.get(served.url + "/v2/models/tiny_embed/stats", headers=auth).json()
    count = [s["inference_count"] for s in (stats0, stats)
             for s in s["model_stats"]]
    assert count[1] - count[0] == 4  # texts answered


# ------------------------------------------------------------ repository, dimensions
def test_the_repository_selects_by_model_and_refuses_a_classifier(repository, embed_export):
    api = client(repository, key="unused")  # no token configured: any key is fine
    _, model, encoder = embed_export
    want = eager(model, encoder, MIXED[:2])
    for name in ("embed", "strict"):
        got = api.embeddings.create(model=name, input=MIXED[:2])
        assert got.model == name
        np.testing.assert_allclose(embeddings_of(got), want, atol=1e-5, rtol=0)
    with pytest.raises(openai.BadRequestError) as e:
        api.embeddings.create(model="sentiment", input="x")
    assert e.value.code == "model_not_embedding" and "classification" in e.value.message
    with pytest.raises(openai.NotFoundError, match="embed.*sentiment.*strict"):
        api.embeddings.create(model="nope", input="x")
    # the 'error' policy: a text over max_len tokens is refused, the truncating model cuts it
    long_text = "长" * (MAX_LEN + 3)
    with pytest.raises(openai.BadRequestError, match="tokens") as e:
        api.embeddings.create(model="strict", input=["ok", long_text])
    assert e.value.param == "input[1]"
    assert len(api.embeddings.create(model="embed", input=long_text).data) == 1
    doc = httpx.get(repository.url + "/openapi.json").json()
    options = doc["components"]["schemas"]["EmbeddingsRequest"]["anyOf"]
    assert [o["properties"]["model"]["enum"] for o in options] == [["embed"], ["strict"]]
    dims = {o["properties"]["model"]["enum"][0]: o["properties"]["dimensions"]
            for o in options}
    assert (dims["embed"]["minimum"], dims["strict"]["minimum"]) == (DIM, 1)


def test_dimensions_cut_and_renormalise_where_the_manifest_allows(repository):
    api = client(repository, key="unused")
    short = [t for t in MIXED if len(t) <= MAX_LEN - 2]  # 'strict' refuses longer ones
    full = embeddings_of(api.embeddings.create(model="strict", input=short))
    same = embeddings_of(api.embeddings.create(model="embed", input=short, dimensions=DIM))
    np.testing.assert_array_equal(full, same)
    for d in (1, 5, 8):
        cut = embeddings_of(api.embeddings.create(model="strict", input=short, dimensions=d))
        assert cut.shape == (len(short), d)
        want = full[:, :d] / np.linalg.norm(full[:, :d], axis=1, keepdims=True)
        np.testing.assert_allclose(cut, want, atol=1e-6, rtol=0)
        np.testing.assert_allclose(np.linalg.norm(cut, axis=1), 1.0, atol=1e-6)
    with pytest.raises(openai.BadRequestError, match="at most 16") as e:
        api.embeddings.create(model="strict", input="x", dimensions=DIM + 1)
    assert e.value.param == "dimensions"


def test_a_cut_is_renormalised_only_when_the_model_normalises():
    results = [{"embedding": [3.0, 4.0, 12.0]}, {"embedding": [0.0, 2.0, 1.0]}]
    spec = {"field": "embedding", "dim": 3, "normalize": True, "truncatable": True}
    np.testing.assert_allclose(routes_openai.vectors(results, spec, 2),
                               [[0.6, 0.8], [0.0, 1.0]], atol=1e-7)
    raw = routes_openai.vectors(results, dict(spec, normalize=False), 2)
    assert raw.dtype == np.float32 and raw.tolist() == [[3.0, 4.0], [0.0, 2.0]]
    assert routes_openai.vectors(results, spec).shape == (2, 3)


# ------------------------------------------------------------ the Open Inference Protocol
def test_triton_clients_get_fp32_embeddings_equal_to_v1(served):
    auth = {"Authorization": f"Bearer {TOKEN}"}
    want = embeddings_of(client(served).embeddings.create(model="tiny_embed", input=MIXED,
                                                          encoding_format="float"))
    http = thttp.InferenceServerClient(served.url.removeprefix("http://"))
    meta = http.get_model_metadata("tiny_embed", headers=auth)
    out = {o["name"]: o for o in meta["outputs"]}
    assert out["embedding"]["datatype"] == "FP32" and out["embedding"]["shape"] == [-1, DIM]
    config = http.get_model_config("tiny_embed", headers=auth)
    spec = {o["name"]: o for o in config["output"]}["embedding"]
    assert spec["data_type"] == "TYPE_FP32" and spec["dims"] == [-1, DIM]
    for binary in (False, True):
        tensor = thttp.InferInput("text", [len(MIXED)], "BYTES")
        tensor.set_data_from_numpy(np.array([t.encode() for t in MIXED], np.object_),
                                   binary_data=binary)
        result = http.infer("tiny_embed", [tensor], headers=auth, outputs=[
            thttp.InferRequestedOutput("embedding", binary_data=binary)])
        got = result.as_numpy("embedding")
        assert got.dtype == np.float32 and got.shape == (len(MIXED), DIM)
        np.testing.assert_array_equal(got, want)
    grpc = tgrpc.InferenceServerClient(f"127.0.0.1:{served.grpc_port}")
    metadata = {"authorization": f"Bearer {TOKEN}"}
    gmeta = grpc.get_model_metadata("tiny_embed", headers=metadata, as_json=True)
    gout = {o["name"]: o for o in gmeta["outputs"]}["embedding"]
    assert gout["datatype"] == "FP32" and gout["shape"] == [str(-1), str(DIM)]
    tensor = tgrpc.InferInput("text", [len(MIXED)], "BYTES")
    tensor.set_data_from_numpy(np.array([t.encode() for t in MIXED], np.object_))
    got = grpc.infer("tiny_embed", [tensor], headers=metadata).as_numpy("embedding")
    assert got.dtype == np.float32 and got.shape == (len(MIXED), DIM)
    np.testing.assert_array_equal(got, want)


# ------------------------------------------------------------ the documented contract
def test_openapi_declares_the_route_only_for_embedding_models(served, cls_export):  # noqa: F811
    auth = {"Authorization": f"Bearer {TOKEN}"}
    doc = httpx.get(served.url + "/openapi.json", headers=auth).json()
    post_doc = doc["paths"]["/v1/embeddings"]["post"]
    assert set(post_doc["responses"]) == {"200", "400", "404", "413", "500", "503"}
    request = doc["components"]["schemas"]["EmbeddingsRequest"]
    assert request["properties"]["model"]["enum"] == ["tiny_embed"]
    assert request["properties"]["input"]["oneOf"][1]["maxItems"] == routes_openai.MAX_INPUTS
    with TestClient(create_app(Predictor(cls_export[0], "onnx"),
                               deploy=deploy_settings(**LIMITS))) as http:
        assert "/v1/embeddings" not in http.get("/openapi.json").json()["paths"]
        r = http.post("/v1/embeddings", json={"model": "tiny", "input": "x"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "model_not_embedding"


def test_schemathesis_finds_no_failure_on_the_embedding_api(embed_export, tmp_path):
    """`schemathesis run --checks all` against a server of the embedding export: /predict,
    the OIP and /v1/embeddings, positive and negative cases."""
    assert_every_case_passed(schemathesis_run(embed_export[0], tmp_path))


# ------------------------------------------------------------ ppvarlen-infer: .npy, Parquet
CORPUS = MIXED + TEXTS + ["长" * (MAX_LEN + 5)]  # 12 lines, one truncated


def corpus_file(path, lines=CORPUS, bad_at=None):
    rows = [json.dumps({"text": t, "id": k}, ensure_ascii=False) for k, t in enumerate(lines)]
    if bad_at is not None:
        rows.insert(bad_at, json.dumps({"text": 3}))
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return str(path)


def infer(*args):
    return main_infer(["--backend", "onnx", "--no-progress", "--window", "5", *args])


def test_infer_writes_npy_and_parquet_rows_equal_to_eager(embed_export, tmp_path):
    export_dir, model, encoder = embed_export
    want = eager(model, encoder, CORPUS)
    source = corpus_file(tmp_path / "in.jsonl")
    out = tmp_path / "vectors.npy"
    assert infer("--model-dir", export_dir, "--input", source, "--output", str(out)) == 0
    rows = np.load(out)
    assert rows.dtype == np.float32 and rows.shape == (len(CORPUS), DIM)
    np.testing.assert_allclose(rows, want, atol=1e-5, rtol=0)
    # the format by flag, whatever the suffix
    assert infer("--model-dir", export_dir, "--input", source, "--output",
                 str(tmp_path / "v.bin"), "--format", "npy") == 0
    assert np.array_equal(np.load(tmp_path / "v.bin"), rows)
    # Parquet: a bad line has no row; 'line' says which input line each row answers
    bad = corpus_file(tmp_path / "bad.jsonl", bad_at=3)
    table_path = tmp_path / "vectors.parquet"
    assert infer("--model-dir", export_dir, "--input", bad, "--output", str(table_path)) == 1
    parquet = pq.ParquetFile(table_path)
    table = parquet.read()
    assert table.column_names == ["line", "embedding", "num_tokens", "truncated"]
    lines = table["line"].to_pylist()
    assert lines == [n for n in range(1, len(CORPUS) + 2) if n != 4]
    np.testing.assert_array_equal(np.stack(table["embedding"].to_numpy(zero_copy_only=False)),
                                  rows)
    assert table["truncated"].to_pylist() == [len(t) > MAX_LEN - 2 for t in CORPUS]
    assert table["num_tokens"].to_pylist() == [min(len(t), MAX_LEN - 2) for t in CORPUS]
    # one row group per window of 5 usable lines (the bad one rides along in the first)
    assert [parquet.metadata.row_group(g).num_rows
            for g in range(parquet.metadata.num_row_groups)] == [5, 5, 2]


def test_infer_npy_refuses_a_bad_line_and_leaves_no_output(embed_export, tmp_path, capsys):
    bad = corpus_file(tmp_path / "bad.jsonl", bad_at=7)
    out = tmp_path / "out" / "vectors.npy"
    assert infer("--model-dir", embed_export[0], "--input", bad, "--output", str(out)) == 2
    err = capsys.readouterr().err
    assert "bad.jsonl:8" in err and "one row per input line" in err and ".parquet" in err
    assert os.listdir(tmp_path / "out") == []  # neither the file nor a temporary one


def test_the_array_writer_holds_one_window_at_most(embed_export, tmp_path, monkeypatch):
    """Each window's rows reach the file when they are predicted: the writer gets at most a
    window of records at a time, and after each write the file holds every row so far."""
    seen = []
    original = embedding_files.NpyRows.write

    def write(self, records):
        original(self, records)
        self.f.flush()
        size = os.fstat(self.f.fileno()).st_size
        seen.append((len(records), size == self.data_start + 4 * DIM * self.count))

    monkeypatch.setattr(embedding_files.NpyRows, "write", write)
    source = corpus_file(tmp_path / "in.jsonl")
    summary = run_file(Predictor(embed_export[0], "onnx"), source, str(tmp_path / "v.npy"),
                       progress=False, window=5)
    assert summary["output_format"] == "npy" and summary["predicted"] == len(CORPUS)
    assert seen == [(5, True), (5, True), (2, True)]


def test_infer_array_outputs_need_an_embedding_export_and_pyarrow(embed_export, cls_export,  # noqa: F811
                                                                   tmp_path, monkeypatch):
    source = corpus_file(tmp_path / "in.jsonl")
    with pytest.raises(DataError, match="classification model; write JSONL"):
        run_file(Predictor(cls_export[0], "onnx"), source, str(tmp_path / "x.npy"),
                 progress=False)
    with pytest.raises(DataError, match="pass --output"):
        run_file(Predictor(embed_export[0], "onnx"), source, None, progress=False,
                 output_format="npy")
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # as if not installed
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(DataError, match=r"ppvarlen\[parquet\]"):
        run_file(Predictor(embed_export[0], "onnx"), source, str(tmp_path / "x.parquet"),
                 progress=False)
    assert not (tmp_path / "x.parquet").exists() and not (tmp_path / "x.npy").exists()
