"""Triton's own load tool measures ppvarlen unchanged: ``perf_analyzer -i http`` and ``-i grpc``
against a classification export, server-side statistics included.

perf_analyzer reads ``/v2``, the model's metadata and its configuration (the
``model_configuration`` extension), sends load, and reads the ``statistics`` extension
before and after each window; a count that does not add up stops it.  The binary is installed
from packages by ``tools/get_perf_analyzer.sh`` on first use (where that cannot run, e.g.
without root for Debian's libb64-0d, the test is skipped — and fails under CI).
"""
import csv
import json
import os
import subprocess
import sys

import httpx
import pytest
from test_deploy_helpers import TEXTS, cls_export  # noqa: F401
from test_server import REPO, RunningServer

from ppvarlen.runtime.predictor import Predictor
from ppvarlen.serve.server import create_app, deploy_settings


def perf_analyzer_path():
    """$PERF_ANALYZER, or the checkout's copy, installed by tools/get_perf_analyzer.sh from
    packages (PyPI wheels, Debian's libb64-0d) when missing."""
    path = os.environ.get("PERF_ANALYZER") or os.path.join(REPO, ".perf_analyzer",
                                                           "perf_analyzer")
    if not os.access(path, os.X_OK) and not os.environ.get("PERF_ANALYZER"):
        r = subprocess.run(["bash", os.path.join(REPO, "tools", "get_perf_analyzer.sh")],
                           capture_output=True, text=True, timeout=600,
                           env={**os.environ, "PYTHON": sys.executable})
        if r.returncode != 0:
            why = f"tools/get_perf_analyzer.sh failed: {r.stderr[-500:]}"
            if os.environ.get("CI"):
                pytest.fail(why)
            pytest.skip(why)
    assert os.access(path, os.X_OK), f"perf_analyzer not found at {path}"
    return path


@pytest.fixture(scope="module")
def server(cls_export):  # noqa: F811
    app = create_app(Predictor(cls_export[0], "onnx"), deploy_settings(max_wait_ms=2),
                     grpc_port=0)
    with RunningServer(app) as srv:
        srv.grpc_url = f"127.0.0.1:{app.state.grpc.port}"
        yield srv


def stats(srv):
    return httpx.get(srv.url + "/v2/models/tiny/stats", timeout=30).json()["model_stats"][0]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_perf_analyzer_measures_ppvarlen_with_server_statistics(server, protocol, tmp_path):
    exe = perf_analyzer_path()
    data = tmp_path / "input.json"
    data.write_text(json.dumps({"data": [{"text": [t]} for t in TEXTS]}, ensure_ascii=False))
    report = tmp_path / "report.csv"
    url = server.url.removeprefix("http://") if protocol == "http" else server.grpc_url
    before = stats(server)["inference_count"]
    r = subprocess.run([exe, "-m", "tiny", "-u", url, "-i", protocol, "--input-data", str(data),
                        "--shape", "text:1", "--concurrency-range", "4",
                        "--measurement-mode", "count_windows",
                        "--measurement-request-count", "60", "--max-trials", "3",
                        # a shared machine is never stable; this checks protocol, not speed
                        "--stability-percentage", "1000",
                        "-f", str(report), "--verbose-csv"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = r.stdout
    assert "Server:" in out and "Inference count" in out and "compute infer" in out, out
    rows = list(csv.DictReader(report.open()))
    assert rows and float(rows[0]["Inferences/Second"]) > 0, rows
    after = stats(server)
    assert after["inference_count"] - before >= 60
    durations = after["inference_stats"]
    counts = {k: durations[k]["count"] for k in ("queue", "compute_input", "compute_infer",
                                                 "compute_output")}
    assert len(set(counts.values())) == 1, counts  # what perf_analyzer requires
    assert durations["fail"]["count"] == 0
