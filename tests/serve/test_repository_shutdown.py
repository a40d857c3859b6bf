"""SIGTERM drains a model-repository server with the Paddle backend, also after a hot reload.

Importing Paddle installs glog's failure signal handlers, SIGTERM among them.  A repository
server loads its predictors after uvicorn has installed its handlers, so without care the
first SIGTERM killed the process ("Termination signal", requests lost) instead of draining.
"""
import os
import shutil
import signal
import subprocess
import sys
import threading

import httpx
from export_helpers import TEXTS, cls_export  # noqa: F401
from test_server import REPO, answers_200, wait_for

DEADLINE_S = 180  # generous: the machine is shared and may be busy
IN_FLIGHT = 8


def test_sigterm_after_a_reload_drains_and_exits_0(cls_export, tmp_path):  # noqa: F811
    root, port_file, log = tmp_path / "models", tmp_path / "port", tmp_path / "server.log"
    shutil.copytree(cls_export[0], root / "tiny" / "1")
    # max_wait_ms of a minute, and no early run once every caller is queued: texts stay
    # queued until shutdown begins, so they are surely in flight when SIGTERM arrives
    # (shutdown then runs them without waiting for company)
    proc = subprocess.Popen(
        [sys.executable, os.path.join(REPO, "deploy/python/serve.py"), "--model-repository",
         str(root), "--backend", "paddle", "--port", "0", "--port-file", str(port_file),
         "-o", "Deploy.max_wait_ms=60000", "-o", "Deploy.batch_when_all_queued=false",
         "-o", "Deploy.repository_poll_s=0"],
        stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        def port_written():
            assert proc.poll() is None, log.read_text()
            return port_file.exists() and int(port_file.read_text())

        url = f"http://127.0.0.1:{wait_for(port_written, 'the port file', DEADLINE_S, 0.2)}"
        wait_for(lambda: answers_200(url + "/v2/health/ready"), "version 1 ready", DEADLINE_S, 0.2)

        # hot reload: version 2 appears (a rename) and is loaded through the endpoint
        shutil.copytree(cls_export[0], tmp_path / "staging")
        os.rename(tmp_path / "staging", root / "tiny" / "2")
        r = httpx.post(url + "/v2/repository/models/tiny/load", timeout=DEADLINE_S)
        assert r.status_code == 200 and r.json()["version"] == "2", r.text

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
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(60)
    out = log.read_text()
    assert "Termination signal" not in out, out[-2000:]
    assert [r.status_code for r in replies] == [200] * IN_FLIGHT, [r.text for r in replies]
    assert {r.json()["model_version"] for r in replies} == {"2"}
    assert "queue drained" in out, out[-2000:]


HANDLER_REPLACED = r"""
import ctypes, os, signal, sys, time
from ppvarlen.serve.signals import rearm_signal_handlers

got = []
signal.signal(signal.SIGTERM, lambda *a: got.append("python"))
# a native library replacing the handler behind Python's back (as Paddle's glog does)
libc = ctypes.CDLL(None)
libc.signal.restype = ctypes.c_void_p
libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
libc.signal(signal.SIGTERM, 1)  # SIG_IGN: the signal vanishes unless Python's is re-armed
if sys.argv[1] == "rearm":
    rearm_signal_handlers()
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(0.2)
print(got)
"""


def test_rearm_restores_the_python_handler_a_native_library_replaced(tmp_path):
    script = tmp_path / "replaced.py"
    script.write_text(HANDLER_REPLACED)
    env = {**os.environ, "PYTHONPATH": REPO}
    runs = {how: subprocess.run([sys.executable, str(script), how], capture_output=True,
                                text=True, timeout=120, env=env) for how in ("rearm", "not")}
    assert runs["not"].stdout.strip() == "[]", runs["not"]  # the replacement is real
    assert runs["rearm"].stdout.strip() == "['python']", runs["rearm"]


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
