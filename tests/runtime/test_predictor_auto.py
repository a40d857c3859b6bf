"""``Predictor(..., precision="auto")`` (what ``ppvarlen-infer --precision auto`` loads) is
decided on the host that runs it, by the server's rule (``precision_choice.load_admitted``):
the export host's timings in the manifest decide nothing.  Timings are injected
(``precision_choice.measure``), as tests/serve/test_precision_auto.py does."""
import json
import shutil

import pytest

from ppvarlen import cli
from ppvarlen.runtime import precision_choice, threads_choice
from ppvarlen.runtime.predictor import Predictor
from test_precision_choice import TEXTS, spread_export


@pytest.fixture(scope="module")
def shared_export(tmp_path_factory):
    return spread_export(tmp_path_factory.mktemp("predictor_auto") / "export", ["fp32", "int8"])


@pytest.fixture
def export_dir(shared_export, tmp_path):
    copy = tmp_path / "export"
    shutil.copytree(shared_export, copy)
    return copy


@pytest.fixture
def host(monkeypatch):
    """The texts per CPU second this host 'times' (``speeds``), and what was timed."""
    class Host:
        speeds = {}
        calls = []
        batches = []

    def measure(predictors, batches, **timing):  # keys (backend, precision); one backend here
        Host.calls.append(sorted(p for _, p in predictors))
        Host.batches.append(batches)
        return {k: Host.speeds[k[1]] for k in predictors}, 2, 0.1

    monkeypatch.setattr(precision_choice, "measure", measure)
    monkeypatch.setattr(precision_choice, "CHOOSE_IN_CHILD", False)  # patches stay in-process
    return Host


def _export_host_timed(export_dir, fp32, int8):
    """The export host's examples/s in the manifest (manifest.json is not in its own hash list)."""
    path = export_dir / "manifest.json"
    manifest = json.loads(path.read_text())
    for precision, speed in (("fp32", fp32), ("int8", int8)):
        manifest["precision_measured"]["onnx"][precision]["examples_per_s"] = speed
    path.write_text(json.dumps(manifest))


@pytest.mark.parametrize("export_host, this_host, expected", [
    ((100.0, 900.0), {"fp32": 100.0, "int8": 100.0}, "fp32"),  # int8 won only elsewhere
    ((100.0, 50.0), {"fp32": 100.0, "int8": 300.0}, "int8"),  # int8 lost only elsewhere
])
def test_predictor_auto_is_timed_on_this_host_not_read_from_the_manifest(
        export_dir, host, export_host, this_host, expected):
    _export_host_timed(export_dir, *export_host)
    host.speeds = this_host
    predictor = Predictor(str(export_dir), backend="onnx", precision="auto")
    assert host.calls == [["fp32", "int8"]]  # both admitted here, then timed together
    assert predictor.precision == expected
    assert predictor.precision_choice["requested"] == "auto"
    assert predictor.precision_choice["texts_per_cpu_s"] == this_host
    assert len(predictor.predict(TEXTS)) == len(TEXTS)
    assert predictor.clone().precision == expected  # Deploy.workers clones serve the same


def test_infer_auto_uses_the_same_rule(export_dir, host, tmp_path, caplog):
    _export_host_timed(export_dir, 100.0, 900.0)
    host.speeds = {"fp32": 100.0, "int8": 100.0}
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(TEXTS[:5]) + "\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    assert cli.main_infer(["--model-dir", str(export_dir), "--backend", "onnx", "--precision",
                           "auto", "--input", str(texts), "--output", str(out),
                           "--no-progress"]) == 0
    assert host.calls == [["fp32", "int8"]]
    assert len(out.read_text(encoding="utf-8").splitlines()) == 5


def test_resolve_refuses_to_pick_auto_on_cpu_from_the_manifest():
    with pytest.raises(ValueError, match="load_admitted"):
        precision_choice.resolve({}, "onnx", "auto", device="cpu")


@pytest.mark.parametrize("workload", ["files", "requests"])
def test_a_library_caller_says_what_it_will_run_and_auto_times_that(export_dir, host, workload):
    """``Predictor(..., workload=...)``: a caller that serves requests of its own (a custom
    server, an actor answering a few texts at a time) gets the server's timing batches."""
    host.speeds = {"fp32": 100.0, "int8": 300.0}
    kwargs = {} if workload == "files" else {"workload": workload}
    predictor = Predictor(str(export_dir), backend="onnx", precision="auto", **kwargs)
    fp32 = Predictor(str(export_dir), backend="onnx", precision="fp32")
    expected = {"files": precision_choice.admission_batches,
                "requests": threads_choice.served_like_batches}[workload](fp32)
    assert host.batches == [expected] and predictor.precision == "int8"
    with pytest.raises(ValueError, match="workload 'file'"):
        Predictor(str(export_dir), backend="onnx", precision="auto", workload="file")
