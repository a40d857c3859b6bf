"""The OpenAI embeddings and models APIs as OpenAI's published OpenAPI document states them,
against ppvarlen-serve on an embedding export.  Source of every fact: openai/openai-openapi
``openapi.yaml`` (info.version 2.3.0) at commit f85dbe2 (2026-08-21):

* ``GET /models`` -> ``ListModelsResponse`` {object: "list", data: [Model]}; ``Model`` requires
  id, object ("model"), created (integer, unix seconds), owned_by (string).
* ``GET /models/{model}`` -> ``Model``.
* ``CreateEmbeddingRequest.input``: a string, or an array of 1..2048 strings, or of 1..2048
  integers / integer arrays (token ids); ``CreateEmbeddingResponse`` requires object ("list"),
  model, data (``Embedding``: index, embedding, object "embedding"), usage {prompt_tokens,
  total_tokens}.
* ``ErrorResponse`` {error: ``Error``}; ``Error`` requires type, message, param, code.

Token ids: this server refuses them (400, code ``unsupported_input``): ids of OpenAI's
tokenizer are not this model's, and embedding them as this model's ids would answer a vector of
other words (docs/SERVING.md: what LangChain and LlamaIndex need).
"""
import httpx
import numpy as np
import pytest
from conformance_servers import serving
from test_embeddings_serving import MIXED, make_embed_export

MODEL_KEYS = {"id", "object", "created", "owned_by"}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    export = make_embed_export(str(tmp_path_factory.mktemp("embed") / "export"))[0]
    with serving(export) as s:
        yield s


def assert_error_response(r, status):
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert {"type", "message", "param", "code"} <= set(error), error  # Error.required
    return error


def embed(served, texts, **extra):
    return httpx.post(served.url + "/v1/embeddings", json={"model": served.name, "input": texts,
                                                           **extra}, timeout=120)


def test_models_list_and_retrieve(served):
    listed = httpx.get(served.url + "/v1/models").json()
    assert listed["object"] == "list" and [m["id"] for m in listed["data"]] == [served.name]
    model = listed["data"][0]
    assert set(model) >= MODEL_KEYS and model["object"] == "model"
    assert isinstance(model["created"], int) and model["created"] > 0
    assert isinstance(model["owned_by"], str)
    one = httpx.get(f"{served.url}/v1/models/{served.name}")
    assert one.status_code == 200 and one.json() == model
    error = assert_error_response(httpx.get(served.url + "/v1/models/text-embedding-3-small"),
                                  404)
    assert error["code"] == "model_not_found"


def test_2048_inputs_answered_in_order_as_each_alone(served):
    texts = [MIXED[i % len(MIXED)][:1 + i % 20] + str(i) for i in range(2048)]
    r = embed(served, texts, encoding_format="float")
    assert r.status_code == 200, r.text[:500]
    answer = r.json()
    assert {"object", "model", "data", "usage"} <= set(answer)
    assert [d["index"] for d in answer["data"]] == list(range(2048))
    assert all(d["object"] == "embedding" for d in answer["data"])
    got = np.asarray([d["embedding"] for d in answer["data"]], np.float32)
    picks = [0, 1, 63, 64, 65, 777, 2047]  # across the parts (Deploy.max_texts_per_request 64)
    alone = np.asarray([d["embedding"] for d in embed(served, [texts[i] for i in picks])
                        .json()["data"]], np.float32)
    assert np.allclose(got[picks], alone, atol=1e-5)
    tokens = sum(embed(served, [t]).json()["usage"]["prompt_tokens"] for t in texts[:8])
    assert answer["usage"]["prompt_tokens"] >= tokens


def test_over_2048_inputs_refused_in_the_error_form(served):
    error = assert_error_response(embed(served, ["x"] * 2049), 400)
    assert error["param"] == "input" and "2048" in error["message"]


@pytest.mark.parametrize("ids", [[1212, 318, 257], [[1212, 318], [257, 1332]]])
def test_token_id_inputs_refused_never_embedded(served, ids):
    error = assert_error_response(embed(served, ids), 400)
    assert error["code"] == "unsupported_input" and error["param"] == "input"
    assert "check_embedding_ctx_length=False" in error["message"]


@pytest.mark.parametrize("method,path,status", [
    ("GET", "/v1/chat/completions", 404), ("GET", "/v1/embeddings", 405),
    ("DELETE", "/v1/models/{name}", 405), ("POST", "/v1/models", 405)])
def test_routing_errors_are_the_error_response(served, method, path, status):
    """Under /v1 a route that does not exist or a method a path does not have is answered with
    ``ErrorResponse`` too, so the client raises its own error types."""
    r = httpx.request(method, served.url + path.format(name=served.name), timeout=30)
    error = assert_error_response(r, status)
    assert error["type"] == "invalid_request_error"
