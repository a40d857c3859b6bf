"""Project-wide rules that a reviewer would otherwise have to remember."""
import os
import re
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CODE_DIRS = ["ppvarlen", "tools", "deploy"]


def code_files():
    for d in CODE_DIRS:
        for root, _, files in os.walk(os.path.join(REPO, d)):
            for f in files:
                if f.endswith(".py"):
                    yield os.path.join(root, f)


def grep(pattern):
    rx = re.compile(pattern)
    hits = []
    for path in code_files():
        for i, line in enumerate(open(path, encoding="utf-8"), 1):
            if rx.search(line) and not line.lstrip().startswith("#"):
                hits.append(f"{os.path.relpath(path, REPO)}:{i}: {line.strip()}")
    return hits


def test_no_runtime_installs_or_downloads():
    hits = grep(r"pip(3)?['\"]?\s*,?\s*['\"]?install|from_pretrained\(\s*['\"][a-z]|urlretrieve|"
                r"requests\.get\(|hf_hub_download|snapshot_download")
    # the shims' message telling a user to install the checkout is advice, not an install
    hits = [h for h in hits if "`pip install -e .`" not in h]
    assert not hits, "code must not install packages or download at run time:\n" + "\n".join(hits)


def test_no_pickle_loading():
    hits = grep(r"paddle\.load\(|pickle\.loads?\(|np\.load\([^)]*allow_pickle\s*=\s*True")
    assert not hits, "no pickle-based loading of files users may receive:\n" + "\n".join(hits)


def test_import_is_quiet():
    """`import ppvarlen` plus paddle/paddlenlp prints no warnings (we silence exact known ones)."""
    code = "import ppvarlen, paddle, paddlenlp.data, paddlenlp.datasets"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr
    assert "Warning" not in r.stderr and "ccache" not in r.stderr, r.stderr


def test_layering():
    """data and models know nothing of engine/export/deploy; deploy never imports models/engine/export."""
    rules = {
        "ppvarlen/data": r"ppvarlen\.(engine|export|deploy)|from \.\.(engine|export|deploy)",
        "ppvarlen/models": r"ppvarlen\.(engine|export|deploy)|from \.\.(engine|export|deploy)",
        "ppvarlen/deploy": r"ppvarlen\.(models|engine|export)|from \.\.(models|engine|export)",
    }
    bad = []
    for d, pattern in rules.items():
        rx = re.compile(r"^\s*(import|from)\s.*(" + pattern + ")")
        for root, _, files in os.walk(os.path.join(REPO, d)):
            for f in files:
                if f.endswith(".py"):
                    p = os.path.join(root, f)
                    for i, line in enumerate(open(p, encoding="utf-8"), 1):
                        if rx.search(line):
                            bad.append(f"{os.path.relpath(p, REPO)}:{i}: {line.strip()}")
    assert not bad, "layering violated:\n" + "\n".join(bad)


SCRIPT_DIRS = ["ppvarlen", "tools", "deploy", "benchmarks"]


def test_no_sys_path_edits_in_shipped_scripts():
    """The package is installed (pip install -e .); no script puts the checkout on sys.path."""
    rx = re.compile(r"sys\.path\.(insert|append|extend)|sys\.path\s*(\+?=|\[)|site\.addsitedir")
    bad = []
    for d in SCRIPT_DIRS:
        for root, _, files in os.walk(os.path.join(REPO, d)):
            for f in (f for f in files if f.endswith(".py")):
                p = os.path.join(root, f)
                for i, line in enumerate(open(p, encoding="utf-8"), 1):
                    if rx.search(line) and not line.lstrip().startswith("#"):
                        bad.append(f"{os.path.relpath(p, REPO)}:{i}: {line.strip()}")
    assert not bad, "sys.path edits in shipped scripts:\n" + "\n".join(bad)
