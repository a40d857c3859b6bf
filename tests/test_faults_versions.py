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

from ppvarlen.deploy.predictor import Predictor
from ppvarlen.deploy.server import create_app, deploy_settings
from ppvarlen.utils.io import HOST_TAG

DEADLINE_S = 60  # generous: the machine is shared and may be busy
REPOSITORY = "ppvarlen.deploy.repository"


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
        wait_for(lambda: index_of(srv.url)["1"]["state"] == "STALE", "version 1 marked",
                 DEADLINE_S)
        entry = index_of(srv.url)["1"]
        assert "files removed" in entry["reason"] and str(root / "tiny" / "1") in entry["reason"]
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
