"""Every shell and Python snippet in README.md and docs/ runs as written, or says why it cannot
run here.

A snippet is a ```bash / ```sh / ```shell / ```console / ```python block; a block whose first
line is a command must say its language (an untagged one fails here).  The line right before
a snippet's fence says how it is checked:

* ``<!-- runnable -->`` / ``<!-- runnable: NAME -->`` (docs/tutorials/ only): run by
  tests/test_tutorials.py, in the tutorial's order, in one shell.
* ``<!-- not run: REASON -->``: it cannot run in the suite (a GPU, the network, a Ray cluster,
  hours of work, your own files); REASON says which, and what runs the same code instead.
  The flags of every documented command, run or not, are checked against their parsers by
  tests/test_readme.py (tools/, deploy/, ppvarlen-*) and tests/test_doc_commands.py
  (benchmarks/).
* nothing: this file runs it, in its page's setting (``SETTINGS``): a working directory with
  the checkout's configs/, examples/, tools/, deploy/ and benchmarks/, this checkout's console
  scripts first on PATH, a store cache of the test's own, and what the page's snippets name:
  a tiny export at the paths they use, ``texts.txt`` / ``texts.jsonl``, a server of tiny
  exports.  The one change made to a snippet's text: the server's address (``127.0.0.1:8080``,
  ``localhost:8080``; gRPC ``127.0.0.1:8081``) becomes the test server's.  Shell snippets run
  under ``bash -euo pipefail`` with ``curl`` failing on an HTTP error status; a ```console
  block runs its ``$ `` lines.  A page's snippets run in page order in one directory.
"""
import glob
import os
import re
import shutil
import subprocess
import sys

import pytest

from test_tutorials import console_script_dir

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHELL = {"bash", "sh", "shell", "console"}
LANGS = SHELL | {"python"}
FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```", re.S | re.M)
MARKER = re.compile(r"^<!--\s*(runnable|not run)\s*(?::\s*(.*?))?\s*-->$")
# an untagged (or ```text) block that starts with one of these is a command someone will paste
COMMAND_START = re.compile(r"^(\$ |python3?(\.\d+)? |ppvarlen-[a-z-]+ |curl |pip |PYTHONPATH=|"
                           r"bash |nice |ray |export |cd )")
CHECKOUT_DIRS = ("configs", "examples", "tools", "deploy", "benchmarks")
CURL = 'curl() { command curl --silent --show-error --fail-with-body --max-time 120 "$@"; }\n'


def pages():
    """README and the hand-written pages (docs/reference/ is generated from the code)."""
    found = [os.path.join(REPO, "README.md")]
    for path in sorted(glob.glob(os.path.join(REPO, "docs", "**", "*.md"), recursive=True)):
        if not os.path.relpath(path, REPO).startswith(os.path.join("docs", "reference")):
            found.append(path)
    return found


def blocks(page):
    """[(line, lang, body, marker kind, marker text)] of every fenced block of a page."""
    text = open(page, encoding="utf-8").read()
    found = []
    for m in FENCE.finditer(text):
        before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1].strip()
        marker = MARKER.match(before)
        found.append((text.count("\n", 0, m.start()) + 1, m.group(1), m.group(2),
                      marker.group(1) if marker else None,
                      (marker.group(2) or "") if marker else None))
    return found


def snippets():
    """[(page, line, lang, body, marker kind, marker text)] of every snippet."""
    return [(page, line, lang, body, kind, why) for page in pages()
            for line, lang, body, kind, why in blocks(page) if lang in LANGS]


def to_run(page):
    return [(line, lang, body) for p, line, lang, body, kind, _ in snippets()
            if p == page and kind is None]


def where(page, line):
    return f"{os.path.relpath(page, REPO)}:{line}"


# ------------------------------------------------------------------ the rules, read statically

def test_a_command_block_says_its_language():
    untagged = [where(page, line) for page in pages()
                for line, lang, body, _, _ in blocks(page)
                if lang in ("", "text") and COMMAND_START.match(body.lstrip())]
    assert not untagged, (f"{untagged}: a block of commands says its language (```bash, "
                          f"```console, ```python), so that this test runs it or it says why not")


def test_every_snippet_runs_here_or_in_a_tutorial_or_says_why_not():
    problems = []
    for page, line, _, _, kind, why in snippets():
        rel = os.path.relpath(page, REPO)
        if kind == "runnable" and not rel.startswith(os.path.join("docs", "tutorials")):
            problems.append(f"{where(page, line)}: <!-- runnable --> is the tutorials' marker")
        elif kind == "not run" and len(why.split()) < 4:
            problems.append(f"{where(page, line)}: <!-- not run: ... --> must say why "
                            f"(got {why!r})")
        elif kind is None and rel not in SETTINGS:
            problems.append(f"{where(page, line)}: neither run here (no setting for {rel} in "
                            f"SETTINGS) nor marked <!-- not run: WHY -->")
    assert not problems, "\n".join(problems)


def test_the_marker_rules_catch_what_they_should(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("<!-- not run: too short -->\n```bash\nls\n```\n\n"
                    "<!-- runnable -->\n```bash\nls\n```\n\n```\nppvarlen-serve --help\n```\n",
                    encoding="utf-8")
    found = blocks(str(page))
    assert [(kind, why) for _, _, _, kind, why in found] == [("not run", "too short"),
                                                              ("runnable", ""), (None, None)]
    assert COMMAND_START.match(found[2][2]) and not COMMAND_START.match("ppvarlen-doctor: x")


# ------------------------------------------------------------------ the settings pages run in

@pytest.fixture(scope="module")
def tiny_exports(tmp_path_factory):
    """(classifier export, embedding export): tiny random models, exported by the exporter."""
    from export_helpers import make_tiny_export
    from test_embeddings_serving import make_embed_export

    root = tmp_path_factory.mktemp("doc_exports")
    return (make_tiny_export(str(root / "cls"), "classification")[0],
            make_embed_export(str(root / "embed"))[0])


def _files(work, exports):
    from export_helpers import TEXTS

    for name in ("sentiment", "sentiment_transformer"):
        os.makedirs(work / "output" / "export", exist_ok=True)
        os.symlink(exports[0], work / "output" / "export" / name)
    (work / "texts.txt").write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    (work / "texts.jsonl").write_text("".join(f'{{"text": "{t}"}}\n' for t in TEXTS),
                                      encoding="utf-8")


def _server(app):
    from test_server import RunningServer

    return RunningServer(app)


def checkout(work, exports, stack):
    return {}


def exports_and_texts(work, exports, stack):
    _files(work, exports)
    return {}


def one_model_server(work, exports, stack):
    """The files of ``exports_and_texts`` and the tiny classifier (served as "tiny") behind
    ppvarlen-serve's app, HTTP only."""
    from ppvarlen.runtime.predictor import Predictor
    from ppvarlen.serve.server import create_app

    _files(work, exports)
    srv = stack.enter_context(_server(create_app(Predictor(exports[0], "onnx"))))
    return {"http": srv.port}


def repository_server(work, exports, stack):
    """A repository: "tiny" (the classifier) and "embed" (the embedding model), HTTP + gRPC."""
    from ppvarlen.runtime.predictor import Predictor
    from ppvarlen.serve.server import create_app, deploy_settings

    root = work / "repo"
    shutil.copytree(exports[0], root / "tiny" / "1")
    shutil.copytree(exports[1], root / "embed" / "1")
    app = create_app(repository=str(root), load_predictor=lambda d: Predictor(d, "onnx"),
                     grpc_port=0, deploy=deploy_settings(repository_poll_s=None))
    srv = stack.enter_context(_server(app))
    return {"http": srv.port, "grpc": app.state.grpc.port}


# page -> what its snippets need
SETTINGS = {
    os.path.join("docs", "SERVING.md"): repository_server,
    os.path.join("docs", "guide", "serve.md"): one_model_server,
    os.path.join("docs", "INFERENCE.md"): exports_and_texts,
    os.path.join("docs", "guide", "doctor.md"): exports_and_texts,
    os.path.join("docs", "guide", "configs.md"): checkout,
    os.path.join("docs", "guide", "data.md"): checkout,
}


def with_ports(body, ports):
    if "http" in ports:
        body = re.sub(r"(?:127\.0\.0\.1|localhost):8080", f"127.0.0.1:{ports['http']}", body)
    if "grpc" in ports:
        body = body.replace("127.0.0.1:8081", f"127.0.0.1:{ports['grpc']}")
    return body


def console_commands(body):
    """The ``$ `` lines of a console block, with their continuation lines."""
    commands, going = [], False
    for line in body.splitlines():
        if line.startswith("$ "):
            commands.append(line[2:])
        elif going:
            commands[-1] += "\n" + line
        else:
            continue
        going = line.rstrip().endswith("\\")
    return "\n".join(commands) + "\n"


def run_snippet(page, line, lang, body, work, env):
    if lang == "python":
        argv = [sys.executable, "-c", body]
    else:
        script = console_commands(body) if lang == "console" else body
        argv = ["bash", "-euo", "pipefail", "-c", CURL + script]
    done = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (f"{where(page, line)} stopped working (exit {done.returncode})"
                                  f":\n{body}\n--- stderr:\n{done.stderr[-3000:]}\n--- stdout:\n"
                                  f"{done.stdout[-1500:]}")
    return done


RUN_PAGES = [p for p in pages() if os.path.relpath(p, REPO) in SETTINGS]


@pytest.mark.parametrize("page", RUN_PAGES, ids=[os.path.relpath(p, REPO) for p in RUN_PAGES])
def test_the_snippets_of_a_page_run(page, tiny_exports, tmp_path):
    import contextlib

    runs = to_run(page)
    assert runs, f"{os.path.relpath(page, REPO)} is in SETTINGS but has no snippet to run"
    work = tmp_path / "work"
    work.mkdir()
    for name in CHECKOUT_DIRS:
        os.symlink(os.path.join(REPO, name), work / name)
    path = [console_script_dir(tmp_path / "bin"), os.path.dirname(sys.executable),
            os.environ.get("PATH", "")]
    env = {**os.environ, "PYTHONPATH": REPO, "PATH": os.pathsep.join(path),
           "XDG_CACHE_HOME": str(tmp_path / "cache")}
    with contextlib.ExitStack() as stack:
        ports = SETTINGS[os.path.relpath(page, REPO)](work, tiny_exports, stack)
        for line, lang, body in runs:
            run_snippet(page, line, lang, with_ports(body, ports), work, env)


def test_counts_of_run_and_marked_snippets():
    """The suite runs most snippets: those of SETTINGS' pages here, the tutorials' there."""
    kinds = [kind for _, _, _, _, kind, _ in snippets()]
    run_here = sum(len(to_run(p)) for p in RUN_PAGES)
    assert run_here >= 11 and kinds.count("runnable") >= 25, (run_here, kinds.count("runnable"))
