"""Issue #46, model versions are what they say: a version's files changing is a new look (a
refused version is examined again), a served version whose files are removed or changed in
place is marked (index STALE, /health, a WARNING naming the path) and never swapped under its
number; the exporter never writes into an existing repository version; a dead export's temp
directories are removed by the next run; a full disk during an export is one DiskFullError;
SIGTERM under keep-alive answers 503 or closes cleanly, never with a reset."""
import functools
import logging
import os
import shutil
import subprocess
import sys

import httpx
import pytest
from test_deploy_helpers import TEXTS, make_tiny_export
from test_server import RunningServer, wait_for

from ppvarlen.runtime.predictor import Predictor
from ppvarlen.serve.server import create_app, deploy_settings
from ppvarlen.utils.io import HOST_TAG

DEADLINE_S = 60  # generous: the machine is shared and may be busy
REPOSITORY = "ppvarlen.serve.repository"


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """Two tiny classification exports that answer differently: {"a": dir, "b": dir}."""
    base = tmp_path_factory.mktemp("versions")
    return {k: make_tiny_export(str(base / k), "classification", seed=seed)[0]
            for k, seed in (("a", 0), ("b", 1))}


@pytest.fixture(scope="module")
def answers(exports):
    return {k: Predictor(d, "onnx").predict(TEXTS[:3]) for k, d in exports.items()}


def serving(root, poll_s=0.1):
    load = functools.partial(Predictor, backend="onnx")
    return RunningServer(create_app(repository=str(root), load_predictor=load,
                                    deploy=deploy_settings(repository_poll_s=poll_s,
                                                           max_wait_ms=2, workers=1)))


def index_of(url):
    return {e["version"]: e for e in httpx.post(url + "/v2/repository/index", timeout=60).json()}


def predict(url):
    r = httpx.post(url + "/predict", json={"texts": TEXTS[:3]}, timeout=60)
    assert r.status_code == 200, r.text
    return r.headers["X-Model-Version"], r.json()["predictions"]


def weights_of(export_dir):
    return sorted(p for p in os.listdir(os.path.join(export_dir, "onnx")) if p.endswith(".onnx"))


def dead_pid():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


# ------------------------------------------------------------------ repository


def test_a_version_refused_mid_copy_loads_once_the_copy_completes(exports, answers, tmp_path):
    """The poller looks again when the files change (not only manifest.json)."""
    root = tmp_path / "models"
    shutil.copytree(exports["a"], root / "tiny" / "1")
    with serving(root) as srv:
        # an in-place copy caught halfway: every file there, one weight file half written
        half = root / "tiny" / "2"
        shutil.copytree(exports["b"], half)
        weights = half / "onnx" / weights_of(exports["b"])[0]
        whole = weights.read_bytes()
        weights.write_bytes(whole[:len(whole) // 2])
        wait_for(lambda: "sha256" in index_of(srv.url).get("2", {}).get("reason", ""),
                 "version 2 refused for its hash", DEADLINE_S)
        weights.write_bytes(whole)  # the copy completes; manifest.json untouched
        wait_for(lambda: index_of(srv.url)["2"]["state"] == "READY", "version 2 loaded",
                 DEADLINE_S)
        assert predict(srv.url) == ("2", answers["b"])


def test_the_load_endpoint_examines_a_refused_version_again(exports, answers, tmp_path):
    root = tmp_path / "models"
    shutil.copytree(exports["a"], root / "tiny" / "1")
    shutil.copytree(exports["b"], root / "tiny" / "2")
    weights = root / "tiny" / "2" / "onnx" / weights_of(exports["b"])[0]
    whole = weights.read_bytes()
    weights.write_bytes(whole[:100])
    with serving(root, poll_s=None) as srv:
        assert index_of(srv.url)["2"]["state"] == "UNAVAILABLE"
        r = httpx.post(srv.url + "/v2/repository/models/tiny/load", timeout=60)
        assert r.status_code == 409 and "sha256" in r.json()["error"], r.text
        weights.write_bytes(whole)
        r = httpx.post(srv.url + "/v2/repository/models/tiny/load", timeout=60)
        assert r.status_code == 200 and r.json()["version"] == "2", r.text
        assert predict(srv.url) == ("2", answers["b"])


def test_a_removed_serving_version_is_marked_and_logged(exports, answers, tmp_path, caplog):
    root = tmp_path / "models"
    shutil.copytree(exports["a"], root / "tiny" / "1")
    with caplog.at_level(logging.WARNING, logger=REPOSITORY), serving(root) as srv:
        assert index_of(srv.url)["1"]["state"] == "READY"
        shutil.rmtree(root / "tiny" / "1")
        # a poll in the middle of the removal sees files changed, the next one the removal
        wait_for(lambda: "files removed" in index_of(srv.url)["1"]["reason"],
                 "version 1 marked", DEADLINE_S)
        entry = index_of(srv.url)["1"]
        assert entry["state"] == "STALE" and str(root / "tiny" / "1") in entry["reason"], entry
        health = httpx.get(srv.url + "/health", timeout=60).json()
        assert "files removed" in health["files_changed"], health
        assert predict(srv.url) == ("1", answers["a"])  # from memory, as before
    warnings = [r.getMessage() for r in caplog.records
                if r.name == REPOSITORY and r.levelno == logging.WARNING]
    assert any("files removed" in m and str(root / "tiny" / "1") in m for m in warnings), warnings


def test_a_version_changed_in_place_is_never_swapped_under_its_number(exports, answers, tmp_path,
                                                                     caplog):
    """Rule: the copy in memory keeps answering, the version is STALE with a WARNING; the next
    start serves the new files, and the manifest sha256 each load logs tells the two apart."""
    root = tmp_path / "models"
    shutil.copytree(exports["a"], root / "tiny" / "1")
    with caplog.at_level(logging.INFO, logger=REPOSITORY):
        with serving(root) as srv:
            assert predict(srv.url) == ("1", answers["a"])
            shutil.copytree(exports["b"], root / "tiny" / "1", dirs_exist_ok=True)
            wait_for(lambda: index_of(srv.url)["1"]["state"] == "STALE", "version 1 marked",
                     DEADLINE_S)
            assert "files changed in place" in index_of(srv.url)["1"]["reason"]
            assert predict(srv.url) == ("1", answers["a"])  # not swapped under the number
        with serving(root) as srv:  # a restart
            assert index_of(srv.url)["1"]["state"] == "READY"
            assert predict(srv.url) == ("1", answers["b"])
    messages = [r.getMessage() for r in caplog.records if r.name == REPOSITORY]
    assert any("files changed in place" in m for m in messages), messages
    loads = [m.split("manifest sha256 ")[1] for m in messages
             if "version 1 verified and serving" in m]
    assert len(loads) == 2 and loads[0] != loads[1], loads


def test_the_fingerprint_sees_what_a_copy_or_a_fix_changes_and_not_a_read(exports, tmp_path):
    """What re-examines a refused version: a permission fixed (a chmod: root reads any file,
    so this suite cannot be refused for one), a file rewritten with its old size and mtime
    restored (``rsync -a``, ``cp -p``), a file replaced by a rename; a read changes nothing."""
    from ppvarlen.serve.repository import content_fingerprint

    version = tmp_path / "1"
    shutil.copytree(exports["a"], version)
    weights = version / "onnx" / weights_of(exports["a"])[0]
    seen = [content_fingerprint(str(version))]
    weights.read_bytes()
    assert content_fingerprint(str(version)) == seen[-1]
    os.chmod(weights, 0o600)
    seen.append(content_fingerprint(str(version)))
    st = weights.stat()
    weights.write_bytes(weights.read_bytes())
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))
    seen.append(content_fingerprint(str(version)))
    shutil.copy(weights, tmp_path / "staged")
    os.replace(tmp_path / "staged", weights)
    seen.append(content_fingerprint(str(version)))
    shutil.rmtree(version)
    seen.append(content_fingerprint(str(version)))
    assert len(set(seen)) == len(seen) and seen[-1] is None, seen


def test_a_repository_scan_removes_a_dead_exports_temp_dirs(exports, tmp_path):
    root = tmp_path / "models"
    shutil.copytree(exports["a"], root / "tiny" / "1")
    dead = root / "tiny" / f".tmp-2.pid{dead_pid()}.{HOST_TAG}.abc123"
    live = root / "tiny" / f".tmp-3.pid{os.getpid()}.{HOST_TAG}.abc123"
    for d in (dead, live):
        d.mkdir()
        (d / "manifest.json").write_text("{}")
    with serving(root, poll_s=None) as srv:
        assert index_of(srv.url)["1"]["state"] == "READY"
    assert not dead.exists() and live.exists()


# ------------------------------------------------------------------ export

def test_the_exporter_never_rewrites_a_repository_version(exports, tmp_path):
    from ppvarlen.config import ConfigError

    root = tmp_path / "models"
    shutil.copytree(exports["a"], root / "tiny" / "1")
    before = {p: p.read_bytes() for p in (root / "tiny" / "1").rglob("*") if p.is_file()}
    with pytest.raises(ConfigError) as e:
        make_tiny_export(str(root / "tiny" / "1"), "classification", seed=1)
    message = str(e.value)
    assert str(root / "tiny" / "1") in message and str(root / "tiny" / "2") in message, message
    assert {p: p.read_bytes() for p in (root / "tiny" / "1").rglob("*") if p.is_file()} == before
    make_tiny_export(str(root / "tiny" / "next"), "classification", seed=1)
    assert sorted(os.listdir(root / "tiny")) == ["1", "2"]
    assert (root / "tiny" / "2" / "manifest.json").is_file()



def test_the_export_command_refuses_an_existing_version_before_loading_anything(exports, tmp_path,
                                                                                capsys):
    from ppvarlen.cli import main_export

    root = tmp_path / "models"
    shutil.copytree(exports["a"], root / "tiny" / "1")
    # the source does not even exist: the output is checked first
    code = main_export(["--pretrained-dir", str(tmp_path / "nothing"), "--output",
                        str(root / "tiny" / "1")])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    assert f"version 1 of the model {root / 'tiny'} exists" in err and "tiny/next" in err, err


def test_an_export_removes_what_a_dead_export_left(exports, tmp_path, monkeypatch):
    import tempfile

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    out = tmp_path / "out"
    pid = dead_pid()
    dead = [tmp_path / f".tmp-out.pid{pid}.{HOST_TAG}.abc", scratch / f"ppvarlen-export.pid{pid}"
            f".{HOST_TAG}.abc"]
    live = [tmp_path / f".tmp-out.pid{os.getpid()}.{HOST_TAG}.abc",
            scratch / f"ppvarlen-export.pid{os.getpid()}.{HOST_TAG}.abc"]
    for d in dead + live:
        (d / "paddle").mkdir(parents=True)
    make_tiny_export(str(out), "classification")
    assert [d.exists() for d in dead + live] == [False, False, True, True]
    assert sorted(os.listdir(scratch)) == [live[1].name]  # its own scratch removed too


def test_the_onnx_worker_reports_a_full_disk_not_unsupported_operators(exports, tmp_path):
    """/dev/full: every write fails with ENOSPC, in the conversion's subprocess too."""
    from ppvarlen.export.onnx_export import convert
    from ppvarlen.utils.io import DiskFullError

    with pytest.raises(DiskFullError) as e:
        convert(os.path.join(exports["a"], "paddle", "model"), "/dev/full", "tiny")
    assert "/dev/full" in str(e.value) and "bytes needed" in str(e.value), str(e.value)
    assert "paddle2onnx" not in str(e.value)


def pages(paths):
    return sum(-(-os.path.getsize(p) // 4096) for p in paths)


def test_a_full_disk_in_each_phase_of_an_export_is_one_error(exports, tmp_path):
    """A real tmpfs, sized so the Paddle save, the ONNX conversion, then the parity report
    each meet a full disk (the last one: parity.json, written after the manifest the admission
    checks read); the old export is there all along (a replace) and kept."""
    from ppvarlen.utils.io import DiskFullError

    mount = tmp_path / "mnt"
    mount.mkdir()
    ref = exports["a"]
    files = [os.path.join(top, f) for top, _, fs in os.walk(ref) for f in fs]
    old = pages(files)
    tokenizer = [os.path.join(ref, f) for f in ("vocab.txt", "encoder.json")]
    paddle = [f for f in files if os.sep + "paddle" + os.sep in f]
    sizes = {"paddle/": old + pages(tokenizer) + 1,
             "onnx/model.onnx": old + pages(tokenizer + paddle) + 1,
             "parity.json": old + pages(files)}
    told = {}
    for phase, size in sizes.items():
        if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size * 4096}", "tmpfs",
                           str(mount)], capture_output=True).returncode != 0:
            pytest.skip("cannot mount a tmpfs here (not root?)")
        try:
            shutil.copytree(ref, mount / "export")
            with pytest.raises(DiskFullError) as e:
                make_tiny_export(str(mount / "export"), "classification", seed=1, verify=True)
            told[phase] = str(e.value)
            assert os.listdir(mount) == ["export"]  # no temp directory left
            assert Predictor(str(mount / "export"), "onnx").predict(TEXTS[:3]) \
                == Predictor(ref, "onnx").predict(TEXTS[:3])  # the old export, whole
        finally:
            subprocess.run(["umount", str(mount)], check=True)
    print(told)
    for phase, message in told.items():
        assert message.startswith(f"{mount / 'export'}: no space left") \
            and f"writing {phase} in the export" in message and "bytes free" in message, told


# ------------------------------------------------------------------ SIGTERM under keep-alive

def test_requests_unread_at_shutdown_are_answered_not_reset(exports, tmp_path):
    """The moment that reset requests, made certain: the server's event loop is held while
    clients send on their idle keep-alive connections (the bytes wait unread in the kernel),
    then shutdown begins as uvicorn's does (the app draining, then every connection's
    ``shutdown()``).  uvicorn closed such a connection at once: its unread request reset it."""
    import socket
    import threading
    import time

    from keepalive_sigterm import REQUEST, read_response

    app = create_app(Predictor(exports["a"], "onnx"), deploy_settings(max_wait_ms=2))
    with RunningServer(app) as srv:
        socks = []
        for _ in range(4):
            s = socket.create_connection(("127.0.0.1", srv.port), timeout=60)
            s.sendall(REQUEST)
            assert read_response(s)[0] == 200  # an idle keep-alive connection now
            socks.append(s)
        connections = list(srv.server.server_state.connections)
        held, sent = threading.Event(), threading.Event()

        def shutdown_with_requests_unread():
            held.set()
            assert sent.wait(60)
            time.sleep(0.2)  # the requests reach the server's socket buffers
            app.state.begin_drain()
            for c in connections:
                c.shutdown()
            srv.server.should_exit = True

        connections[0].loop.call_soon_threadsafe(shutdown_with_requests_unread)
        assert held.wait(60)
        for s in socks:
            s.sendall(REQUEST)
        sent.set()
        outcomes = []
        for s in socks:
            try:
                status, headers = read_response(s)
                outcomes.append((status, headers.get("retry-after")))
            except ConnectionResetError:
                outcomes.append("reset")
            s.close()
    assert outcomes == [(503, "1")] * len(socks), outcomes


def test_sigterm_under_keep_alive_answers_503_or_closes_never_resets(exports, tmp_path):
    """The server as run (a subprocess, SIGTERM), clients on idle keep-alive connections
    sending just after the signal: each is answered (200 before the drain began, 503 with
    Retry-After after) or reads end of file; none is reset (tests/keepalive_sigterm.py
    measures many runs)."""
    from keepalive_sigterm import one_run

    for _ in range(2):
        outcomes, code = one_run(exports["a"], str(tmp_path), clients=8, spread_s=0.1)
        assert code == 0 and set(outcomes) <= {"200", "503", "closed"}, outcomes


KILL_CHILD = """
import sys
sys.path.insert(0, {tests!r})
from test_deploy_helpers import make_tiny_export
make_tiny_export({out!r}, "classification", seed=1)
"""


@pytest.mark.parametrize("point", ["scratch", "staged_onnx"])
def test_an_export_killed_mid_write_keeps_the_old_export_and_the_next_export_reaps(
        point, exports, answers, tmp_path, monkeypatch):
    """kill -9 (the export's whole process group, its ONNX worker too) once its scratch
    directory exists, or once ONNX files are staged beside the output: the old export still
    answers as before, and the next export removes what the killed one left."""
    import signal
    import tempfile
    import time

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    out = tmp_path / "models" / "out"
    shutil.copytree(exports["a"], out)
    code = KILL_CHILD.format(tests=os.path.dirname(os.path.abspath(__file__)), out=str(out))
    child = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "TMPDIR": str(scratch)},
                             start_new_session=True)
    mine = f".pid{child.pid}."

    def reached():
        if point == "scratch":
            return any(mine in n for n in os.listdir(scratch))
        staged = [out.parent / n for n in os.listdir(out.parent) if n.startswith(".tmp-out" + mine)]
        return any((d / "onnx").is_dir() and os.listdir(d / "onnx") for d in staged)

    deadline = time.monotonic() + DEADLINE_S
    while not reached():
        assert child.poll() is None, f"the export ended (rc {child.returncode}) before {point}"
        assert time.monotonic() < deadline, f"the export never reached {point}"
        time.sleep(0.005)
    os.killpg(child.pid, signal.SIGKILL)
    child.wait()
    left = [n for d in (scratch, out.parent) for n in os.listdir(d) if mine in n]
    assert left, "nothing of the killed export was on disk: the kill came too late to test"
    assert Predictor(str(out), "onnx").predict(TEXTS[:3]) == answers["a"]  # the old export
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    make_tiny_export(str(tmp_path / "models" / "other"), "classification")
    assert sorted(os.listdir(out.parent)) == ["other", "out"]
    assert os.listdir(scratch) == []
