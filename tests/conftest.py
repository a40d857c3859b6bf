"""Suite-wide test settings: the ``gpu`` marker (docs/TESTING.md), the local Ray cluster
and a free port for Ray Serve's proxy.

Tests marked ``@pytest.mark.gpu`` need a CUDA build of Paddle (or onnxruntime-gpu) and a
visible GPU; elsewhere they are skipped with the reason.  Paddle is imported only when a
collected test carries the marker (most files never import it); Ray only by the tests that
use ``ray_cluster``.
"""
import os
import socket
import sys

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TESTS)
# The suite is one folder per package; test modules share helpers by module name
# (``from test_server import RunningServer``), whichever folder each lives in: every folder is
# importable, as the flat tests/ was.  Module names are unique across the folders.
for _entry in sorted(os.listdir(TESTS)):
    if os.path.isfile(os.path.join(TESTS, _entry, "__init__.py")) or _entry.startswith(("_", ".")):
        continue
    if os.path.isdir(os.path.join(TESTS, _entry)) and _entry != "fixtures":
        sys.path.insert(1, os.path.join(TESTS, _entry))
# Serve's controller reads these from its environment (ray/serve/_private/constants.py): it
# kills an HTTP proxy whose readiness check misses RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S
# (default 5 s) -- on a loaded host the proxy was killed before it answered (ActorDiedError).
# The raylet starts Ray's workers at nice 15 unless RAY_worker_niceness says otherwise (Ray's
# own job manager sets it to 0): next to two busy processes at nice 0 the proxy actor then got
# so little CPU that serve.start gave up after its fixed 60 s ("HTTP proxies not available").
RAY_SERVE_SLOW_MACHINE_ENV = {"RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "120",
                              "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S": "120",
                              "RAY_worker_niceness": "0"}


@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray cluster (num_cpus=2) for one test module; Serve and Ray shut down after it.
    Its workers (started by this process's raylet, with its environment) import this
    checkout's ppvarlen whatever the caller's PYTHONPATH."""
    ray = pytest.importorskip("ray")
    from ray import serve

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH"))
                                                if p))
        for name, value in RAY_SERVE_SLOW_MACHINE_ENV.items():
            mp.setenv(name, value)
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    try:
        yield ray
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.fixture(scope="session", autouse=True)
def session_choice_cache(tmp_path_factory):
    """The suite's auto choices (``ppvarlen.runtime.choice_cache``) stay out of the user's
    ~/.cache: the servers of module fixtures keep theirs here."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PPVARLEN_CHOICE_CACHE_DIR", str(tmp_path_factory.mktemp("choices")))
        yield


@pytest.fixture(autouse=True)
def own_choice_cache(session_choice_cache, tmp_path_factory, monkeypatch):
    """... and each test keeps its own, inherited by the processes it starts: what one test
    timed (or another test's injected timings decided) is never another test's choice."""
    monkeypatch.setenv("PPVARLEN_CHOICE_CACHE_DIR", str(tmp_path_factory.mktemp("choices")))


@pytest.fixture
def free_port():
    """A loopback port free right now.  Serve's proxy binds inside its actor and its API
    reports no kernel-chosen port, so port 0 cannot be used there; the proxy's bind fails
    loudly (the readiness check) if another process takes the port in between."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gpu_status():
    """(usable, why) -- the same check tools/check_gpu.py makes before checking anything."""
    from ppvarlen.export.gpu_check import gpu_status as status

    return status()


def pytest_collection_modifyitems(config, items):
    marked = [item for item in items if item.get_closest_marker("gpu")]
    if not marked:
        return
    usable, why = gpu_status()
    if usable:
        return
    skip = pytest.mark.skip(reason=f"needs a GPU: {why}")
    for item in marked:
        item.add_marker(skip)
