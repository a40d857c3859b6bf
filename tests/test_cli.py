"""ppvarlen/cli.py: the console scripts, their shims and the one error policy."""
import ast
import glob
import importlib
import os
import resource
import signal
import subprocess
import sys
import time

import pytest

from ppvarlen import cli
from ppvarlen.config import ConfigError
from ppvarlen.data.errors import DataError
from ppvarlen.runtime.manifest import UnservableExportError
from ppvarlen.export.errors import ExportFailedError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMANDS = {"train", "eval", "export", "lengths", "pretrain", "infer", "serve", "bench",
            "check-gpu", "config", "doctor"}
# shim -> the console script it is the same command as
SHIMS = {"tools/train.py": "train", "tools/eval.py": "eval", "tools/export.py": "export",
         "tools/analyze_lengths.py": "lengths", "tools/pretrain.py": "pretrain",
         "deploy/python/infer.py": "infer", "deploy/python/serve.py": "serve",
         "deploy/python/bench_client.py": "bench", "tools/check_gpu.py": "check_gpu",
         "tools/doctor.py": "doctor"}
# tools/quickstart.py is not a command of its own: it runs the shims above by path, as a user would;
# tools/gen_docs.py is the maintainers' generator of docs/reference/ (over ppvarlen/docs_gen.py)
NOT_SHIMS = {"tools/quickstart.py", "tools/gen_docs.py"}


def console_scripts():
    """name -> "module:function", read from setup.py without running it."""
    tree = ast.parse(open(os.path.join(REPO, "setup.py"), encoding="utf-8").read())
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "CONSOLE_SCRIPTS":
            return dict(item.split("=", 1) for item in ast.literal_eval(node.value))
    raise AssertionError("setup.py has no CONSOLE_SCRIPTS list")


def test_every_console_script_is_declared_and_resolves_to_a_callable():
    scripts = console_scripts()
    assert set(scripts) == {f"ppvarlen-{c}" for c in COMMANDS}
    setup_text = open(os.path.join(REPO, "setup.py"), encoding="utf-8").read()
    assert 'entry_points={"console_scripts": CONSOLE_SCRIPTS}' in setup_text
    for name, target in scripts.items():
        module, func = target.split(":")
        assert callable(getattr(importlib.import_module(module), func)), name
        assert func == f"main_{name.removeprefix('ppvarlen-').replace('-', '_')}"


def test_shipped_scripts_are_shims_over_the_cli():
    shipped = {os.path.relpath(p, REPO) for p in glob.glob(os.path.join(REPO, "tools", "*.py"))
               + glob.glob(os.path.join(REPO, "deploy", "python", "*.py"))}
    assert shipped == set(SHIMS) | NOT_SHIMS
    for path, command in SHIMS.items():
        text = open(os.path.join(REPO, path), encoding="utf-8").read()
        assert f"from ppvarlen.cli import main_{command} as main" in text, path
        code = [line for line in text.split('"""', 2)[2].splitlines() if line.strip()]
        assert len(code) <= 10, f"{path} is a shim: the logic belongs in ppvarlen/cli.py"


def test_help_of_every_command_is_fast_and_paddle_free():
    code = ("import sys, time\nfrom ppvarlen import cli\nfor c in sys.argv[1:]:\n"
            "    t = time.perf_counter()\n    try:\n        getattr(cli, 'main_' + c.replace('-', '_'))(['--help'])\n"
            "    except SystemExit as e:\n        assert e.code == 0, (c, e.code)\n"
            "    print('TIME', c, time.perf_counter() - t, file=sys.stderr)\n"
            "print('PADDLE', 'paddle' in sys.modules, file=sys.stderr)\n")
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = subprocess.run([sys.executable, "-c", code, *sorted(COMMANDS)], capture_output=True,
                       text=True, timeout=300)
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    # CPU seconds, not wall time: other processes on the host do not count
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    assert r.returncode == 0, r.stderr
    assert "PADDLE False" in r.stderr
    assert r.stdout.count("usage: ") == len(COMMANDS)
    for c in COMMANDS:  # each help shows its console script's usage line
        assert f"ppvarlen-{c} " in r.stdout, c
    assert cpu < 20, f"--help of all commands took {cpu:.1f} CPU seconds"


@pytest.mark.parametrize("path", sorted(SHIMS))
def test_shim_help_runs(path):
    r = subprocess.run([sys.executable, os.path.join(REPO, path), "-h"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"usage: {os.path.basename(path)}")


def test_shim_without_the_package_says_how_to_install_it(tmp_path):
    """-S: no site-packages, so neither the editable install nor PYTHONPATH's ppvarlen."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    for path in SHIMS:
        r = subprocess.run([sys.executable, "-S", os.path.join(REPO, path), "-h"], cwd=tmp_path,
                           env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 1, (path, r.stderr)
        assert r.stderr.strip().count("\n") == 0 and "Traceback" not in r.stderr, r.stderr
        assert "install this checkout's ppvarlen first (README" in r.stderr and "No module named 'ppvarlen'" in r.stderr


def _bad_config(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("Model:\n  name: rnn_cls\n  num_heads: 4\n", encoding="utf-8")
    return str(bad)


@pytest.mark.parametrize("command, extra", [
    ("train", []), ("pretrain", []), ("lengths", []),
    ("eval", ["--checkpoint", "x"]), ("export", ["--checkpoint", "x", "--output", "y"]),
])
def test_config_error_is_one_paragraph_and_exit_2(command, extra, tmp_path, capsys):
    rc = getattr(cli, f"main_{command}")(["-c", _bad_config(tmp_path), *extra])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("\n") == 1 and "Traceback" not in err  # one paragraph
    assert "Model.name=rnn_cls does not use Model.num_heads" in err and "accepts" in err


def test_config_error_through_a_shim_has_no_traceback(tmp_path):
    r = subprocess.run([sys.executable, os.path.join(REPO, "tools", "train.py"), "-c",
                        _bad_config(tmp_path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.startswith("train.py: error: ") and "num_heads" in r.stderr


@pytest.mark.parametrize("error, code, prefix", [
    (ConfigError("bad key"), 2, "error"), (DataError("f.jsonl:3: bad line"), 2, "error"),
    (UnservableExportError("manifest.json is missing"), 2, "error"),
    (ExportFailedError("parity check failed"), 1, "export failed"),
])
def test_typed_errors_follow_the_policy(error, code, prefix, tmp_path, capsys, monkeypatch):
    import ppvarlen.length_report as report

    def fail(*args):
        raise error

    monkeypatch.setattr(report, "analyze_lengths", fail)
    cfg = tmp_path / "c.yaml"
    cfg.write_text("Data: {corpus: sentiment}\n", encoding="utf-8")
    assert cli.main_lengths(["-c", str(cfg)]) == code
    assert capsys.readouterr().err == f"{os.path.basename(sys.argv[0])}: {prefix}: {error}\n"


@pytest.mark.parametrize("error", [ValueError("a bug"), KeyError("a bug"), RuntimeError("a bug")])
def test_other_exceptions_propagate(error, tmp_path, monkeypatch):
    import ppvarlen.length_report as report

    def fail(*args):
        raise error

    monkeypatch.setattr(report, "analyze_lengths", fail)
    cfg = tmp_path / "c.yaml"
    cfg.write_text("Data: {corpus: sentiment}\n", encoding="utf-8")
    with pytest.raises(type(error)):
        cli.main_lengths(["-c", str(cfg)])


def test_a_bug_keeps_its_traceback_in_a_real_process(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("Data: {corpus: sentiment}\n", encoding="utf-8")
    code = ("import sys\nimport ppvarlen.length_report as r\nfrom ppvarlen import cli\n"
            "def boom(*a):\n    raise ValueError('deliberate bug')\n"
            "r.analyze_lengths = boom\nsys.exit(cli.main_lengths(['-c', sys.argv[1]]))\n")
    r = subprocess.run([sys.executable, "-c", code, str(cfg)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1
    assert "Traceback" in r.stderr and "ValueError: deliberate bug" in r.stderr


def test_ctrl_c_is_one_line_and_the_process_ends_by_sigint(tmp_path):
    """Ctrl-C in the middle of a command (here its work stands still in a sleep, as a native
    call would) prints one line, not a traceback from wherever the command was, and the
    process ends by SIGINT, as Python's own exit on it does (a shell's loop stops too)."""
    started = tmp_path / "started"
    code = ("import signal, sys, time\n"
            "signal.signal(signal.SIGINT, signal.default_int_handler)  # were it ignored\n"
            "import ppvarlen.length_report as r\nfrom ppvarlen import cli\n"
            "def stuck(*a):\n    open(sys.argv[2], 'w').close()\n    time.sleep(3600)\n"
            "r.analyze_lengths = stuck\nsys.exit(cli.main_lengths(['-c', sys.argv[1]]))\n")
    cfg = tmp_path / "c.yaml"
    cfg.write_text("Data: {corpus: sentiment}\n", encoding="utf-8")
    proc = subprocess.Popen([sys.executable, "-c", code, str(cfg), str(started)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not started.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert started.exists(), proc.communicate()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGINT, err
    assert err.endswith(": stopped by Ctrl-C (SIGINT)\n") and "Traceback" not in err, err


def test_missing_checkpoint_fails_before_loading(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("Data: {corpus: sentiment}\n", encoding="utf-8")
    assert cli.main_eval(["-c", str(cfg), "--checkpoint", str(tmp_path / "nope")]) == 2
    assert "not a checkpoint directory (no meta.json)" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["serve", "bench"])
def test_serving_commands_take_only_deploy_overrides(command, tmp_path, capsys):
    main = getattr(cli, f"main_{command}")
    assert main(["--model-dir", str(tmp_path), "-o", "Train.epochs=3"]) == 2
    assert "only Deploy.KEY=VALUE overrides" in capsys.readouterr().err
    assert main(["--model-dir", str(tmp_path), "-o", "Deploy.max_wait_mss=1"]) == 2
    assert "did you mean 'max_wait_ms'" in capsys.readouterr().err


@pytest.mark.parametrize("argv,message", [(["--batch-size", "0"], "must be positive"),
                                          (["--pool-sizes", "10", "-1"], "must be 0 or more")])
def test_out_of_range_sizes_are_usage_errors(argv, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main_lengths(["-c", str(tmp_path / "c.yaml"), *argv])
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_config_show_prints_the_keys_a_model_reads_with_type_default_and_meaning(capsys):
    import re

    from ppvarlen.config_schema import MODEL_KEYS, SCHEMA

    assert cli.main_config(["show", "Model", "--model", "rnn_cls"]) == 0
    out = capsys.readouterr().out
    shown = re.findall(r"^Model\.(\w+)  \((.+?), default (.+?)[;)]", out, flags=re.M)
    assert [k for k, _, _ in shown] == [k for k in SCHEMA["Model"]
                                       if k == "name" or k in MODEL_KEYS["rnn_cls"]]
    assert ("cell", "str", "lstm") in shown and ("pooling", "str", "null") in shown
    assert "null = the model's default" in out  # pooling's meaning, wrapped under the key
    assert "num_heads" not in out  # a Transformer key rnn_cls does not read


def test_config_show_a_section_and_bad_names(capsys):
    assert cli.main_config(["show", "Data"]) == 0
    out = capsys.readouterr().out
    assert "Data.pool_size  (int, default 200)" in out and "Train." not in out
    assert cli.main_config(["show", "Modle"]) == 2
    assert "not one of ['Global', 'Data', 'Model'" in capsys.readouterr().err
    assert cli.main_config(["show", "--model", "rnn"]) == 2
    assert "'rnn_cls'" in capsys.readouterr().err
    assert cli.main_config(["show", "Data", "--model", "rnn_cls"]) == 2
    assert "ppvarlen-config show Model --model rnn_cls" in capsys.readouterr().err


def test_export_output_is_not_buried_in_paddle_and_paddlenlp_noise(tmp_path):
    """Paddle's glog 'PIR not support input out tensor', its 'place' UserWarning and PaddleNLP's
    coloured INFO lines used to fill an export's stderr; the commands quiet them at start."""
    env = {**os.environ, "PYTHONPATH": REPO}
    env.pop("GLOG_minloglevel", None)
    model_dir = tmp_path / "ernie"
    build = ("import sys\nfrom ppvarlen.integrations.paddlenlp_trainer import make_random_model_dir\n"
             "make_random_model_dir(sys.argv[1], ['很好的酒店', '太差了'], 2, vocab_size=20, "
             "hidden_size=16, max_position=64)\n")
    subprocess.run([sys.executable, "-c", build, str(model_dir)], check=True, env=env,
                   capture_output=True, timeout=300)
    run = subprocess.run([sys.executable, "-c", "import sys\nfrom ppvarlen.cli import main_export\n"
                          "sys.exit(main_export(sys.argv[1:]))", "--pretrained-dir", str(model_dir),
                          "--output", str(tmp_path / "export"), "--format", "paddle", "--no-verify"],
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "exported paddlenlp_seq_cls" in run.stdout
    for noise in ("not support input out tensor", "'place' interface", "[    INFO]"):
        assert noise not in run.stderr, f"{noise!r} is back in an export's stderr:\n{run.stderr}"


@pytest.mark.parametrize("module, argv, says", [
    ("ray_store", ["-c", "configs/sentiment/transformer.yaml", "-o", "Data.no_such_key=1"],
     "Data.no_such_key"),
    ("ray_store", ["-c", "configs/sentiment/transformer.yaml", "--address", "auto",
                   "--num-cpus", "2"], "drop --num-cpus"),
    ("ray_serve", ["--config", "no/such/serve.yaml"], "no/such/serve.yaml"),
    ("ray_batch", ["--model-dir", "m", "--input", "i", "--output-dir", "o", "--address", "auto",
                   "--num-cpus", "1"], "drop --num-cpus"),
])
def test_ray_commands_answer_through_the_cli_error_policy(module, argv, says, capsys,
                                                          monkeypatch):
    """deploy/ray/*.py: a bad config or cluster flag is one 'PROG: error: ...' line and exit 2,
    found before any Ray cluster starts."""
    pytest.importorskip("ray")
    mod = importlib.import_module(f"ppvarlen.integrations.{module}")
    monkeypatch.setattr(sys, "argv", [f"{module}.py"])
    monkeypatch.chdir(REPO)
    import ray

    assert mod.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"{module}.py: error: ") and says in err[0], err
    assert not ray.is_initialized()
