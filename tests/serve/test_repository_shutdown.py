"""SIGTERM drains a model-repository server with the Paddle backend, also after a hot reload.

Importing Paddle installs glog's failure signal handlers, SIGTERM among them.  A repository
server loads its predictors after uvicorn has installed its handlers, so without care the
first SIGTERM killed the process ("Termination signal", requests lost) instead of draining.
"""
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading

import httpx
import pytest
from export_helpers import TEXTS, cls_export  # noqa: F401
from test_server import REPO, answers_200, wait_for

DEADLINE_S = 180  # generous: the machine is shared and may be busy
IN_FLIGHT = 8


@contextlib.contextmanager
def repository_server(root, log, *options, env=None):
    """deploy/python/serve.py over the model repository ``root`` (its output in ``log``, no
    polling: versions load through the endpoint; ``env``: its environment, this process's by
    default) -> (process, url) once a version is ready; killed on the way out if it still
    runs."""
    port_file = log.parent / f"{log.name}.port"
    proc = subprocess.Popen(
        [sys.executable, os.path.join(REPO, "deploy/python/serve.py"), "--model-repository",
         str(root), "--port", "0", "--port-file", str(port_file),
         "-o", "Deploy.repository_poll_s=0", *options],
        stdout=log.open("w"), stderr=subprocess.STDOUT, env=env)
    try:
        def port_written():
            assert proc.poll() is None, log.read_text()
            return port_file.exists() and int(port_file.read_text())

        url = f"http://127.0.0.1:{wait_for(port_written, 'the port file', DEADLINE_S, 0.2)}"
        wait_for(lambda: answers_200(url + "/v2/health/ready"), "a version ready", DEADLINE_S,
                 0.2)
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(60)


def add_version(url, staged, version_dir):
    """Hot reload: the export ``staged`` appears as ``version_dir`` (NAME/VERSION, a rename)
    and is loaded through the endpoint."""
    os.rename(staged, version_dir)
    name, version = version_dir.parent.name, version_dir.name
    r = httpx.post(url + f"/v2/repository/models/{name}/load", timeout=DEADLINE_S)
    assert r.status_code == 200 and r.json()["version"] == version, r.text


def test_sigterm_after_a_reload_drains_and_exits_0(cls_export, tmp_path):  # noqa: F811
    root, log = tmp_path / "models", tmp_path / "server.log"
    shutil.copytree(cls_export[0], root / "tiny" / "1")
    # max_wait_ms of a minute, and no early run once every caller is queued: texts stay
    # queued until shutdown begins, so they are surely in flight when SIGTERM arrives
    # (shutdown then runs them without waiting for company)
    with repository_server(root, log, "--backend", "paddle", "-o", "Deploy.max_wait_ms=60000",
                           "-o", "Deploy.batch_when_all_queued=false") as (proc, url):
        shutil.copytree(cls_export[0], tmp_path / "staging")
        add_version(url, tmp_path / "staging", root / "tiny" / "2")

        replies = [None] * IN_FLIGHT

        def ask(k):
            replies[k] = httpx.post(url + "/predict", json={"texts": [TEXTS[k % len(TEXTS)]]},
                                    timeout=DEADLINE_S)

        threads = [threading.Thread(target=ask, args=(k,)) for k in range(IN_FLIGHT)]
        for t in threads:
            t.start()
        wait_for(lambda: httpx.get(url + "/metrics.json", timeout=30).json()["queue_depth"]
                 == IN_FLIGHT, f"{IN_FLIGHT} texts queued", DEADLINE_S, 0.05)

        proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(DEADLINE_S)
            assert not t.is_alive(), "a request still unanswered long after SIGTERM"
        assert proc.wait(DEADLINE_S) == 0, log.read_text()[-2000:]
    out = log.read_text()
    assert "Termination signal" not in out, out[-2000:]
    assert [r.status_code for r in replies] == [200] * IN_FLIGHT, [r.text for r in replies]
    assert {r.json()["model_version"] for r in replies} == {"2"}
    assert "queue drained" in out, out[-2000:]


def test_stop_waiting_runs_what_the_batcher_holds_at_once():
    from test_batcher import FakePredictor, Item

    from ppvarlen.serve.batcher import DynamicBatcher

    pred = FakePredictor()
    # an hour's wait for company: only stop_waiting can get these texts run within the test
    b = DynamicBatcher([pred], max_wait_ms=3_600_000, max_batch_tokens=1000, max_batch_size=64)
    futures = b.submit([Item(1, 4), Item(2, 5)])
    assert b.queue_depth() == 2 and pred.batches == []
    b.stop_waiting()
    assert [f.result(120) for f in futures] == [("echo", 1), ("echo", 2)]
    assert pred.batches == [[1, 2]]
    # later texts do not wait either, and the batcher still takes them (it is not closed)
    assert b.submit([Item(3, 4)])[0].result(120) == ("echo", 3)
    b.close()


# deploy/python/serve.py, but the export directories named "stuck" never finish loading (a
# sleep standing for native code no signal interrupts); argv[1]: a file created as one starts
STUCK_LOAD_SERVER = """
import signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)  # were it ignored where we started
import ppvarlen.serve.server as server
from ppvarlen.cli import main_serve
load = server.load_admitted
def stuck_or_load(engine, export_dir, *args, **kwargs):
    if "stuck" in str(export_dir):
        open(sys.argv[1], "w").close()
        time.sleep(3600)
    return load(engine, export_dir, *args, **kwargs)
server.load_admitted = stuck_or_load
sys.exit(main_serve(sys.argv[2:]))
"""


@pytest.mark.parametrize("served", ["repository", "export"])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_during_start_up_ends_the_server_at_once(cls_export, tmp_path, sig,  # noqa: F811
                                                        served):
    """A repository's models load before it serves, in a thread no signal interrupts, and a
    single export loads before the server exists: a stop asked meanwhile ends the process at
    once (it dies by the signal, after one log line), where a repository used to wait for
    every load -- here one that never ends -- and a single export's load answered SIGINT with
    a traceback and SIGTERM not at all (held) or without a word."""
    root, log, loading = tmp_path / "models", tmp_path / "server.log", tmp_path / "loading"
    shutil.copytree(cls_export[0], root / "a" / "1")
    shutil.copytree(cls_export[0], root / "stuck" / "1")
    what = ["--model-repository", str(root), "-o", "Deploy.repository_poll_s=0"] \
        if served == "repository" else ["--model-dir", str(root / "stuck" / "1")]
    proc = subprocess.Popen(
        [sys.executable, "-c", STUCK_LOAD_SERVER, str(loading), *what, "--backend", "onnx",
         "--precision", "fp32", "--port", "0"], stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: (proc.poll() is None or pytest.fail(log.read_text()[-2000:]))
                 and loading.exists(), "the stuck load", DEADLINE_S, 0.1)
        proc.send_signal(sig)
        try:
            status = proc.wait(DEADLINE_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running {DEADLINE_S} s after {sig.name}: {log.read_text()[-2000:]}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(60)
    out = log.read_text()
    assert status == -sig, out[-2000:]
    assert f"WARNING ppvarlen.serve.server: {sig.name} " in out, out[-2000:]
    assert "before serving began: stopped; what was loading is abandoned" in out, out[-2000:]
    assert "Traceback" not in out and "Termination signal" not in out, out[-2000:]


def test_a_load_built_off_the_main_thread_answers_as_it_would_on_it():
    """``built_unless_stopped`` gives the build's value or re-raises its error, on the main
    thread (the build on a thread of its own, the handlers put back after) and elsewhere
    (no handlers there: the build runs as it is)."""
    from ppvarlen.serve.server import built_unless_stopped

    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    assert built_unless_stopped(lambda: 42, False, 0) == 42
    with pytest.raises(KeyError, match="a bad export"):
        built_unless_stopped(lambda: {}["a bad export"], False, 0)
    assert {sig: signal.getsignal(sig) for sig in handlers} == handlers
    out = []
    thread = threading.Thread(target=lambda: out.append(built_unless_stopped(lambda: 7, True,
                                                                             0)))
    thread.start()
    thread.join(60)
    assert out == [7]
