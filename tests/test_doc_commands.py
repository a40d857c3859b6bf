"""The benchmark commands README.md and docs/ show parse as written: each command's arguments go
through the script's own argument parser (``--help`` lists every flag the pages use).  Running
them in full takes minutes to hours on a 2-core machine, so the suite checks that they run as
typed, not what they measure.  (The commands of tools/, deploy/ and ppvarlen-* are checked
against their parsers by tests/test_readme.py; which snippets run is tests/test_doc_snippets.py.)"""
import os
import re
import shlex
import subprocess
import sys

import pytest

from test_readme import documentation_pages

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMAND = re.compile(r"python (benchmarks/\w+\.py)((?:\\\n|[^`\n]|\n(?=\s+--))*)")


def documented_commands():
    """[(page, script, args)] of every `python benchmarks/X.py ...` in README.md and docs/."""
    found = []
    for page in documentation_pages():
        text = open(page, encoding="utf-8").read()
        for m in COMMAND.finditer(text):
            line = m.group(2).replace("\\\n", " ").replace("\n", " ")
            args = [a.strip("[]") for a in shlex.split(line, comments=True)]  # [--opt] optional
            found.append((os.path.relpath(page, REPO), m.group(1), [a for a in args if a]))
    return found


def commands_by_parser():
    """{(script, subcommand): {flag: [pages]}}: one --help per parser."""
    by_parser = {}
    for page, script, args in documented_commands():
        flags = by_parser.setdefault((script, _subcommand(args)), {})
        for a in args:
            if a.startswith("-"):
                flags.setdefault(a.split("=", 1)[0], []).append(page)
    return by_parser


def _subcommand(args):
    return args[0] if args and not args[0].startswith("-") else ""


@pytest.mark.parametrize("script,sub,flags", [(s, sub, f) for (s, sub), f in
                                               sorted(commands_by_parser().items())],
                         ids=lambda v: v if isinstance(v, str) else None)
def test_a_documented_benchmark_command_uses_only_flags_its_script_has(script, sub, flags):
    helped = subprocess.run([sys.executable, os.path.join(REPO, script), *([sub] if sub else []),
                             "--help"], capture_output=True, text=True, cwd=REPO, timeout=300,
                            env={**os.environ, "PYTHONPATH": REPO})
    assert helped.returncode == 0, helped.stderr[-2000:]
    unknown = {f: pages for f, pages in sorted(flags.items())
               if not re.search(rf"(?<![\w-]){re.escape(f)}(?![\w-])", helped.stdout)}
    assert not unknown, f"{script} has no {unknown} (its --help: {helped.stdout[:600]})"


def test_the_pages_show_benchmark_commands():
    assert {s for _, s, _ in documented_commands()} >= {"benchmarks/precision_throughput.py",
                                                        "benchmarks/serve_memory.py",
                                                        "benchmarks/corpus_scale.py",
                                                        "benchmarks/mutation.py",
                                                        "benchmarks/serve_vs_triton.py"}
