"""Deploy.precision auto (the default) is decided on the serving host: the precisions the
export verified that this CPU runs and that pass admission are timed here, the fastest that
beats fp32 by AUTO_MIN_GAIN serves, and the choice is shown on /health, the model config
and /metrics.  Timings are injected (``precision_choice.measure``): nothing here depends on
which precision this test machine runs faster."""
import functools
import json
import logging
import os
import shutil
import subprocess
import sys
import time

import pytest
from fastapi.testclient import TestClient

from ppvarlen import cli
from ppvarlen.runtime import admission
from ppvarlen.runtime import precision_choice, threads_choice
from ppvarlen.runtime.admission import AdmissionError
from ppvarlen.runtime.predictor import Predictor
from ppvarlen.serve.server import app_from_config
from ppvarlen.serve.dataplane import deploy_settings
from ppvarlen.export.exporter import export_model
from test_export import CFG, _encoder, _meta
from test_precision_choice import ITEMS
from test_quantize import spread_transformer

NAME = "transformer_cls"


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory):
    """paddle fp32+bf16 and onnx fp32+int8, every one verified; bf16 recorded as verified on
    a host with bf16 instructions whatever this test machine has (manifest.json is not in its
    own hash list), as an export made on such a host reads."""
    out = tmp_path_factory.mktemp("auto") / "export"
    export_model(spread_transformer(ITEMS), _meta("classification", NAME, ["a", "b"]),
                 _encoder(), CFG, str(out), ["paddle", "onnx"], ["fp32", "bf16", "int8"],
                 verify=True, test_examples=ITEMS)
    path = out / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["precision_measured"]["paddle"]["bf16"]["cpu_bf16"] = True
    path.write_text(json.dumps(manifest))
    return str(out)


@pytest.fixture
def host(monkeypatch):
    """This host as a test sets it: bf16 instructions or not, and the texts/s timed here
    (``speeds``; a test that must not time sets ``timed`` to None)."""
    class Host:
        speeds = {}  # or speeds(batches) -> {name: texts/s}
        calls = []
        batches = []

    def measure(predictors, batches, **timing):
        # keys (backend, precision); named by precision alone when one backend is timed
        several = len({backend for backend, _ in predictors}) > 1
        names = {k: f"{k[0]} {k[1]}" if several else k[1] for k in predictors}
        Host.calls.append(sorted(names.values()))
        Host.batches.append(batches)
        assert batches and all(batches)  # built from the export
        speeds = Host.speeds(batches) if callable(Host.speeds) else Host.speeds
        return {k: speeds[names[k]] for k in predictors}, 2, 0.1

    monkeypatch.setattr(precision_choice, "measure", measure)
    monkeypatch.setattr(precision_choice, "CHOOSE_IN_CHILD", False)  # patches stay in-process
    monkeypatch.setattr(precision_choice, "cpu_supports_bf16", lambda: True)
    return Host


def _loader(backend):
    def load(export_dir, precision):
        return Predictor(export_dir, backend, precision=precision)
    return load


def _refuse_admission_of(monkeypatch, refused):
    real = admission.admit

    def admit(predictor, seed=0, renderers=()):
        if predictor.precision == refused:
            raise AdmissionError("padding", "length 1: the output alone differs from the "
                                 "output batched with other lengths (padding changes the answer)")
        return real(predictor, seed, renderers)

    monkeypatch.setattr(admission, "admit", admit)


def test_deploy_precision_defaults_to_auto():
    assert deploy_settings().precision == "auto"


@pytest.mark.parametrize("on_host, expected", [
    ({"fp32": 100.0, "bf16": 150.0}, "bf16"),  # export host: bf16 within AUTO_MIN_GAIN
    ({"fp32": 100.0, "bf16": 100.0 * precision_choice.AUTO_MIN_GAIN - 1}, "fp32"),
])
def test_auto_serves_what_this_host_times_fastest(export_dir, host, on_host, expected, caplog):
    host.speeds = on_host
    caplog.set_level(logging.INFO, logger="ppvarlen.runtime.precision")
    predictor = precision_choice.load_admitted(_loader("paddle"), export_dir, "auto")
    assert host.calls == [["bf16", "fp32"]]  # both admitted, then timed together
    assert predictor.precision == expected
    choice = predictor.precision_choice
    assert choice["precision"] == expected and choice["requested"] == "auto"
    assert choice["texts_per_cpu_s"] == {p: round(v, 1) for p, v in on_host.items()}
    assert set(predictor.admission) == set(admission.CHECKS)  # what serves was admitted
    line = next(r.getMessage() for r in caplog.records if "precision auto:" in r.getMessage())
    assert f"{on_host['fp32']:.1f}" in line and f"{on_host['bf16']:.1f}" in line
    assert "CPU flags:" in line


def test_bf16_verified_on_another_host_is_skipped_on_a_cpu_without_bf16(
        export_dir, host, monkeypatch, caplog):
    monkeypatch.setattr(precision_choice, "cpu_supports_bf16", lambda: False)
    caplog.set_level(logging.INFO, logger="ppvarlen.runtime.precision")
    predictor = precision_choice.load_admitted(_loader("paddle"), export_dir, "auto")
    assert predictor.precision == "fp32" and host.calls == []  # nothing else to time
    assert "passes admission here" in predictor.precision_choice["reason"]
    assert any("bf16" in r.getMessage() and "skipped" in r.getMessage()
               and "no bf16 instructions" in r.getMessage() for r in caplog.records)


def test_a_precision_failing_admission_here_is_skipped_and_fp32_serves(
        export_dir, host, monkeypatch, caplog):
    _refuse_admission_of(monkeypatch, "int8")
    host.speeds = {"fp32": 100.0, "int8": 900.0}
    caplog.set_level(logging.INFO, logger="ppvarlen.runtime.precision")
    predictor = precision_choice.load_admitted(_loader("onnx"), export_dir, "auto")
    assert predictor.precision == "fp32" and host.calls == []
    assert any(r.levelno == logging.WARNING and "int8" in r.getMessage()
               and "padding check" in r.getMessage() for r in caplog.records)


def test_an_explicit_precision_overrides_auto_and_is_not_timed(export_dir, host):
    host.speeds = {"fp32": 100.0, "bf16": 900.0}
    predictor = precision_choice.load_admitted(_loader("paddle"), export_dir, "fp32")
    assert predictor.precision == "fp32" and host.calls == []
    assert predictor.precision_choice == {**precision_choice.as_requested("fp32"),
                                          "backend": "paddle"}


def test_an_explicit_precision_failing_admission_is_named(export_dir, monkeypatch, capsys):
    _refuse_admission_of(monkeypatch, "int8")
    with pytest.raises(AdmissionError, match=r"^int8: padding check: length 1"):
        precision_choice.load_admitted(_loader("onnx"), export_dir, "int8")
    for flags in (["--precision", "int8"], ["-o", "Deploy.precision=int8"]):
        rc = cli.main_serve(["--model-dir", export_dir, "--backend", "onnx", "--port", "0",
                             *flags])
        err = capsys.readouterr().err
        assert rc == 2 and "int8: padding check: length 1" in err, err


def _any_backend():
    """What the server loads with Deploy.backend: auto."""
    return functools.partial(Predictor, backend="auto")


@pytest.mark.parametrize("on_host, expected", [
    ({"paddle fp32": 100.0, "paddle bf16": 150.0, "onnx fp32": 120.0, "onnx int8": 300.0},
     ("onnx", "int8")),
    ({"paddle fp32": 100.0, "paddle bf16": 400.0, "onnx fp32": 120.0, "onnx int8": 300.0},
     ("paddle", "bf16")),
    # reduced precisions within AUTO_MIN_GAIN of the fastest fp32: the faster fp32
    ({"paddle fp32": 100.0, "paddle bf16": 140.0, "onnx fp32": 130.0, "onnx int8": 140.0},
     ("onnx", "fp32")),
])
def test_backend_auto_serves_the_backend_and_precision_this_host_times_fastest(
        export_dir, host, on_host, expected, caplog):
    host.speeds = on_host
    caplog.set_level(logging.INFO, logger="ppvarlen.runtime.precision")
    predictor = precision_choice.load_admitted(_any_backend(), export_dir, "auto")
    assert host.calls == [sorted(on_host)]  # every backend's candidates, timed together
    assert (predictor.backend, predictor.precision) == expected
    choice = predictor.precision_choice
    assert (choice["backend"], choice["precision"], choice["requested"]) == (*expected, "auto")
    assert choice["texts_per_cpu_s"] == on_host
    assert set(predictor.admission) == set(admission.CHECKS)  # what serves was admitted
    line = next(r.getMessage() for r in caplog.records
                if "backend and precision auto:" in r.getMessage())
    assert f"{expected[1]} for backend {expected[0]}" in line and "CPU flags:" in line


def test_backend_auto_with_an_explicit_precision_chooses_among_the_backends_holding_it(
        export_dir, host, monkeypatch, caplog):
    real_choose = precision_choice.choose
    # only ONNX holds int8: nothing to choose, so no candidate loads (no child process either)
    monkeypatch.setattr(precision_choice, "choose", lambda *a, **k: pytest.fail("chose"))
    caplog.set_level(logging.INFO, logger="ppvarlen.runtime.precision")
    predictor = precision_choice.load_admitted(_any_backend(), export_dir, "int8")
    assert (predictor.backend, predictor.precision) == ("onnx", "int8")
    assert host.calls == []
    assert predictor.precision_choice["backend"] == "onnx"
    assert any("backend auto: onnx, the one backend of this export that holds precision int8"
               in r.getMessage() for r in caplog.records)
    monkeypatch.setattr(precision_choice, "choose", real_choose)
    host.speeds = {"paddle fp32": 100.0, "onnx fp32": 120.0}
    predictor = precision_choice.load_admitted(_any_backend(), export_dir, "fp32")
    assert host.calls == [["onnx fp32", "paddle fp32"]]
    assert (predictor.backend, predictor.precision) == ("onnx", "fp32")
    assert predictor.precision_choice["requested"] == "fp32"
    with pytest.raises(precision_choice.UnservableExportError, match="no backend .* holds "
                       "precision 'fp16'"):
        precision_choice.load_admitted(_any_backend(), export_dir, "fp16")


def test_backend_auto_on_a_one_backend_export_chooses_its_precision_only(export_dir, host,
                                                                         tmp_path, caplog):
    """An export written with one format (``--format paddle``): the backend is that one, and
    ``auto`` times its precisions as with ``--backend paddle``."""
    one = tmp_path / "export"
    shutil.copytree(export_dir, one)
    manifest = json.loads((one / "manifest.json").read_text())
    for key in ("backends", "precisions", "precision_measured"):
        manifest[key].pop("onnx")
    (one / "manifest.json").write_text(json.dumps(manifest))
    host.speeds = {"fp32": 100.0, "bf16": 150.0}
    caplog.set_level(logging.INFO, logger="ppvarlen.runtime.precision")
    predictor = precision_choice.load_admitted(_any_backend(), str(one), "auto")
    assert host.calls == [["bf16", "fp32"]]  # named by precision alone: one backend timed
    assert (predictor.backend, predictor.precision) == ("paddle", "bf16")
    assert any("backend auto: paddle, the export's only backend" in r.getMessage()
               for r in caplog.records)


def test_backend_auto_skips_a_backend_that_fails_here(export_dir, host, monkeypatch, caplog):
    real = admission.admit

    def admit(predictor, seed=0, renderers=()):
        if predictor.backend == "paddle":
            raise AdmissionError("smoke", "the engine answered NaN")
        return real(predictor, seed, renderers)

    monkeypatch.setattr(admission, "admit", admit)
    host.speeds = {"fp32": 100.0, "int8": 300.0}  # the ONNX candidates alone
    caplog.set_level(logging.INFO, logger="ppvarlen.runtime.precision")
    predictor = precision_choice.load_admitted(_any_backend(), export_dir, "auto")
    assert (predictor.backend, predictor.precision) == ("onnx", "int8")
    assert any(r.levelno == logging.WARNING and "backend auto: paddle skipped" in r.getMessage()
               for r in caplog.records)


def test_precision_flag_and_override_must_agree(export_dir, capsys):
    rc = cli.main_serve(["--model-dir", export_dir, "--precision", "fp32",
                         "-o", "Deploy.precision=int8"])
    assert rc == 2 and "disagree" in capsys.readouterr().err


def test_auto_times_the_batches_admission_ran_with_no_untimed_pass(export_dir, monkeypatch):
    """For a file run ``auto`` times the admission batches, which admitting each candidate ran
    (their kernels are set up): no pass of them runs untimed.  A server's workload is batches
    admission did not run: they get their untimed pass."""
    monkeypatch.setattr(precision_choice, "CHOOSE_IN_CHILD", False)
    admitted_ran, timed = [], []
    real_run, real_measure = Predictor.run_engine, precision_choice.measure

    def run_engine(self, rows, *args, **kwargs):
        admitted_ran.append([list(r) for r in rows])
        return real_run(self, rows, *args, **kwargs)

    def measure(predictors, batches, **timing):
        timed.append((set(timing.get("warm", ())), all(b in admitted_ran for b in batches)))
        return real_measure(predictors, batches, **timing)

    monkeypatch.setattr(Predictor, "run_engine", run_engine)
    monkeypatch.setattr(precision_choice, "measure", measure)
    precision_choice.choose(functools.partial(Predictor, backend="onnx"), export_dir)
    assert timed == [({("onnx", "fp32"), ("onnx", "int8")}, True)]
    precision_choice.choose(functools.partial(Predictor, backend="onnx"), export_dir,
                            workload="requests")
    assert timed[1] == (set(), False)


def test_a_server_times_its_kind_of_batches_and_a_file_run_its_own(export_dir, host, tmp_path,
                                                                    capsys):
    """The engines can rank differently on a server's batches of one to four texts and on
    fuller ones: a server times the served-like batches, ``ppvarlen-infer`` the admission
    batches, and each serves what won on its own (a choice kept for one is not the other's)."""
    fp32 = Predictor(export_dir, "onnx", precision="fp32")
    served = threads_choice.served_like_batches(fp32)
    files = precision_choice.admission_batches(fp32)
    assert [len(b) for b in served[:3]] == [1, 2, 4] and served != files
    small = {"paddle fp32": 100.0, "paddle bf16": 150.0, "onnx fp32": 120.0, "onnx int8": 300.0}
    full = {"paddle fp32": 100.0, "paddle bf16": 400.0, "onnx fp32": 120.0, "onnx int8": 300.0}
    host.speeds = lambda batches: small if batches == served else full
    src = tmp_path / "in.txt"
    src.write_text("a b\nb a a\n", encoding="utf-8")
    assert cli.main_infer(["--model-dir", export_dir, "--input", str(src), "--output",
                           str(tmp_path / "out.jsonl"), "--no-progress"]) == 0
    assert host.batches == [files]
    err = capsys.readouterr().err  # the command's log and summary
    summary = json.loads(err.strip().splitlines()[-1])
    assert (summary["backend"], summary["precision"]) == ("paddle", "bf16")
    assert "timed on the admission batches" in err
    with TestClient(app_from_config(export_dir, deploy_settings(max_wait_ms=1))) as client:
        health = client.get("/health").json()
    assert host.batches == [files, served]  # the file run's kept choice is not the server's
    assert (health["backend"], health["precision"]) == ("onnx", "int8")
    assert "(timed on served-like batches of the export's length profile, 24 texts in groups " \
           "of 1, 2 and 4; " in capsys.readouterr().err
def test_measure_interleaves_rounds_and_stops_at_the_budget():
    now = [0.0]
    ran = []

    class Timed:  # a predictor whose every batch takes `cost` seconds of a fake clock
        def __init__(self, name, cost):
            self.name, self.cost = name, cost

        def run_engine(self, rows):
            ran.append(self.name)
            now[0] += self.cost

        def _reset_counters(self):
            pass

    batches = [[[7, 8]], [[7], [8, 9]]]  # 3 texts
    speeds, rounds, took = precision_choice.measure(
        {"fp32": Timed("fp32", 0.5), "int8": Timed("int8", 0.25)}, batches, budget_s=3.5,
        clock=lambda: now[0], wall=lambda: now[0])
    # an untimed warm-up pass, then rounds of 1.5 s: the second timed round ends past the 3.5 s
    # budget and is the last
    assert rounds == 2 and took == pytest.approx(4.5)
    assert ran == ["fp32"] * 2 + ["int8"] * 2 + ["fp32"] * 2 + ["int8"] * 2 \
        + ["int8"] * 2 + ["fp32"] * 2  # the order turns each round
    assert speeds == {"fp32": pytest.approx(3.0), "int8": pytest.approx(6.0)}
    now[0] = 0.0
    _, rounds, _ = precision_choice.measure({"fp32": Timed("fp32", 0.0)}, batches,
                                            clock=lambda: now[0], wall=lambda: now[0])
    assert rounds == precision_choice.MAX_ROUNDS


@pytest.mark.parametrize("repository", [False, True])
def test_the_choice_is_shown_on_health_config_and_metrics(export_dir, host, tmp_path,
                                                           repository):
    host.speeds = {"fp32": 100.0, "bf16": 150.0}
    deploy = deploy_settings(max_wait_ms=1)
    if repository:
        root = tmp_path / "repo"
        shutil.copytree(export_dir, root / NAME / "1")
        app = app_from_config(None, deploy, "paddle", repository=str(root))
    else:
        app = app_from_config(export_dir, deploy, "paddle")
    with TestClient(app) as client:
        health = client.get("/health").json()
        assert health["precision"] == "bf16" and "150.0 vs fp32 100.0 texts/CPU-s" in \
            health["precision_reason"]
        params = client.get(f"/v2/models/{NAME}/config").json()["parameters"]
        assert params["precision"] == {"string_value": "bf16"}
        assert params["precision_requested"] == {"string_value": "auto"}
        metrics = client.get("/metrics").text
        assert (f'ppvarlen_model_precision{{backend="paddle",model="{NAME}",precision="bf16",'
                f'requested="auto",'
                f'version="1"}} 1.0') in metrics


def test_a_server_with_backend_auto_shows_the_backend_it_chose(export_dir, host):
    host.speeds = {"paddle fp32": 100.0, "paddle bf16": 150.0, "onnx fp32": 120.0,
                   "onnx int8": 300.0}
    app = app_from_config(export_dir, deploy_settings(max_wait_ms=1, backend="auto"))
    with TestClient(app) as client:
        health = client.get("/health").json()
        assert (health["backend"], health["precision"]) == ("onnx", "int8")
        assert "onnx int8 300.0 vs paddle bf16 150.0 texts/CPU-s" in health["precision_reason"]
        assert client.get(f"/v2/models/{NAME}/config").json()["platform"] == "ppvarlen_onnx"
        assert client.post("/predict", json={"texts": ["a b"]}).status_code == 200
        assert (f'ppvarlen_model_precision{{backend="onnx",model="{NAME}",precision="int8",'
                f'requested="auto",version="1"}} 1.0') in client.get("/metrics").text


def test_bf16_verified_by_fp32_kernels_on_the_export_host_is_not_a_candidate(
        monkeypatch, caplog):
    monkeypatch.setattr(precision_choice, "cpu_supports_bf16", lambda: True)
    manifest = {"precision_measured": {"paddle": {
        "fp32": {"verified": True}, "bf16": {"verified": True, "cpu_bf16": False}}}}
    caplog.set_level(logging.INFO, logger="ppvarlen.runtime.precision")
    assert precision_choice.host_candidates(manifest, "paddle") == []
    assert any("export host had no bf16" in r.getMessage() for r in caplog.records)
    manifest["precision_measured"]["paddle"]["bf16"]["cpu_bf16"] = True
    assert precision_choice.host_candidates(manifest, "paddle") == ["bf16"]


RECORDED = []  # the precisions recording_load loaded in this process (the child has its own)


def recording_load(export_dir, precision, backend):
    """A loader ``auto`` can describe to its child: ``functools.partial(recording_load, ...)``."""
    RECORDED.append(precision)
    return Predictor(export_dir, backend, precision=precision)


def sleeping_load(export_dir, precision, backend, home):
    """Loads in process ``home``; in any other (the child) it never returns."""
    while os.getpid() != home:
        time.sleep(1)
    return recording_load(export_dir, precision, backend)


def test_auto_times_the_candidates_in_a_child_and_loads_only_the_chosen_here(export_dir):
    """Paddle keeps every predictor's oneDNN shapes in one per-process map: the candidates
    load and time in a child process, this one loads (and admits) only what it serves."""
    RECORDED.clear()
    load = functools.partial(recording_load, backend="onnx")
    predictor = precision_choice.load_admitted(load, export_dir, "auto")
    assert RECORDED == [predictor.precision]
    choice = predictor.precision_choice
    assert choice["requested"] == "auto" and choice["precision"] == predictor.precision
    assert set(choice["texts_per_cpu_s"]) == {"fp32", "int8"}  # both timed, in the child
    assert set(predictor.admission) == set(admission.CHECKS)


def test_auto_chooses_in_this_process_when_the_child_cannot_start(export_dir, caplog):
    caplog.set_level(logging.INFO, logger="ppvarlen.runtime.precision")
    predictor = precision_choice.load_admitted(_loader("onnx"), export_dir, "auto")  # a closure
    assert predictor.precision_choice["requested"] == "auto"
    assert any(r.levelno == logging.WARNING and "could not start" in r.getMessage()
               and "choosing in this process" in r.getMessage() for r in caplog.records)


@pytest.mark.timeout(240)
def test_a_child_that_does_not_choose_in_time_is_killed_and_the_choice_made_here(
        export_dir, monkeypatch, caplog):
    monkeypatch.setattr(precision_choice, "CHILD_TIMEOUT_S", 5)
    caplog.set_level(logging.INFO, logger="ppvarlen.runtime.precision")
    load = functools.partial(sleeping_load, backend="onnx", home=os.getpid())
    predictor = precision_choice.load_admitted(load, export_dir, "auto")
    assert set(predictor.precision_choice["texts_per_cpu_s"]) == {"fp32", "int8"}
    assert any("had not chosen after 5s and was killed" in r.getMessage()
               for r in caplog.records)


# A user's script with no ``if __name__ == "__main__":`` guard (as a hand-written console
# wrapper of main_serve is): the auto child must not run it again.
_UNGUARDED_SCRIPT = """
import functools, json, sys
sys.path[:0] = {path!r}
with open({runs!r}, "a") as f:
    f.write("ran\\n")
from ppvarlen.runtime import precision_choice, threads_choice
from test_precision_auto import recording_load
load = functools.partial(recording_load, backend="onnx")
predictor = precision_choice.load_admitted(load, {export!r}, "auto")
print(json.dumps(predictor.precision_choice))
"""


@pytest.mark.timeout(300)
def test_auto_in_a_script_without_a_main_guard_runs_the_script_once(export_dir, tmp_path):
    """... and from a working directory that holds another ``ppvarlen`` (a checkout of another
    version, say): the child imports the parent's, not the one beside it."""
    runs = tmp_path / "runs.txt"
    (tmp_path / "scripts").mkdir()
    script = tmp_path / "scripts" / "unguarded.py"
    script.write_text(_UNGUARDED_SCRIPT.format(path=[p for p in sys.path if p], runs=str(runs),
                                               export=export_dir))
    (tmp_path / "ppvarlen").mkdir()
    (tmp_path / "ppvarlen" / "__init__.py").write_text(
        "raise ImportError('the ppvarlen of the working directory was imported')\n")
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=280, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert runs.read_text().splitlines() == ["ran"], run.stderr
    assert "choosing in this process" not in run.stderr, run.stderr
    choice = json.loads(run.stdout.strip().splitlines()[-1])
    assert set(choice["texts_per_cpu_s"]) == {"fp32", "int8"}


def test_a_server_timing_an_export_without_a_length_profile_says_what_it_timed(
        export_dir, host, tmp_path, caplog):
    copy = tmp_path / "export"
    shutil.copytree(export_dir, copy)
    path = copy / "manifest.json"  # not in its own hash list
    manifest = json.loads(path.read_text())
    manifest["length_profile"] = None
    path.write_text(json.dumps(manifest))
    host.speeds = {"fp32": 100.0, "int8": 300.0}
    caplog.set_level(logging.INFO, logger="ppvarlen.runtime.precision")
    predictor = precision_choice.load_admitted(functools.partial(Predictor, backend="onnx"),
                                               str(copy), workload="requests")
    assert predictor.precision == "int8"
    assert "(the manifest has no length_profile: lengths up to max_len, half of them max_len;" \
        in caplog.text
