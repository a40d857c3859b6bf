"""docs/PITFALLS.md matches the code: cited tests exist, every trap is covered, citations resolve.

Reads files only (tests are parsed with ``ast``, never imported), so it runs in well under a second.
"""
import ast
import os
import re

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PITFALLS = os.path.join(REPO, "docs", "PITFALLS.md")
GENERAL_TRAPS = range(1, 25)  # the numbered list every code comment cites; 25+ are stack traps

HEADING = re.compile(r"^### (\d+)\. ", re.M)
TEST_REF = re.compile(r"tests/([\w/]+\.py)::([\w:]+)")
MODULE_REF = re.compile(r"`(ppvarlen(?:\.\w+)+)`")
NO_TEST = re.compile(r"\bno test:", re.I)
# "PITFALLS 20", "PITFALLS 12, 21", "docs/PITFALLS.md 9-15", "pitfalls 6 and 8", "pitfall 7"
CODE_CITATION = re.compile(r"pitfalls?(?:\.md)?\s+(\d+(?:\s*(?:,|-|and)\s*\d+)*)", re.I)


def pitfall_sections():
    """{number: section text} in document order; numbers must be unique."""
    text = open(PITFALLS, encoding="utf-8").read()
    heads = list(HEADING.finditer(text))
    assert heads, "docs/PITFALLS.md has no '### N. title' entries"
    sections = {}
    for k, head in enumerate(heads):
        end = heads[k + 1].start() if k + 1 < len(heads) else len(text)
        number = int(head.group(1))
        assert number not in sections, f"docs/PITFALLS.md: entry {number} appears twice"
        sections[number] = text[head.start():end]
    return sections


def defined_tests(path):
    """Names of test functions and Class::method in a test file, read with ast."""
    tree = ast.parse(open(path, encoding="utf-8").read(), filename=path)
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names.update(f"{node.name}::{item.name}" for item in node.body
                         if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)))
    return {n for n in names if n.split("::")[-1].startswith("test")}


def test_every_cited_test_exists():
    missing, cache = [], {}
    for number, section in pitfall_sections().items():
        for rel, name in TEST_REF.findall(section):
            path = os.path.join(REPO, "tests", rel)
            if not os.path.isfile(path):
                missing.append(f"entry {number}: tests/{rel} does not exist")
                continue
            if path not in cache:
                cache[path] = defined_tests(path)
            if name not in cache[path]:
                missing.append(f"entry {number}: tests/{rel}::{name} is not a test in that file")
    assert not missing, "docs/PITFALLS.md cites tests that are gone (renamed or moved?):\n" + \
        "\n".join(missing)


def test_every_trap_is_numbered_in_order_and_cites_a_test_or_says_why_not():
    sections = pitfall_sections()
    numbers = list(sections)
    assert numbers == list(range(1, len(numbers) + 1)), \
        f"entries must be numbered 1, 2, 3, ... in order (code cites the numbers); got {numbers}"
    assert set(GENERAL_TRAPS) <= set(numbers), "the 24 general traps must all be listed"
    uncovered = [n for n, s in sections.items() if not TEST_REF.search(s) and not NO_TEST.search(s)]
    assert not uncovered, f"entries with neither a cited test nor a 'no test:' line: {uncovered}"


def test_module_references_exist():
    stale = []
    for number, section in pitfall_sections().items():
        for dotted in MODULE_REF.findall(section):
            base = os.path.join(REPO, *dotted.split("."))
            is_package = os.path.isfile(os.path.join(base, "__init__.py"))
            if not (os.path.isfile(base + ".py") or is_package):
                stale.append(f"entry {number}: `{dotted}` is not a module or package")
    assert not stale, "docs/PITFALLS.md names modules that do not exist:\n" + "\n".join(stale)


def test_pitfall_numbers_cited_in_the_code_exist():
    numbers = set(pitfall_sections())
    bad = []
    for top in ("ppvarlen", "tools", "deploy"):
        for root, _, files in os.walk(os.path.join(REPO, top)):
            for f in files:
                if not f.endswith(".py"):
                    continue
                path = os.path.join(root, f)
                for i, line in enumerate(open(path, encoding="utf-8"), 1):
                    for group in CODE_CITATION.findall(line):
                        cited = set()
                        for part in re.split(r"\s*(?:,|and)\s*", group):
                            lo, _, hi = part.partition("-")
                            cited.update(range(int(lo), int(hi or lo) + 1))
                        if cited - numbers:
                            bad.append(f"{os.path.relpath(path, REPO)}:{i}: cites "
                                       f"{sorted(cited - numbers)}")
    assert not bad, "code cites pitfall numbers docs/PITFALLS.md does not have:\n" + "\n".join(bad)


def design_module_map():
    """The ppvarlen/... paths listed in docs/DESIGN.md's "Module map" code block."""
    text = open(os.path.join(REPO, "docs", "DESIGN.md"), encoding="utf-8").read()
    section = text.split("## Module map", 1)[1]
    block = section.split("```", 2)[1]
    return {line.split()[0] for line in block.splitlines() if line.startswith("ppvarlen/")}


def test_design_module_map_lists_every_module_and_only_real_ones():
    listed = design_module_map()
    actual = set()
    for root, _, files in os.walk(os.path.join(REPO, "ppvarlen")):
        actual.update(os.path.relpath(os.path.join(root, f), REPO) for f in files
                      if f.endswith(".py"))
    assert not listed - actual, f"docs/DESIGN.md lists modules that do not exist: " \
                                f"{sorted(listed - actual)}"
    assert not actual - listed, f"modules missing from docs/DESIGN.md's module map: " \
                                f"{sorted(actual - listed)}"


GUARANTEES = os.path.join(REPO, "docs", "GUARANTEES.md")


def test_every_file_guarantee_cites_tests_that_exist_and_every_fault_test_is_cited():
    """docs/GUARANTEES.md states each promise with the test that breaks it on purpose: a cited
    test that was renamed fails here, and so does a fault test the page does not state."""
    text = open(GUARANTEES, encoding="utf-8").read()
    cited = set(TEST_REF.findall(text))
    missing = [f"tests/{rel}::{name}" for rel, name in sorted(cited)
               if name not in defined_tests(os.path.join(REPO, "tests", rel))]
    assert not missing, f"docs/GUARANTEES.md cites tests that do not exist: {missing}"
    fault_files = sorted(os.path.relpath(os.path.join(root, f), os.path.join(REPO, "tests"))
                         for root, _, files in os.walk(os.path.join(REPO, "tests"))
                         for f in files if f.startswith("test_faults_") and f.endswith(".py"))
    assert fault_files
    unstated = [f"tests/{f}::{name}" for f in fault_files
                for name in sorted(defined_tests(os.path.join(REPO, "tests", f)))
                if (f, name) not in cited]
    assert not unstated, f"fault tests docs/GUARANTEES.md does not state: {unstated}"
