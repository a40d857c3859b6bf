"""Connection bounds (ppvarlen/serve/http/connections.py) over real sockets on 127.0.0.1.

Every server here is built by ``connections.uvicorn_config``, the builder ``serve()`` runs:
in a thread with a small FastAPI app for the answers and deadlines, and as
``deploy/python/serve.py`` itself (a subprocess serving a tiny export) where the server's own
descriptors and memory are measured and a real /predict must be answered after the attack.
Deadlines are set to about a second; every wait is bounded generously (the suite shares a
loaded machine) and no test asserts that something took at least some time.
"""
import hashlib
import inspect
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time

import httptools
import httpx
import pytest
import uvicorn
from fastapi import FastAPI, Request
from starlette.requests import ClientDisconnect
from test_deploy_helpers import TEXTS, make_tiny_export
from test_server import RunningServer, wait_for
from uvicorn.protocols.http import httptools_impl

from ppvarlen.config import ConfigError, load_config
from ppvarlen.serve.http import connections
from ppvarlen.runtime.predictor import Predictor

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WAIT_S = 15  # the longest any answer or close is waited for (the deadlines are ~1 s)
# uvicorn/protocols/http/httptools_impl.py as BoundedHttpToolsProtocol was written against it
HTTPTOOLS_IMPL_SHA256 = "475becbacd7474f6b0d7528db1d1a2bbc3c56af9aae42abbe18dc293f2060eeb"


def deploy_settings(**keys):
    """The Deploy section with ``keys`` set as ``-o Deploy.KEY=V`` would (None = null)."""
    return load_config(overrides=[f"Deploy.{k}={'null' if v is None else v}"
                                  for k, v in keys.items()]).Deploy


def small_app():
    """GET /hello answers the client's port (one port = one connection); POST /echo reads the
    body and answers its length, recording in ``app.state.disconnects`` a client that left."""
    app = FastAPI()
    app.state.disconnects = []

    @app.get("/hello")
    async def hello(request: Request):
        return {"client_port": request.client.port}

    @app.post("/echo")
    async def echo(request: Request):
        try:
            body = await request.body()
        except ClientDisconnect:
            app.state.disconnects.append(request.client.port)
            return {"gone": True}  # dropped by uvicorn: the client has gone
        return {"bytes": len(body)}

    return app


class BoundedServer(RunningServer):
    """``small_app`` (or ``app``) served as ``serve()`` serves, with the Deploy ``keys``."""

    def __init__(self, app=None, **keys):
        self.app = app or small_app()
        super().__init__(self.app, **keys)

    def connect(self):
        return socket.create_connection(("127.0.0.1", self.port), timeout=WAIT_S)


def read_until_closed(sock, limit_s=WAIT_S):
    """Everything the server sends until it closes (b"" or a reset), within ``limit_s``."""
    sock.settimeout(limit_s)
    deadline = time.monotonic() + limit_s
    data = b""
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, BrokenPipeError):
            return data
        if not chunk:
            return data
        data += chunk
    raise AssertionError(f"the server kept the connection open for {limit_s} s; got {data[:200]!r}")


def parse_answer(data):
    """(status, lower-cased headers, body) of one HTTP/1.1 answer."""
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return status, headers, body


def assert_refusal(data, status, key, field):
    """``data`` is one answer ``status`` in the app's error form naming Deploy.``key``."""
    assert data, f"the connection was closed without the {status} answer"
    got, headers, body = parse_answer(data)
    assert got == status, data[:300]
    assert headers["content-type"] == "application/json" and headers["connection"] == "close"
    error = json.loads(body)
    assert set(error) == {"error", "field"} and error["field"] == field, error
    assert f"Deploy.{key}" in error["error"], error
    return error, headers


@pytest.fixture
def log_records():
    """Every log record of ppvarlen, uvicorn and asyncio while the test runs."""
    records = []

    class Keep(logging.Handler):
        def emit(self, record):  # once, though it may pass several of the loggers below
            if not any(r is record for r in records):
                records.append(record)

    handler = Keep(logging.DEBUG)
    loggers = [logging.getLogger(name) for name in ("ppvarlen", "uvicorn", "uvicorn.error",
                                                    "asyncio", "")]
    saved = [(lg, lg.level) for lg in loggers]
    for lg in loggers:
        lg.addHandler(handler)
    logging.getLogger("ppvarlen.serve.http.connections").setLevel(logging.INFO)
    yield records
    for lg, level in saved:
        lg.removeHandler(handler)
    logging.getLogger("ppvarlen.serve.http.connections").setLevel(logging.NOTSET)


def assert_no_tracebacks(records):
    bad = [r for r in records if r.exc_info or "Traceback" in r.getMessage()]
    assert not bad, [f"{r.name}: {r.getMessage()}" for r in bad]


def reports(records, kind):
    """The report lines ConnectionEvents wrote for ``kind``."""
    what = connections.EVENTS[kind][1]
    return [r for r in records if r.name == "ppvarlen.serve.http.connections" and
            r.levelno >= logging.INFO and r.getMessage().startswith(what)]


# ------------------------------------------------------------------ head bounds

def test_an_oversized_head_is_answered_431_naming_the_key_then_closed(log_records):
    with BoundedServer(max_header_bytes=4096) as srv:
        with srv.connect() as s:  # just over, sent at once: counted as parsed
            s.sendall(b"GET /hello HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 4096 + b"\r\n\r\n")
            assert_refusal(read_until_closed(s), 431, "max_header_bytes", "headers")
        with srv.connect() as s:  # a large one trickled in pieces: refused while it arrives
            s.sendall(b"GET /hello HTTP/1.1\r\nHost: x\r\nX-Big: ")
            sent = 0
            while sent < 1 << 18:
                try:
                    s.sendall(b"a" * 8192)
                except (BrokenPipeError, ConnectionResetError):
                    break
                sent += 8192
                if select.select([s], [], [], 0)[0]:
                    break  # answered: the server is no longer reading the head
            assert_refusal(read_until_closed(s), 431, "max_header_bytes", "headers")
        under = httpx.get(srv.url + "/hello", headers={"X-Fits": "a" * 3000}, timeout=WAIT_S)
        assert under.status_code == 200 and "client_port" in under.json()
        assert srv.events.counts["max_header_bytes"] == 2
    assert len(reports(log_records, "max_header_bytes")) == 1  # the second one only counted
    assert_no_tracebacks(log_records)


def test_more_header_fields_than_max_headers_is_431(log_records):
    with BoundedServer() as srv:  # the default max_headers
        most = srv.events.limits.max_headers
        fields = {f"X-F{i}": "v" for i in range(most)}  # with Host: one over
        with srv.connect() as s:
            s.sendall(b"GET /hello HTTP/1.1\r\nHost: x\r\n" +
                      b"".join(f"{k}: {v}\r\n".encode() for k, v in fields.items()) + b"\r\n")
            error, _ = assert_refusal(read_until_closed(s), 431, "max_headers", "headers")
            assert str(most) in error["error"]
        for k in list(fields)[:5]:  # exactly max_headers with the five httpx adds (Host,
            fields.pop(k)           # Accept, Accept-Encoding, Connection, User-Agent)
        assert httpx.get(srv.url + "/hello", headers=fields, timeout=WAIT_S).status_code == 200
    assert_no_tracebacks(log_records)


# ------------------------------------------------------------------ deadlines

def test_a_head_that_trickles_is_answered_408_and_closed(log_records):
    with BoundedServer(header_timeout_s=1) as srv:
        with srv.connect() as s:
            s.sendall(b"GET /hello HTTP/1.1\r\nHost: x\r\n")
            deadline = time.monotonic() + WAIT_S
            while not select.select([s], [], [], 0.3)[0]:  # a header line every 0.3 s
                assert time.monotonic() < deadline, "the trickling head was never cut off"
                s.sendall(b"X-More: yes\r\n")
            assert_refusal(read_until_closed(s), 408, "header_timeout_s", "headers")
        assert srv.events.counts["header_timeout_s"] == 1
        assert httpx.get(srv.url + "/hello", timeout=WAIT_S).status_code == 200
    assert_no_tracebacks(log_records)


def test_a_silent_new_connection_is_closed_unanswered(log_records):
    with BoundedServer(idle_timeout_s=1) as srv:
        with srv.connect() as s:
            assert read_until_closed(s) == b""
        assert srv.events.counts["idle_timeout_s"] == 1
    assert_no_tracebacks(log_records)


def test_a_body_that_trickles_is_answered_408_and_the_app_hears_a_disconnect(log_records):
    with BoundedServer(body_timeout_s=1) as srv:
        with srv.connect() as s:
            s.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 1000\r\n\r\n" + b"a" * 10)
            deadline = time.monotonic() + WAIT_S
            while not select.select([s], [], [], 0.3)[0]:  # a byte every 0.3 s
                assert time.monotonic() < deadline, "the trickling body was never cut off"
                s.sendall(b"a")
            assert_refusal(read_until_closed(s), 408, "body_timeout_s", "body")
        wait_for(lambda: srv.app.state.disconnects, "the app to hear the disconnect", WAIT_S)
        whole = httpx.post(srv.url + "/echo", content=b"a" * 100_000, timeout=WAIT_S)
        assert whole.status_code == 200 and whole.json() == {"bytes": 100_000}
        assert srv.events.counts["body_timeout_s"] == 1
    assert_no_tracebacks(log_records)


def test_a_keep_alive_client_is_served_on_one_connection_then_closed_when_idle(log_records):
    with BoundedServer(keep_alive_timeout_s=1, header_timeout_s=1, idle_timeout_s=1) as srv:
        with httpx.Client(base_url=srv.url, timeout=WAIT_S) as client:
            ports = {client.get("/hello").json()["client_port"] for _ in range(5)}
            assert client.post("/echo", content=b"a" * 5000).json() == {"bytes": 5000}
            ports.add(client.get("/hello").json()["client_port"])
        assert len(ports) == 1, ports  # one connection for all of them
        with srv.connect() as s:
            s.sendall(b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")
            status, _, body = parse_answer(read_until_closed(s))  # closed once idle
            assert status == 200 and "client_port" in json.loads(body)
        assert not srv.events.counts  # keep-alive closes are not refusals
    assert_no_tracebacks(log_records)


# ------------------------------------------------------------------ serve.py under attack

@pytest.fixture(scope="module")
def tiny_export(tmp_path_factory):
    return make_tiny_export(str(tmp_path_factory.mktemp("conn") / "export"))[0]


class ServeScript:
    """``deploy/python/serve.py`` (``serve()``) on a free loopback port with ``overrides``;
    ``log`` holds its stderr after it stopped."""

    def __init__(self, export_dir, tmp_path, *overrides):
        self.port_file = tmp_path / "port"
        self.stderr_path = tmp_path / "stderr"
        self.args = [sys.executable, os.path.join(REPO, "deploy/python/serve.py"),
                     "--model-dir", export_dir, "--port", "0", "--port-file",
                     str(self.port_file), "--backend", "onnx", "-o", "Deploy.max_wait_ms=1",
                     *[a for o in overrides for a in ("-o", o)]]
        self.log = ""

    def __enter__(self):
        self.proc = subprocess.Popen(self.args, stderr=open(self.stderr_path, "w"))

        def port_written():
            assert self.proc.poll() is None, self.stderr_path.read_text()
            return self.port_file.exists() and self.port_file.read_text().strip()

        self.port = int(wait_for(port_written, "serve.py to write its port", 120, 0.1))
        self.url = f"http://127.0.0.1:{self.port}"
        wait_for(self.healthy, "serve.py's /health", 120, 0.1)
        return self

    def healthy(self):
        try:
            return httpx.get(self.url + "/health", timeout=WAIT_S).status_code == 200
        except httpx.TransportError:
            return False

    def fds(self):
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def rss_bytes(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS"))

    def __exit__(self, *exc):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(60)
        self.log = self.stderr_path.read_text()


def assert_predict_answers_correctly(url, export_dir):
    r = httpx.post(url + "/predict", json={"texts": TEXTS}, timeout=WAIT_S)
    assert r.status_code == 200, r.text
    want = Predictor(export_dir, "onnx").predict(TEXTS)
    assert [p["label"] for p in r.json()["predictions"]] == [w["label"] for w in want]


class Sampler:
    """Polls ``measure()`` every few milliseconds in a thread; ``peak`` is the largest value."""

    def __init__(self, measure):
        self.measure, self.peak = measure, measure()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self.measure())
            time.sleep(0.005)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(WAIT_S)


def test_a_burst_of_idle_connections_stays_within_max_connections(tiny_export, tmp_path):
    most, burst = 20, 100
    with ServeScript(tiny_export, tmp_path, f"Deploy.max_connections={most}",
                     "Deploy.idle_timeout_s=2") as srv:
        time.sleep(0.5)  # the health check's connection closed
        baseline = srv.fds()
        with Sampler(srv.fds) as fds:
            socks = [socket.create_connection(("127.0.0.1", srv.port), timeout=WAIT_S)
                     for _ in range(burst)]
            answers = [read_until_closed(s) for s in socks]  # refused at once, or idle 2 s
        for s in socks:
            s.close()
        refused = [a for a in answers if a]
        assert len(refused) >= burst - most, f"{len(refused)} of {burst} were refused"
        for a in refused:
            assert_refusal(a, 503, "max_connections", None)
            assert parse_answer(a)[1]["retry-after"] == "1"
        # the held connections, and a refused one for a moment; nothing like the burst
        assert fds.peak <= baseline + most + 10, (baseline, fds.peak)
        wait_for(lambda: srv.fds() <= baseline + 1, "the server to let the connections go",
                 WAIT_S)
        assert_predict_answers_correctly(srv.url, tiny_export)
    assert "Traceback" not in srv.log
    assert srv.log.count("connections refused at accept") == 1, srv.log  # reported, not spammed


def test_rss_stays_bounded_under_64_one_mebibyte_heads(tiny_export, tmp_path):
    head = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (1 << 20) + b"\r\n\r\n"
    answers = []

    def attack():
        with socket.create_connection(("127.0.0.1", srv.port), timeout=WAIT_S) as s:
            try:
                s.sendall(head)
            except (BrokenPipeError, ConnectionResetError):
                pass
            answers.append(read_until_closed(s))

    with ServeScript(tiny_export, tmp_path) as srv:  # the default Deploy bounds
        before = srv.rss_bytes()
        with Sampler(srv.rss_bytes) as rss:
            threads = [threading.Thread(target=attack, daemon=True) for _ in range(64)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
        assert not any(t.is_alive() for t in threads), "an attacking client hung"
        # 64 connections buffering at most max_header_bytes and one read each, with room
        # for allocator noise; without the bound the 64 MiB of heads are held
        assert rss.peak - before < 24 << 20, (before, rss.peak)
        assert len(answers) == 64
        for a in answers:
            assert_refusal(a, 431, "max_header_bytes", "headers")
        assert_predict_answers_correctly(srv.url, tiny_export)
    assert "Traceback" not in srv.log


# ------------------------------------------------------------------ settings and internals

def test_the_builder_carries_the_deploy_keys_and_checks_them():
    cfg = deploy_settings(keep_alive_timeout_s=7, max_connections=50, header_timeout_s=None)
    config = connections.uvicorn_config(small_app(), cfg, "127.0.0.1", 0)
    assert config.timeout_keep_alive == 7 and config.limit_concurrency is None
    assert issubclass(config.http, connections.BoundedHttpToolsProtocol)
    limits = config.http.limits
    assert limits.max_connections == 50 and limits.header_timeout_s is None
    assert limits.max_header_bytes == 65536 and limits.max_headers == 100
    for key, value in [("header_timeout_s", 0), ("max_connections", -1),
                       ("keep_alive_timeout_s", -1)]:
        with pytest.raises(ConfigError, match=f"Deploy.{key}"):
            connections.uvicorn_config(small_app(), deploy_settings(**{key: value}),
                                       "127.0.0.1", 0)


def test_max_connections_is_fitted_under_the_open_file_limit(monkeypatch):
    limits = connections.ConnectionLimits.from_deploy(deploy_settings(max_connections=1000))
    set_to = []
    monkeypatch.setattr(connections.resource, "setrlimit", lambda what, v: set_to.append(v))
    monkeypatch.setattr(connections.resource, "getrlimit", lambda what: (256, 4096))
    assert connections.fit_open_file_limit(limits) == limits  # soft raised, enough
    assert set_to == [(1000 + connections.FD_RESERVE, 4096)]
    monkeypatch.setattr(connections.resource, "getrlimit", lambda what: (256, 512))
    fitted = connections.fit_open_file_limit(limits)
    assert fitted.max_connections == 512 - connections.FD_RESERVE
    assert set_to[-1] == (512, 512)


def test_the_uvicorn_internals_the_protocol_relies_on_are_as_read():
    """Fails when uvicorn changes under BoundedHttpToolsProtocol: read the new
    uvicorn/protocols/http/httptools_impl.py against ppvarlen/serve/http/connections.py (its
    data_received copies uvicorn's), then update UVICORN_READ and the hash here."""
    source = inspect.getsource(httptools_impl).encode()
    assert uvicorn.__version__ == connections.UVICORN_READ, uvicorn.__version__
    assert hashlib.sha256(source).hexdigest() == HTTPTOOLS_IMPL_SHA256
    # httptools hands an exception from a callback back as a parser error (parsing stops)
    assert issubclass(httptools.HttpParserCallbackError, httptools.HttpParserError)
    assert not issubclass(httptools.HttpParserUpgrade, httptools.HttpParserError)
    cycle = inspect.getsource(httptools_impl.RequestResponseCycle)
    for flag in ("self.disconnected", "self.response_started", "self.response_complete",
                 "self.keep_alive", "self.message_event"):
        assert flag in cycle, flag
