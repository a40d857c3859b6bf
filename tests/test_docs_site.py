"""The docs site: references generated from the code and current, every key explained, and
`mkdocs build --strict` clean (no broken link or anchor, no page left out of the nav)."""
import os
import shutil
import subprocess
import sys

import pytest

from ppvarlen import docs_gen
from ppvarlen.config_schema import iter_keys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_config_key_has_a_meaning():
    missing = [k.path for k in iter_keys() if not (k.meaning or "").strip()]
    assert not missing, ("config keys without a meaning text (help= in ppvarlen/config_schema.py; "
                         f"the config reference and ppvarlen-config show print it): {missing}")


def test_committed_reference_pages_are_what_the_code_generates():
    stale = docs_gen.stale_pages()
    assert not stale, (f"docs/reference/ {stale} differ from the code (edited by hand, or the "
                       f"code changed): run python tools/gen_docs.py and commit the result")


def test_a_hand_edit_of_a_reference_page_is_caught(tmp_path):
    for name, text in docs_gen.generate().items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    assert docs_gen.stale_pages(str(tmp_path)) == []
    page = tmp_path / "config.md"
    page.write_text(page.read_text("utf-8").replace("default `512`", "default `256`", 1), "utf-8")
    assert docs_gen.stale_pages(str(tmp_path)) == ["config.md"]


def test_config_reference_lists_every_key_and_the_keys_of_each_model():
    page = open(os.path.join(REPO, "docs", "reference", "config.md"), encoding="utf-8").read()
    missing = [k.path for k in iter_keys() if f"### `{k.path}`" not in page]
    assert not missing, f"docs/reference/config.md lacks {missing}"
    rnn_row = next(line for line in page.splitlines() if line.startswith("| `rnn_cls` |"))
    for key in ("cell", "pooling", "emb_size", "hidden_size"):
        assert f"`{key}`" in rnn_row


def _build(config_dir, site_dir):
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                           "-f", os.path.join(config_dir, "mkdocs.yml"), "-d", str(site_dir)],
                          cwd=config_dir, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": REPO, "NO_MKDOCS_2_WARNING": "1"})


def test_mkdocs_build_strict_passes(tmp_path):
    run = _build(REPO, tmp_path / "site")
    assert run.returncode == 0, run.stderr[-4000:]
    for page in ("index.html", "tutorials/tagging/index.html", "reference/config/index.html",
                 "reference/python-api/index.html", "BENCHMARKS/index.html"):
        assert (tmp_path / "site" / page).is_file(), page
    api = (tmp_path / "site" / "reference" / "python-api" / "index.html").read_text("utf-8")
    assert "TokenBudgetBatchSampler" in api and "max_tokens" in api  # docstrings rendered


def test_an_orphan_page_or_a_broken_link_fails_the_build(tmp_path):
    """The strictness is real: a page outside the nav and a link to nowhere each fail it."""
    copy = tmp_path / "repo"
    shutil.copytree(os.path.join(REPO, "docs"), copy / "docs")
    shutil.copy(os.path.join(REPO, "mkdocs.yml"), copy / "mkdocs.yml")
    os.symlink(os.path.join(REPO, "ppvarlen"), copy / "ppvarlen")
    (copy / "docs" / "orphan.md").write_text("# Orphan\n", "utf-8")
    run = _build(str(copy), tmp_path / "site")
    assert run.returncode != 0 and "orphan.md" in run.stderr
    (copy / "docs" / "orphan.md").unlink()
    index = copy / "docs" / "index.md"
    index.write_text(index.read_text("utf-8") + "\n[gone](no-such-page.md)\n", "utf-8")
    run = _build(str(copy), tmp_path / "site2")
    assert run.returncode != 0 and "no-such-page.md" in run.stderr
