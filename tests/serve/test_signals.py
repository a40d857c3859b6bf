"""A repository's server holds SIGTERM while Paddle's import installs glog's handler for it.

Importing Paddle installs glog's failure handler for SIGTERM (it kills the process, printing
"Termination signal").  A model repository's versions load while it serves, a version on ONNX
Runtime without importing Paddle at all; ``serve.signals`` keeps the drain whichever runtime a
version brings.
"""
import json
import os
import shutil
import signal
import subprocess
import sys

import httpx
from export_helpers import TEXTS, cls_export  # noqa: F401
from test_repository_shutdown import DEADLINE_S, add_version, repository_server
from test_server import REPO

# SIGTERM sent to the process over and over (0.1 ms apart, or as soon as its thread runs) for
# as long as Paddle's import runs, with NumPy's BLAS thread (started before any mask is set, so
# it takes the signal) there as in a server
STORM = r"""
import os, signal, sys, threading, time
import numpy
from ppvarlen.serve.signals import sigterm_held
signal.signal(signal.SIGTERM, lambda *a: None)  # Python's handler, as uvicorn installs one
with sigterm_held(sys.argv[1] == "held"):
    done, sent = threading.Event(), []

    def storm():
        while not done.is_set():
            os.kill(os.getpid(), signal.SIGTERM)
            sent.append(1)
            time.sleep(0.0001)

    t = threading.Thread(target=storm)
    t.start()
    import paddle.inference
    done.set()
    t.join()
print("survived", len(sent), flush=True)
"""


def run_ways(tmp_path, code, ways, timeout=300):
    """{way: the finished run of ``code``, a script of its own, with the argument ``way``}."""
    script = tmp_path / "script.py"
    script.write_text(code)
    env = {**os.environ, "PYTHONPATH": REPO}
    return {way: subprocess.run([sys.executable, str(script), way], capture_output=True,
                                text=True, timeout=timeout, env=env) for way in ways}


def test_a_sigterm_storm_while_paddle_is_imported_never_reaches_glogs_handler(tmp_path):
    runs = run_ways(tmp_path, STORM, ("held", "not"))
    # the storm is real: without the hold, glog's handler takes a signal and the process dies
    # of it (Python's handler, there before and after the import, ignores it)
    assert runs["not"].returncode == -signal.SIGTERM, runs["not"]
    assert runs["held"].returncode == 0, runs["held"].stderr[-2000:]
    survived, sent = runs["held"].stdout.split()
    assert survived == "survived" and int(sent) > 100, runs["held"].stdout


# in a process of its own with one thread: in the suite's (NumPy's BLAS thread does not block
# SIGTERM) a SIGTERM sent to the process may be delivered to that thread rather than pend
HELD = r"""
import os, signal, threading
from ppvarlen.serve.signals import sigterm_held, sigterm_pending

def blocked():
    return signal.SIGTERM in signal.pthread_sigmask(signal.SIG_BLOCK, set())

assert not blocked() and threading.active_count() == 1
with sigterm_held(True) as held:
    assert held and blocked()
    os.kill(os.getpid(), signal.SIGTERM)  # pending, not delivered: nothing here dies
    assert sigterm_pending() and not sigterm_pending()
    os.kill(os.getpid(), signal.SIGTERM)  # left pending: taken on the way out
assert not blocked() and not sigterm_pending()
with sigterm_held(False) as held:
    assert not held and not blocked()
answer = []
worker = threading.Thread(target=lambda: answer.append(sigterm_held(True).__enter__()))
worker.start()
worker.join()
assert answer == [False]  # signal handlers are the main thread's: nothing to hold there
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
with sigterm_held(True) as held:  # blocked already: the caller's to take
    assert not held
assert blocked()
print("ok")
"""


def test_held_sigterm_is_taken_and_the_mask_restored(tmp_path):
    run = run_ways(tmp_path, HELD, ("once",))["once"]
    assert run.returncode == 0 and run.stdout.strip() == "ok", run


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
    runs = run_ways(tmp_path, HANDLER_REPLACED, ("rearm", "not"))
    assert runs["not"].stdout.strip() == "[]", runs["not"]  # the replacement is real
    assert runs["rearm"].stdout.strip() == "['python']", runs["rearm"]


def _only_backend(src, dst, backend):
    """A copy of the export at ``src`` whose manifest keeps ``backend`` only: the default
    backend (auto) then serves it on that runtime whatever the timing."""
    shutil.copytree(src, dst)
    manifest = json.loads((dst / "manifest.json").read_text())
    for key in ("backends", "precisions", "precision_measured"):
        for other in [b for b in (manifest.get(key) or {}) if b != backend]:
            manifest[key].pop(other)
    (dst / "manifest.json").write_text(json.dumps(manifest))


def _blocks_sigterm(pid):
    status = open(f"/proc/{pid}/status").read()
    mask = int(next(line for line in status.splitlines() if line.startswith("SigBlk:"))
               .split()[1], 16)
    return bool(mask & (1 << (signal.SIGTERM - 1)))


def test_a_repository_on_the_default_backend_imports_paddle_only_for_a_paddle_version(
        cls_export, tmp_path):  # noqa: F811
    root, log = tmp_path / "models", tmp_path / "server.log"
    _only_backend(cls_export[0], root / "tiny" / "1", "onnx")
    with repository_server(root, log) as (proc, url):
        maps = open(f"/proc/{proc.pid}/maps").read()
        assert "onnxruntime" in maps and "libpaddle" not in maps
        assert _blocks_sigterm(proc.pid)

        # version 2 runs on Paddle only: Paddle is imported now, while the server serves
        _only_backend(cls_export[0], tmp_path / "staging", "paddle")
        add_version(url, tmp_path / "staging", root / "tiny" / "2")
        assert "libpaddle" in open(f"/proc/{proc.pid}/maps").read()
        r = httpx.post(url + "/predict", json={"texts": TEXTS[:2]}, timeout=DEADLINE_S)
        assert r.status_code == 200 and r.json()["model_version"] == "2", r.text

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(DEADLINE_S) == 0, log.read_text()[-2000:]
    out = log.read_text()
    assert "Termination signal" not in out, out[-2000:]
    assert "queue drained" in out, out[-2000:]
