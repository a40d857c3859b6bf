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


# command path in the docs -> the ppvarlen.cli function behind it (the shims' targets)
README_COMMANDS = {"tools/train.py": "main_train", "tools/eval.py": "main_eval",
                   "tools/export.py": "main_export", "tools/analyze_lengths.py": "main_lengths",
                   "tools/pretrain.py": "main_pretrain", "deploy/python/infer.py": "main_infer",
                   "deploy/python/serve.py": "main_serve",
                   "deploy/python/bench_client.py": "main_bench",
                   "tools/check_gpu.py": "main_check_gpu", "tools/doctor.py": "main_doctor"}


def documentation_pages():
    """README and the hand-written docs pages (docs/reference/ is generated from --help)."""
    pages = [os.path.join(REPO, "README.md")]
    for root, _, files in os.walk(os.path.join(REPO, "docs")):
        if os.path.relpath(root, REPO).startswith(os.path.join("docs", "reference")):
            continue
        pages += [os.path.join(root, f) for f in sorted(files) if f.endswith(".md")]
    return pages


def _options(parser):
    """Every option string of a parser and of its subcommands."""
    import argparse

    options = set(parser._option_string_actions)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                options |= _options(sub)
    return options


def test_documented_commands_use_flags_their_command_accepts(monkeypatch):
    """Every `python tools/X.py ...`, `deploy/python/X.py ...` and `ppvarlen-X ...` in README and
    docs/: a known command, and each of its --flags an option of that command's parser."""
    from ppvarlen import cli

    monkeypatch.setattr(cli, "_run", lambda parser, argv, command: parser)  # main_* -> its parser
    checked = 0
    for page in documentation_pages():
        text = open(page, encoding="utf-8").read().replace("\\\n", " ")
        uses = re.findall(r"python (?:-m paddle\.distributed\.launch [^\n]*?)?"
                          r"((?:tools|deploy/python)/\w+\.py)([^\n`]*)", text)
        uses += [(f"ppvarlen-{name}", rest) for name, rest in
                 re.findall(r"(?<![\w/-])ppvarlen-([a-z][a-z-]*)([^\n`]*)", text)]
        for script, rest in uses:
            if script == "tools/quickstart.py":
                continue
            where = f"{os.path.relpath(page, REPO)}: {script}"
            if script.startswith("ppvarlen-"):
                function = "main_" + script.removeprefix("ppvarlen-").replace("-", "_")
            else:
                assert script in README_COMMANDS, f"{where} is no command"
                function = README_COMMANDS[script]
            assert hasattr(cli, function), f"{where} is no command"
            options = _options(getattr(cli, function)())
            for flag in re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", rest.split("#")[0]):
                assert flag in options, f"{where} {flag} is not an option of the command"
                checked += 1
    assert checked >= 30, f"only {checked} documented flags found: the parse is broken"


def test_readme_is_a_front_page_that_links_into_the_site():
    text = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()
    assert len(text.splitlines()) <= 150, "README is the front page: 150 lines at most"
    links = re.findall(r"\]\(((?:docs/)[^)#]+)(?:#[^)]*)?\)", text)
    missing = [link for link in links if not os.path.exists(os.path.join(REPO, link))]
    assert not missing, f"README links to missing files: {missing}"
    # a newcomer's two questions (issue 26), each one click from the README
    assert "docs/tutorials/tagging.md" in links and "docs/reference/config.md" in links
    assert re.search(r"ppvarlen-config +show Model --model rnn_cls", text)
