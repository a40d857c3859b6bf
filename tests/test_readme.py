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
