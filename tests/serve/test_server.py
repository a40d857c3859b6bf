"""HTTP server on a free loopback port: order, parity with the predictor, 4xx, 503, draining."""
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest
from export_helpers import TEXTS, cls_export, tag_export  # noqa: F401

from ppvarlen.runtime.predictor import Predictor
from ppvarlen.serve.http.connections import uvicorn_config
from ppvarlen.serve.server import create_app, deploy_settings

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def listening_socket():
    """A socket bound to a free loopback port by the kernel, kept open for the server (no
    bind-close-reuse race with other processes)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


def wait_for(condition, what, timeout=120, every=0.02):
    """Poll ``condition()`` until it is truthy; fail naming ``what`` after ``timeout`` s (generous:
    the suite shares a loaded machine)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(every)


class RunningServer:
    """uvicorn in a thread on 127.0.0.1 (a pre-bound socket), configured as ``serve()``
    configures it (``connection_keys``: Deploy connection bounds); stops (gracefully) on exit;
    ``events`` counts the connection layer's refusals."""

    def __init__(self, app, **connection_keys):
        import uvicorn

        self.sock = listening_socket()
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        # the uvicorn config serve() runs, with the Deploy connection bounds
        config = uvicorn_config(app, deploy_settings(**connection_keys), "127.0.0.1", self.port)
        self.events = config.http.events
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       daemon=True)

    def __enter__(self):
        self.thread.start()
        wait_for(lambda: self.server.started or not self.thread.is_alive(), "the server to start")
        assert self.thread.is_alive(), "the server thread died while starting"
        return self

    def stop(self):
        self.server.should_exit = True
        self.thread.join(120)
        assert not self.thread.is_alive(), "the server did not stop within 120 s"
        self.sock.close()

    def __exit__(self, *exc):
        self.stop()


class GatedPredictor:
    """A real predictor whose batches wait until the test opens ``gate`` (to fill the queue
    without racing a timer); ``in_flight`` counts batches waiting at the gate."""

    def __init__(self, predictor, gate=None, shared=None):
        self._p = predictor
        self.gate = gate or threading.Event()
        self._shared = shared or {"lock": threading.Lock(), "in_flight": 0}

    @property
    def in_flight(self):
        return self._shared["in_flight"]

    def __getattr__(self, name):
        return getattr(self._p, name)

    def clone(self):
        return GatedPredictor(self._p.clone(), self.gate, self._shared)

    def predict_encoded(self, items):
        with self._shared["lock"]:
            self._shared["in_flight"] += 1
        try:
            assert self.gate.wait(300), "the test never opened the gate"
        finally:
            with self._shared["lock"]:
                self._shared["in_flight"] -= 1
        return self._p.predict_encoded(items)


def post(url, payload=None, content=None, headers=None):
    body = content if content is not None else json.dumps(payload, ensure_ascii=False).encode()
    return httpx.post(url + "/predict", content=body, headers=headers, timeout=120)


def run_concurrently(fn, args_list, timeout=300):
    """``fn(*a)`` for each ``a`` in threads; the results in order.  A call that raised re-raises
    here; calls still running after ``timeout`` s fail the test (never a silent None)."""
    out, errors = [None] * len(args_list), {}

    def call(i, a):
        try:
            out[i] = fn(*a)
        except BaseException as e:  # noqa: BLE001 -- handed to the test thread below
            errors[i] = e

    threads = [threading.Thread(target=call, args=(i, a), daemon=True)
               for i, a in enumerate(args_list)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    stuck = [i for i, t in enumerate(threads) if t.is_alive()]
    if stuck:
        raise TimeoutError(f"run_concurrently: calls {stuck} of {len(threads)} still running "
                           f"after {timeout} s")
    if errors:
        i = min(errors)
        raise RuntimeError(f"run_concurrently: call {i} raised {errors[i]!r}") from errors[i]
    return out


@pytest.mark.parametrize("task", ["classification", "tagging"])
def test_concurrent_requests_keep_order_and_match_predictor(cls_export, tag_export,  # noqa: F811
                                                            task):
    export_dir = (cls_export if task == "classification" else tag_export)[0]
    expected_of = Predictor(export_dir, "onnx")
    app = create_app(Predictor(export_dir, "paddle"), deploy=deploy_settings(workers=2, max_wait_ms=20))
    requests = [[TEXTS[(k + j) % len(TEXTS)] * (1 + j % 2) for j in range(1 + k % 4)]
                for k in range(16)]
    with RunningServer(app) as srv:
        replies = run_concurrently(lambda texts: post(srv.url, {"texts": texts}),
                                   [(r,) for r in requests])
        metrics = httpx.get(srv.url + "/metrics.json", timeout=120).json()
        health = httpx.get(srv.url + "/health", timeout=120).json()
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


def test_one_worker_on_two_threads_splits_them_under_load_and_says_so(cls_export):  # noqa: F811
    """Deploy.split_threads_under_load: one worker on 2 ONNX Runtime threads gets a second,
    1-thread session for batches that queue; /health and the OIP model config say so, and
    the answers are the predictor's own.  Off (the default), or on Paddle Inference (its
    predictors keep one thread count): null."""
    export_dir = cls_export[0]
    want = Predictor(export_dir, "onnx").predict(TEXTS)
    app = create_app(Predictor(export_dir, "onnx", threads=2),
                     deploy=deploy_settings(max_wait_ms=1, split_threads_under_load=True))
    with RunningServer(app) as srv:
        replies = run_concurrently(lambda k: post(srv.url, {"texts": [TEXTS[k % len(TEXTS)]]}),
                                   [(k,) for k in range(24)])
        health = httpx.get(srv.url + "/health", timeout=120).json()
        config = httpx.get(srv.url + f"/v2/models/{health['model_name']}/config",
                           timeout=120).json()
        metrics = httpx.get(srv.url + "/metrics.json", timeout=120).json()
    for k, reply in enumerate(replies):
        assert reply.status_code == 200, reply.text
        assert reply.json()["predictions"] == [want[k % len(TEXTS)]]
    split = {"batches_at_once": 2, "threads_each": 1}
    assert health["threads"] == 2 and health["threads_under_load"] == split
    assert config["parameters"]["math_threads_under_load"] == \
        {"string_value": "2 batches at once, 1 thread each"}
    assert 0 <= metrics["batches_narrow"] <= metrics["batches"]
    for predictor, deploy in ((Predictor(export_dir, "onnx", threads=2), deploy_settings()),
                              (Predictor(export_dir, "paddle", threads=2),
                               deploy_settings(split_threads_under_load=True))):
        with RunningServer(create_app(predictor, deploy=deploy)) as srv:
            health = httpx.get(srv.url + "/health", timeout=120).json()
        assert health["threads"] == 2 and health["threads_under_load"] is None


def split_server_warnings(predictor):
    """(/health, the serving layer's warnings) of a server of ``predictor`` started with
    Deploy.split_threads_under_load."""
    warnings = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: warnings.append(record.getMessage())
    logger = logging.getLogger("ppvarlen.serve.repository")
    logger.addHandler(handler)
    try:
        app = create_app(predictor, deploy=deploy_settings(split_threads_under_load=True))
        with RunningServer(app) as srv:
            return httpx.get(srv.url + "/health", timeout=120).json(), warnings
    finally:
        logger.removeHandler(handler)


def test_a_one_thread_session_answering_otherwise_is_not_split_in(cls_export,  # noqa: F811
                                                                   monkeypatch):
    """The split runs a text on either session: one whose outputs on admission's smoke rows
    differ from the wide one's (here skewed by 1e-3) is dropped at start, with a warning."""
    from ppvarlen.runtime import backends

    real = backends.OnnxEngine.with_threads

    def skewed(self, threads):
        engine = real(self, threads)
        run = engine.run
        engine.run = lambda *arrays: {k: v + 1e-3 if v.dtype.kind == "f" else v
                                      for k, v in run(*arrays).items()}
        return engine

    monkeypatch.setattr(backends.OnnxEngine, "with_threads", skewed)
    health, warnings = split_server_warnings(Predictor(cls_export[0], "onnx", threads=2))
    assert health["threads"] == 2 and health["threads_under_load"] is None
    assert any("the one-thread session answers admission's smoke rows otherwise than the "
               "first; every batch runs on all 2 threads" in m for m in warnings), warnings


def test_a_split_asked_for_on_one_math_thread_says_nothing_was_split_and_why(
        cls_export):  # noqa: F811
    """Deploy.split_threads_under_load on a version that runs on one math thread (here set; a
    threads auto that chose one says its reason the same way): nothing to split, a warning
    naming why, not silence."""
    health, warnings = split_server_warnings(Predictor(cls_export[0], "onnx", threads=1))
    assert health["threads"] == 1 and health["threads_under_load"] is None
    assert any("Deploy.split_threads_under_load: nothing split: one math thread to split ("
               in m for m in warnings), warnings


def test_malformed_requests_get_4xx_naming_the_field(cls_export):  # noqa: F811
    limits = dict(max_texts_per_request=3, max_body_bytes=2000, max_text_chars=50)
    app = create_app(Predictor(cls_export[0], "onnx"), deploy=deploy_settings(**limits, max_wait_ms=1))
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
    app = create_app(p, deploy=deploy_settings(max_wait_ms=50))
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
    gated = GatedPredictor(p)
    app = create_app(gated, deploy=deploy_settings(max_wait_ms=0, max_batch_size=1, queue_size=2))
    texts = [TEXTS[k % len(TEXTS)] for k in range(12)]
    with RunningServer(app) as srv:
        burst = {}
        sender = threading.Thread(target=lambda: burst.setdefault("replies", run_concurrently(
            lambda t: post(srv.url, {"texts": [t]}), [(t,) for t in texts])), daemon=True)
        sender.start()

        def settled():  # every request answered 503, queued, or held at the gate
            m = httpx.get(srv.url + "/metrics.json", timeout=120).json()
            return (m["requests"] == len(texts) and m["responses"].get("503", 0) + m["queue_depth"]
                    + gated.in_flight == len(texts))

        wait_for(settled, "the burst to fill the queue")
        gated.gate.set()
        sender.join(300)
        assert not sender.is_alive(), "requests still running 300 s after the gate opened"
        statuses = [r.status_code for r in burst["replies"]]
        assert statuses.count(200) == 3 and statuses.count(503) == 9, statuses  # 1 running + 2
        for t, r in zip(texts, burst["replies"]):
            if r.status_code == 503:
                assert r.headers["Retry-After"] == "1" and "overloaded" in r.json()["error"]
            else:
                assert r.status_code == 200 and r.json()["predictions"] == [want[t]]
        # once the burst is over the server answers normally again
        assert post(srv.url, {"texts": [TEXTS[0]]}).json()["predictions"] == [want[TEXTS[0]]]
        metrics = httpx.get(srv.url + "/metrics.json", timeout=120).json()
        assert metrics["responses"]["503"] == statuses.count(503)


def test_shutdown_drains_accepted_requests(cls_export):  # noqa: F811
    p = Predictor(cls_export[0], "onnx")
    gated = GatedPredictor(p)
    app = create_app(gated, deploy=deploy_settings(max_wait_ms=0, max_batch_size=1, queue_size=100))
    srv = RunningServer(app).__enter__()
    replies = {}
    threads = [threading.Thread(target=lambda k=k: replies.__setitem__(
        k, post(srv.url, {"texts": [TEXTS[k]]})), daemon=True) for k in range(4)]
    for t in threads:
        t.start()
    wait_for(lambda: httpx.get(srv.url + "/metrics.json", timeout=120).json()["queue_depth"]
             + gated.in_flight == 4, "4 requests accepted")
    srv.server.should_exit = True  # what SIGINT/SIGTERM does: stop accepting, finish in-flight
    gated.gate.set()
    srv.stop()
    for t in threads:
        t.join(120)
        assert not t.is_alive()
    assert [replies[k].status_code for k in range(4)] == [200] * 4


def test_serve_script_starts_and_stops_on_sigint(cls_export, tmp_path):  # noqa: F811
    port_file = tmp_path / "port"
    proc = subprocess.Popen([sys.executable, os.path.join(REPO, "deploy/python/serve.py"),
                             "--model-dir", cls_export[0], "--port", "0", "--port-file",
                             str(port_file), "--backend", "onnx", "-o", "Deploy.max_wait_ms=1"],
                            stderr=subprocess.PIPE, text=True)
    try:
        def port_written():
            assert proc.poll() is None, proc.stderr.read()
            return port_file.exists() and int(port_file.read_text())

        port = wait_for(port_written, "serve.py to write its port", timeout=180, every=0.2)
        # the port file appears once the socket listens: a connection is queued, not refused
        socket.create_connection(("127.0.0.1", port), timeout=60).close()
        url = f"http://127.0.0.1:{port}"
        # the socket listens before the app's startup (loading the predictor) completes
        wait_for(lambda: answers_200(url + "/health"), "serve.py's /health", timeout=180,
                 every=0.2)
        r = httpx.post(url + "/predict", json={"texts": ["好"]}, timeout=120)
        assert r.status_code == 200
        proc.send_signal(signal.SIGINT)
        assert proc.wait(120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(60)


def test_a_single_export_served_on_onnx_by_the_default_backend_loads_no_paddle(cls_export,  # noqa: F811
                                                                               tmp_path):
    """``--backend auto`` (the default) chose ONNX Runtime: Paddle is not in the process (it
    costs an ONNX Runtime server memory and speed, docs/PRECISION.md).  The export's Paddle
    entry is removed, so the choice is ONNX whatever the timing."""
    export = tmp_path / "export"
    shutil.copytree(cls_export[0], export)
    manifest = json.loads((export / "manifest.json").read_text())
    for key in ("backends", "precisions", "precision_measured"):
        (manifest.get(key) or {}).pop("paddle", None)
    (export / "manifest.json").write_text(json.dumps(manifest))
    port_file = tmp_path / "port"
    proc = subprocess.Popen([sys.executable, os.path.join(REPO, "deploy/python/serve.py"),
                             "--model-dir", str(export), "--port", "0", "--port-file",
                             str(port_file)], stderr=subprocess.PIPE, text=True)
    try:
        def port_written():
            assert proc.poll() is None, proc.stderr.read()
            return port_file.exists() and int(port_file.read_text())

        url = f"http://127.0.0.1:{wait_for(port_written, 'the port file', 180, 0.2)}"
        wait_for(lambda: answers_200(url + "/health"), "/health", timeout=180, every=0.2)
        assert httpx.get(url + "/health", timeout=30).json()["backend"] == "onnx"
        maps = open(f"/proc/{proc.pid}/maps").read()
        assert "onnxruntime" in maps  # the libraries the process has loaded, as the kernel sees
        assert "libpaddle" not in maps
        proc.send_signal(signal.SIGINT)
        assert proc.wait(120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(60)


def answers_200(url):
    """Whether a GET of ``url`` answers 200 now (False while the server is not listening)."""
    try:
        return httpx.get(url, timeout=30).status_code == 200
    except httpx.TransportError:
        return False


def test_serve_script_rejects_bad_options(cls_export, tmp_path):  # noqa: F811
    script = os.path.join(REPO, "deploy/python/serve.py")
    r = subprocess.run([sys.executable, script, "--model-dir", str(tmp_path)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "manifest.json is missing" in r.stderr
    r = subprocess.run([sys.executable, script, "--model-dir", cls_export[0], "-o",
                        "Deploy.max_wait_mss=1"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "max_wait_ms" in r.stderr and "Traceback" not in r.stderr
