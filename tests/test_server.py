"""HTTP server on a free loopback port: order, parity with the predictor, 4xx, 503, draining."""
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest
from test_deploy_helpers import TEXTS, cls_export, tag_export  # noqa: F401

from ppvarlen.deploy.predictor import Predictor
from ppvarlen.deploy.server import Limits, create_app

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RunningServer:
    """uvicorn in a thread on 127.0.0.1; stops (gracefully) on exit."""

    def __init__(self, app):
        import uvicorn

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port,
                                                   log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "server did not start"
            time.sleep(0.02)
        return self

    def stop(self):
        self.server.should_exit = True
        self.thread.join(30)
        assert not self.thread.is_alive()

    def __exit__(self, *exc):
        self.stop()


class SlowPredictor:
    """A real predictor that takes ``delay`` seconds per batch (to fill the queue)."""

    def __init__(self, predictor, delay):
        self._p, self.delay = predictor, delay

    def __getattr__(self, name):
        return getattr(self._p, name)

    def clone(self):
        return SlowPredictor(self._p.clone(), self.delay)

    def predict_encoded(self, items):
        time.sleep(self.delay)
        return self._p.predict_encoded(items)


def post(url, payload=None, content=None, headers=None):
    body = content if content is not None else json.dumps(payload, ensure_ascii=False).encode()
    return httpx.post(url + "/predict", content=body, headers=headers, timeout=30)


def run_concurrently(fn, args_list):
    out = [None] * len(args_list)

    def call(i, a):
        out[i] = fn(*a)

    threads = [threading.Thread(target=call, args=(i, a)) for i, a in enumerate(args_list)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out


@pytest.mark.parametrize("task", ["classification", "tagging"])
def test_concurrent_requests_keep_order_and_match_predictor(cls_export, tag_export,  # noqa: F811
                                                            task):
    export_dir = (cls_export if task == "classification" else tag_export)[0]
    expected_of = Predictor(export_dir, "onnx")
    app = create_app(Predictor(export_dir, "paddle"), workers=2, max_wait_ms=20)
    requests = [[TEXTS[(k + j) % len(TEXTS)] * (1 + j % 2) for j in range(1 + k % 4)]
                for k in range(16)]
    with RunningServer(app) as srv:
        replies = run_concurrently(lambda texts: post(srv.url, {"texts": texts}),
                                   [(r,) for r in requests])
        metrics = httpx.get(srv.url + "/metrics.json").json()
        health = httpx.get(srv.url + "/health").json()
    for texts, reply in zip(requests, replies):
        assert reply.status_code == 200, reply.text
        got = reply.json()["predictions"]
        want = expected_of.predict(texts)
        if task == "classification":
            assert [g["label"] for g in got] == [w["label"] for w in want]
        else:
            assert [g["tags"] for g in got] == [w["tags"] for w in want]
            assert [g["entities"] for g in got] == [w["entities"] for w in want]
    assert metrics["items"] == sum(len(r) for r in requests)
    assert metrics["responses"]["200"] == len(requests)
    assert metrics["latency_ms"]["p99"] >= metrics["latency_ms"]["p50"] > 0
    assert 0 < metrics["padding_efficiency"] <= 1 and metrics["queue_depth"] == 0
    assert health["status"] == "ok" and health["task"] == task
    if task == "tagging":  # the scheme answers are read with; repairs summed over all answers
        with open(os.path.join(export_dir, "manifest.json"), encoding="utf-8") as f:
            assert json.load(f)["tag_scheme"] == health["tag_scheme"] == "bio"
        answered = [g for reply in replies for g in reply.json()["predictions"]]
        assert metrics["answers"]["tag_chunks_repaired"] == sum(g["repaired_chunks"]
                                                                for g in answered)
        assert metrics["answers"]["tag_sequences_repaired"] == sum(g["repaired_chunks"] > 0
                                                                   for g in answered)


def test_malformed_requests_get_4xx_naming_the_field(cls_export):  # noqa: F811
    limits = Limits(max_texts_per_request=3, max_body_bytes=2000, max_text_chars=50)
    app = create_app(Predictor(cls_export[0], "onnx"), limits=limits, max_wait_ms=1)
    cases = [
        (dict(content=b"{\"texts\": [\"a\""), 400, "body", "not valid JSON"),
        (dict(content=b"\xff\xfe"), 400, "body", "not valid JSON"),
        (dict(payload=["a"]), 422, "body", "JSON object"),
        (dict(payload={}), 422, "texts", "required"),
        (dict(payload={"texts": "abc"}), 422, "texts", "list of strings"),
        (dict(payload={"texts": []}), 422, "texts", "empty"),
        (dict(payload={"texts": ["好", 3]}), 422, "texts[1]", "must be a string"),
        (dict(payload={"texts": ["好", "  "]}), 422, "texts[1]", "empty"),
        (dict(payload={"texts": ["a"] * 4}), 422, "texts", "at most 3"),
        (dict(payload={"texts": ["长" * 51]}), 422, "texts[0]", "at most 50"),
        (dict(payload={"texts": ["a"], "extra": 1}), 422, "extra", "unknown field"),
        (dict(content=b"[" + b"1," * 1500 + b"1]"), 413, "body", "Deploy.max_body_bytes"),
    ]
    with RunningServer(app) as srv:
        for kw, status, field, words in cases:
            r = post(srv.url, **kw)
            assert r.status_code == status, (kw, r.text)
            assert r.json()["field"] == field and words in r.json()["error"], r.text
        # chunked upload without Content-Length is bounded while reading
        r = httpx.post(srv.url + "/predict", content=iter([b"{\"texts\": [\"" + b"a" * 1000] * 3),
                       timeout=30)
        assert r.status_code == 413
        assert post(srv.url, {"texts": ["好"]}).status_code == 200  # still serving


def test_bad_requests_do_not_affect_batchmates(cls_export):  # noqa: F811
    p = Predictor(cls_export[0], "paddle")
    want = p.predict(TEXTS)
    app = create_app(p, max_wait_ms=50)
    with RunningServer(app) as srv:
        calls = [({"texts": TEXTS},), ({"texts": [1]},), ({"texts": TEXTS},), ({"texts": [""]},)]
        replies = run_concurrently(lambda payload: post(srv.url, payload), calls * 3)
    for (payload,), r in zip(calls * 3, replies):
        if payload["texts"] is TEXTS:
            assert r.status_code == 200 and r.json()["predictions"] == want
        else:
            assert r.status_code == 422


def test_overload_gets_503_while_accepted_requests_succeed(cls_export):  # noqa: F811
    p = Predictor(cls_export[0], "onnx")
    want = {t: r for t, r in zip(TEXTS, p.predict(TEXTS))}
    app = create_app(SlowPredictor(p, 0.15), max_wait_ms=0, max_batch_size=1, queue_size=2)
    with RunningServer(app) as srv:
        texts = [TEXTS[k % len(TEXTS)] for k in range(12)]
        replies = run_concurrently(lambda t: post(srv.url, {"texts": [t]}), [(t,) for t in texts])
        statuses = [r.status_code for r in replies]
        assert 503 in statuses and 200 in statuses, statuses
        for t, r in zip(texts, replies):
            if r.status_code == 503:
                assert r.headers["Retry-After"] == "1" and "overloaded" in r.json()["error"]
            else:
                assert r.status_code == 200 and r.json()["predictions"] == [want[t]]
        # once the burst is over the server answers normally again
        assert post(srv.url, {"texts": [TEXTS[0]]}).json()["predictions"] == [want[TEXTS[0]]]
        assert httpx.get(srv.url + "/metrics.json").json()["responses"]["503"] == statuses.count(503)


def test_shutdown_drains_accepted_requests(cls_export):  # noqa: F811
    p = Predictor(cls_export[0], "onnx")
    app = create_app(SlowPredictor(p, 0.2), max_wait_ms=0, max_batch_size=1, queue_size=100)
    srv = RunningServer(app).__enter__()
    replies = {}
    threads = [threading.Thread(target=lambda k=k: replies.__setitem__(
        k, post(srv.url, {"texts": [TEXTS[k]]}))) for k in range(4)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 10
    while httpx.get(srv.url + "/metrics.json").json()["requests"] < 4:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    srv.stop()  # what SIGINT/SIGTERM does: stop accepting, finish in-flight requests
    for t in threads:
        t.join(30)
    assert [replies[k].status_code for k in range(4)] == [200] * 4


def test_serve_script_starts_and_stops_on_sigint(cls_export):  # noqa: F811
    port = free_port()
    proc = subprocess.Popen([sys.executable, os.path.join(REPO, "deploy/python/serve.py"),
                             "--model-dir", cls_export[0], "--port", str(port), "--backend", "onnx",
                             "-o", "Deploy.max_wait_ms=1"], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "serve.py did not come up"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        r = httpx.post(f"http://127.0.0.1:{port}/predict", json={"texts": ["好"]}, timeout=10)
        assert r.status_code == 200
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_serve_script_rejects_bad_options(cls_export, tmp_path):  # noqa: F811
    script = os.path.join(REPO, "deploy/python/serve.py")
    r = subprocess.run([sys.executable, script, "--model-dir", str(tmp_path)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "manifest.json is missing" in r.stderr
    r = subprocess.run([sys.executable, script, "--model-dir", cls_export[0], "-o",
                        "Deploy.max_wait_mss=1"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "max_wait_ms" in r.stderr and "Traceback" not in r.stderr
