"""Ray Data batch inference and Ray Serve on one local Ray cluster (num_cpus=2) shared by all tests.

The export is a tiny random classifier made by the exporter itself (test_deploy_helpers)
with a vocabulary of the sentiment test split, so different reviews get different
probabilities and a row answered with another row's prediction is caught.
"""
import json
import os
import shutil
import subprocess
import sys

import httpx
import pytest
import export_helpers
from test_server import RunningServer, post, run_concurrently

ray = pytest.importorskip("ray")
from ray import serve  # noqa: E402

from ppvarlen.runtime.admission import AdmissionError  # noqa: E402
from ppvarlen.runtime.predictor import Predictor  # noqa: E402
from ppvarlen.serve.server import create_app, deploy_settings  # noqa: E402
from ppvarlen.integrations.ray_batch import run_batch  # noqa: E402
from ppvarlen.config import ConfigError  # noqa: E402
from ppvarlen.integrations.ray_serve import (ReplicaStartError, build_app,  # noqa: E402
                                             load_serve_config, run_config)
from ppvarlen.integrations.text_shards import plan_units, read_unit  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BAD_LINES = [b'{"id": "b1", "text": ""}', b'{"id": "b2", "text": 42}', b'{"id": "b3"}',
             b'{"id": "b4", "text": "\xff\xfe broken"}', b'not json', b'["a list"]',
             b'{"id": "b5", "text": "   "}']
BAD_REASONS = ["empty text", "wrong type", "missing", "not UTF-8", "not valid JSON",
               "expected an object", "empty text"]
HTTP_TIMEOUT = 120  # seconds per request to a replica (httpx's default of 5 s is too short)


@pytest.fixture
def cluster(ray_cluster):  # the module's Ray cluster (conftest.py)
    return ray_cluster


@pytest.fixture
def fresh_serve(cluster):
    """Serve is shut down after the test, whatever happened, so no proxy, port or application
    of one test is seen by the next (serve.start ignores new HTTP options while Serve runs)."""
    yield
    serve.shutdown()


@pytest.fixture(scope="module")
def reviews():
    from ppvarlen.config import load_config
    from ppvarlen.data.sources import load_corpus

    corpus = load_corpus(load_config(overrides=["Data.corpus=sentiment"]).Data)
    return [ex["text"] for ex in corpus.splits["test"] if ex["text"].strip()][:600]


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory, reviews):
    with pytest.MonkeyPatch.context() as mp:  # the tiny model's vocabulary: these reviews
        mp.setattr(export_helpers, "TEXTS", reviews)
        out, _, _ = export_helpers.make_tiny_export(
            str(tmp_path_factory.mktemp("ray") / "export"), "classification", max_len=128)
    return out


@pytest.fixture(scope="module")
def expected(export_dir, reviews):
    """What the single-process predictor answers, per backend."""
    return {b: Predictor(export_dir, b).predict(reviews) for b in ("paddle", "onnx")}


def write_jsonl(path, reviews, bad_every=0):
    """Reviews as JSONL ({"id": k, "text": ...}); a bad line after every ``bad_every``-th."""
    lines, bad_rows = [], {}
    for k, text in enumerate(reviews):
        lines.append(json.dumps({"id": k, "text": text}, ensure_ascii=False).encode())
        if bad_every and k % bad_every == 0 and len(bad_rows) < len(BAD_LINES):
            bad_rows[len(lines) + 1] = len(bad_rows)  # 1-based line number -> which bad line
            lines.append(BAD_LINES[len(bad_rows) - 1])
    path.write_bytes(b"\n".join(lines) + b"\n")
    return bad_rows


def read_jsonl(path):
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()]


def assert_same_predictions(got, want):
    assert got["label"] == want["label"] and got["num_tokens"] == want["num_tokens"]
    for name, p in want["probs"].items():
        assert abs(got["probs"][name] - p) < 1e-5, (got, want)


def test_batch_jsonl_paddle_equals_predictor_with_rejects(cluster, export_dir, reviews, expected,
                                                          tmp_path):
    src = tmp_path / "in" / "reviews.jsonl"
    src.parent.mkdir()
    bad_rows = write_jsonl(src, reviews, bad_every=80)
    summary = run_batch(export_dir, str(src.parent), str(tmp_path / "out"), "paddle", actors=2,
                        window=128, preserve_order=True, unit_bytes=16 << 10)
    preds = read_jsonl(tmp_path / "out" / "predictions.jsonl")
    rejects = read_jsonl(tmp_path / "out" / "rejects.jsonl")
    # preserve_order: lines come back in input order; each id is its review's index
    assert [p["id"] for p in preds] == list(range(len(reviews)))
    assert all(p["file"] == "reviews.jsonl" for p in preds)
    for p, want in zip(preds, expected["paddle"]):
        assert_same_predictions(p, want)
    assert sorted(r["row"] for r in rejects) == sorted(bad_rows)
    for r in rejects:
        assert BAD_REASONS[bad_rows[r["row"]]] in r["reason"], r
    assert summary["rows_in"] == len(reviews) + len(BAD_LINES)
    assert summary["rows_out"] == len(reviews) and summary["rejected"] == len(BAD_LINES)
    assert summary["units"] > 2  # the file was cut into pieces read by several tasks
    assert 0.5 < summary["padding_efficiency"] <= 1
    assert json.loads((tmp_path / "out" / "summary.json").read_text()) == summary


def test_batch_parquet_shards_onnx_equals_predictor(cluster, export_dir, reviews, expected,
                                                    tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    half = len(reviews) // 2
    (tmp_path / "in").mkdir()
    for name, (lo, hi) in {"a.parquet": (0, half), "b.parquet": (half, len(reviews))}.items():
        table = pa.table({"id": list(range(lo, hi)), "text": reviews[lo:hi]})
        pq.write_table(table, tmp_path / "in" / name, row_group_size=100)
    summary = run_batch(export_dir, str(tmp_path / "in"), str(tmp_path / "out"), "onnx",
                        actors=2, window=256)
    preds = read_jsonl(tmp_path / "out" / "predictions.jsonl")
    assert sorted(p["id"] for p in preds) == list(range(len(reviews)))  # each row exactly once
    for p in preds:
        assert p["row"] == p["id"] + 1 - (half if p["file"] == "b.parquet" else 0)
        assert_same_predictions(p, expected["onnx"][p["id"]])
    assert summary["rejected"] == 0 and summary["units"] == 6  # 3 row groups per file


def test_an_auto_job_runs_the_drivers_choice_on_every_actor(cluster, export_dir, reviews,
                                                          expected, tmp_path):
    """Backend and precision ``auto`` are chosen once, on the driver (here: an export whose
    Paddle entry is removed, so ONNX Runtime fp32 whatever the timing); the actors load that
    choice, and the summary records it beside what was asked."""
    onnx_only = tmp_path / "export"
    shutil.copytree(export_dir, onnx_only)
    manifest = json.loads((onnx_only / "manifest.json").read_text())
    for key in ("backends", "precisions", "precision_measured"):
        (manifest.get(key) or {}).pop("paddle", None)
    (onnx_only / "manifest.json").write_text(json.dumps(manifest))
    src = tmp_path / "reviews.jsonl"
    write_jsonl(src, reviews[:60])
    summary = run_batch(str(onnx_only), str(src), str(tmp_path / "out"), "auto", actors=1,
                        window=64, predictor_kwargs={"precision": "auto"})
    assert (summary["backend"], summary["precision"]) == ("onnx", "fp32")
    assert summary["requested"] == {"backend": "auto", "precision": "auto"}
    preds = read_jsonl(tmp_path / "out" / "predictions.jsonl")
    assert sorted(p["id"] for p in preds) == list(range(60))
    for p in preds:
        assert_same_predictions(p, expected["onnx"][p["id"]])


def test_killed_actor_is_replaced_and_every_row_answered_once(cluster, export_dir, reviews,
                                                              expected, tmp_path):
    src = tmp_path / "reviews.jsonl"
    write_jsonl(src, reviews)
    marker = tmp_path / "crashed"
    summary = run_batch(export_dir, str(src), str(tmp_path / "out"), "paddle", actors=2,
                        window=64, unit_bytes=8 << 10, crash_once_marker=str(marker))
    assert marker.exists()  # an actor did kill its own process mid-run
    preds = read_jsonl(tmp_path / "out" / "predictions.jsonl")
    assert sorted(p["id"] for p in preds) == list(range(len(reviews)))
    for p in preds:
        assert_same_predictions(p, expected["paddle"][p["id"]])
    assert summary["rows_out"] == len(reviews) and summary["rejected"] == 0


def test_a_bad_export_stops_the_job_with_its_reason_before_ray_runs(export_dir, tmp_path):
    from test_hostile_serving import five_label_names

    bad = five_label_names(export_dir, tmp_path / "bad")
    src = tmp_path / "in.jsonl"
    write_jsonl(src, ["好"])
    with pytest.raises(AdmissionError, match="smoke check: .*5 label_names"):
        run_batch(bad, str(src), str(tmp_path / "out"), "onnx", actors=1)
    assert not (tmp_path / "out").exists()


def test_parquet_bad_values_become_rejects_with_reasons(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": pa.array([b"ok", b"\xff", None, b" "], pa.binary())}),
                   tmp_path / "bytes.parquet")
    pq.write_table(pa.table({"text": [1, 2]}), tmp_path / "ints.parquet")
    rows = [r for u in plan_units(str(tmp_path)) for r in read_unit(u)]
    assert [(r["file"], r["row"], r["error"].split(":")[0]) for r in rows] == [
        ("bytes.parquet", 1, ""), ("bytes.parquet", 2, "not UTF-8"),
        ("bytes.parquet", 3, '"text" is missing or null'), ("bytes.parquet", 4, "empty text"),
        ("ints.parquet", 1, "wrong type"), ("ints.parquet", 2, "wrong type")]


def serve_config(port, export_dir, replicas=2):
    config = load_serve_config(os.path.join(REPO, "deploy", "ray", "serve.yaml"), export_dir)
    config.http_options.port = port
    config.applications[0].deployments[0].num_replicas = replicas
    return config


def test_serve_two_replicas_answer_like_the_single_process_server(fresh_serve, export_dir,
                                                                   reviews, free_port):
    requests = [{"texts": reviews[k:k + 1 + k % 4]} for k in range(0, 240, 5)]
    requests += [{"texts": ["好", ""]}, {"texts": "not a list"}, {"texts": ["a"], "extra": 1}]
    single = create_app(Predictor(export_dir, "paddle"), deploy=deploy_settings(max_wait_ms=5))
    with RunningServer(single) as srv:
        want = run_concurrently(lambda r: post(srv.url, r), [(r,) for r in requests])
    url = run_config(serve_config(free_port, export_dir))
    got = run_concurrently(lambda r: post(url, r), [(r,) for r in requests])
    health = httpx.get(url + "/health", timeout=HTTP_TIMEOUT).json()
    # several readings: the proxy routes each to one of the two replicas
    readings = [httpx.get(url + "/metrics.json", timeout=HTTP_TIMEOUT).json() for _ in range(8)]
    bad_json = post(url, content=b'{"texts": [')
    assert [g.status_code for g in got] == [w.status_code for w in want]
    assert {w.status_code for w in want} == {200, 422}
    for g, w in zip(got, want):
        if w.status_code != 200:
            assert g.json() == w.json()  # same error JSON: {"error": ..., "field": ...}
            continue
        assert len(g.json()["predictions"]) == len(w.json()["predictions"])
        for a, b in zip(g.json()["predictions"], w.json()["predictions"]):
            assert_same_predictions(a, b)
    assert bad_json.status_code == 400 and bad_json.json()["field"] == "body"
    assert health["status"] == "ok" and health["task"] == "classification"
    served = sum(len(r["texts"]) for r in requests[:-3])
    for m in readings:
        assert m["settings"]["max_wait_ms"] == 5 and 0 <= m["texts"] <= served
        # a replica that ran no batch has no efficiency yet
        assert (m["padding_efficiency"] is None) == (m["texts"] == 0), m
        assert m["padding_efficiency"] is None or 0 < m["padding_efficiency"] <= 1
    # Each replica counts only its own texts.  On a loaded host Serve's router can send every
    # request to one replica (seen with two busy loops: the replica answering /metrics.json had
    # run no batch), so the split is not asserted, only that two replicas' counts add up.
    counts = {m["texts"] for m in readings}
    assert len(counts) <= 2, counts
    if len(counts) == 2:
        assert sum(counts) == served, (counts, served)


def test_replica_that_cannot_load_the_export_fails_with_the_predictors_error(fresh_serve,
                                                                             export_dir, tmp_path,
                                                                             free_port):
    broken = tmp_path / "export"
    shutil.copytree(export_dir, broken)
    with open(broken / "vocab.txt", "a", encoding="utf-8") as f:
        f.write("tampered\n")
    with pytest.raises(ReplicaStartError, match=r"UnservableExportError: .*vocab\.txt: sha256 .* does not "
                                                r"match the manifest"):
        run_config(serve_config(free_port, str(broken), replicas=1))


def test_serve_args_are_checked_before_any_replica_starts():
    with pytest.raises(ConfigError, match="set http_options.port"):
        build_app({"model_dir": "x", "deploy": {"port": 9000}})
    with pytest.raises(ConfigError, match=r"unknown \['modeldir'\]"):
        build_app({"modeldir": "x"})
    with pytest.raises(ConfigError, match="max_wait_ms"):
        build_app({"model_dir": "x", "deploy": {"max_wait_ms": "soon"}})


def test_core_package_never_imports_ray():
    code = ("import sys, ppvarlen, ppvarlen.serve.server, ppvarlen.runtime.predictor, "
            "ppvarlen.integrations, ppvarlen.integrations.text_shards; "
            "print([m for m in sys.modules if m == 'ray' or m.startswith('ray.')])")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                       timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr
