"""The user pages describe the present: no issue numbers, no commit hashes, and the measurement
artefacts a page shows live in docs/assets/, each one referenced by a page and each reference
resolving.  History (what was measured before a change, which commit did it) lives in git."""
import os
import re

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(REPO, "docs")
ASSETS = os.path.join(DOCS, "assets")

ISSUE_REF = re.compile(r"(?<![\w&/])#\d+\b|\b(?:issues?|PR)\s+#?\d+\b", re.I)
# a short (7-12) or full (40) hex commit name; not a path's part (cache keys in log excerpts)
HEX = re.compile(r"(?<![\w/.-])([0-9a-f]{7,12}|[0-9a-f]{40})(?![\w/-])")
LINK = re.compile(r"\]\(([^)\s]+?)(?:#[^)]*)?\)")


def user_pages():
    pages = [os.path.join(REPO, "README.md")]
    for root, _, files in os.walk(DOCS):
        pages += [os.path.join(root, f) for f in sorted(files) if f.endswith(".md")]
    return sorted(pages)


def commit_like(token):
    return bool(re.search(r"\d", token) and re.search(r"[a-f]", token))


def present_tense_violations(text):
    found = [m.group(0) for m in ISSUE_REF.finditer(text)]
    found += [t for t in HEX.findall(text) if commit_like(t)]
    return found


@pytest.mark.parametrize("page", user_pages(), ids=lambda p: os.path.relpath(p, REPO))
def test_a_user_page_names_no_issue_and_no_commit(page):
    text = open(page, encoding="utf-8").read()
    found = present_tense_violations(text)
    assert not found, (f"{os.path.relpath(page, REPO)} cites {found}: a page says what is, "
                       f"with the command, date and machine of a measurement; history is git's")


def test_the_rule_catches_issue_numbers_and_hashes_but_not_seeds_or_cache_keys():
    assert present_tense_violations("as issue 34 asks") == ["issue 34"]
    assert present_tense_violations("before (main `ae5416d`) and after") == ["ae5416d"]
    assert present_tense_violations("see #48") == ["#48"]
    assert not present_tense_violations("seed 20261202, key .../stores/5cbd67df27cb…, "
                                        "[link](#machines), default `4194304`, deadbeef")


def referenced_assets():
    """{absolute asset path: [pages that link it]} from every markdown link of every page."""
    refs = {}
    for page in user_pages():
        text = open(page, encoding="utf-8").read()
        for target in LINK.findall(text):
            if "://" in target:
                continue
            path = os.path.normpath(os.path.join(os.path.dirname(page), target))
            if path.startswith(ASSETS + os.sep):
                refs.setdefault(path, []).append(os.path.relpath(page, REPO))
        for named in re.findall(r"docs/assets/[\w./-]+\w", text):  # named as a path in prose
            refs.setdefault(os.path.join(REPO, named), []).append(os.path.relpath(page, REPO))
    return refs


def test_every_referenced_asset_exists():
    missing = {os.path.relpath(p, REPO): pages for p, pages in referenced_assets().items()
               if not os.path.isfile(p)}
    assert not missing, f"pages link assets that are not there: {missing}"


def test_every_file_under_docs_is_a_page_or_an_asset_a_page_references():
    refs = referenced_assets()
    stray = []
    for root, _, files in os.walk(DOCS):
        for name in files:
            path = os.path.join(root, name)
            if name.endswith(".md"):
                continue
            if not path.startswith(ASSETS + os.sep) or path not in refs:
                stray.append(os.path.relpath(path, REPO))
    assert not stray, (f"{sorted(stray)}: a measurement artefact lives in docs/assets/ only when "
                       f"a page shows or links it; a raw benchmark output goes to output/bench/ "
                       f"(gitignored)")
    assert refs, "no page references docs/assets/: the link parse is broken"
