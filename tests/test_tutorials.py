"""The tutorials in docs/tutorials/ run: each page's runnable blocks, in order, on a small slice.

A block is runnable when the line before its fence is ``<!-- runnable -->`` (a bash block,
run) or ``<!-- runnable: NAME -->`` (its text is saved as the file NAME, as the page tells the
reader to).  A page's sentences "for the test, we pass `ARGS` to every `COMMAND` command"
append ARGS to each of its COMMAND lines (tiny step counts and data slices), so what the page
shows is what a user runs.  A collector of our own rather than mktestdocs: the blocks of one
page share a working directory and a shell, and take the page's own overrides; mktestdocs runs
each block alone with neither.
"""
import glob
import os
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TUTORIALS = sorted(glob.glob(os.path.join(REPO, "docs", "tutorials", "*.md")))
RUNNABLE = re.compile(r"^<!-- runnable(?::\s*(\S+))?\s*-->\n```(\w+)\n(.*?)^```", re.S | re.M)
FOR_THE_TEST = re.compile(r"for the test, we pass `([^`]+)` to every `([^`]+)` command", re.I)
# what a command needs from the checkout, linked into the tutorial's working directory
CHECKOUT_DIRS = ("configs", "examples")


def console_script_dir(directory):
    """setup.py's console scripts, as pip writes them, over this checkout's ppvarlen.cli: the
    tutorial runs this checkout's commands even where the installed package predates one."""
    from ppvarlen.docs_gen import console_scripts

    directory.mkdir()
    for script, function in console_scripts():
        path = directory / script
        path.write_text(f"#!{sys.executable}\nimport sys\nfrom ppvarlen.cli import {function}\n"
                        f"sys.exit({function}())\n", encoding="utf-8")
        path.chmod(0o755)
    return str(directory)


def tutorial_script(page):
    """(files to write, bash script) of a tutorial page."""
    text = open(page, encoding="utf-8").read()
    overrides = FOR_THE_TEST.findall(text)
    files, lines, used = {}, [], set()
    for name, lang, body in RUNNABLE.findall(text):
        if name:
            files[name] = body
            continue
        assert lang == "bash", f"{page}: a runnable block without a file name must be bash"
        for line in body.replace("\\\n", " ").splitlines():
            for args, command in overrides:
                if line.split()[:len(command.split())] == command.split():
                    line = f"{line} {args}"
                    used.add(command)
            lines.append(line)
    assert lines, f"{page} has no runnable bash block"
    unused = {c for _, c in overrides} - used
    assert not unused, f"{page}: 'for the test, we pass ...' names commands the page never runs: " \
                       f"{sorted(unused)}"
    return files, "\n".join(lines) + "\n"


@pytest.mark.parametrize("page", TUTORIALS, ids=[os.path.basename(p)[:-3] for p in TUTORIALS])
def test_tutorial(page, tmp_path):
    files, script = tutorial_script(page)
    work = tmp_path / "work"
    work.mkdir()
    for name in CHECKOUT_DIRS:
        os.symlink(os.path.join(REPO, name), work / name)
    for name, body in files.items():
        (work / name).write_text(body, encoding="utf-8")
    path = [console_script_dir(tmp_path / "bin"), os.path.dirname(sys.executable),
            os.environ.get("PATH", "")]
    env = {**os.environ, "PYTHONPATH": REPO, "PATH": os.pathsep.join(path)}
    run = subprocess.run(["bash", "-euxo", "pipefail", "-c", script], cwd=work, env=env,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, (f"{os.path.relpath(page, REPO)} stopped working (exit "
                                 f"{run.returncode}):\n{run.stderr[-4000:]}\n{run.stdout[-2000:]}")


def test_every_tutorial_is_collected_and_says_what_the_test_passes():
    names = {os.path.basename(p) for p in TUTORIALS}
    assert {"sentiment.md", "tagging.md", "g2p.md", "paddlenlp-model-dir.md",
            "paddlenlp-trainer.md"} <= names
    for page in TUTORIALS:
        tutorial_script(page)  # parses, has runnable blocks, overrides name real commands
