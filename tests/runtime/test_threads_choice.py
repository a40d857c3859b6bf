"""``threads: auto`` (Deploy.threads' default, ``ppvarlen-infer --threads auto``): one thread or
the usable cores, whichever the rule in ppvarlen/runtime/threads_choice.py says serves more,
from the engine's cost per text timed at load.  Timings are injected
(``threads_choice.time_per_text``): nothing here depends on this machine's speed."""
import gc
import json
import random
import shutil
import weakref

import pytest
from fastapi.testclient import TestClient

import ppvarlen
from ppvarlen import cli
from ppvarlen.config import ConfigError, load_config
from ppvarlen.runtime import precision_choice, threads_choice
from ppvarlen.runtime import predictor as predictor_module
from ppvarlen.runtime.predictor import Predictor
from ppvarlen.serve.dataplane import deploy_settings
from ppvarlen.serve.server import app_from_config, create_app
from ppvarlen.utils import parallel
from export_helpers import cls_export  # noqa: F401
from test_precision_choice import TEXTS, spread_export

MS = 1e-3
HEAVY = {1: (50 * MS, 50 * MS, 50 * MS), 2: (28 * MS, 56 * MS, 27 * MS)}
# the rule on HEAVY: min(1 / 28, 2 / (56 + 0.5)) / min(1 / 50, 2 / (50 + 0.5)) ms
HEAVY_GAIN = f"{(2 / 56.5) / (1 / 50):.2f}x"


@pytest.fixture(scope="module")
def shared_export(tmp_path_factory):
    return spread_export(tmp_path_factory.mktemp("threads") / "export", ["fp32"])


@pytest.fixture
def export_dir(shared_export, tmp_path):
    copy = tmp_path / "export"
    shutil.copytree(shared_export, copy)
    return str(copy)


@pytest.fixture
def host(monkeypatch):
    """A host of ``cores`` usable cores whose engines cost ``per_text[threads]`` = (wall,
    process CPU, thread CPU) seconds per text; ``timed`` records what was timed together."""
    class Host:
        cores = 2
        per_text = {}
        timed = []

    def time_per_text(predictors, batches, **timing):
        assert batches and all(batches)
        Host.timed.append(sorted(p.threads for p in predictors.values()))
        return {k: Host.per_text[p.threads] for k, p in predictors.items()}

    monkeypatch.setattr(threads_choice, "time_per_text", time_per_text)
    monkeypatch.setattr(parallel, "usable_cores", lambda: Host.cores)
    monkeypatch.setattr(threads_choice, "usable_cores", lambda: Host.cores)
    monkeypatch.setattr(precision_choice, "CHOOSE_IN_CHILD", False)  # patches stay in-process
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    return Host


def test_a_heavy_engine_gets_the_cores(export_dir, host):
    host.per_text = HEAVY  # 1 thread 50 ms per text; 2 threads 28 ms wall, 56 ms of CPU
    predictor = Predictor(export_dir, "onnx", threads="auto")
    assert host.timed == [[2], [1, 2]]  # the cores alone, then both interleaved
    assert predictor.threads == 2
    assert predictor.engine.settings["intra_op_threads"] == 2
    assert predictor.precision_choice["threads"] == 2
    assert f"2 threads serve {HEAVY_GAIN} one" in predictor.precision_choice["threads_reason"]
    assert predictor.clone().threads == 2  # Deploy.workers clones run the same
    assert len(predictor.predict(TEXTS[:3])) == 3


def test_a_light_engine_keeps_one_thread_without_loading_a_second(export_dir, host,
                                                                  monkeypatch):
    # 0.4 ms of CPU per text at 2 threads, next to the front end's 0.5 ms: however little
    # one thread cost, 2 threads could not beat it by the margin
    host.per_text = {2: (0.25 * MS, 0.4 * MS, 0.25 * MS)}
    predictor = Predictor(export_dir, "onnx", threads="auto")
    assert host.timed == [[2]]  # no one-thread engine was loaded or timed
    assert predictor.threads == 1
    assert predictor.engine.settings["intra_op_threads"] == 1
    assert "could serve at most" in predictor.precision_choice["threads_reason"]


def test_threads_that_only_spin_lose_to_one(export_dir, host):
    # 2 threads no faster in wall time and twice the CPU (spinning): one thread serves more
    host.per_text = {1: (1.2 * MS, 2.4 * MS, 1.2 * MS), 2: (1.2 * MS, 2.4 * MS, 1.0 * MS)}
    predictor = Predictor(export_dir, "onnx", threads="auto")
    assert host.timed == [[2], [1, 2], [1, 2]]  # a verdict of one thread is timed again
    assert predictor.threads == 1
    assert "would serve only" in predictor.precision_choice["threads_reason"]


def test_a_slow_spell_of_the_other_core_does_not_decide_for_one_thread(export_dir, host,
                                                                      monkeypatch):
    """2 threads as slow as one for the first rounds (another tenant on the second core),
    then as usual: each clock keeps its fastest round over all of them."""
    slow = {1: HEAVY[1], 2: (50 * MS, 100 * MS, 50 * MS)}
    answers = iter([{2: HEAVY[2]}, slow, HEAVY])
    rounds = []

    def time_per_text(predictors, batches, **timing):
        rounds.append(timing.get("min_rounds", 1))
        got = next(answers)
        return {k: got[p.threads] for k, p in predictors.items()}

    monkeypatch.setattr(threads_choice, "time_per_text", time_per_text)
    predictor = Predictor(export_dir, "onnx", threads="auto")
    assert rounds == [1, 2, threads_choice.CONFIRM_ROUNDS]
    assert predictor.threads == 2
    assert f"2 threads serve {HEAVY_GAIN} one" in predictor.precision_choice["threads_reason"]


@pytest.mark.parametrize("per_text, served, loads", [
    (HEAVY, 2, [2, 1]),  # the cores win: the engine timed is the one served, not loaded again
    ({1: (1.2 * MS, 2.4 * MS, 1.2 * MS), 2: (1.2 * MS, 2.4 * MS, 1.0 * MS)}, 1, [2, 1, 1]),
    ({2: (0.25 * MS, 0.4 * MS, 0.25 * MS)}, 1, [2, 1]),  # decided from the cores alone
])
def test_an_explicit_precision_times_its_threads_in_the_serving_process(
        export_dir, host, monkeypatch, per_text, served, loads):
    """With only the threads left (ONNX Runtime, an explicit precision) no child process
    starts; every engine timed and not served is freed, and what serves is admitted."""
    def no_child(*args, **kwargs):
        raise AssertionError("a child process was started")

    monkeypatch.setattr(precision_choice, "choose_in_child", no_child)
    monkeypatch.setattr(precision_choice, "choose", no_child)
    built, engines = [], []

    def build_engine(*args, **kwargs):
        built.append(kwargs["threads"])
        engine = real_build(*args, **kwargs)
        engines.append(weakref.ref(engine))
        return engine

    real_build = predictor_module.build_engine
    monkeypatch.setattr(predictor_module, "build_engine", build_engine)
    host.per_text = per_text
    predictor = Predictor(export_dir, "onnx", precision="fp32", threads="auto")
    assert built == loads and predictor.threads == served
    assert predictor.engine.settings["intra_op_threads"] == served
    assert predictor.precision_choice["threads"] == served
    assert predictor.precision_choice["precision"] == "fp32"
    assert predictor.precision_choice["reason"] == "requested"
    assert "padding" in predictor.admission
    gc.collect()
    assert [ref() for ref in engines if ref() is not None] == [predictor.engine]


def test_auto_with_nothing_but_fp32_to_serve_starts_no_child(export_dir, host, monkeypatch):
    """An export that verified fp32 only: nothing to time, so ``precision: auto`` loads fp32
    here, and threads auto is timed on it as for an explicit precision."""
    def no_child(*args, **kwargs):
        raise AssertionError("candidates were loaded or a child process started")

    monkeypatch.setattr(precision_choice, "choose_in_child", no_child)
    monkeypatch.setattr(precision_choice, "choose", no_child)
    host.per_text = HEAVY
    predictor = Predictor(export_dir, "onnx", precision="auto", threads="auto")
    choice = predictor.precision_choice
    assert predictor.precision == "fp32" and predictor.threads == 2
    assert choice["requested"] == "auto" and choice["precision"] == "fp32"
    assert choice["reason"] == "no other precision the export verified runs here"
    assert HEAVY_GAIN in choice["threads_reason"] and "padding" in predictor.admission
    predictor = Predictor(export_dir, "onnx", precision="auto", threads=1)
    assert predictor.threads == 1 and predictor.precision_choice["requested"] == "auto"


def test_the_rule_prices_the_front_end():
    n, f = 2, threads_choice.FRONT_END_CPU_S
    # a perfect 2x split of a heavy engine gains about 2x; of a light one, far less
    heavy = threads_choice.rate_many(25 * MS, 50 * MS, n) / threads_choice.rate_one(50 * MS, n)
    light = threads_choice.rate_many(f / 2, f, n) / threads_choice.rate_one(f, n)
    assert heavy == pytest.approx(2 * 50 / 50.5, rel=1e-6) and light < 1.10
    assert threads_choice.ceiling_gain(f, n) == pytest.approx(1.0)


def test_one_usable_core_or_several_workers_are_not_timed(export_dir, host):
    host.cores = 1
    assert Predictor(export_dir, "onnx", threads="auto").threads == 1
    host.cores = 8
    assert threads_choice.resolve("auto", workers=3) == 2  # the cores split between workers
    assert threads_choice.resolve(3, workers=3) == 3  # a count is served as set
    assert host.timed == []


def test_a_server_shows_the_threads_it_chose_and_why(export_dir, host):
    host.per_text = HEAVY
    app = app_from_config(export_dir, deploy_settings(max_wait_ms=1), "onnx")
    with TestClient(app) as client:
        health = client.get("/health").json()
        assert health["threads"] == 2 and HEAVY_GAIN in health["threads_reason"]
        params = client.get("/v2/models/transformer_cls/config").json()["parameters"]
        assert params["math_threads"] == {"string_value": "2"}
        assert HEAVY_GAIN in params["math_threads_reason"]["string_value"]


def test_an_explicit_count_is_served_as_set_and_not_timed(export_dir, host):
    app = app_from_config(export_dir, deploy_settings(max_wait_ms=1, threads=3), "onnx")
    with TestClient(app) as client:
        health = client.get("/health").json()
        assert health["threads"] == 3 and health["threads_reason"].startswith("as set")
    assert host.timed == []


def test_a_predictor_built_by_its_caller_shows_the_count_it_was_built_with(export_dir, host):
    host.cores = 4  # Deploy.threads auto would have timed; the caller's predictor runs one
    app = create_app(Predictor(export_dir, "onnx"), deploy=deploy_settings(max_wait_ms=1))
    with TestClient(app) as client:
        health = client.get("/health").json()
    assert health["threads"] == 1
    assert health["threads_reason"] == "as the predictor was built (1 math thread(s))"
    assert host.timed == []


@pytest.mark.parametrize("value", ["0", "fast", "true", "1.5"])
def test_deploy_threads_takes_a_count_or_auto(value):
    assert load_config(overrides=["Deploy.threads=auto"]).Deploy.threads == "auto"
    assert load_config(overrides=["Deploy.threads=4"]).Deploy.threads == 4
    with pytest.raises(ConfigError, match="Deploy.threads.*a count >= 1 or auto"):
        load_config(overrides=[f"Deploy.threads={value}"])


def test_infer_runs_a_file_on_the_usable_cores_by_default_untimed(export_dir, host, tmp_path,
                                                                  capsys):
    """A file's batches are large and nothing else in the process needs a core: the
    server's timed rule is not used; the summary says what ran."""
    host.cores = 3
    src = tmp_path / "texts.txt"
    src.write_text("\n".join(TEXTS[:5]) + "\n", encoding="utf-8")
    args = ["--model-dir", export_dir, "--backend", "onnx", "--input", str(src),
            "--output", str(tmp_path / "out.jsonl"), "--no-progress"]
    assert cli.main_infer(args) == 0
    summary = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert summary["threads"] == 3 and summary["precision"] == "fp32"
    assert host.timed == []
    assert cli.main_infer(args + ["--threads", "1"]) == 0
    assert json.loads(capsys.readouterr().err.strip().splitlines()[-1])["threads"] == 1


def test_infer_threads_flag_takes_a_count_or_auto(capsys):
    with pytest.raises(SystemExit):
        cli.main_infer(["--model-dir", "x", "--input", "y", "--threads", "fast"])
    assert "a count >= 1 or auto, got 'fast'" in capsys.readouterr().err


@pytest.mark.parametrize("cpu_max, expected", [("150000 100000\n", 2), ("max 100000\n", 4),
                                               ("50000 100000\n", 1), ("garbage\n", 4)])
def test_usable_cores_follow_a_cgroup_quota(tmp_path, monkeypatch, cpu_max, expected):
    monkeypatch.setattr(parallel.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    path = tmp_path / "cpu.max"
    path.write_text(cpu_max)
    assert parallel.usable_cores(str(path)) == expected
    assert parallel.usable_cores(str(tmp_path / "absent")) == 4


def test_timing_lengths_follow_the_export_length_profile():
    profile = {"p50": 48, "p95": 191, "p99": 256, "max": 256}
    lengths = threads_choice.profile_lengths(profile, 256, 4000, random.Random(0))
    assert lengths == sorted(lengths) and 1 <= lengths[0] and lengths[-1] <= 256
    share = sum(n <= 48 for n in lengths) / len(lengths)
    assert 0.45 < share < 0.56  # half the mass up to p50 (plus the band edges)
    assert 0.9 < sum(n <= 191 for n in lengths) / len(lengths) < 0.98
    lengths = threads_choice.profile_lengths({"p50": 500, "p95": 900}, 64, 50, random.Random(1))
    assert lengths[-1] <= 64


def test_served_like_batches_are_length_sorted_groups_of_one_two_and_four():
    class Encoder:
        vocab_size = 100

    class Predictor:
        manifest = {"length_profile": {"p50": 8, "p95": 30, "p99": 40, "max": 40},
                    "special_ids": {"pad": 0, "unk": 1}}
        encoder, max_len = Encoder(), 40

    batches = threads_choice.served_like_batches(Predictor(), seed=0, texts=15)
    assert [len(b) for b in batches] == [1, 2, 4, 1, 2, 4, 1]
    widths = [max(len(r) for r in b) for b in batches]
    assert widths == sorted(widths)  # length-sorted groups
    assert all(2 <= i < 100 for b in batches for r in b for i in r)
    assert threads_choice.served_like_batches(Predictor(), seed=0, texts=15) == batches  # seeded


def test_paddle_gets_the_cores_untimed(monkeypatch):
    """Paddle's math-thread count is process state: a second predictor of another count
    would change the first's, so nothing is loaded or timed."""
    class Engine:
        backend, precision = "paddle", "bf16"

    def refuse(*args, **kwargs):
        raise AssertionError("timed or loaded")

    monkeypatch.setattr(threads_choice, "time_per_text", refuse)
    choice = threads_choice.choose(Engine(), refuse, 4, 1.10)
    assert choice["threads"] == 4 and "not timed" in choice["threads_reason"]


def test_omp_num_threads_caps_what_auto_tries(host, monkeypatch):
    host.cores = 8
    assert threads_choice.math_cores({"OMP_NUM_THREADS": "2"}) == 2
    assert threads_choice.math_cores({"OMP_NUM_THREADS": "16"}) == 8
    assert threads_choice.math_cores({"OMP_NUM_THREADS": "x"}) == 8
    # a launcher's limit (Ray's for an actor): set before ppvarlen was imported
    monkeypatch.setattr(ppvarlen, "OMP_BEFORE_PADDLE", "1")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert threads_choice.resolve("auto") == 1 and threads_choice.count("auto") == 1
    assert threads_choice.untimed_reason("auto") == (
        "auto, not timed: 1 math thread(s) per predictor (1 usable core(s), OMP_NUM_THREADS=1; "
        "1 worker(s))")


def test_paddle_with_an_explicit_precision_starts_no_child_for_its_threads(cls_export,  # noqa: F811
                                                                          monkeypatch):
    """Paddle's threads are not timed, so a Paddle engine of an explicit precision is decided
    without the child process: start-up pays nothing for threads auto."""
    monkeypatch.setattr(threads_choice, "usable_cores", lambda: 2)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)

    def no_child(*args, **kwargs):
        raise AssertionError("a child process was started")

    monkeypatch.setattr(precision_choice, "choose_in_child", no_child)
    monkeypatch.setattr(precision_choice, "choose", no_child)
    predictor = Predictor(cls_export[0], "paddle", precision="fp32", threads="auto")
    assert predictor.threads == 2 and predictor.engine.settings["math_threads"] == 2
    assert "not timed" in predictor.precision_choice["threads_reason"]
