"""The README's two Quickstart commands are the project's contract with users and CI."""
import os
import re

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def quickstart_commands():
    text = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()
    section = text.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```(?:bash|sh)?\n(.*?)```", section, flags=re.S)


def test_quickstart_has_exactly_two_self_contained_commands():
    blocks = quickstart_commands()
    assert len(blocks) == 2, f"Quickstart must show exactly two command blocks, found {len(blocks)}"
    for block in blocks:
        lines = [l for l in block.strip().splitlines() if l.strip() and not l.startswith("#")]
        assert len(lines) == 1, f"each Quickstart command is one line: {block!r}"
        assert lines[0].startswith("python3.11 -m venv"), "each command creates its own venv"


def test_ci_runs_the_readme_test_command_verbatim():
    test_cmd = quickstart_commands()[1].strip().splitlines()[-1].strip()
    ci = open(os.path.join(REPO, ".ci", "run"), encoding="utf-8").read()
    ci_lines = [l.strip() for l in ci.splitlines() if l.strip() and not l.lstrip().startswith("#")]
    assert test_cmd in ci_lines, f".ci/run must run the README test command verbatim: {test_cmd}"
    assert "pytest" in test_cmd


# README command path -> the ppvarlen.cli function behind it (the shims' targets)
README_COMMANDS = {"tools/train.py": "main_train", "tools/eval.py": "main_eval",
                   "tools/export.py": "main_export", "tools/analyze_lengths.py": "main_lengths",
                   "tools/pretrain.py": "main_pretrain", "deploy/python/infer.py": "main_infer",
                   "deploy/python/serve.py": "main_serve",
                   "deploy/python/bench_client.py": "main_bench",
                   "tools/check_gpu.py": "main_check_gpu"}


def test_readme_commands_use_flags_their_command_accepts(monkeypatch):
    """Every `python tools/X.py ...` / `deploy/python/X.py ...` in the README: a known command,
    and each of its --flags an option of that command's parser."""
    from ppvarlen import cli

    monkeypatch.setattr(cli, "_run", lambda parser, argv, command: parser)  # main_* -> its parser
    text = open(os.path.join(REPO, "README.md"), encoding="utf-8").read().replace("\\\n", " ")
    uses = re.findall(r"python (?:-m paddle\.distributed\.launch [^\n]*?)?"
                      r"((?:tools|deploy/python)/\w+\.py)([^\n`]*)", text)
    checked = 0
    for script, rest in uses:
        if script == "tools/quickstart.py":
            continue
        assert script in README_COMMANDS, f"README runs {script}, which is no command"
        options = getattr(cli, README_COMMANDS[script])()._option_string_actions
        for flag in re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", rest.split("#")[0]):
            assert flag in options, f"README: {script} {flag} is not an option of the command"
            checked += 1
    assert checked >= 10, f"only {checked} README flags found: the README parse is broken"
