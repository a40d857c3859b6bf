"""Open Inference Protocol v2 driven by Triton's own client (tritonclient.http): health,
metadata, infer with mixed-length BYTES texts (JSON and binary tensors) for a classification,
a tagging and a seq2seq export, answers equal to /predict's, and the protocol's 4xx errors."""
import json

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
from test_deploy_helpers import TEXTS, cls_export, tag_export  # noqa: F401
from test_deploy_seq2seq import MIXED, make_seq2seq_export
from test_server import RunningServer
from tritonclient.utils import InferenceServerException

from ppvarlen.runtime.predictor import Predictor
from ppvarlen.serve.server import create_app, deploy_settings

# mixed lengths: 1 to 26 characters, one beyond the exports' max_len of 16 tokens
MIXED_TEXTS = TEXTS + ["好", "北京", "这是一段非常非常非常非常长的句子，超过了最大长度"]
OUTPUTS = {"classification": ["label", "label_id", "probs", "num_tokens", "truncated"],
           "tagging": ["entities", "tags", "repaired_chunks", "num_tokens", "truncated"],
           "seq2seq": ["output", "output_ids", "num_tokens", "truncated", "pieces"]}
DATATYPES = {"label": "BYTES", "label_id": "INT64", "probs": "FP32", "num_tokens": "INT64",
             "truncated": "BOOL", "entities": "BYTES", "tags": "BYTES", "output": "BYTES",
             "output_ids": "BYTES", "pieces": "INT64", "repaired_chunks": "INT64"}


@pytest.fixture(scope="module")
def s2s_export(tmp_path_factory):
    return make_seq2seq_export(str(tmp_path_factory.mktemp("s2s_oip") / "export"))


@pytest.fixture(params=["classification", "tagging", "seq2seq"])
def served(request, cls_export, tag_export, s2s_export):  # noqa: F811
    export_dir = {"classification": cls_export, "tagging": tag_export,
                  "seq2seq": s2s_export}[request.param][0]
    limits = dict(max_texts_per_request=16, max_text_chars=200)
    app = create_app(Predictor(export_dir, "onnx"), deploy=deploy_settings(workers=2, max_wait_ms=5, **limits))
    with RunningServer(app) as srv:
        yield request.param, srv


def _texts_input(texts, binary):
    tensor = triton.InferInput("text", [len(texts)], "BYTES")
    tensor.set_data_from_numpy(np.array([t.encode("utf-8") for t in texts], dtype=np.object_),
                               binary_data=binary)
    return tensor


def _as_text(value):
    return value.decode("utf-8") if isinstance(value, bytes) else value


def _expected(prediction, labels):
    """The OIP rows /predict's prediction stands for (probabilities in the labels' order)."""
    out = dict(prediction)
    if "probs" in out:
        out["probs"] = [prediction["probs"][n] for n in labels]
    return out


def _rows(task, result, name, n):
    arr = result.as_numpy(name)
    assert arr is not None and arr.shape[0] == n, (name, arr)
    if name in ("tags", "entities", "output_ids"):
        return [json.loads(_as_text(v)) for v in arr]
    if name in ("label", "output"):
        return [_as_text(v) for v in arr]
    return arr.tolist()


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_tritonclient_infer_equals_predict(served, binary):
    task, srv = served
    host = srv.url.removeprefix("http://")
    client = triton.InferenceServerClient(host, network_timeout=120.0, connection_timeout=60.0)
    meta = httpx.get(srv.url + "/v2").json()
    assert meta["name"] == "ppvarlen" and "binary_tensor_data" in meta["extensions"]
    assert client.is_server_live() and client.is_server_ready()
    name = httpx.get(srv.url + "/health").json()["model_name"]
    assert client.is_model_ready(name) and client.is_model_ready(name, "1")
    assert not client.is_model_ready(name, "7") and not client.is_model_ready("nope")
    metadata = client.get_model_metadata(name)
    assert metadata["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
    assert [o["name"] for o in metadata["outputs"]] == OUTPUTS[task]
    assert all(o["datatype"] == DATATYPES[o["name"]] for o in metadata["outputs"])
    assert metadata["versions"] == ["1"]
    labels = httpx.get(srv.url + "/health").json()["labels"]

    texts = MIXED_TEXTS if task != "seq2seq" else MIXED
    outputs = None if binary else [triton.InferRequestedOutput(n, binary_data=False)
                                   for n in OUTPUTS[task]]
    result = client.infer(name, [_texts_input(texts, binary)], outputs=outputs,
                          request_id="req-42")
    response = result.get_response()
    assert response["id"] == "req-42" and response["model_version"] == "1"
    want = httpx.post(srv.url + "/predict", json={"texts": texts}, timeout=120).json()
    assert want["model_version"] == "1"
    for i, prediction in enumerate(want["predictions"]):
        expected = _expected(prediction, labels)
        for out in OUTPUTS[task]:
            got = _rows(task, result, out, len(texts))[i]
            if out == "probs":
                assert np.allclose(got, expected[out], atol=1e-6), (i, got, expected[out])
            else:
                assert got == expected[out], (out, i, got, expected[out])
    client.close()


def test_infer_by_version_path_and_long_text_parameter(served):
    task, srv = served
    name = httpx.get(srv.url + "/health").json()["model_name"]
    long_text = "北京上海" * 6  # 24 characters: over max_len 16
    body = {"id": "x", "parameters": {"long_text": "error"},
            "inputs": [{"name": "text", "datatype": "BYTES", "shape": [2],
                        "data": ["好", long_text]}]}
    r = httpx.post(f"{srv.url}/v2/models/{name}/versions/1/infer", json=body, timeout=60)
    assert r.status_code == 422 and set(r.json()) == {"error"}
    assert "inputs[0].data[1]" in r.json()["error"] and "'error'" in r.json()["error"]
    body["parameters"] = {"long_text": "truncate"}
    r = httpx.post(f"{srv.url}/v2/models/{name}/versions/1/infer", json=body, timeout=60)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["parameters"] == {"long_text": "truncate"} and answer["id"] == "x"
    assert r.headers["X-Model-Version"] == "1"
    truncated = next(o for o in answer["outputs"] if o["name"] == "truncated")
    assert truncated["data"] == [False, True] and truncated["datatype"] == "BOOL"


def test_bad_requests_get_the_protocols_error(served):
    task, srv = served
    host = srv.url.removeprefix("http://")
    client = triton.InferenceServerClient(host, network_timeout=120.0)
    name = httpx.get(srv.url + "/health").json()["model_name"]

    def refused(model, inputs, version="", words=""):
        with pytest.raises(InferenceServerException) as err:
            client.infer(model, inputs, model_version=version)
        assert err.value.status() in ("404", "422"), err.value
        assert words in err.value.message(), err.value.message()
        return err.value

    wrong_type = triton.InferInput("text", [2], "INT64")
    wrong_type.set_data_from_numpy(np.array([1, 2], dtype=np.int64), binary_data=False)
    assert refused(name, [wrong_type], words="datatype").status() == "422"
    wrong_shape = triton.InferInput("text", [1, 2], "BYTES")
    wrong_shape.set_data_from_numpy(np.array([[b"a", b"b"]], dtype=np.object_),
                                    binary_data=False)
    assert refused(name, [wrong_shape], words="shape").status() == "422"
    ok = _texts_input(["好"], False)
    assert refused("nope", [ok], words="not served").status() == "404"
    assert refused(name, [ok], version="7", words="no ready version").status() == "404"
    too_long = _texts_input(["好" * 201], True)
    assert refused(name, [too_long], words="Deploy.max_text_chars").status() == "422"
    client.close()
    # the raw protocol: shape and data disagree; an unknown field; the body is not JSON
    for body, status in [
            ({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [3], "data": ["a"]}]},
             422),
            ({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a"]}],
              "extra": 1}, 422),
            (b"{not json", 400)]:
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        r = httpx.post(f"{srv.url}/v2/models/{name}/infer", content=content, timeout=60)
        assert r.status_code == status and set(r.json()) == {"error"}, r.text
