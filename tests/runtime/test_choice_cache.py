"""What ``auto`` timed is kept for the next load on this host (``runtime/choice_cache.py``):
a second load of the same export with the same settings loads the kept choice and admits it
without timing; another export, setting or a damaged entry times again; a kept choice that
fails here now is forgotten.  A Paddle oneDNN grid's shape times are kept too: the next
start seeds its grid with them and runs one warm-up pass without re-timing a shape.  Timings are
injected (``precision_choice.measure``, ``threads_choice.choose``), so every assertion holds
on any machine."""
import functools
import json
import logging
import os
import shutil
import subprocess
import sys

import pytest

from ppvarlen import cli
from ppvarlen.export.exporter import export_model
from ppvarlen.runtime import choice_cache, precision_choice, threads_choice
from ppvarlen.runtime.predictor import Predictor
from ppvarlen.utils.io import HOST_TAG, owned_prefix
from test_precision_auto import _refuse_admission_of
from test_precision_memory import mlp_export  # noqa: F401
from test_export import CFG, _encoder, _meta
from test_precision_choice import ITEMS
from test_quantize import spread_transformer

ONNX = functools.partial(Predictor, backend="onnx")


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory):
    """ONNX fp32 and int8, both verified: ``auto`` has two candidates to time."""
    out = tmp_path_factory.mktemp("kept") / "export"
    export_model(spread_transformer(ITEMS), _meta("classification", "kept", ["a", "b"]),
                 _encoder(), CFG, str(out), ["onnx"], ["fp32", "int8"], verify=True,
                 test_examples=ITEMS)
    return str(out)


@pytest.fixture
def host(monkeypatch, tmp_path):
    """Injected timings (``speeds``, counted in ``calls``), in this process, and a cache
    directory of the test's own."""
    class Host:
        speeds = {}
        calls = []

    def measure(predictors, batches, **timing):
        Host.calls.append(sorted(p for _, p in predictors))
        return {k: Host.speeds[k[1]] for k in predictors}, 2, 0.1

    monkeypatch.setattr(precision_choice, "measure", measure)
    monkeypatch.setattr(precision_choice, "CHOOSE_IN_CHILD", False)
    monkeypatch.setenv(choice_cache.DIR_VARIABLE, str(tmp_path / "choices"))
    return Host


def _auto(export_dir, cache=True, load=ONNX):
    return precision_choice.load_admitted(load, export_dir, "auto", cache=cache)


def _rewrite(entry, kept):
    """Write ``kept`` as an entry whose sha256 matches (an intact file that says ``kept``)."""
    entry.write_text(json.dumps(choice_cache.seal(kept)))


def _one_thread_verdict(monkeypatch, timing):
    """Two usable cores, and ``threads_choice.choose`` injected to answer one thread with
    ``timing``; returns the list of its calls' core counts."""
    monkeypatch.setattr(threads_choice, "math_cores", lambda: 2)
    calls = []

    def choose(many, load_one, n, min_gain, batches=None):
        calls.append(n)
        return {"threads": 1, "threads_reason": "one thread served more (injected)",
                "threads_timing": timing}

    monkeypatch.setattr(threads_choice, "choose", choose)
    return calls


def _entries(tmp_path):
    """The kept entries (not a writer's temporary files, which start with a dot)."""
    folder = tmp_path / "choices"
    return sorted(p for p in folder.iterdir() if not p.name.startswith(".")) \
        if folder.exists() else []


def test_a_second_load_serves_the_kept_choice_without_timing(export_dir, host, tmp_path,
                                                             caplog):
    host.speeds = {"fp32": 100.0, "int8": 300.0}
    first = _auto(export_dir)
    assert first.precision == "int8" and host.calls == [["fp32", "int8"]]
    [entry] = _entries(tmp_path)
    kept = json.loads(entry.read_text())
    assert kept["choice"]["precision"] == "int8" and kept["parts"]["requested"] == "auto"
    host.speeds = {"fp32": 300.0, "int8": 100.0}  # would choose fp32 if timed again
    caplog.set_level(logging.INFO, logger="ppvarlen.runtime.precision")
    second = _auto(export_dir)
    assert second.precision == "int8" and host.calls == [["fp32", "int8"]]  # not timed
    assert second.precision_choice["cached"] == str(entry)
    assert second.precision_choice["reason"] == (  # what /health shows
        f"{kept['choice']['reason']} (timed at {kept['chosen_at']}, kept)")
    assert second.precision_choice["texts_per_cpu_s"] == {"fp32": 100.0, "int8": 300.0}
    assert set(second.admission) == {"graph", "smoke", "padding", "render"}  # still admitted
    line = next(r.getMessage() for r in caplog.records if "as timed on this host" in
                r.getMessage())
    assert str(entry) in line and "delete it to time again" in line
    # the same content elsewhere is the same export
    copy = shutil.copytree(export_dir, tmp_path / "copy")
    assert _auto(str(copy)).precision == "int8" and len(host.calls) == 1


def test_without_the_cache_every_load_times(export_dir, host, tmp_path):
    host.speeds = {"fp32": 100.0, "int8": 300.0}
    assert _auto(export_dir, cache=False).precision == "int8"
    host.speeds = {"fp32": 300.0, "int8": 100.0}
    assert _auto(export_dir, cache=False).precision == "fp32"
    assert len(host.calls) == 2 and _entries(tmp_path) == []


def test_another_setting_or_export_times_again(export_dir, host, tmp_path):
    host.speeds = {"fp32": 100.0, "int8": 300.0}
    _auto(export_dir)
    host.speeds = {"fp32": 300.0, "int8": 100.0}
    smaller = functools.partial(ONNX, max_batch_size=8)
    assert _auto(export_dir, load=smaller).precision == "fp32" and len(host.calls) == 2
    other = shutil.copytree(export_dir, tmp_path / "other")
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["label_names"] = ["b", "a"]  # another export: its manifest differs
    (other / "manifest.json").write_text(json.dumps(manifest))
    assert _auto(str(other)).precision == "fp32" and len(host.calls) == 3
    assert len(_entries(tmp_path)) == 3


@pytest.mark.parametrize("damage", [b"{not json", b"[]", b'{"parts": {}, "choice": {}}',
                                    b"[" * 100_000, b" " * (2 << 20) + b"{}", b"\xff\xfe{}"])
def test_a_damaged_entry_is_timed_again_and_replaced(export_dir, host, tmp_path, caplog,
                                                     damage):
    host.speeds = {"fp32": 100.0, "int8": 300.0}
    _auto(export_dir)
    [entry] = _entries(tmp_path)
    entry.write_bytes(damage)
    caplog.set_level(logging.INFO, logger="ppvarlen.runtime.precision")
    assert _auto(export_dir).precision == "int8" and len(host.calls) == 2
    assert any(r.levelno == logging.WARNING and str(entry) in r.getMessage()
               and "timing again" in r.getMessage() for r in caplog.records)
    assert json.loads(entry.read_text())["choice"]["precision"] == "int8"


def test_a_kept_choice_failing_admission_now_is_forgotten(export_dir, host, tmp_path,
                                                          monkeypatch, caplog):
    host.speeds = {"fp32": 100.0, "int8": 300.0}
    _auto(export_dir)
    _refuse_admission_of(monkeypatch, "int8")
    caplog.set_level(logging.INFO, logger="ppvarlen.runtime.precision")
    predictor = _auto(export_dir)
    assert predictor.precision == "fp32" and "cached" not in predictor.precision_choice
    assert any(r.levelno == logging.WARNING and "fails here now" in r.getMessage()
               and "padding check" in r.getMessage() for r in caplog.records)
    [entry] = _entries(tmp_path)
    assert json.loads(entry.read_text())["choice"]["precision"] == "fp32"


def test_a_cache_that_cannot_be_written_costs_timing_not_the_load(export_dir, host, tmp_path,
                                                                 monkeypatch, caplog):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    monkeypatch.setenv(choice_cache.DIR_VARIABLE, str(blocker / "choices"))
    host.speeds = {"fp32": 100.0, "int8": 300.0}
    caplog.set_level(logging.INFO, logger="ppvarlen.runtime.precision")
    assert _auto(export_dir).precision == "int8" and _auto(export_dir).precision == "int8"
    assert len(host.calls) == 2
    assert any(r.levelno == logging.WARNING and "could not write" in r.getMessage()
               for r in caplog.records)


def test_threads_timed_for_an_explicit_precision_are_kept_too(export_dir, tmp_path,
                                                              monkeypatch):
    monkeypatch.setenv(choice_cache.DIR_VARIABLE, str(tmp_path / "choices"))
    calls = _one_thread_verdict(monkeypatch, {})  # one thread by CPU time alone
    load = functools.partial(ONNX, threads="auto")
    first = precision_choice.load_admitted(load, export_dir, "int8", cache=True)
    second = precision_choice.load_admitted(load, export_dir, "int8", cache=True)
    assert calls == [2] and first.threads == second.threads == 1
    assert second.precision_choice["threads_reason"].startswith(
        "one thread served more (injected) (timed at ")
    assert "cached" in second.precision_choice


def test_infer_keeps_its_auto_choice_unless_told_not_to(export_dir, host, tmp_path, caplog):
    src = tmp_path / "in.txt"
    src.write_text("a b\nb a a\n", encoding="utf-8")
    host.speeds = {"fp32": 100.0, "int8": 300.0}
    argv = ["--model-dir", export_dir, "--backend", "onnx", "--precision", "auto", "--input",
            str(src), "--output", str(tmp_path / "out.jsonl"), "--no-progress"]
    assert cli.main_infer(argv) == 0 and cli.main_infer(argv) == 0
    assert len(host.calls) == 1 and len(_entries(tmp_path)) == 1
    assert cli.main_infer(argv + ["--no-choice-cache"]) == 0 and len(host.calls) == 2
    assert os.path.exists(tmp_path / "out.jsonl")


@pytest.mark.parametrize("choice", [{"precision": "int4"},
                                    {"precision": "bf16", "backend": "onnx"},
                                    {"threads": 10 ** 6}, {"threads": "2"}, {"reason": "x"}])
def test_a_kept_choice_naming_what_cannot_load_is_timed_again(export_dir, host, tmp_path,
                                                              choice):
    host.speeds = {"fp32": 100.0, "int8": 300.0}
    _auto(export_dir)
    [entry] = _entries(tmp_path)
    kept = json.loads(entry.read_text())
    kept["choice"] = dict(kept["choice"], **choice)
    if choice == {"reason": "x"}:
        kept["choice"] = choice
    _rewrite(entry, kept)
    assert _auto(export_dir).precision == "int8" and len(host.calls) == 2


def test_the_oldest_entries_go_past_the_bound(export_dir, host, tmp_path, monkeypatch):
    monkeypatch.setattr(choice_cache, "MAX_ENTRIES", 2)
    host.speeds = {"fp32": 100.0, "int8": 300.0}
    for size in (8, 16, 32):
        _auto(export_dir, load=functools.partial(ONNX, max_batch_size=size))
        for entry in _entries(tmp_path):  # the earlier ones older
            os.utime(entry, (entry.stat().st_mtime - 10,) * 2)
    kept = [json.loads(p.read_text())["parts"]["loader"]["kwargs"]["max_batch_size"]
            for p in _entries(tmp_path)]
    assert sorted(kept) == [16, 32]


# ---------------------------------------------------------------- a oneDNN grid's shape times

def _counted(predictor):
    """``predictor`` with its engine runs counted in ``predictor.runs``."""
    predictor.runs = 0
    run = predictor.run_engine

    def counting(rows):
        predictor.runs += 1
        return run(rows)
    predictor.run_engine = counting
    return predictor


def test_a_grid_starts_from_its_kept_shape_times_with_one_pass(mlp_export, tmp_path,
                                                               monkeypatch):
    monkeypatch.setenv(choice_cache.DIR_VARIABLE, str(tmp_path / "choices"))
    first = _counted(Predictor(mlp_export, "paddle", precision="fp32", threads=1))
    grid = first.engine.shape_grid
    assert grid is not None and choice_cache.kept_grid_times(first) is None
    first.warmup()
    # one timing pass, then the largest shape and any timed slower than a larger one again
    assert first.runs > len(grid.shapes())
    choice_cache.keep_grid_times(first)
    timed = dict(grid.costs)
    second = _counted(Predictor(mlp_export, "paddle", precision="fp32", threads=1))
    kept = choice_cache.kept_grid_times(second)
    assert kept == timed
    second.warmup(kept_times=kept)
    assert second.runs == len(grid.shapes())
    costs = second.engine.shape_grid.costs
    assert set(costs) == set(timed) and all(costs[k] <= timed[k] for k in timed)
    # another engine setting is another grid's times
    other = Predictor(mlp_export, "paddle", precision="fp32", threads=2)
    assert choice_cache.kept_grid_times(other) is None
    copies = Predictor(mlp_export, "paddle", precision="fp32", threads=1)
    copies.engine.settings = {**copies.engine.settings, "onednn_shared_weights": False}
    assert choice_cache.kept_grid_times(copies) is None
    # and other source of the engine or its warm-up (here: fewer modules hashed)
    monkeypatch.setattr(choice_cache, "GRID_MODULES", choice_cache.GRID_MODULES[:1])
    assert choice_cache.kept_grid_times(second) is None


def test_a_grid_entry_missing_a_shape_is_not_used(mlp_export, tmp_path, monkeypatch):
    monkeypatch.setenv(choice_cache.DIR_VARIABLE, str(tmp_path / "choices"))
    first = Predictor(mlp_export, "paddle", precision="fp32", threads=1)
    first.warmup()
    choice_cache.keep_grid_times(first)
    [entry] = _entries(tmp_path)
    kept = json.loads(entry.read_text())
    kept["choice"]["seconds"].popitem()
    _rewrite(entry, kept)
    assert choice_cache.kept_grid_times(first) is None


def test_a_server_keeps_its_grid_times_for_its_next_start(mlp_export, tmp_path, monkeypatch,
                                                          caplog):
    from fastapi.testclient import TestClient

    from ppvarlen.serve.server import create_app, deploy_settings

    monkeypatch.setenv(choice_cache.DIR_VARIABLE, str(tmp_path / "choices"))
    caplog.set_level(logging.INFO, logger="ppvarlen")
    for start in range(2):
        predictor = Predictor(mlp_export, "paddle", precision="fp32", threads=1)
        app = create_app(predictor, deploy_settings(max_wait_ms=1))
        with TestClient(app) as client:
            assert client.post("/predict", json={"texts": ["好"]}).status_code == 200
            # a run faster than warm-up's, as traffic on a quieter host observes
            rows, width = predictor.engine.shape_grid.shapes()[0]
            predictor.engine.shape_grid.observe(rows, width, 1e-6 * (start + 1))
        seeded = [r for r in caplog.records if "seeds this start" in r.getMessage()]
        assert len(seeded) == start
        # kept at shut-down, with what traffic lowered
        entry = choice_cache.lookup(choice_cache.grid_parts(predictor), lambda choice: True)
        assert entry["choice"]["seconds"][f"{rows}x{width}"] == 1e-6
    caplog.clear()
    app = create_app(Predictor(mlp_export, "paddle", precision="fp32", threads=1),
                     deploy_settings(max_wait_ms=1, choice_cache=False))
    with TestClient(app):
        assert not any("seeds this start" in r.getMessage() for r in caplog.records)


def test_a_kept_choice_missing_the_threads_its_loader_leaves_open_is_timed_again(
        export_dir, host, tmp_path, monkeypatch):
    monkeypatch.setattr(threads_choice, "math_cores", lambda: 2)
    monkeypatch.setattr(threads_choice, "choose", lambda *args, **kw: {
        "threads": 2, "threads_reason": "injected", "threads_timing": {}})
    load = functools.partial(ONNX, threads="auto", backend="auto")
    host.speeds = {"fp32": 100.0, "int8": 300.0}
    first = _auto(export_dir, load=load)
    [entry] = _entries(tmp_path)
    kept = json.loads(entry.read_text())
    assert {"backend", "threads"} <= set(kept["choice"])
    del kept["choice"]["threads"]
    _rewrite(entry, kept)
    second = _auto(export_dir, load=load)
    assert (second.backend, second.precision) == (first.backend, first.precision)
    assert "threads" in json.loads(entry.read_text())["choice"] and len(host.calls) == 2


def test_one_thread_by_wall_time_is_timed_again_at_each_start(export_dir, tmp_path,
                                                              monkeypatch, caplog):
    """Neighbours' work slows the cores' wall time: such a verdict is not kept."""
    monkeypatch.setenv(choice_cache.DIR_VARIABLE, str(tmp_path / "choices"))
    calls = _one_thread_verdict(monkeypatch, {"cpu_ms_per_text": {"1": 5.0, "2": 6.0},
                                              "wall_ms_per_text": {"2": 5.5}, "gain": 0.9})
    caplog.set_level(logging.INFO, logger="ppvarlen.runtime.precision")
    load = functools.partial(ONNX, threads="auto")
    for _ in range(2):
        assert precision_choice.load_admitted(load, export_dir, "int8", cache=True).threads == 1
    assert calls == [2, 2] and _entries(tmp_path) == []
    assert any("not kept for the next start" in r.getMessage() for r in caplog.records)


def test_an_entry_edited_past_its_sha256_is_timed_again(export_dir, host, tmp_path, caplog):
    host.speeds = {"fp32": 100.0, "int8": 300.0}
    _auto(export_dir)
    [entry] = _entries(tmp_path)
    kept = json.loads(entry.read_text())
    kept["choice"]["precision"] = "fp32"  # a valid choice, but not the one that was written
    entry.write_text(json.dumps(kept))
    caplog.set_level(logging.INFO, logger="ppvarlen.runtime.precision")
    assert _auto(export_dir).precision == "int8" and len(host.calls) == 2
    assert any("does not match its sha256" in r.getMessage() for r in caplog.records)
    assert choice_cache.lookup(kept["parts"]) is not None  # replaced by a sealed entry


def test_a_dead_writers_temporary_file_is_removed_by_the_next_write(export_dir, host,
                                                                    tmp_path):
    folder = tmp_path / "choices"
    folder.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    debris = folder / f".tmp-x.json.pid{int(dead.stdout)}.{HOST_TAG}.abc123"
    debris.write_text("{")
    mine = folder / (owned_prefix(".tmp-y.json") + "def456")  # a live writer's: kept
    mine.write_text("{")
    host.speeds = {"fp32": 100.0, "int8": 300.0}
    _auto(export_dir)
    assert not debris.exists() and mine.exists()
    assert len(_entries(tmp_path)) == 1
