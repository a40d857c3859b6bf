"""Model repository with hot reload under load: 16 clients keep asking while version 2 is
dropped in, then a corrupted version 3.  No request fails or is lost, every answer comes from
exactly one version and equals that version's own predictions, version 3 is refused with the
reason (log, metrics, index, load endpoint), version 2 keeps serving, and the process' memory
after version 1 is unloaded is within 10% of what it was with one version loaded."""
import ctypes
import functools
import gc
import json
import logging
import os
import shutil
import threading
import time
import weakref

import httpx
import pytest
from export_helpers import TEXTS, cls_export, make_tiny_export, tag_export  # noqa: F401
from test_prometheus import samples, value
from test_repository_shutdown import add_version, repository_server
from test_server import RunningServer

from ppvarlen.runtime.predictor import Predictor
from ppvarlen.serve.server import create_app, deploy_settings
from ppvarlen.utils.parallel import usable_cores

CLIENTS = 16
DEADLINE_S = 120  # generous: the machine is shared and may be busy


def rss_bytes():
    """Resident memory after a full collection and returning freed heap to the OS."""
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def oip_request(text):
    return {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [text]}]}


class ClientLoop:
    """CLIENTS threads posting /predict (or ``model``'s OIP infer) until stopped; every answer
    is recorded as (text, X-Model-Version, the body's version, the prediction)."""

    def __init__(self, url, model=None):
        self.url, self.model, self.stop = url, model, threading.Event()
        self.cond = threading.Condition()
        self.answers, self.failures, self.sent = [], [], 0
        self.threads = [threading.Thread(target=self._run, args=(k,)) for k in range(CLIENTS)]

    def _run(self, k):
        with httpx.Client(timeout=60) as client:
            i = k
            while not self.stop.is_set():
                text = TEXTS[i % len(TEXTS)]
                i += 1
                with self.cond:
                    self.sent += 1
                try:
                    if self.model is None:
                        r = client.post(self.url + "/predict", json={"texts": [text]})
                    else:
                        r = client.post(f"{self.url}/v2/models/{self.model}/infer",
                                        json=oip_request(text))
                except httpx.HTTPError as e:
                    with self.cond:
                        self.failures.append(repr(e))
                        self.cond.notify_all()
                    continue
                with self.cond:
                    if r.status_code != 200:
                        self.failures.append((r.status_code, r.text))
                    else:
                        body = r.json()
                        prediction = (body["predictions"][0] if self.model is None else
                                      {o["name"]: o["data"][0] for o in body["outputs"]})
                        self.answers.append((text, r.headers["X-Model-Version"],
                                             body["model_version"], prediction))
                    self.cond.notify_all()

    def wait_for(self, predicate, what):
        with self.cond:
            assert self.cond.wait_for(lambda: predicate(self.answers) or self.failures,
                                      DEADLINE_S), f"timed out waiting for {what}"
            assert not self.failures, self.failures[:3]

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(DEADLINE_S)


def wait_until(check, what):
    deadline = time.monotonic() + DEADLINE_S
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)  # polling an HTTP endpoint, not a race: the deadline is the bound


class Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_hot_reload_under_load(cls_export, tmp_path):  # noqa: F811
    root, staging = tmp_path / "models", tmp_path / "staging"
    shutil.copytree(cls_export[0], root / "tiny" / "1")
    v2 = make_tiny_export(str(staging / "2"), "classification", seed=1)[0]
    shutil.copytree(v2, staging / "3")
    weights = next(p for p in sorted((staging / "3").rglob("*.onnx")))
    raw = bytearray(weights.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # one flipped byte: the manifest's sha256 no longer matches
    weights.write_bytes(bytes(raw))
    # each version's own answers, computed before the server runs (and kept alive throughout)
    own = {v: dict(zip(TEXTS, Predictor(str(d), "onnx").predict(TEXTS)))
           for v, d in (("1", root / "tiny" / "1"), ("2", v2))}
    assert own["1"] != own["2"]  # the versions are told apart by their answers

    log = Records()
    logging.getLogger("ppvarlen.serve.repository").addHandler(log)
    load = functools.partial(Predictor, backend="onnx")
    app = create_app(repository=str(root), load_predictor=load, deploy=deploy_settings(repository_poll_s=0.2, max_wait_ms=2, workers=1, drain_timeout_s=60))
    with RunningServer(app) as srv, ClientLoop(srv.url) as loop:
        index = lambda: {e["version"]: e for e in httpx.post(srv.url + "/v2/repository/index",  # noqa: E731
                                                              timeout=30).json()}
        loop.wait_for(lambda a: len(a) >= 200, "200 answers from version 1")
        one_version = rss_bytes()
        v1 = app.state.registry.get("tiny", "1")
        # what unloading must free: the version, its predictor and the engine it runs
        v1_refs = [weakref.ref(o) for o in (v1, v1.predictor, v1.predictor.engine)]
        del v1

        os.rename(staging / "2", root / "tiny" / "2")  # atomic: the directory appears whole
        loop.wait_for(lambda a: sum(v == "2" for _, v, _, _ in a) >= 200,
                      "200 answers from version 2")
        wait_until(lambda: index()["1"]["reason"] == "unloaded", "version 1 unloaded")

        os.rename(staging / "3", root / "tiny" / "3")
        wait_until(lambda: "3" in index(), "version 3 seen")
        refused = index()["3"]
        assert refused["state"] == "UNAVAILABLE" and "sha256" in refused["reason"], refused
        r = httpx.post(srv.url + "/v2/repository/models/tiny/load", timeout=60)
        assert r.status_code == 409 and "sha256" in r.json()["error"], r.text
        after = len(loop.answers)
        loop.wait_for(lambda a: len(a) >= after + 200, "200 more answers after the refusal")
        assert httpx.get(srv.url + "/v2/models/tiny/versions/2/ready").status_code == 200
        assert httpx.get(srv.url + "/v2/models/tiny/versions/1/ready").status_code == 404
        metrics = samples(httpx.get(srv.url + "/metrics").text)
    unloaded = rss_bytes()
    gc.collect()
    assert [r() for r in v1_refs] == [None] * 3, "version 1 is still referenced after unloading"

    assert not loop.failures, loop.failures[:3]
    assert len(loop.answers) == loop.sent  # every request sent got its answer
    for text, header, body_version, prediction in loop.answers:
        assert header == body_version and body_version in ("1", "2")
        assert prediction == own[body_version][text]
    versions = [v for _, v, _, _ in loop.answers]
    last_one = max(i for i, v in enumerate(versions) if v == "1")
    assert versions[last_one + 1:] and set(versions[last_one + 1:]) == {"2"}
    # refused by the poller, and again by the load endpoint (which examines it again); the
    # poller does not retry it while its files stay as they are
    assert value(metrics, "ppvarlen_model_load_failures_total", model="tiny", version="3",
                 reason="manifest") == 2
    assert value(metrics, "ppvarlen_model_version_loaded", model="tiny", version="1") == 0
    assert value(metrics, "ppvarlen_model_version_loaded", model="tiny", version="2") == 1
    logging.getLogger("ppvarlen.serve.repository").removeHandler(log)
    assert any("version 3 refused" in m and "sha256" in m for m in log.messages), log.messages
    print(f"{len(versions)} answers ({versions.count('1')} from version 1, "
          f"{versions.count('2')} from version 2), 0 failed; RSS with one version "
          f"{one_version / 2**20:.1f} MiB, after the swap and the unload "
          f"{unloaded / 2**20:.1f} MiB ({unloaded / one_version - 1:+.1%})")
    assert unloaded <= 1.10 * one_version


def test_serve_script_refuses_an_empty_repository(tmp_path):
    import subprocess
    import sys

    from test_server import REPO

    (tmp_path / "tiny" / "latest").mkdir(parents=True)  # not a version number
    r = subprocess.run([sys.executable, os.path.join(REPO, "deploy/python/serve.py"),
                        "--model-repository", str(tmp_path)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and "no NAME/VERSION/" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_two_models_in_one_repository(cls_export, tag_export, tmp_path):  # noqa: F811
    """Each model by its OIP path with its own metadata; /predict names both and takes
    neither (409); reloading one while the other is under load leaves the other untouched."""
    root = tmp_path / "models"
    shutil.copytree(cls_export[0], root / "sentiment" / "1")
    shutil.copytree(tag_export[0], root / "ner" / "1")
    (root / "notes").mkdir()  # no version directories: not a model, ignored
    own = {"sentiment": dict(zip(TEXTS, Predictor(cls_export[0], "onnx").predict(TEXTS))),
           "ner": dict(zip(TEXTS, Predictor(tag_export[0], "onnx").predict(TEXTS)))}
    app = create_app(repository=str(root), load_predictor=functools.partial(Predictor,
                     backend="onnx"), deploy=deploy_settings(repository_poll_s=None, max_wait_ms=2, drain_timeout_s=60))
    with RunningServer(app) as srv:
        get = lambda path: httpx.get(srv.url + path, timeout=60)  # noqa: E731
        meta = {name: get(f"/v2/models/{name}").json() for name in own}
        outputs = {name: [o["name"] for o in m["outputs"]] for name, m in meta.items()}
        assert outputs["sentiment"][:3] == ["label", "label_id", "probs"], outputs
        assert outputs["ner"][:2] == ["entities", "tags"], outputs
        assert all(m["versions"] == ["1"] and m["inputs"][0]["name"] == "text"
                   for m in meta.values())
        for name, model_own in own.items():
            for text in TEXTS[:3]:
                r = httpx.post(f"{srv.url}/v2/models/{name}/infer", json=oip_request(text),
                               timeout=60)
                assert r.status_code == 200 and r.json()["model_name"] == name, r.text
                row = {o["name"]: o["data"][0] for o in r.json()["outputs"]}
                if name == "sentiment":
                    assert row["label"] == model_own[text]["label"]
                else:
                    assert json.loads(row["entities"]) == model_own[text]["entities"]
        r = httpx.post(srv.url + "/predict", json={"texts": [TEXTS[0]]}, timeout=60)
        assert r.status_code == 409, r.text
        assert "['ner', 'sentiment']" in r.json()["error"] and "/v2/models/NAME/infer" in \
            r.json()["error"]
        assert get("/health").json()["model_name"] == "ner"  # the first by name (documented)
        assert "409" in get("/openapi.json").json()["paths"]["/predict"]["post"]["responses"]

        with ClientLoop(srv.url, model="ner") as loop:
            loop.wait_for(lambda a: len(a) >= 100, "100 answers from ner")
            shutil.copytree(cls_export[0], tmp_path / "staging")
            os.rename(tmp_path / "staging", root / "sentiment" / "2")
            r = httpx.post(srv.url + "/v2/repository/models/sentiment/load", timeout=120)
            assert r.status_code == 200 and r.json()["version"] == "2", r.text
            after = len(loop.answers)
            loop.wait_for(lambda a: len(a) >= after + 100, "100 ner answers after the reload")
        assert get("/v2/models/sentiment/versions/1/ready").status_code == 404
        assert get("/v2/models/sentiment/versions/2/ready").status_code == 200
        assert get("/v2/models/ner/versions/1/ready").status_code == 200
        metrics = samples(get("/metrics").text)

    assert not loop.failures, loop.failures[:3]
    assert len(loop.answers) == loop.sent
    for text, header, body_version, prediction in loop.answers:
        assert header == body_version == "1"
        assert json.loads(prediction["entities"]) == own["ner"][text]["entities"]
        assert json.loads(prediction["tags"]) == own["ner"][text]["tags"]
    assert value(metrics, "ppvarlen_model_version_loaded", model="ner", version="1") == 1
    assert value(metrics, "ppvarlen_model_version_loaded", model="sentiment", version="1") == 0
    assert value(metrics, "ppvarlen_model_version_loaded", model="sentiment", version="2") == 1


def test_a_paddle_model_on_a_shape_grid_logs_the_time_of_each_grid_shape(cls_export, tmp_path,  # noqa: F811
                                                                          caplog):
    """The batcher plans with the grid shapes' times measured at start; the ready line gives
    them, so the batches a server formed can be explained from its log, and /metrics.json
    gives them as traffic lowers them (each shape's fastest run)."""
    root = tmp_path / "models"
    shutil.copytree(cls_export[0], root / "sentiment" / "1")
    app = create_app(repository=str(root), load_predictor=functools.partial(Predictor,
                     backend="paddle"), deploy=deploy_settings(repository_poll_s=None))
    with caplog.at_level(logging.INFO, logger="ppvarlen"), RunningServer(app) as srv:
        for text in TEXTS:
            assert httpx.post(srv.url + "/predict", json={"texts": [text]}).status_code == 200
        now = httpx.get(srv.url + "/metrics.json").json()["shape_grid_ms"]
    line = next(r.getMessage() for r in caplog.records if "held shapes" in r.getMessage())
    assert ") with one weight copy for all of them," in line  # a classifier's grid shares it
    rows, widths = (json.loads(x) for x in
                    line.split("(rows ")[1].split(")")[0].split(", widths "))
    times = line.split("rows x width: ")[1].rstrip(")").split(", ")
    assert [t.split()[0] for t in times] == [f"{r}x{w}" for r in rows for w in widths], line
    assert all(float(t.split()[1]) > 0 for t in times), line
    at_start = {t.split()[0]: float(t.split()[1]) for t in times}
    assert list(now) == list(at_start)
    assert all(0 < now[shape] <= at_start[shape] for shape in now), (now, at_start)


def test_a_version_loaded_after_paddles_import_gets_the_cores_like_the_first(cls_export,  # noqa: F811
                                                                            tmp_path):
    # Paddle's import (version 1) writes OMP_NUM_THREADS=1 into the server's environment when
    # it is unset: read as a limit, version 2 (and its chooser child) served one thread
    root, log = tmp_path / "models", tmp_path / "server.log"
    shutil.copytree(cls_export[0], root / "tiny" / "1")
    shell = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}  # a user's shell
    with repository_server(root, log, "--backend", "paddle", env=shell) as (proc, url):
        configs = [httpx.get(f"{url}/v2/models/tiny/versions/1/config").json()]
        shutil.copytree(cls_export[0], tmp_path / "staging")
        add_version(url, tmp_path / "staging", root / "tiny" / "2")  # version 1 unloads
        configs.append(httpx.get(f"{url}/v2/models/tiny/versions/2/config").json())
    threads = [c["parameters"]["math_threads"]["string_value"] for c in configs]
    assert threads == [str(usable_cores())] * 2, log.read_text()[-3000:]
