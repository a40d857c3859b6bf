"""The model repository extension, server readiness and the request timeout as the protocol
and Triton define them, against ppvarlen-serve on a model repository (REST and gRPC, with
tritonclient).  Sources: kserve/open-inference-protocol inference_rest.md (main of
2025-05-11): "The 'server ready' health API indicates if all the models are ready for
inferencing"; Triton's protocol extensions (triton-inference-server/server docs/protocol/
extension_model_repository.md: index with ``ready``, load, unload; extension_parameters.md and
tritonclient's ``timeout``: microseconds a request may wait, Triton answering "Request timeout
expired" with UNAVAILABLE); grpc/grpc doc/health-checking.md.

The repository holds ``sentiment/1`` (the tiny classification export, its batches held at a
gate the test opens: ``GatedPredictor``) and ``broken/1`` (an export whose weights are not what
its manifest hashes: refused at load).
"""
import functools
import json
import shutil
import threading

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from export_helpers import TEXTS, cls_export  # noqa: F401
from grpc_health.v1 import health_pb2, health_pb2_grpc
from test_server import GatedPredictor, RunningServer, wait_for
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from ppvarlen.runtime.predictor import Predictor
from ppvarlen.serve.server import create_app, deploy_settings


class Repo:
    def __init__(self, srv, app, root, gate, shared):
        self.url, self.root, self.gate, self.shared = srv.url, root, gate, shared
        self.grpc_url = f"127.0.0.1:{app.state.grpc.port}"

    def held(self):
        """Batches waiting at the gate."""
        return self.shared["in_flight"]

    def queued(self):
        return httpx.get(self.url + "/metrics.json").json()["queue_depth"]

    def http(self):
        return thttp.InferenceServerClient(self.url.removeprefix("http://"))

    def grpc(self):
        return tgrpc.InferenceServerClient(self.grpc_url)


def _gated(gate, shared, export_dir):
    return GatedPredictor(Predictor(export_dir, "onnx"), gate, shared)


@pytest.fixture(scope="module")
def repo(cls_export, tmp_path_factory):  # noqa: F811
    root = tmp_path_factory.mktemp("repository") / "models"
    shutil.copytree(cls_export[0], root / "sentiment" / "1")
    shutil.copytree(cls_export[0], root / "broken" / "1")
    listed = json.loads((root / "broken" / "1" / "manifest.json").read_text())["files"]
    (root / "broken" / "1" / sorted(listed)[0]).write_bytes(b"not what the manifest hashes")
    gate, shared = threading.Event(), {"lock": threading.Lock(), "in_flight": 0}
    gate.set()
    app = create_app(repository=str(root), load_predictor=functools.partial(_gated, gate, shared),
                     deploy=deploy_settings(repository_poll_s=None, max_wait_ms=1, workers=1,
                                            drain_timeout_s=60), grpc_port=0)
    with RunningServer(app) as srv:
        yield Repo(srv, app, root, gate, shared)


def texts(module, n=1):
    tensor = module.InferInput("text", [n], "BYTES")
    tensor.set_data_from_numpy(np.array([t.encode() for t in TEXTS[:n]], dtype=np.object_))
    return [tensor]


def health_status(repo, service=""):
    with grpc.insecure_channel(repo.grpc_url) as channel:
        return health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=30).status


def test_1_server_ready_only_when_every_model_is(repo):
    """A model of the repository left without a version (refused) makes the server not ready;
    once its directory is gone, ready."""
    assert httpx.get(repo.url + "/v2/health/ready").status_code == 503
    assert not repo.grpc().is_server_ready()
    assert health_status(repo) == health_pb2.HealthCheckResponse.NOT_SERVING
    assert health_status(repo, "sentiment") == health_pb2.HealthCheckResponse.SERVING
    index = httpx.post(repo.url + "/v2/repository/index").json()
    assert {(e["name"], e["state"]) for e in index} == {("sentiment", "READY"),
                                                        ("broken", "UNAVAILABLE")}
    ready = httpx.post(repo.url + "/v2/repository/index", json={"ready": True}).json()
    assert [(e["name"], e["state"]) for e in ready] == [("sentiment", "READY")]
    with grpc.insecure_channel(repo.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        grpc_ready = stub.RepositoryIndex(service_pb2.RepositoryIndexRequest(ready=True))
        grpc_all = stub.RepositoryIndex(service_pb2.RepositoryIndexRequest())
    assert [m.name for m in grpc_ready.models] == ["sentiment"] and len(grpc_all.models) == 2
    shutil.rmtree(repo.root / "broken")
    assert httpx.get(repo.url + "/v2/health/ready").status_code == 200
    assert repo.grpc().is_server_ready()
    assert "model_repository" in httpx.get(repo.url + "/v2").json()["extensions"]


def test_2_unload_drains_the_queue_then_load_serves_again(repo):
    repo.gate.clear()
    client = repo.http()
    answers = {}
    held = threading.Thread(target=lambda: answers.setdefault(
        "held", repo.http().infer("sentiment", texts(thttp))), daemon=True)
    held.start()
    wait_for(lambda: repo.held() == 1, "a request held at the gate")
    unloading = threading.Thread(target=lambda: answers.setdefault(
        "unload", httpx.post(repo.url + "/v2/repository/models/sentiment/unload", timeout=120)),
        daemon=True)
    unloading.start()
    wait_for(lambda: httpx.get(repo.url + "/v2/models/sentiment/ready").status_code == 404,
             "sentiment out of routing")
    refused = httpx.post(repo.url + "/v2/models/sentiment/infer", json={"inputs": [
        {"name": "text", "datatype": "BYTES", "shape": [1], "data": [TEXTS[0]]}]})
    assert refused.status_code == 404 and "error" in refused.json()
    assert unloading.is_alive(), "unload returned before the queued request was answered"
    repo.gate.set()
    held.join(120)
    unloading.join(120)
    assert answers["held"].as_numpy("probs").shape == (1, 2)  # the queued one was answered
    assert answers["unload"].status_code == 200, answers["unload"].text
    index = {e["name"]: e for e in httpx.post(repo.url + "/v2/repository/index").json()}
    assert index["sentiment"]["state"] == "UNAVAILABLE"
    assert httpx.get(repo.url + "/v2/health/ready").status_code == 503  # no model at all
    grpc_client = repo.grpc()
    grpc_client.load_model("sentiment")
    assert grpc_client.is_model_ready("sentiment")
    grpc_client.unload_model("sentiment")
    with pytest.raises(InferenceServerException):
        grpc_client.is_model_ready("sentiment")
    client.load_model("sentiment")
    # server-ready means every model is: the refused `broken` counts until test_1 removes it
    # (pytest-randomly may run this test first)
    assert client.is_model_ready("sentiment")
    assert client.is_server_ready() == (not (repo.root / "broken").exists())


def test_3_a_request_timeout_expires_in_the_queue_with_triton_s_answer(repo):
    """tritonclient's ``timeout`` (microseconds): a request still queued when it passes is
    refused, 503 over REST and UNAVAILABLE over gRPC, "request timeout expired"; the one that
    held the worker is answered."""
    repo.gate.clear()
    answers = {}  # one client per thread: a tritonclient.http client holds one connection
    held = threading.Thread(target=lambda: answers.setdefault(
        "held", repo.http().infer("sentiment", texts(thttp))), daemon=True)
    held.start()
    wait_for(lambda: repo.held() == 1, "the first request at the gate")
    waiting = [threading.Thread(target=lambda: answers.setdefault("rest", _refusal(
                   lambda: repo.http().infer("sentiment", texts(thttp), timeout=100_000))),
                   daemon=True),
               threading.Thread(target=lambda: answers.setdefault("grpc", _refusal(
                   lambda: repo.grpc().infer("sentiment", texts(tgrpc), timeout=100_000))),
                   daemon=True)]
    for t in waiting:
        t.start()
    wait_for(lambda: repo.queued() == 2, "both timed requests queued")
    threading.Event().wait(0.3)  # past their 0.1 s; the worker is still held at the gate
    repo.gate.set()
    for t in [held, *waiting]:
        t.join(120)
    assert answers["held"].as_numpy("probs").shape == (1, 2)
    assert "request timeout expired" in answers["rest"].message()
    assert answers["rest"].status() == "503"
    assert "request timeout expired" in answers["grpc"].message()
    assert answers["grpc"].status() == "StatusCode.UNAVAILABLE"
    ok = repo.http().infer("sentiment", texts(thttp), timeout=30_000_000)  # time enough: answered
    assert ok.as_numpy("probs").shape == (1, 2)


def _refusal(call):
    try:
        call()
    except InferenceServerException as e:
        return e
    raise AssertionError("the timed request was answered; it should have expired")


@pytest.mark.parametrize("name", ["nosuch", "..", "a%2Fb", "x" * 300])
def test_unloading_or_loading_a_model_the_repository_lacks_is_a_4xx_naming_it(repo, name):
    """A hostile or unknown model name on the repository routes is refused in the protocol's
    error form, never a 500; the served model is untouched."""
    for action in ("unload", "load"):
        r = httpx.post(f"{repo.url}/v2/repository/models/{name}/{action}", timeout=60)
        assert 400 <= r.status_code < 500, (action, name, r.status_code, r.text)
        assert set(r.json()) == {"error"}, r.text
    assert httpx.get(repo.url + "/v2/models/sentiment/ready").status_code == 200
