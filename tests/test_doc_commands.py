"""The benchmark commands docs/PRECISION.md and docs/GUARANTEES.md show parse as written: each
command's arguments go through the script's own argument parser (``--help`` lists every flag
the page uses).  Running them in full takes minutes to hours on a 2-core machine, so the suite
checks that they run as typed, not what they measure."""
import os
import re
import shlex
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = ("docs/PRECISION.md", "docs/GUARANTEES.md")
COMMAND = re.compile(r"python (benchmarks/\w+\.py)((?:[^`\n]|\\\n|\n(?=\s+--))*)")


def documented_commands():
    found = []
    for page in PAGES:
        text = open(os.path.join(REPO, page), encoding="utf-8").read()
        for m in COMMAND.finditer(text):
            args = shlex.split(m.group(2).replace("\\\n", " ").replace("\n", " "))
            found.append((page, m.group(1), args))
    return found


@pytest.mark.parametrize("page,script,args", documented_commands(),
                         ids=lambda v: v if isinstance(v, str) else None)
def test_a_documented_benchmark_command_uses_only_flags_its_script_has(page, script, args):
    helped = subprocess.run([sys.executable, os.path.join(REPO, script), *_subcommand(args),
                             "--help"], capture_output=True, text=True, cwd=REPO, timeout=300,
                            env={**os.environ, "PYTHONPATH": REPO})
    assert helped.returncode == 0, helped.stderr[-2000:]
    flags = {a.split("=", 1)[0] for a in args if a.startswith("-")}
    unknown = sorted(f for f in flags if not re.search(rf"(?<![\w-]){re.escape(f)}(?![\w-])",
                                                       helped.stdout))
    assert not unknown, f"{page}: {script} has no {unknown} (its --help: {helped.stdout[:600]})"


def _subcommand(args):
    return args[:1] if args and not args[0].startswith("-") else []


def test_the_pages_show_benchmark_commands():
    assert {s for _, s, _ in documented_commands()} >= {"benchmarks/precision_throughput.py",
                                                        "benchmarks/serve_memory.py",
                                                        "benchmarks/corpus_scale.py"}
