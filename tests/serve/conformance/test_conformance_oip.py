"""The Open Inference Protocol as its published definition states it, against ppvarlen-serve
(a classification export, REST and gRPC).  Source of every fact: kserve/open-inference-protocol
at commit d49cc23 (open_inference_rest.yaml info.version 2.0, inference_rest.md,
open_inference_grpc.proto, inference_grpc.md); gRPC health: grpc/grpc doc/health-checking.md.

* inference_rest.md "Parameters": ``$parameters`` are zero or more name/value pairs, a value a
  string, number or boolean; "a server can implement server-specific parameters" -- so a
  request, an input and an output may carry keys the server does not know (here: ignored).
* open_inference_rest.yaml ``inference_request``: properties id, parameters, inputs, outputs;
  a body that also names the model (KServe's client sends ``model_name``) is the same request.
* inference_rest.md "Tensor Data": elements "may be presented in their natural
  multi-dimensional representation, or as a flattened one-dimensional representation".
* inference_rest.md error objects: ``{"error": $string}`` with an HTTP error status.
* inference_rest.md "Platforms": the platform names a model's metadata may give.
* open_inference_grpc.proto ``ModelInferRequest.raw_input_contents``: "If this field is
  specified then InferInputTensor::contents must not be specified for any input tensor."
* grpc health-checking.md: ``Check`` answers SERVING / NOT_SERVING for a known service and
  NOT_FOUND for an unknown one; the empty name is the server's overall health.
"""
import gzip
import json
import zlib

import grpc
import httpx
import numpy as np
import pytest
from conformance_servers import OIP_PLATFORMS, serving
from export_helpers import TEXTS, cls_export  # noqa: F401
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc


@pytest.fixture(scope="module")
def served(cls_export):  # noqa: F811
    with serving(cls_export[0]) as s:
        s.meta = httpx.get(f"{s.url}/v2/models/{s.name}").json()
        yield s


def infer(served, body, headers=None, content=None):
    return httpx.post(f"{served.url}/v2/models/{served.name}/infer", json=None if content
                      else body, content=content, headers=headers, timeout=60)


def texts_body(texts, shape=None, data=None, **extra):
    return {"inputs": [{"name": "text", "datatype": "BYTES", "shape": shape or [len(texts)],
                        "data": texts if data is None else data}], **extra}


def assert_protocol_error(r, status):
    assert r.status_code == status, r.text
    body = r.json()
    assert isinstance(body.get("error"), str) and body["error"], body


def test_metadata_has_the_required_fields_and_a_listed_platform(served):
    server = httpx.get(served.url + "/v2").json()
    assert {"name", "version", "extensions"} <= set(server)  # metadata_server_response.required
    assert {"name", "platform"} <= set(served.meta)  # metadata_model_response.required
    assert served.meta["platform"] in OIP_PLATFORMS  # served on ONNX Runtime: onnx_onnxv1
    for tensor in served.meta["inputs"] + served.meta["outputs"]:
        assert {"name", "datatype", "shape"} <= set(tensor)  # metadata_tensor.required


def test_free_form_parameters_at_every_level_are_accepted(served):
    plain = infer(served, texts_body(TEXTS[:2]))
    assert plain.status_code == 200, plain.text
    out_name = served.meta["outputs"][0]["name"]
    body = texts_body(TEXTS[:2], parameters={"priority": 1, "timeout": 10_000_000,
                                             "my_server_key": "x", "flag": True})
    body["inputs"][0]["parameters"] = {"content_type": "str", "weight": 0.5}
    body["outputs"] = [{"name": out_name, "parameters": {"classification": 0, "k": "v"}}]
    r = infer(served, body)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert {"model_name", "outputs"} <= set(answer)  # inference_response.required
    assert [o["name"] for o in answer["outputs"]] == [out_name]
    expected = next(o for o in plain.json()["outputs"] if o["name"] == out_name)
    assert answer["outputs"][0]["data"] == expected["data"]
    for o in answer["outputs"]:
        assert {"name", "shape", "datatype", "data"} <= set(o)  # response_output.required


def test_a_parameter_value_must_be_a_string_number_or_boolean(served):
    r = infer(served, texts_body(TEXTS[:1], parameters={"nested": {"a": 1}}))
    assert_protocol_error(r, 422)
    assert "parameters.nested" in r.json()["error"]


def test_model_name_and_version_in_the_body_accepted_when_they_match_the_path(served):
    ok = infer(served, texts_body(TEXTS[:1], model_name=served.name, model_version="1"))
    assert ok.status_code == 200, ok.text
    r = httpx.post(f"{served.url}/v2/models/{served.name}/versions/1/infer",
                   json=texts_body(TEXTS[:1], model_name=served.name), timeout=60)
    assert r.status_code == 200, r.text
    wrong = infer(served, texts_body(TEXTS[:1], model_name="other"))
    assert_protocol_error(wrong, 422)
    assert "model_name 'other'" in wrong.json()["error"]
    assert_protocol_error(infer(served, texts_body(TEXTS[:1], model_version="9")), 422)


def test_bytes_of_shape_n_by_1_flat_or_nested_equal_shape_n(served):
    texts = TEXTS[:3]
    flat = infer(served, texts_body(texts))
    for data in (texts, [[t] for t in texts]):
        r = infer(served, texts_body(texts, shape=[3, 1], data=data))
        assert r.status_code == 200, r.text
        assert r.json()["outputs"] == flat.json()["outputs"]
    assert_protocol_error(infer(served, texts_body(texts, shape=[3, 2])), 422)


def test_unknown_top_level_fields_still_refused_in_the_error_form(served):
    assert_protocol_error(infer(served, texts_body(TEXTS[:1], inptus=[])), 422)


@pytest.mark.parametrize("encoding,compress", [
    ("gzip", gzip.compress), ("deflate", zlib.compress)])
def test_compressed_bodies_are_decoded(served, encoding, compress):
    body = json.dumps(texts_body(TEXTS[:2])).encode()
    r = infer(served, None, {"Content-Encoding": encoding, "Content-Type": "application/json"},
              compress(body))
    assert r.status_code == 200, r.text
    assert r.json()["outputs"] == infer(served, texts_body(TEXTS[:2])).json()["outputs"]


def test_compressed_bodies_within_the_body_limit_decoded_or_refused_in_the_error_form(served):
    bomb = gzip.compress(b" " * (2 << 20))  # 2 MiB of spaces: over Deploy.max_body_bytes 1 MiB
    assert len(bomb) < 8192
    r = infer(served, None, {"Content-Encoding": "gzip"}, bomb)
    assert_protocol_error(r, 413)
    assert "max_body_bytes" in r.json()["error"]
    assert_protocol_error(infer(served, None, {"Content-Encoding": "gzip"}, b"not gzip"), 400)
    assert_protocol_error(infer(served, None, {"Content-Encoding": "br"}, b"{}"), 415)


def _grpc_request(served, texts, raw=True, typed=False):
    tensor = service_pb2.ModelInferRequest.InferInputTensor(name="text", datatype="BYTES",
                                                            shape=[len(texts)])
    request = service_pb2.ModelInferRequest(model_name=served.name)
    encoded = [t.encode("utf-8") for t in texts]
    if typed:
        tensor.contents.bytes_contents.extend(encoded)
    request.inputs.append(tensor)
    if raw:
        request.raw_input_contents.append(b"".join(len(b).to_bytes(4, "little") + b
                                                   for b in encoded))
    return request


def test_grpc_free_form_parameters_and_one_content_form_per_request(served):
    with grpc.insecure_channel(served.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        for raw, typed in ((True, False), (False, True)):
            request = _grpc_request(served, TEXTS[:2], raw, typed)
            request.parameters["priority"].uint64_param = 1
            request.parameters["server_specific"].string_param = "x"
            request.inputs[0].parameters["content_type"].string_param = "str"
            response = stub.ModelInfer(request, timeout=60)
            assert response.model_name == served.name and response.outputs
        with pytest.raises(grpc.RpcError) as err:
            stub.ModelInfer(_grpc_request(served, TEXTS[:2], raw=True, typed=True), timeout=60)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "raw_input_contents" in err.value.details()


def test_grpc_health_check_on_the_grpc_port(served):
    with grpc.insecure_channel(served.grpc_url) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        serving_ = health_pb2.HealthCheckResponse.SERVING
        for service in ("", "inference.GRPCInferenceService", served.name):
            answer = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=30)
            assert answer.status == serving_, service
        with pytest.raises(grpc.RpcError) as err:
            health.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=30)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_binary_and_json_infer_agree_on_n_by_1(served):
    """The binary tensor data extension with a [N, 1] BYTES input (tritonclient's usual
    shape for a batch of strings)."""
    import tritonclient.http as thttp

    client = thttp.InferenceServerClient(served.url.removeprefix("http://"))
    tensor = thttp.InferInput("text", [2, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[t.encode()] for t in TEXTS[:2]], dtype=np.object_),
                               binary_data=True)
    result = client.infer(served.name, [tensor])
    for expected in infer(served, texts_body(TEXTS[:2])).json()["outputs"]:
        got = result.as_numpy(expected["name"])
        assert list(got.shape) == expected["shape"], expected["name"]
        if got.dtype == np.object_:
            assert [v.decode() for v in got.ravel()] == expected["data"]
        else:
            assert np.allclose(got.ravel(), expected["data"], atol=1e-6), expected["name"]
    client.close()


@pytest.mark.parametrize("method,path", [
    ("GET", "/v2/no/such/route"), ("GET", "/v2/models/{name}/infer"),
    ("POST", "/v2/health/ready"), ("DELETE", "/v2/models/{name}")])
def test_routing_errors_are_the_protocols_error_object(served, method, path):
    """No such route and a wrong method answer ``{"error": string}`` too (tritonclient
    decodes every error answer as that object)."""
    r = httpx.request(method, served.url + path.format(name=served.name), timeout=30)
    assert_protocol_error(r, 404 if "no/such" in path else 405)
    assert set(r.json()) == {"error"}, r.json()  # the error object, nothing else
    if r.status_code == 405:
        assert r.headers["allow"] and r.headers["allow"] in r.json()["error"]


def test_one_export_advertises_no_repository_extension_and_has_none(served):
    assert "model_repository" not in httpx.get(served.url + "/v2").json()["extensions"]
    assert_protocol_error(httpx.post(served.url + "/v2/repository/index"), 404)
    with grpc.insecure_channel(served.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        extensions = stub.ServerMetadata(service_pb2.ServerMetadataRequest()).extensions
        assert "model_repository" not in extensions
        with pytest.raises(grpc.RpcError) as err:
            stub.RepositoryIndex(service_pb2.RepositoryIndexRequest())
        assert err.value.code() == grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize("name,version", [("", ""), ("{name}", "one"), ("{name}", "-1")])
def test_grpc_an_empty_name_or_a_version_that_is_no_number_is_invalid_argument(
        served, name, version):
    """As Triton answers them (its gRPC server checks the request before looking a model up);
    a well-formed name that is not served stays NOT_FOUND."""
    name = name.format(name=served.name)
    with grpc.insecure_channel(served.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        for call in (lambda: stub.ModelReady(service_pb2.ModelReadyRequest(
                         name=name, version=version)),
                     lambda: stub.ModelMetadata(service_pb2.ModelMetadataRequest(
                         name=name, version=version)),
                     lambda: stub.ModelInfer(service_pb2.ModelInferRequest(
                         model_name=name, model_version=version))):
            with pytest.raises(grpc.RpcError) as err:
                call()
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
        with pytest.raises(grpc.RpcError) as err:
            stub.ModelReady(service_pb2.ModelReadyRequest(name="not_served"))
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
