"""The Open Inference Protocol v2 over gRPC driven by Triton's own client (tritonclient.grpc),
on a classification export served with ``create_app(..., grpc_port=0)``: what
tests/serve/test_oip.py checks over REST with tritonclient.http (live/ready, metadata, infer with
mixed-length texts equal to /predict's answers, refusals), plus Triton's model configuration
and statistics extensions over both transports (the REST documents parse as Triton's own
messages and equal gRPC's), and the refusals as gRPC status codes naming the field."""
import json

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from google.protobuf import json_format
from export_helpers import cls_export  # noqa: F401
from test_oip import DATATYPES, MIXED_TEXTS, OUTPUTS, _expected
from test_server import RunningServer
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from ppvarlen.serve.protocols.oip.grpc import SERVICE
from ppvarlen.runtime.predictor import Predictor
from ppvarlen.serve.server import create_app, deploy_settings

LIMITS = dict(max_texts_per_request=16, max_text_chars=200, max_body_bytes=8192)


class Served:
    def __init__(self, srv, grpc_port):
        self.url, self.grpc_url = srv.url, f"127.0.0.1:{grpc_port}"
        health = httpx.get(srv.url + "/health").json()
        self.name, self.labels = health["model_name"], health["labels"]

    def client(self):
        return tgrpc.InferenceServerClient(self.grpc_url)

    def predict(self, texts):
        r = httpx.post(self.url + "/predict", json={"texts": texts}, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()["predictions"]


@pytest.fixture(scope="module")
def served(cls_export):  # noqa: F811
    app = create_app(Predictor(cls_export[0], "onnx"),
                     deploy=deploy_settings(workers=2, max_wait_ms=5, **LIMITS), grpc_port=0)
    with RunningServer(app) as srv:
        yield Served(srv, app.state.grpc.port)


def texts_input(texts, name="text"):
    tensor = tgrpc.InferInput(name, [len(texts)], "BYTES")
    tensor.set_data_from_numpy(np.array([t.encode("utf-8") for t in texts], dtype=np.object_))
    return tensor


def rows(result, name, n):
    """Output ``name`` of a gRPC result as Python values, one per text."""
    arr = result.as_numpy(name)
    assert arr is not None and arr.shape[0] == n, (name, arr)
    if arr.dtype == np.object_:
        values = [v.decode("utf-8") for v in arr]
        return [json.loads(v) if name in ("tags", "entities", "output_ids") else v
                for v in values]
    return arr.tolist()


def assert_rows_equal_predict(result, predictions, outputs, labels):
    for i, prediction in enumerate(predictions):
        expected = _expected(prediction, labels)
        for out in outputs:
            got = rows(result, out, len(predictions))[i]
            if isinstance(got, float) or out == "probs":
                assert np.allclose(got, expected[out], atol=1e-6), (out, i, got, expected[out])
            else:
                assert got == expected[out], (out, i, got, expected[out])


def stats_of(client, name):
    (entry,) = client.get_inference_statistics(name).model_stats
    return entry


def test_grpc_health_metadata_and_model_config(served):
    client = served.client()
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready(served.name) and client.is_model_ready(served.name, "1")
    for model, version in ((served.name, "7"), ("nope", "")):
        with pytest.raises(InferenceServerException) as err:  # REST: 404 (tritonclient: False)
            client.is_model_ready(model, version)
        assert err.value.status() == "StatusCode.NOT_FOUND", err.value
    server = client.get_server_metadata()
    rest_server = httpx.get(served.url + "/v2").json()
    assert server.name == "ppvarlen" and list(server.extensions) == rest_server["extensions"]
    assert {"binary_tensor_data", "model_configuration", "statistics"} <= set(server.extensions)

    meta = client.get_model_metadata(served.name)
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.inputs] == [("text", "BYTES", [-1])]
    assert [t.name for t in meta.outputs] == OUTPUTS["classification"]
    assert all(t.datatype == DATATYPES[t.name] for t in meta.outputs)
    assert list(meta.versions) == ["1"] and meta.platform == "onnx_onnxv1"
    rest = httpx.get(f"{served.url}/v2/models/{served.name}").json()
    assert json_format.ParseDict(rest, service_pb2.ModelMetadataResponse()) == meta

    config = client.get_model_config(served.name).config
    assert config.name == served.name and config.max_batch_size == 0
    assert [(t.name, t.data_type, list(t.dims)) for t in config.input] == \
        [("text", model_config_pb2.TYPE_STRING, [-1])]
    assert [t.name for t in config.output] == OUTPUTS["classification"]
    probs = next(t for t in config.output if t.name == "probs")
    assert probs.data_type == model_config_pb2.TYPE_FP32 and list(probs.dims) == [-1, 2]
    assert config.dynamic_batching.max_queue_delay_microseconds == 5000
    assert config.parameters["task"].string_value == "classification"
    assert client.get_model_config(served.name, "1").config == config
    with pytest.raises(InferenceServerException) as err:
        client.get_model_config("nope")
    assert err.value.status() == "StatusCode.NOT_FOUND" and "nope" in err.value.message()
    client.close()


def test_rest_config_and_stats_are_triton_shaped_json(served):
    """GET /v2/models/NAME/config and /stats: JSON that parses as Triton's own messages
    (``model_config.proto``, ``ModelStatisticsResponse``, unknown fields refused) and equals
    what gRPC answers; tritonclient.http reads both."""
    client = served.client()
    http = thttp.InferenceServerClient(served.url.removeprefix("http://"))
    rest = httpx.get(f"{served.url}/v2/models/{served.name}/config").json()
    assert http.get_model_config(served.name) == rest
    assert rest["input"] == [{"name": "text", "data_type": "TYPE_STRING", "dims": [-1]}]
    assert rest["max_batch_size"] == 0 and rest["backend"] == "ppvarlen"
    assert json_format.ParseDict(rest, model_config_pb2.ModelConfig()) == \
        client.get_model_config(served.name).config
    versioned = httpx.get(f"{served.url}/v2/models/{served.name}/versions/1/config")
    assert versioned.json() == rest

    client.infer(served.name, [texts_input(["好", "质量一般般"])])  # something to count
    stats = httpx.get(f"{served.url}/v2/models/{served.name}/stats").json()
    assert http.get_inference_statistics(served.name)["model_stats"][0]["name"] == served.name
    parsed = json_format.ParseDict(stats, service_pb2.ModelStatisticsResponse())
    assert parsed == client.get_inference_statistics(served.name)  # nothing ran in between
    (entry,) = stats["model_stats"]
    assert entry["version"] == "1" and entry["inference_count"] >= 2
    assert set(entry["inference_stats"]) >= {"success", "fail", "queue", "compute_input",
                                             "compute_infer", "compute_output"}
    assert all(set(v) == {"count", "ns"} for v in entry["inference_stats"].values())
    assert entry["batch_stats"] and all("batch_size" in b for b in entry["batch_stats"])
    everything = httpx.get(f"{served.url}/v2/models/stats").json()
    assert [e["name"] for e in everything["model_stats"]] == [served.name]
    json_format.ParseDict(everything, service_pb2.ModelStatisticsResponse())
    for path in ("nope/config", "nope/stats", f"{served.name}/versions/7/config"):
        r = httpx.get(f"{served.url}/v2/models/{path}")
        assert r.status_code == 404 and set(r.json()) == {"error"}, (path, r.text)
    client.close()
    http.close()


def test_grpc_infer_equals_predict_and_statistics_count_the_texts(served):
    client = served.client()
    before = stats_of(client, served.name)
    result = client.infer(served.name, [texts_input(MIXED_TEXTS)], request_id="req-42")
    response = result.get_response()
    assert response.id == "req-42" and response.model_version == "1"
    assert response.model_name == served.name
    after = stats_of(client, served.name)
    n = len(MIXED_TEXTS)
    assert after.inference_count - before.inference_count == n
    assert after.inference_stats.success.count - before.inference_stats.success.count == 1
    for kind in ("queue", "compute_input", "compute_infer", "compute_output"):
        grew = getattr(after.inference_stats, kind).count - \
            getattr(before.inference_stats, kind).count
        assert grew == n, (kind, grew)
    assert after.execution_count > before.execution_count
    assert after.inference_stats.fail.count == before.inference_stats.fail.count

    predictions = served.predict(MIXED_TEXTS)
    assert any(p["truncated"] for p in predictions)  # one text over the export's max_len
    assert_rows_equal_predict(result, predictions, OUTPUTS["classification"], served.labels)
    # some outputs only, and the texts as bytes_contents (tritonclient sends raw contents)
    some = client.infer(served.name, [texts_input(MIXED_TEXTS)],
                        outputs=[tgrpc.InferRequestedOutput("label"),
                                 tgrpc.InferRequestedOutput("probs")])
    assert [o.name for o in some.get_response().outputs] == ["label", "probs"]
    assert_rows_equal_predict(some, predictions, ["label", "probs"], served.labels)
    request = service_pb2.ModelInferRequest(model_name=served.name, inputs=[
        service_pb2.ModelInferRequest.InferInputTensor(
            name="text", datatype="BYTES", shape=[n], contents=service_pb2.InferTensorContents(
                bytes_contents=[t.encode("utf-8") for t in MIXED_TEXTS]))])
    with grpc.insecure_channel(served.grpc_url) as channel:
        raw = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=120)
    assert_rows_equal_predict(tgrpc.InferResult(raw), predictions, OUTPUTS["classification"],
                              served.labels)
    client.close()


def test_grpc_refusals_are_status_codes_naming_the_field(served):
    client = served.client()
    before = stats_of(client, served.name)

    def refused(inputs, code, words, model=None, version=""):
        with pytest.raises(InferenceServerException) as err:
            client.infer(model or served.name, inputs, model_version=version)
        assert err.value.status() == f"StatusCode.{code}", err.value
        assert words in err.value.message(), err.value.message()

    refused([texts_input(["好"], name="txt")], "INVALID_ARGUMENT", "inputs[0].name 'txt'")
    wrong_type = tgrpc.InferInput("text", [2], "INT64")
    wrong_type.set_data_from_numpy(np.array([1, 2], dtype=np.int64))
    refused([wrong_type], "INVALID_ARGUMENT", "inputs[0].datatype 'INT64'")
    wrong_shape = tgrpc.InferInput("text", [1, 2], "BYTES")
    wrong_shape.set_data_from_numpy(np.array([[b"a", b"b"]], dtype=np.object_))
    refused([wrong_shape], "INVALID_ARGUMENT", "inputs[0].shape")
    refused([texts_input(["好"] * 17)], "INVALID_ARGUMENT", "Deploy.max_texts_per_request")
    refused([texts_input(["好", "好" * 201])], "INVALID_ARGUMENT",
            "inputs[0].data[1] has 201 characters; at most 200 (Deploy.max_text_chars)")
    refused([texts_input(["  "])], "INVALID_ARGUMENT", "inputs[0].data[0]: text is empty")
    # 16 texts of 200 characters: every limit above holds, the message is over 8192 bytes
    refused([texts_input(["好" * 200] * 16)], "RESOURCE_EXHAUSTED", "Deploy.max_body_bytes")
    refused([texts_input(["好"])], "NOT_FOUND", "model 'nope' is not served", model="nope")
    refused([texts_input(["好"])], "NOT_FOUND", "no ready version '7'", version="7")
    ok = client.infer(served.name, [texts_input(["好"])])  # still answering
    assert ok.as_numpy("label").shape == (1,)
    after = stats_of(client, served.name)
    assert after.inference_stats.success.count == before.inference_stats.success.count + 1
    client.close()


def test_grpc_long_text_parameter_chooses_the_policy(served):
    client = served.client()
    texts = texts_input(["好", "北京上海" * 6])  # 24 characters: over max_len 16
    result = client.infer(served.name, [texts], parameters={"long_text": "truncate"})
    assert rows(result, "truncated", 2) == [False, True]
    for policy, words in (("error", "inputs[0].data[1]: text has 24 tokens"),
                          ("window", "parameters.long_text 'window': one of")):
        with pytest.raises(InferenceServerException) as err:
            client.infer(served.name, [texts], parameters={"long_text": policy})
        assert err.value.status() == "StatusCode.INVALID_ARGUMENT", err.value
        assert words in err.value.message(), err.value.message()
    client.close()


def test_grpc_echoes_the_long_text_parameter_as_rest_does(served):
    client = served.client()
    result = client.infer(served.name, [texts_input(["好"])],
                          parameters={"long_text": "truncate"})
    assert result.get_response().parameters["long_text"].string_param == "truncate"
    client.close()


def test_grpc_message_over_the_body_limit_names_the_setting(served):
    client = served.client()
    with pytest.raises(InferenceServerException) as err:
        client.infer(served.name, [texts_input(["好" * 200] * 16)])
    assert err.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
    assert "Deploy.max_body_bytes" in err.value.message(), err.value.message()


def test_grpc_bytes_that_are_no_message_and_unknown_methods_get_status_codes(served):
    with grpc.insecure_channel(served.grpc_url) as channel:
        infer = channel.unary_unary(f"/{SERVICE}/ModelInfer")  # no serialisers: raw bytes
        with pytest.raises(grpc.RpcError) as err:
            infer(b"\xff\xff\xff", timeout=60)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "not a valid ModelInferRequest" in err.value.details()
        stream = channel.unary_unary(f"/{SERVICE}/ModelStreamInfer")
        with pytest.raises(grpc.RpcError) as err:
            stream(b"", timeout=60)
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
        live = service_pb2_grpc.GRPCInferenceServiceStub(channel).ServerLive(
            service_pb2.ServerLiveRequest(), timeout=60)
        assert live.live
