"""The inference routes answered ahead of FastAPI's routing (``ppvarlen.serve.http.direct``): the
same answers, errors, headers and counts as a FastAPI route, under a mount prefix too, and
FastAPI still owning everything else about those paths (405, the trailing-slash redirect, the
OpenAPI document)."""
import asyncio
import json

import pytest
from fastapi.testclient import TestClient
from test_deploy_helpers import TEXTS, cls_export  # noqa: F401

from ppvarlen.serve.http.direct import route_path
from ppvarlen.runtime.predictor import Predictor
from ppvarlen.serve.server import create_app, deploy_settings

INFER = "/v2/models/tiny/infer"


@pytest.fixture(scope="module")
def client(cls_export):  # noqa: F811
    app = create_app(Predictor(cls_export[0], "onnx"), deploy_settings(max_wait_ms=1))
    with TestClient(app) as c:
        yield c


def call(app, method, path, body=b"", root_path="", headers=()):
    """One request straight through the ASGI app -> (status, headers dict, body)."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": method, "scheme": "http", "path": root_path + path,
             "raw_path": (root_path + path).encode(), "query_string": b"",
             "root_path": root_path, "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80),
             "headers": [(b"host", b"127.0.0.1"), (b"content-length", b"%d" % len(body)),
                         *headers]}
    messages, sent = [], []

    async def receive():
        if not sent:
            sent.append(1)
            return {"type": "http.request", "body": body, "more_body": False}
        return {"type": "http.disconnect"}

    async def send(message):
        messages.append(message)

    async def run():
        await app(scope, receive, send)

    asyncio.run_coroutine_threadsafe(run(), app.state.app_state.loop).result(60)
    start = messages[0]
    return (start["status"], {k.decode(): v.decode() for k, v in start["headers"]},
            b"".join(m.get("body", b"") for m in messages[1:]))


def test_the_route_path_is_the_path_under_the_mount():
    assert route_path({"path": "/api/predict", "root_path": "/api"}) == "/predict"
    assert route_path({"path": "/predict", "root_path": ""}) == "/predict"
    assert route_path({"path": "/apix/predict", "root_path": "/api"}) == "/apix/predict"


def test_answers_errors_and_counts_as_a_route_does(client):
    r = client.post("/predict", json={"texts": TEXTS[:2]})
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    assert r.headers["x-model-name"] == "tiny" and r.headers["x-model-version"] == "1"
    assert int(r.headers["content-length"]) == len(r.content)
    assert [p["label"] for p in r.json()["predictions"]] and r.json()["model_version"] == "1"
    bad = client.post("/predict", json={"texts": []})
    assert bad.status_code == 422
    assert bad.json() == {"error": "\"texts\" is empty; send at least one", "field": "texts"}
    oip_bad = client.post(INFER, json={"inputs": []})
    assert oip_bad.status_code == 422 and set(oip_bad.json()) == {"error"}
    assert client.post("/v2/models/nope/infer", json={}).status_code == 404
    metrics = client.get("/metrics").text
    assert 'ppvarlen_requests_total{route="/predict",status="422"} 1.0' in metrics
    assert f'ppvarlen_requests_total{{route="/v2/models/{{name}}/infer",status="404"}}' \
        in metrics


def test_fastapi_keeps_the_other_methods_the_redirect_and_the_document(client):
    r = client.get("/predict")
    assert r.status_code == 405 and r.headers["allow"] == "POST"
    assert client.get(INFER).status_code == 405
    assert client.post("/predict/", json={"texts": ["a"]},
                       follow_redirects=False).status_code == 307
    paths = client.get("/openapi.json").json()["paths"]
    assert "post" in paths["/predict"] and "requestBody" in paths["/predict"]["post"]
    assert paths["/v2/models/{name}/infer"]["post"]["operationId"].startswith("infer")


def test_a_mounted_app_answers_under_its_prefix(client):
    body = json.dumps({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1],
                                   "data": [TEXTS[0]]}]}).encode()
    status, headers, content = call(client.app, "POST", INFER, body, root_path="/serve")
    assert status == 200 and headers["x-model-version"] == "1"
    assert json.loads(content)["outputs"][0]["name"] == "label"
    status, _, content = call(client.app, "POST", "/v2/models/nope/infer", b"{}",
                              root_path="/serve")
    assert status == 404 and set(json.loads(content)) == {"error"}  # still an OIP route


def test_a_client_gone_mid_body_is_counted_not_answered(client):
    # the body is announced longer than what arrives before the disconnect
    gone = 'ppvarlen_requests_total{route="/predict",status="499"} 1.0'
    assert gone not in client.get("/metrics").text
    app = client.app
    scope_body = b'{"texts": ["'
    messages = []

    async def receive_then_leave():
        if not messages:
            messages.append("body")
            return {"type": "http.request", "body": scope_body, "more_body": True}
        return {"type": "http.disconnect"}

    async def send(message):
        messages.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": "/predict", "raw_path": b"/predict",
             "query_string": b"", "root_path": "", "client": ("127.0.0.1", 1),
             "server": ("127.0.0.1", 80), "headers": [(b"host", b"x")]}
    asyncio.run_coroutine_threadsafe(app(scope, receive_then_leave, send),
                                     app.state.app_state.loop).result(60)
    assert messages == ["body"]  # nothing was sent back
    assert gone in client.get("/metrics").text


def test_requests_never_wait_out_max_wait_once_every_caller_is_queued(cls_export):  # noqa: F811
    # max_wait_ms of 10 minutes: the answers come only because every caller's text is queued
    deploy = deploy_settings(max_wait_ms=600_000)
    app = create_app(Predictor(cls_export[0], "onnx"), deploy)
    with TestClient(app) as c:
        one = c.post("/predict", json={"texts": [TEXTS[0]]})
        assert one.status_code == 200
        body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1],
                            "data": [TEXTS[1]]}]}
        assert c.post(INFER, json=body).status_code == 200
        callers = app.state.app_state.registry.callers
        assert callers.held == 0 and callers.preparing == 0
        refused = c.post("/predict", json={"texts": [""]})
        assert refused.status_code == 422 and callers.held == callers.preparing == 0
