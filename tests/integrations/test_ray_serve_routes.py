"""Ray Serve replicas run the same app: the Open Inference Protocol v2 routes (driven by Triton's
client), Prometheus /metrics and a model repository rollout work through Serve's proxy."""
import os
import shutil

import httpx
import numpy as np
import pytest
from export_helpers import TEXTS, cls_export  # noqa: F401
from test_prometheus import samples, value

ray = pytest.importorskip("ray")
triton = pytest.importorskip("tritonclient.http")
from ray import serve  # noqa: E402

from ppvarlen.integrations.ray_serve import load_serve_config, run_config  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_serve_replica_answers_oip_metrics_and_rolls_out(ray_cluster, cls_export, tmp_path,  # noqa: F811
                                                         free_port):
    root = tmp_path / "models"
    shutil.copytree(cls_export[0], root / "tiny" / "1")
    config = load_serve_config(os.path.join(REPO, "deploy", "ray", "serve.yaml"))
    config.http_options.port = free_port
    app = config.applications[0]
    app.args = {"model_repository": str(root), "backend": "onnx",
                "deploy": {"max_wait_ms": 5, "repository_poll_s": 0}}
    app.deployments[0].num_replicas = 1
    url = run_config(config)
    try:
        client = triton.InferenceServerClient(url.removeprefix("http://"), network_timeout=120.0)
        assert client.is_server_live() and client.is_server_ready()
        assert client.is_model_ready("tiny", "1")
        assert client.get_model_metadata("tiny")["inputs"][0]["datatype"] == "BYTES"
        texts = triton.InferInput("text", [len(TEXTS)], "BYTES")
        texts.set_data_from_numpy(np.array([t.encode() for t in TEXTS], dtype=np.object_))
        result = client.infer("tiny", [texts])
        want = httpx.post(url + "/predict", json={"texts": TEXTS}, timeout=120).json()
        assert [v.decode() for v in result.as_numpy("label")] == [
            p["label"] for p in want["predictions"]]
        assert result.get_response()["model_version"] == want["model_version"] == "1"

        shutil.copytree(cls_export[0], root / "tiny" / "2")  # a rollout: version 2 appears
        loaded = httpx.post(url + "/v2/repository/models/tiny/load", timeout=300)
        assert loaded.status_code == 200 and loaded.json()["version"] == "2", loaded.text
        after = httpx.post(url + "/predict", json={"texts": TEXTS[:1]}, timeout=120)
        assert after.headers["X-Model-Version"] == "2"
        assert after.json()["predictions"] == want["predictions"][:1]  # same weights
        metrics = samples(httpx.get(url + "/metrics", timeout=60).text)
        assert value(metrics, "ppvarlen_requests_total", route="/predict", status="200") == 2
        assert value(metrics, "ppvarlen_model_version_loaded", model="tiny", version="1") == 0
        client.close()
    finally:
        serve.delete(app.name)
