"""A bad model version or a hostile client never takes a model out of service, never gets a 500.

Crafted artifacts (each built here from the tiny export, its hashes rewritten as a bad build
would write them): truncated weights, an ``encoder.json`` of ``[]``, five label names for a
two-logit model, a NaN ``[SEP]`` embedding row, a vocabulary larger than the embedding table,
symbolic links out of the export or the repository, a version directory named ``²``.  Each is
refused by the one admission check (``ppvarlen.runtime.admission``) with its reason — at
start-up, on the load endpoint (409) and in the index — while the good version keeps answering
16 clients with no request failed or lost.  Hostile requests (deep JSON, huge integers, lone
surrogates, NaN literals, bad binary-extension headers, a client gone mid-body, a bug in a
route) get the project's JSON error naming the field, and a normal request is answered
correctly afterwards.
"""
import functools
import json
import logging
import os
import shutil
import socket
import subprocess
import sys

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient
from export_helpers import TEXTS, cls_export  # noqa: F401
from test_model_repository import ClientLoop, Records, rss_bytes, wait_until
from test_prometheus import samples, value
from test_server import REPO, RunningServer, run_concurrently

from ppvarlen.config import ConfigError, load_config
from ppvarlen.serve.protocols.predict import openapi as api
from ppvarlen.runtime.admission import AdmissionError, admit
from ppvarlen.runtime.manifest import MAX_MANIFEST_BYTES, UnservableExportError
from ppvarlen.runtime.predictor import Predictor
from ppvarlen.serve.server import app_from_config, create_app, deploy_settings
from ppvarlen.export.errors import ExportFailedError
from ppvarlen.export.exporter import admit_export
from ppvarlen.utils.io import sha256_file

TEXT = TEXTS[0]


# ---------------------------------------------------------------- crafted artifacts

def rehash(export_dir):
    """Rewrite the manifest's sha256 of every listed file, as a bad build would."""
    path = os.path.join(export_dir, "manifest.json")
    with open(path) as f:
        manifest = json.load(f)
    manifest["files"] = {rel: sha256_file(os.path.join(export_dir, rel))
                         for rel in manifest["files"]}
    with open(path, "w") as f:
        json.dump(manifest, f)
    return manifest


def edit_manifest(export_dir, change):
    path = os.path.join(export_dir, "manifest.json")
    with open(path) as f:
        manifest = json.load(f)
    change(manifest)
    with open(path, "w") as f:
        json.dump(manifest, f)


def copy_of(good, where):
    shutil.copytree(good, where)
    return str(where)


def truncated(good, where, rel):
    d = copy_of(good, where)
    path = os.path.join(d, rel)
    with open(path, "rb") as f:
        raw = f.read()
    with open(path, "wb") as f:
        f.write(raw[:len(raw) // 2])
    rehash(d)
    return d


def encoder_json_empty_list(good, where):
    d = copy_of(good, where)
    with open(os.path.join(d, "encoder.json"), "w") as f:
        f.write("[]")
    rehash(d)
    return d


def five_label_names(good, where):
    d = copy_of(good, where)
    edit_manifest(d, lambda m: m.update(label_names=["a", "b", "c", "d", "e"]))
    return d


def nan_embedding_row(good, where, token_id):
    """The ONNX graph's embedding table with row ``token_id`` set to NaN."""
    import onnx
    from onnx import numpy_helper

    d = copy_of(good, where)
    path = os.path.join(d, "onnx", "model.onnx")
    model = onnx.load(path)
    vocab = json.load(open(os.path.join(d, "encoder.json")))["vocab_size"]
    # paddle2onnx writes weights as Constant nodes (or initializers): the [vocab, hidden] one
    tensors = list(model.graph.initializer) + [a.t for n in model.graph.node
                                               if n.op_type == "Constant"
                                               for a in n.attribute if a.name == "value"]
    table = next(t for t in tensors if len(t.dims) == 2 and t.dims[0] == vocab)
    weights = numpy_helper.to_array(table).copy()
    weights[token_id] = np.nan
    table.CopyFrom(numpy_helper.from_array(weights, table.name))
    onnx.save(model, path)
    rehash(d)
    return d


def vocab_beyond_embedding(good, where, extra=500):
    """vocab.txt and encoder.json with ``extra`` more characters than the embedding has rows."""
    d = copy_of(good, where)
    with open(os.path.join(d, "vocab.txt"), "a", encoding="utf-8") as f:
        f.write("".join(chr(0xE000 + i) + "\n" for i in range(extra)))
    meta_path = os.path.join(d, "encoder.json")
    meta = json.load(open(meta_path))
    meta["vocab_size"] += extra
    json.dump(meta, open(meta_path, "w"))
    rehash(d)
    edit_manifest(d, lambda m: m["tokenizer"].update(vocab_size=m["tokenizer"]["vocab_size"]
                                                     + extra))
    return d


def vocab_symlinked_out(good, where, outside_dir):
    d = copy_of(good, where)
    os.makedirs(outside_dir, exist_ok=True)
    target = os.path.join(outside_dir, "vocab.txt")
    shutil.move(os.path.join(d, "vocab.txt"), target)
    os.symlink(target, os.path.join(d, "vocab.txt"))
    return d


def with_fifo(good, where, rel):
    """A copy of ``good`` whose ``rel`` is a named pipe: a read of it waits for a writer that
    never comes.  (shutil copies no FIFO: stage such a version with this, not copytree.)"""
    shutil.copytree(good, where, ignore=lambda d, names: [rel] if d == good else [])
    os.mkfifo(os.path.join(where, rel))
    return str(where)


FIFOS = {"manifest_fifo": "manifest.json", "vocab_fifo": "vocab.txt"}


def manifest_past_its_bound(good, where):
    """manifest.json grown past what a manifest can need (zeros after the JSON, sparse)."""
    d = copy_of(good, where)
    os.truncate(os.path.join(d, "manifest.json"), MAX_MANIFEST_BYTES + 1)
    return d


@pytest.fixture(scope="module")
def bad(cls_export, tmp_path_factory):  # noqa: F811
    """{kind: export dir} of every crafted artifact, and the good one."""
    good = cls_export[0]
    base = tmp_path_factory.mktemp("bad")
    sep = json.load(open(os.path.join(good, "encoder.json")))["special_ids"]["sep"]
    return {"good": good,
            "truncated_pdiparams": truncated(good, base / "t1", "paddle/model.pdiparams"),
            "truncated_onnx": truncated(good, base / "t2", "onnx/model.onnx"),
            "encoder_list": encoder_json_empty_list(good, base / "e"),
            "five_labels": five_label_names(good, base / "l"),
            "nan_sep": nan_embedding_row(good, base / "n", sep),
            "big_vocab": vocab_beyond_embedding(good, base / "v"),
            "vocab_link": vocab_symlinked_out(good, base / "s", str(base / "elsewhere")),
            "huge_manifest": manifest_past_its_bound(good, base / "m"),
            **{kind: with_fifo(good, base / kind, rel) for kind, rel in FIFOS.items()}}


# what each is refused for: (backend, words the reason holds)
REFUSALS = {
    "truncated_pdiparams": ("paddle", "tensor desc"),
    "truncated_onnx": ("onnx", "model.onnx"),
    "encoder_list": ("onnx", "encoder.json: must be a JSON object"),
    "five_labels": ("onnx", "5 label_names"),
    "nan_sep": ("onnx", "not finite"),
    "big_vocab": ("onnx", "largest vocabulary id 563"),
    "vocab_link": ("onnx", "outside the export directory"),
    "huge_manifest": ("onnx", f"manifest.json: cannot be read ({MAX_MANIFEST_BYTES + 1:,} "
                              f"bytes, more than the {MAX_MANIFEST_BYTES:,} a manifest can need)"),
    "manifest_fifo": ("onnx", "manifest.json: cannot be read (a FIFO (named pipe), not a "
                              "regular file)"),
    "vocab_fifo": ("onnx", "vocab.txt: listed in the manifest but cannot be read (a FIFO "
                           "(named pipe), not a regular file)"),
}


def refusal(export_dir, backend):
    """The reason admission (or loading) gives for ``export_dir``, or None when it passes."""
    try:
        admit(Predictor(export_dir, backend))
    except Exception as e:  # noqa: BLE001 - the reason is what the test reads
        return f"{type(e).__name__}: {e}"
    return None


def test_admission_refuses_each_crafted_artifact_naming_why(bad):
    assert refusal(bad["good"], "onnx") is None and refusal(bad["good"], "paddle") is None
    for kind, (backend, words) in REFUSALS.items():
        reason = refusal(bad[kind], backend)
        assert reason is not None and words in reason, (kind, reason)
    # the checks that name themselves: which one refused
    with pytest.raises(AdmissionError) as e:
        admit(Predictor(bad["five_labels"], "onnx"))
    assert e.value.check == "smoke" and "shape [3, 2]" in str(e.value)
    with pytest.raises(AdmissionError) as e:
        admit(Predictor(bad["nan_sep"], "onnx"))
    assert e.value.check == "smoke" and "'logits'" in str(e.value)
    # the symlinked vocabulary is served only when the operator says so
    assert refusal(bad["vocab_link"], "onnx") is not None
    admit(Predictor(bad["vocab_link"], "onnx", allow_external_symlinks=True))


def test_export_verify_refuses_what_the_server_would(bad):
    with pytest.raises(ExportFailedError, match="would be refused by the server"):
        admit_export(bad["five_labels"], "tiny", ["onnx"])
    admit_export(bad["good"], "tiny", ["paddle", "onnx"])


def test_single_export_start_up_runs_the_admission_check(bad):
    deploy = load_config().Deploy
    with pytest.raises(UnservableExportError, match="largest vocabulary id"):
        app_from_config(bad["big_vocab"], deploy, backend="onnx")
    app_from_config(bad["good"], deploy, backend="onnx")


def test_serve_command_refuses_a_bad_export_with_one_clear_line(bad):
    r = subprocess.run([sys.executable, os.path.join(REPO, "deploy/python/serve.py"),
                        "--model-dir", bad["five_labels"], "--backend", "onnx", "--port", "0"],
                       capture_output=True, text=True, timeout=300, cwd=REPO)
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    assert "5 label_names" in r.stderr and "re-export" in r.stderr, r.stderr


def test_infer_command_refuses_a_bad_export_as_the_server_does(bad, tmp_path):
    """An explicit precision is admitted too: a NaN [SEP] row would otherwise write NaN
    logits for every line, a vocabulary past the table out-of-range lookups."""
    texts = tmp_path / "in.txt"
    texts.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    for kind, words in (("nan_sep", "not finite"), ("big_vocab", "largest vocabulary id 563")):
        r = subprocess.run([sys.executable, os.path.join(REPO, "deploy/python/infer.py"),
                            "--model-dir", bad[kind], "--backend", "onnx", "--precision", "fp32",
                            "--input", str(texts), "--output", str(out), "--no-progress"],
                           capture_output=True, text=True, timeout=300, cwd=REPO)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert "smoke check" in r.stderr and words in r.stderr, (kind, r.stderr)
        assert not out.exists()


# ---------------------------------------------------------------- the repository

def repository(root, versions):
    """``root/tiny/V`` for each (V, export dir); returns the root."""
    for v, d in versions:
        shutil.copytree(d, os.path.join(root, "tiny", str(v)), symlinks=True)
    return str(root)


def index_of(url):
    return {e["version"]: e for e in httpx.post(url + "/v2/repository/index", timeout=60).json()}


def test_start_up_serves_the_good_version_under_bad_ones(bad, tmp_path):
    """good v1 + bad v2 (truncated weights, Paddle) -> v1; good v2 under bad v3 -> v2."""
    load = functools.partial(Predictor, backend="paddle")
    root = repository(tmp_path / "a", [(1, bad["good"]), (2, bad["truncated_pdiparams"])])
    with RunningServer(create_app(repository=root, load_predictor=load, deploy=deploy_settings(repository_poll_s=0.2))) as srv:
        r = httpx.post(srv.url + "/predict", json={"texts": [TEXT]}, timeout=60)
        assert r.status_code == 200 and r.headers["X-Model-Version"] == "1", r.text
        index = index_of(srv.url)
        assert index["2"]["state"] == "UNAVAILABLE" and "tensor desc" in index["2"]["reason"]
        assert index["2"]["reason"].startswith(os.path.join(root, "tiny", "2"))
        load_answer = httpx.post(srv.url + "/v2/repository/models/tiny/load", timeout=60)
        assert load_answer.status_code == 409 and load_answer.json()["error"], load_answer.text
        assert "still serving ['1']" in load_answer.json()["error"]
    root = repository(tmp_path / "b", [(2, bad["good"]), (3, bad["five_labels"])])
    load = functools.partial(Predictor, backend="onnx")
    with RunningServer(create_app(repository=root, load_predictor=load, deploy=deploy_settings(repository_poll_s=0.2))) as srv:
        r = httpx.post(srv.url + "/predict", json={"texts": [TEXT]}, timeout=60)
        assert r.status_code == 200 and r.headers["X-Model-Version"] == "2", r.text
        assert "5 label_names" in index_of(srv.url)["3"]["reason"]


def test_bad_versions_under_load_never_fail_a_request(bad, tmp_path):
    """16 clients keep asking while every crafted artifact is dropped in as the newest
    version: each is refused (409 on the load endpoint, its reason in the index and the
    metrics), no request fails or is lost, then a good version takes over."""
    root = tmp_path / "models"
    repository(root, [(1, bad["good"])])
    outside = tmp_path / "outside"
    shutil.copytree(bad["good"], outside / "tiny_elsewhere")
    own = dict(zip(TEXTS, Predictor(bad["good"], "onnx").predict(TEXTS)))
    log = Records()
    logging.getLogger("ppvarlen.serve.repository").addHandler(log)
    load = functools.partial(Predictor, backend="onnx")
    app = create_app(repository=str(root), load_predictor=load, deploy=deploy_settings(repository_poll_s=0.3, max_wait_ms=2))
    kinds = [k for k, (backend, _) in REFUSALS.items() if backend == "onnx"] + ["dir_link"]
    try:
        with RunningServer(app) as srv, ClientLoop(srv.url) as loop:
            loop.wait_for(lambda a: len(a) >= 50, "50 answers from version 1")
            for v, kind in enumerate(kinds, start=2):
                target = root / "tiny" / str(v)
                if kind == "dir_link":  # a version directory linked from outside the repository
                    os.symlink(outside / "tiny_elsewhere", target)
                    words = "outside the repository"
                else:  # staged and renamed in, as docs/SERVING.md says: the poller never
                    # sees a half-copied directory
                    if kind in FIFOS:
                        with_fifo(bad["good"], tmp_path / "staging" / kind, FIFOS[kind])
                    else:
                        shutil.copytree(bad[kind], tmp_path / "staging" / kind, symlinks=True)
                    os.rename(tmp_path / "staging" / kind, target)
                    words = REFUSALS[kind][1]
                r = httpx.post(srv.url + "/v2/repository/models/tiny/load", timeout=120)
                assert r.status_code == 409 and words in r.json()["error"], (kind, r.text)
                assert r.headers["content-type"] == "application/json"
                entry = index_of(srv.url)[str(v)]
                assert entry["state"] == "UNAVAILABLE" and words in entry["reason"], entry
                before = len(loop.answers)
                loop.wait_for(lambda a: len(a) >= before + 20, f"answers after {kind}")
            good = len(kinds) + 2
            shutil.copytree(bad["good"], tmp_path / "staging" / "good")
            os.rename(tmp_path / "staging" / "good", root / "tiny" / str(good))
            r = httpx.post(srv.url + "/v2/repository/models/tiny/load", timeout=120)
            assert r.status_code == 200 and r.json()["state"] == "READY", r.text
            loop.wait_for(lambda a: sum(v == str(good) for _, v, _, _ in a) >= 50,
                          f"50 answers from version {good}")
            os.mkdir(root / "tiny" / "²")  # not a version: ignored, never an error
            wait_until(lambda: index_of(srv.url)[str(good)]["state"] == "READY", "a poll")
            r = httpx.get(srv.url + "/v2/models/tiny/versions/²", timeout=30)
            assert r.status_code == 404 and "ASCII digits" in r.json()["error"], r.text
            metrics = samples(httpx.get(srv.url + "/metrics", timeout=30).text)
    finally:
        logging.getLogger("ppvarlen.serve.repository").removeHandler(log)
    assert not loop.failures, loop.failures[:3]
    assert len(loop.answers) == loop.sent
    assert {v for _, v, _, _ in loop.answers} == {"1", str(good)}
    for text, header, body_version, prediction in loop.answers:
        assert prediction == own[text] and header == body_version
    for v, kind in enumerate(kinds, start=2):
        # refused by the load endpoint, which examines the newest version again, and perhaps
        # first by the poller; never again while its files stay as they are
        refusals = sum(value(metrics, "ppvarlen_model_load_failures_total", model="tiny",
                             version=str(v), reason=reason)
                       for reason in ("manifest", "load", "symlink", "smoke"))
        assert refusals in (1, 2), kind
        assert sum(f"version {v} refused" in m for m in log.messages) == refusals, \
            (kind, log.messages)
    assert not any("Traceback" in m for m in log.messages)


# ---------------------------------------------------------------- non-finite at serve time

def test_nonfinite_outputs_get_503_and_mark_the_version_unhealthy(bad, tmp_path):
    """A NaN row admission could not see (a character only some texts hold): those texts get
    503 naming the version, counted; the version says it is unhealthy; other texts are still
    answered (a replacement version takes over in a repository)."""
    encoder = json.load(open(os.path.join(bad["good"], "encoder.json")))
    vocab = open(os.path.join(bad["good"], "vocab.txt"), encoding="utf-8").read().split("\n")
    poisoned_char = "电"
    export = nan_embedding_row(bad["good"], tmp_path / "nan", vocab.index(poisoned_char))
    assert encoder["special_ids"]["sep"] != vocab.index(poisoned_char)
    app = create_app(Predictor(export, "onnx"), deploy=deploy_settings(max_wait_ms=2))
    with RunningServer(app) as srv:
        ok = httpx.post(srv.url + "/predict", json={"texts": ["质量一般般"]}, timeout=60)
        assert ok.status_code == 200, ok.text
        for route, payload in (("/predict", {"texts": ["质量一般般", "这部电影真好看"]}),
                               ("/v2/models/tiny/infer",
                                {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1],
                                             "data": ["这部电影真好看"]}]})):
            r = httpx.post(srv.url + route, json=payload, timeout=60)
            assert r.status_code == 503 and "NaN" in r.json()["error"], r.text
            assert "version 1" in r.json()["error"] and "unhealthy" in r.json()["error"]
        health = httpx.get(srv.url + "/health", timeout=30)
        assert health.status_code == 503 and health.json()["status"] == "unhealthy"
        ready = httpx.get(srv.url + "/v2/models/tiny/versions/1/ready", timeout=30)
        assert ready.status_code == 503 and "non-finite" in ready.json()["reason"]
        again = httpx.post(srv.url + "/predict", json={"texts": ["质量一般般"]}, timeout=60)
        assert again.status_code == 200 and again.json() == ok.json()
        metrics = samples(httpx.get(srv.url + "/metrics", timeout=30).text)
    assert value(metrics, "ppvarlen_nonfinite_outputs_total", model="tiny", version="1") == 2
    assert value(metrics, "ppvarlen_model_version_healthy", model="tiny", version="1") == 0


# ---------------------------------------------------------------- hostile requests

@pytest.fixture(scope="module")
def server(cls_export):  # noqa: F811
    app = create_app(Predictor(cls_export[0], "onnx"), deploy=deploy_settings(max_wait_ms=2))
    with RunningServer(app) as srv:
        srv.expected = httpx.post(srv.url + "/predict", json={"texts": [TEXT]},
                                  timeout=60).json()
        srv.app = app
        yield srv


def still_serving(srv):
    r = httpx.post(srv.url + "/predict", json={"texts": [TEXT]}, timeout=60)
    assert r.status_code == 200 and r.json() == srv.expected, r.text


OIP = "/v2/models/tiny/infer"
HOSTILE = [  # (route, body bytes, headers, status, field, words in the error)
    ("/predict", b"[" * 100_000 + b"]" * 100_000, {}, 400, "body", "too deeply"),
    ("/predict", b'{"texts": [' + b"9" * 5000 + b"]}", {}, 400, "body", "not valid JSON"),
    ("/predict", b'{"texts": ["a"], "\\ud800": 1}', {}, 400, "body (a key)", "surrogate"),
    ("/predict", b'{"texts": ["\\udc00"]}', {}, 400, "body.texts[0]", "surrogate"),
    ("/predict", b'{"texts": [NaN]}', {}, 400, "body", "NaN is not a JSON value"),
    ("/predict", b'{"texts": ["a"], "' + b"k" * 100_000 + b'": 1}', {}, 422, None, "unknown"),
    ("/predict", b'\xed\xa0\x80', {}, 400, "body", "not UTF-8"),
    (OIP, b'{"id": "\\ud800", "inputs": []}', {}, 400, None, "surrogate"),
    (OIP, json.dumps({"id": "x" * 300, "inputs": []}).encode(), {}, 422, None, "at most 256"),
    (OIP, b'{"inputs": []}', {"Inference-Header-Content-Length": "²".encode()}, 400, None,
     "Inference-Header-Content-Length"),
    (OIP, b'{"inputs": []}', {"Inference-Header-Content-Length": "99999999999999999999"},
     400, None, "Inference-Header-Content-Length"),
]


@pytest.mark.parametrize("case", range(len(HOSTILE)))
def test_hostile_requests_get_a_json_4xx_naming_the_field(server, case):
    route, body, headers, status, field, words = HOSTILE[case]
    before = rss_bytes()
    try:
        r = httpx.post(server.url + route, content=body, headers=headers, timeout=60)
    except httpx.HTTPError:  # the HTTP layer refused the request outright (a bad header)
        r = None
    if r is not None:
        assert r.status_code == status, r.text[:300]
        assert r.headers["content-type"] == "application/json", r.headers
        error = r.json()
        assert len(r.content) < 2000, "the error echoes the client's value unbounded"
        if words is not None:
            assert words in error["error"], error
        if field is not None:
            assert error["field"] == field, error
    still_serving(server)
    assert rss_bytes() - before < 100 * 2**20


def test_a_client_gone_mid_body_is_one_log_line(server):
    records = Records()
    for name in ("ppvarlen", "uvicorn.error"):
        logging.getLogger(name).addHandler(records)
    server_log = logging.getLogger("ppvarlen.serve.server")
    level = server_log.level
    server_log.setLevel(logging.INFO)
    try:
        port = int(server.url.rsplit(":", 1)[1])
        for _ in range(20):
            with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
                s.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                          b"\r\nContent-Length: 1000\r\n\r\n{\"texts\": [")
        still_serving(server)
        wait_until(lambda: sum("disconnected" in m for m in records.messages) >= 20,
                   "20 disconnect lines")
    finally:
        server_log.setLevel(level)
        for name in ("ppvarlen", "uvicorn.error"):
            logging.getLogger(name).removeHandler(records)
    assert not any("Traceback" in m or "Exception in ASGI" in m for m in records.messages)
    assert sum("disconnected" in m for m in records.messages) == 20, records.messages


def test_a_bug_in_a_route_is_a_json_500_counted_everywhere(server, monkeypatch):
    def broken(*args):
        raise KeyError("a bug")

    monkeypatch.setattr(api, "predict_body", broken)
    r = httpx.post(server.url + "/predict", json={"texts": [TEXT]}, timeout=60)
    assert r.status_code == 500 and r.headers["content-type"] == "application/json"
    assert "internal server error" in r.json()["error"] and "a bug" not in r.text
    monkeypatch.undo()
    still_serving(server)
    counts = httpx.get(server.url + "/metrics.json", timeout=30).json()["responses"]
    assert counts.get("500") == 1, counts
    metrics = samples(httpx.get(server.url + "/metrics", timeout=30).text)
    assert value(metrics, "ppvarlen_requests_total", route="/predict", status="500") == 1


# ---------------------------------------------------------------- token and CORS

TOKEN = "t0k3n-" + "x" * 26


def test_bearer_token_guards_the_repository_endpoints_or_every_route(bad, tmp_path):
    root = repository(tmp_path / "models", [(1, bad["good"])])
    load = functools.partial(Predictor, backend="onnx")
    for all_routes in (False, True):
        app = create_app(repository=root, load_predictor=load, auth_token=TOKEN,
                         deploy=deploy_settings(auth_all_routes=all_routes))
        with TestClient(app) as client:
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
                r = client.post("/v2/repository/index", headers=headers)
                assert r.status_code == 401 and r.json()["field"] == "Authorization", r.text
                assert r.headers["www-authenticate"].startswith("Bearer")
            ok = client.post("/v2/repository/index", headers={"Authorization": f"Bearer {TOKEN}"})
            assert ok.status_code == 200 and ok.json()[0]["state"] == "READY"
            predict = client.post("/predict", json={"texts": [TEXT]})
            assert predict.status_code == (401 if all_routes else 200), predict.text
            assert client.get("/v2/health/ready").status_code == 200  # probes stay open


def test_token_file_and_cors_keys(bad, tmp_path):
    weak = tmp_path / "weak"
    weak.write_text("short\n")
    strong = tmp_path / "token"
    strong.write_text(TOKEN + "\n")
    strong.chmod(0o600)
    for overrides, words in ((["Deploy.auth_all_routes=true"], "needs Deploy.auth_token_file"),
                             ([f"Deploy.auth_token_file={weak}"], "at least 16"),
                             ([f"Deploy.auth_token_file={tmp_path / 'missing'}"],
                              "cannot be read")):
        with pytest.raises(ConfigError, match=words):
            app_from_config(bad["good"], load_config(overrides=overrides).Deploy, "onnx")
    origin = "https://app.example.com"
    deploy = load_config(overrides=[f"Deploy.auth_token_file={strong}",
                                    f"Deploy.cors_origins=[{origin}]"]).Deploy
    with TestClient(app_from_config(bad["good"], deploy, "onnx")) as client:
        preflight = client.options("/predict", headers={
            "Origin": origin, "Access-Control-Request-Method": "POST"})
        assert preflight.headers["access-control-allow-origin"] == origin
        other = client.post("/predict", json={"texts": [TEXT]},
                            headers={"Origin": "https://evil.example"})
        assert other.status_code == 200 and "access-control-allow-origin" not in other.headers
    with TestClient(app_from_config(bad["good"], load_config().Deploy, "onnx")) as client:
        r = client.post("/predict", json={"texts": [TEXT]}, headers={"Origin": origin})
        assert "access-control-allow-origin" not in r.headers  # default: no CORS at all


def test_a_4000_request_soak_of_good_and_hostile_requests(server):
    """16 clients, 4,000 requests, one in four hostile (the cases above, in turn): no 5xx,
    every good request answered exactly, every hostile one refused with its 4xx, and the
    server's memory and open files where they were."""
    fds = lambda: len(os.listdir("/proc/self/fd"))  # noqa: E731 - the server runs in-process
    rss0, fds0 = rss_bytes(), fds()
    oip_good = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [TEXT]}]}

    def client(k):
        out = []
        with httpx.Client(timeout=120) as c:
            for i in range(250):
                n = k * 250 + i
                if n % 4 == 3:
                    route, body, headers, status, _, _ = HOSTILE[(n // 4) % len(HOSTILE)]
                    r = c.post(server.url + route, content=body, headers=headers)
                    out.append(("hostile", status, r.status_code, None))
                elif n % 2:
                    r = c.post(server.url + "/predict", json={"texts": [TEXT]})
                    out.append(("predict", 200, r.status_code, r.json()))
                else:
                    r = c.post(server.url + OIP, json=oip_good)
                    out.append(("oip", 200, r.status_code, r.json()))
        return out

    results = [x for part in run_concurrently(client, [(k,) for k in range(16)]) for x in part]
    assert len(results) == 4000
    assert not [r for r in results if r[2] >= 500], [r[:3] for r in results if r[2] >= 500][:5]
    assert all(want == got for _, want, got, _ in results), \
        [r[:3] for r in results if r[1] != r[2]][:5]
    oip_answer = {o["name"]: o["data"] for o in results[0][3]["outputs"]}
    for kind, _, _, body in results:
        if kind == "predict":
            assert body == server.expected
        elif kind == "oip":
            assert {o["name"]: o["data"] for o in body["outputs"]} == oip_answer
    assert oip_answer["label"] == [server.expected["predictions"][0]["label"]]
    still_serving(server)
    assert rss_bytes() - rss0 < 150 * 2**20
    assert fds() - fds0 < 20
