"""The ecosystem's clients, as installed from PyPI (setup.py's ``test`` extra), against
ppvarlen-serve: tritonclient over HTTP and gRPC with its infer options (priority, timeout,
request compression, custom parameters), KServe's ``InferenceRESTClient`` and
``InferenceGRPCClient``, the official ``openai`` client (``models.list``, ``models.retrieve``,
``embeddings.create`` with 2,048 inputs) and LangChain's ``OpenAIEmbeddings`` in the setting
docs/SERVING.md documents (``check_embedding_ctx_length=False``).

Accepted-and-ignored options (priority; the timeout until the queue honours it) are checked to
answer the same values as a request without them.
"""
import json
import os
import subprocess
import sys

import numpy as np
import openai
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from conformance_servers import serving
from export_helpers import TEXTS, cls_export  # noqa: F401
from test_embeddings_serving import MIXED, make_embed_export

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def cls_served(cls_export):  # noqa: F811
    with serving(cls_export[0]) as s:
        yield s


@pytest.fixture(scope="module")
def embed_served(tmp_path_factory):
    export = make_embed_export(str(tmp_path_factory.mktemp("embed") / "export"))[0]
    with serving(export) as s:
        yield s


def _bytes_input(module, texts, shape, binary=None):
    tensor = module.InferInput("text", shape, "BYTES")
    data = np.array([t.encode() for t in texts], dtype=np.object_).reshape(shape)
    if binary is None:
        tensor.set_data_from_numpy(data)
    else:
        tensor.set_data_from_numpy(data, binary_data=binary)
    return tensor


def _probs(result):
    return np.asarray(result.as_numpy("probs"), np.float32)


def test_tritonclient_http_with_its_infer_options(cls_served):
    client = thttp.InferenceServerClient(cls_served.url.removeprefix("http://"))
    plain = _probs(client.infer(cls_served.name, [_bytes_input(thttp, TEXTS[:3], [3])]))
    for compression in (None, "gzip", "deflate"):
        for binary in (True, False):
            result = client.infer(cls_served.name, [_bytes_input(thttp, TEXTS[:3], [3, 1], binary)],
                                  priority=2, timeout=30_000_000, parameters={"custom": "x"},
                                  request_compression_algorithm=compression)
            assert np.allclose(_probs(result), plain, atol=1e-6), (compression, binary)
    client.close()


def test_tritonclient_grpc_with_its_infer_options(cls_served):
    client = tgrpc.InferenceServerClient(cls_served.grpc_url)
    plain = _probs(client.infer(cls_served.name, [_bytes_input(tgrpc, TEXTS[:3], [3])]))
    for compression in (None, "gzip", "deflate"):
        result = client.infer(cls_served.name, [_bytes_input(tgrpc, TEXTS[:3], [3, 1])],
                              priority=2, timeout=30_000_000, parameters={"custom": "x"},
                              compression_algorithm=compression, client_timeout=60)
        assert np.allclose(_probs(result), plain, atol=1e-6), compression
    client.close()


def test_kserve_rest_and_grpc_clients(cls_served):
    """KServe's clients (in a process of their own: ``kserve_clients.py`` says why)."""
    reference = thttp.InferenceServerClient(cls_served.url.removeprefix("http://"))
    plain = _probs(reference.infer(cls_served.name, [_bytes_input(thttp, TEXTS[:3], [3])]))
    reference.close()
    run = subprocess.run([sys.executable, os.path.join(HERE, "kserve_clients.py"),
                          cls_served.url, cls_served.grpc_url, cls_served.name, *TEXTS[:3]],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    answers = json.loads(run.stdout)
    for transport in ("rest", "grpc"):
        answer = answers[transport]
        assert answer["ready"] and answer["id"] == "r-1", (transport, answer)
        assert answer["model_name"] == cls_served.name
        assert np.allclose(np.reshape(answer["probs"], plain.shape), plain, atol=1e-6), transport


def test_openai_client_models_and_2048_embeddings(embed_served):
    api = openai.OpenAI(base_url=embed_served.url + "/v1", api_key="unused", max_retries=0,
                        timeout=120)
    assert [m.id for m in api.models.list()] == [embed_served.name]
    assert api.models.retrieve(embed_served.name).owned_by == "ppvarlen"
    texts = [MIXED[i % len(MIXED)] + str(i) for i in range(2048)]
    answer = api.embeddings.create(model=embed_served.name, input=texts)  # base64, decoded
    assert len(answer.data) == 2048 and [d.index for d in answer.data] == list(range(2048))
    alone = api.embeddings.create(model=embed_served.name, input=[texts[100]],
                                  encoding_format="float")
    assert np.allclose(answer.data[100].embedding, alone.data[0].embedding, atol=1e-5)


def test_langchain_openai_embeddings_in_the_documented_setting(embed_served):
    from langchain_openai import OpenAIEmbeddings

    lc = OpenAIEmbeddings(model=embed_served.name, base_url=embed_served.url + "/v1",
                          api_key="unused", check_embedding_ctx_length=False, max_retries=0)
    texts = [MIXED[i % len(MIXED)] + str(i) for i in range(1500)]  # 2 requests: 1000 + 500
    vectors = lc.embed_documents(texts)
    api = openai.OpenAI(base_url=embed_served.url + "/v1", api_key="unused", max_retries=0)
    direct = api.embeddings.create(model=embed_served.name, input=[texts[1200]],
                                   encoding_format="float").data[0].embedding
    assert len(vectors) == 1500 and np.allclose(vectors[1200], direct, atol=1e-5)
    assert np.allclose(lc.embed_query(texts[3]), vectors[3], atol=1e-5)

