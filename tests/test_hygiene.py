"""Project-wide rules that a reviewer would otherwise have to remember."""
import ast
import glob
import os
import re
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CODE_DIRS = ["ppvarlen", "tools", "deploy"]


def code_files(dirs=CODE_DIRS):
    for d in dirs:
        for root, _, files in os.walk(os.path.join(REPO, d)):
            for f in files:
                if f.endswith(".py"):
                    yield os.path.join(root, f)


def grep(pattern, dirs=CODE_DIRS):
    rx = re.compile(pattern)
    hits = []
    for path in code_files(dirs):
        for i, line in enumerate(open(path, encoding="utf-8"), 1):
            if rx.search(line) and not line.lstrip().startswith("#"):
                hits.append(f"{os.path.relpath(path, REPO)}:{i}: {line.strip()}")
    return hits


def test_no_runtime_installs_or_downloads():
    hits = grep(r"pip(3)?['\"]?\s*,?\s*['\"]?install|from_pretrained\(\s*['\"][a-z]|urlretrieve|"
                r"requests\.get\(|hf_hub_download|snapshot_download")
    assert not hits, "code must not install packages or download at run time:\n" + "\n".join(hits)


def test_no_pickle_loading():
    hits = grep(r"paddle\.load\(|pickle\.loads?\(|np\.load\([^)]*allow_pickle\s*=\s*True")
    assert not hits, "no pickle-based loading of files users may receive:\n" + "\n".join(hits)


def test_child_processes_get_the_environment_from_child_environ():
    # Paddle's import writes OMP_NUM_THREADS=1 into the environment; a copy of os.environ
    # hands it to the child as a limit (utils/parallel.child_environ leaves it out)
    hits = [h for h in grep(r"dict\(os\.environ|os\.environ\.copy\(\)", ["ppvarlen"])
            if not h.startswith(os.path.join("ppvarlen", "utils", "parallel.py"))]
    assert not hits, "build a child's environment with child_environ:\n" + "\n".join(hits)
    # ... and a child started without env= inherits this process's, Paddle's "1" included
    starts = ("subprocess.Popen", "subprocess.run", "subprocess.call", "subprocess.check_call",
              "subprocess.check_output", "os.execv", "os.execve", "os.spawnv", "os.posix_spawn")
    found, bare = 0, []
    for path in sorted(glob.glob(os.path.join(REPO, "ppvarlen", "**", "*.py"), recursive=True)):
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if isinstance(node, ast.Call) and ast.unparse(node.func) in starts:
                found += 1
                if "env" not in {k.arg for k in node.keywords}:
                    bare.append(f"{os.path.relpath(path, REPO)}:{node.lineno}")
    assert found >= 4, "the rule sees no child process start: has the code moved?"
    assert not bare, "pass env=parallel.child_environ(...) to every child:\n" + "\n".join(bare)


def test_a_command_start_is_quiet():
    """A ppvarlen command's start plus paddle/paddlenlp prints no warnings (exact known ones
    silenced by ``cli.command_settings``), nor does a Python process it starts."""
    code = ("import ppvarlen.cli\nppvarlen.cli.command_settings()\n"
            "import paddle, paddlenlp.data, paddlenlp.datasets\n"
            # and a Python process the command starts (the precision chooser, say)
            "import subprocess, sys\n"
            "subprocess.run([sys.executable, '-c', 'import paddle'], check=True)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert "Warning" not in r.stderr and "ccache" not in r.stderr, r.stderr


# a snapshot of the process state a library import must leave alone
_PROCESS_STATE = ("import os, sys, warnings, json\n"
                  "def state():\n"
                  "    return json.dumps([dict(os.environ), [repr(f) for f in warnings.filters]])\n")


def test_importing_ppvarlen_leaves_the_environment_and_warning_filters_alone():
    """A user's script that imports ppvarlen helpers keeps its environment variables and warning
    filters (the commands set theirs at start).  The third-party libraries are imported first
    (numpy adds filters of its own), so what they change is not counted against ppvarlen."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("MKL_DEBUG_CPU_TYPE", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
    for first, ours in (("import numpy, yaml, pydantic\n", "ppvarlen, ppvarlen.config, ppvarlen.cli, ppvarlen.metrics, "
                             "ppvarlen.tasks, ppvarlen.models, ppvarlen.runtime.predictor"),
                        ("import paddle, paddlenlp.transformers, paddlenlp.trainer\n",
                         "ppvarlen.engine, ppvarlen.export.exporter, "
                         "ppvarlen.integrations.paddlenlp_trainer")):
        code = (_PROCESS_STATE + first + "before = state()\n" + f"import {ours}\n"
                "print(before == state())\n"
                # the check itself can fail: a command's settings do change both
                "ppvarlen.cli.command_settings() if 'ppvarlen.cli' in sys.modules else None\n"
                "print(before == state())\n")
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                           env=env, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        assert r.stdout.split()[0] == "True", f"import {ours} changed the process"
        if "ppvarlen.cli" in ours:
            assert r.stdout.split()[1] == "False"


LAYER_RULES = {  # package or module -> the ppvarlen subpackages it must not import (at any depth)
    # data is task-agnostic: a task hands its store fields and encode function in
    "ppvarlen/data": "tasks|engine|export|runtime|serve|doctor",
    "ppvarlen/models": "engine|export|runtime|serve|doctor",
    # an export directory -> predictions, with no server and no training code in it
    "ppvarlen/runtime": "models|engine|export|serve|doctor",
    # the server loads exports through the runtime; beside the trainer, never above it
    "ppvarlen/serve": "models|engine|export|doctor",
    # export builds its parity backends, reads manifests and admits what it wrote through the
    # runtime; it never imports the server
    "ppvarlen/export": "serve|doctor",
    # tasks read their metrics from ppvarlen/metrics.py, never from the trainer's package; they
    # receive model objects and never import models (the runtime imports tasks: a serving host
    # needs no model or training code)
    "ppvarlen/tasks": "models|engine|export|runtime|serve|doctor",
    # the store build drives a task over the corpus the data layer reads: above both, below
    # the trainer, the exporter and the tools that call it
    "ppvarlen/store_build.py": "models|engine|export|runtime|serve|doctor",
    # the metrics are read by tasks, the trainer and the server alike
    "ppvarlen/metrics.py": "tasks|models|engine|export|runtime|serve|doctor",
    # the doctor loads models the way they are deployed: the runtime's predictor and its shared
    # checks, PaddleNLP directories (models); never the trainer, the exporter or the server,
    # and nothing imports the doctor but the command line
    "ppvarlen/doctor": "engine|export|serve",
    # Ray batch inference runs exports through the runtime; only Ray Serve needs the server
    "ppvarlen/integrations/ray_batch.py": "serve|engine|export|doctor",
}


def _layer_rx(packages):
    """``from ppvarlen.X``, ``from ..X`` / ``from ...X`` / ``from .X`` in a top-level module
    (relative) or ``import ppvarlen.X``."""
    return re.compile(r"^\s*(from\s+(ppvarlen\.|\.{1,})|import\s+ppvarlen\.)(" + packages +
                      r")\b")


def test_layering_pattern_catches_the_forms_it_names():
    rx = _layer_rx(LAYER_RULES["ppvarlen/data"])
    for line in ("from ..tasks import get_task", "    from ...tasks.base import Task",
                 "import ppvarlen.tasks", "from ppvarlen.engine import metrics",
                 "from ..export.parity import x", "    from ...serve import openapi"):
        assert rx.search(line), line
    for line in ("from .store import StoreField", "from ..utils.io import atomic_dir",
                 "from .corpora import load_corpus", "# from ..tasks import nothing"):
        assert not rx.search(line), line


def test_layering():
    """Each package imports only the floors below it (LAYER_RULES), not even lazily: data <
    tasks < runtime < export / doctor / serve; serve beside engine; nothing imports the
    doctor but the command line."""
    bad = []
    for d, pattern in LAYER_RULES.items():
        rx = _layer_rx(pattern)
        top = os.path.join(REPO, d)
        walked = [(os.path.dirname(top), [os.path.basename(top)])] if d.endswith(".py") else \
            [(root, files) for root, _, files in os.walk(top)]
        for root, files in walked:
            for f in files:
                if f.endswith(".py"):
                    p = os.path.join(root, f)
                    for i, line in enumerate(open(p, encoding="utf-8"), 1):
                        if rx.search(line):
                            bad.append(f"{os.path.relpath(p, REPO)}:{i}: {line.strip()}")
    assert not bad, "layering violated:\n" + "\n".join(bad)


# Task-name comparisons: the Task objects (ppvarlen/tasks) own what differs by task.
TASK_COMPARISON = (r"task\s*[!=]=|[!=]=\s*['\"](seq2seq|classification|tagging|masked_lm)['\"]|"
                   r"\.task\s+(not\s+)?in\s+\(")
TASK_COMPARISON_ALLOWED = {
    "ppvarlen/tasks/__init__.py",  # the registry
    # a declared Data.task checked against the corpus's: validation, no behaviour per task
    "ppvarlen/data/corpora/registry.py: if cfg.task not in (None, built_in.task):",
}


def test_no_task_name_comparisons_outside_the_registry():
    hits = []
    for hit in grep(TASK_COMPARISON, CODE_DIRS + ["benchmarks", "examples"]):
        path, _, line = hit.split(":", 2)
        if path in TASK_COMPARISON_ALLOWED or f"{path}: {line.strip()}" in TASK_COMPARISON_ALLOWED:
            continue
        hits.append(hit)
    assert not hits, ("ask the Task object (ppvarlen.tasks.get_task) instead of comparing task "
                      "names:\n" + "\n".join(hits))


def test_task_comparison_pattern_catches_the_forms_it_names():
    import re

    rx = re.compile(TASK_COMPARISON)
    for line in ('if task == "seq2seq":', "if self.task != x:", 'm["task"] == "tagging"',
                 'if corpus.task in ("a", "b"):', 'x if kind == "classification" else y'):
        assert rx.search(line), line
    for line in ("task = get_task(name)", "if task.pairs:", "tasks == other_tasks_list"):
        assert not rx.search(line), line


def imported_modules(source, module, is_package=False, top_level_only=True):
    """Module names ``source`` (the text of dotted ``module``) imports, relative ones resolved;
    ``from X import name`` counts as both X and X.name (name may be a module).
    ``top_level_only``: what loading the module imports; else every import statement, also one
    inside a function (tests/serve/test_layering_serve.py)."""
    import ast

    tree = ast.parse(source)
    package = module if is_package else module.rsplit(".", 1)[0]
    out = set()
    for node in tree.body if top_level_only else ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[:len(parts) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)
    return out


def _module_level_imports(path, module):
    """Modules ``module`` (dotted) imports when it is loaded: top-level statements only."""
    with open(path, encoding="utf-8") as f:
        return imported_modules(f.read(), module, path.endswith("__init__.py"))


def _ppvarlen_modules():
    mods = {}
    for root, _, files in os.walk(os.path.join(REPO, "ppvarlen")):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(root, f)
                rel = os.path.relpath(path, REPO)[:-3].replace(os.sep, ".")
                mods[rel[:-len(".__init__")] if rel.endswith(".__init__") else rel] = path
    return mods


def test_no_import_cycle_in_ppvarlen():
    """No cycle among module-level imports (a lazy import inside a function is not loaded with
    the module, so it cannot make a partially initialised module visible)."""
    mods = _ppvarlen_modules()
    graph = {}
    for m, p in mods.items():
        deps = set()
        for d in _module_level_imports(p, m):
            while d:  # importing a.b.c first imports the packages a.b and a
                deps.add(d)
                d = d.rpartition(".")[0]
        # a module's own packages are already initialising when it loads
        graph[m] = {d for d in deps if d in mods and d != m and not m.startswith(d + ".")}
    state, cycles = {}, []

    def visit(node, stack):
        state[node] = "open"
        for dep in sorted(graph[node]):
            if state.get(dep) == "open":
                cycles.append(" -> ".join(stack[stack.index(dep):] + [dep]))
            elif dep not in state:
                visit(dep, stack + [dep])
        state[node] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_every_module_imports():
    """Each module imports on its own (in a fresh interpreter, so order cannot hide a cycle)."""
    mods = sorted(_ppvarlen_modules())
    code = ("import importlib, sys\nfor m in sys.argv[1:]:\n"
            "    importlib.import_module(m)\n"
            "    [sys.modules.pop(k) for k in list(sys.modules) if k.startswith('ppvarlen')]\n")
    r = subprocess.run([sys.executable, "-c", code, *mods], capture_output=True, text=True,
                       cwd=REPO, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]


SCRIPT_DIRS = ["ppvarlen", "tools", "deploy", "benchmarks", "examples"]


def test_no_sys_path_edits_in_shipped_scripts():
    """The package is installed (pip install -e .); no script puts the checkout on sys.path."""
    bad = grep(r"sys\.path\.(insert|append|extend)|sys\.path\s*(\+?=|\[)|site\.addsitedir",
               SCRIPT_DIRS)
    assert not bad, "sys.path edits in shipped scripts:\n" + "\n".join(bad)


# ------------------------------------------------------------ task fields in generic layers
# The generic layers iterate over what a task declares (its store Fields, input/output specs);
# they name no task's field.  The names are collected FROM the registered tasks' declarations,
# minus the token-row contract every task shares (the base Task's: ids, lengths, doc id).
GENERIC_DIRS = ["ppvarlen/data", "ppvarlen/export", "ppvarlen/runtime", "ppvarlen/serve",
                "ppvarlen/engine"]
# corpus readers: they define the corpora's line formats ({"text", "label"}, {"tokens", "tags"}),
# which are the corpora's keys, not a task's item fields
CORPUS_READERS = ("ppvarlen/data/corpora/", "ppvarlen/data/readers.py", "ppvarlen/data/splits.py",
                  "ppvarlen/data/sources.py",  # raw corpus lines: their keys, not item fields
                  "ppvarlen/data/columns.py")  # the corpus keys' column names in users' files
# remaining (file, name) uses, each with its reason; the test fails when one is added AND when
# one disappears (then delete it here), so the list only shrinks
KNOWN_FIELD_NAMES = {
    ("ppvarlen/serve/protocols/predict/routes.py", "labels"): "/health key listing the label names",
    ("ppvarlen/export/precision_speed.py", "tokens"): "a timing report's token count key",
    ("ppvarlen/export/exporter.py", "label"): "pretrained-dir verify file format (docstring)",
    ("ppvarlen/export/exporter.py", "tags"): "pretrained-dir verify file format (docstring)",
    ("ppvarlen/export/exporter.py", "tokens"): "seq2seq's greedy export view (GreedyView)",
    ("ppvarlen/export/parity.py", "src_ids"): "seq2seq's decoded-ids parity (verify_greedy)",
    ("ppvarlen/export/parity.py", "src_len"): "seq2seq's decoded-ids parity (verify_greedy)",
    ("ppvarlen/export/parity.py", "tokens"): "seq2seq's decoded-ids parity (verify_greedy)",
    ("ppvarlen/runtime/backends.py", "src_ids"): "seq2seq's greedy ONNX engine (OnnxGreedyEngine)",
    ("ppvarlen/runtime/backends.py", "src_len"): "seq2seq's greedy ONNX engine (OnnxGreedyEngine)",
    ("ppvarlen/runtime/backends.py", "tokens"): "seq2seq's greedy ONNX engine (OnnxGreedyEngine)",
    ("ppvarlen/serve/protocols/openai/routes.py", "embedding"): "the OpenAI API's own names (data[i]."
    "embedding, \"object\": \"embedding\")",
}


def declared_names(task):
    """Every name a task declares: store fields and their batch keys, exported inputs/outputs."""
    names = set()
    for f in task.store_fields():
        key = f.key or f.name
        names.update(n for n in (f.name, key, f.lengths) if n)
        if f.shift:
            names.update({key + "_in", key + "_out"})
    names.update(s["name"] for s in task.input_specs + task.output_specs)
    return names


def task_field_names():
    from ppvarlen.tasks import TASKS
    from ppvarlen.tasks.base import Task

    contract = declared_names(Task())
    return {name: sorted(t for t, cls in TASKS.items() if name in declared_names(cls()))
            for cls in TASKS.values() for name in declared_names(cls()) - contract}


def field_literal_hits(names, dirs=GENERIC_DIRS):
    rx = re.compile(r"[\"'](%s)[\"']" % "|".join(map(re.escape, sorted(names))))
    hits = {}
    for path in code_files(dirs):
        rel = os.path.relpath(path, REPO)
        if rel.startswith(CORPUS_READERS):
            continue
        for i, line in enumerate(open(path, encoding="utf-8"), 1):
            for m in rx.finditer(line):
                hits.setdefault((rel, m.group(1)), []).append(f"{rel}:{i}: {line.strip()}")
    return hits


def test_generic_layers_name_no_task_field():
    names = task_field_names()
    assert len(names) >= 5, names  # tagging, classification, seq2seq declare fields of their own
    hits = field_literal_hits(names)
    new = {k: v for k, v in hits.items() if k not in KNOWN_FIELD_NAMES}
    assert not new, ("a generic module names a task's field (declare it on the Task and "
                     "iterate over the declaration):\n" +
                     "\n".join(f"{line}  [{k[1]}: declared by {names[k[1]]}]"
                               for k, lines in new.items() for line in lines))
    gone = sorted(set(KNOWN_FIELD_NAMES) - set(hits))
    assert not gone, f"no longer used, remove from KNOWN_FIELD_NAMES: {gone}"


def test_task_field_check_catches_a_planted_name(tmp_path):
    """The check can fail: a module naming a declared field is found."""
    names = task_field_names()
    name = sorted(names)[0]
    planted = tmp_path / "ppvarlen_fake" / "collate.py"
    planted.parent.mkdir()
    planted.write_text(f'batch[{name!r}] = pad(rows)\nother = "not_a_field"\n')
    hits = field_literal_hits(names, [str(planted.parent)])
    assert [k[1] for k in hits] == [name]


# ------------------------------------------------------------ imports at the top
# Imports go at the top of their module.  An import inside a function is allowed only at a
# documented boundary: (module path glob, imported module(s), why it must stay lazy).  An entry
# that no import uses any more fails the test too (delete it then), so the list only shrinks.
PADDLE_FREE = "the serving path (runtime, serve, tasks, data) imports without paddle"
LAZY_IMPORTS = [
    ("ppvarlen/cli.py", ("ppvarlen.engine", "ppvarlen.export.exporter",
                         "ppvarlen.export.gpu_check", "ppvarlen.length_report",
                         "ppvarlen.serve.server", "ppvarlen.serve.bench",
                         "ppvarlen.doctor.diagnose"),
     "one import of the command's module when it runs: --help and config errors stay instant "
     "and paddle-free (tests/test_cli.py)"),
    ("ppvarlen/runtime/*", ("paddle",), PADDLE_FREE + "; Paddle Inference loads when it runs"),
    ("ppvarlen/tasks/*", ("paddle",), PADDLE_FREE + "; only training/eval calls need paddle"),
    ("ppvarlen/models/__init__.py", ("ppvarlen.models.weights",),
     "`import ppvarlen.models` (the registry) stays paddle-free: config checks need no paddle"),
    ("ppvarlen/*", ("paddlenlp",), "PaddleNLP's import takes seconds and imports paddle: only "
     "where a PaddleNLP model or tokenizer is used"),
    ("ppvarlen/*", ("onnxruntime", "paddle2onnx", "onnxconverter_common"),
     "ONNX libraries: loaded when an ONNX file is written, converted or run, not by a "
     "Paddle-only export or server (paddle2onnx also imports paddle)"),
    ("ppvarlen/*", ("ray",), "optional extra ppvarlen[ray]"),
    ("ppvarlen/*", ("pyarrow",), "optional extra ppvarlen[parquet]: Parquet input and "
     "embedding output only"),
    ("ppvarlen/engine/logbook.py", ("visualdl",), "optional: Train.visualdl only"),
    ("ppvarlen/*", ("matplotlib",), "about a second to import, for an optional PNG only"),
]


def function_imports(paths):
    """[(relative path, line, function, absolute imported module)] of every import statement
    inside a function body (nested functions and methods included)."""
    import ast

    found = []
    for path in paths:
        rel = os.path.relpath(path, REPO)
        module = rel[:-3].replace(os.sep, ".")
        package = module.rsplit(".", 1)[0]  # __init__.py: the package itself

        def visit(node, function):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                    visit(child, getattr(child, "name", "<lambda>"))
                elif isinstance(child, (ast.Import, ast.ImportFrom)) and function:
                    if isinstance(child, ast.Import):
                        names = [a.name for a in child.names]
                    elif child.level:  # relative: resolve against the module's package
                        parts = package.split(".")
                        base = ".".join(parts[:len(parts) - child.level + 1])
                        names = ([f"{base}.{child.module}"] if child.module else
                                 [f"{base}.{a.name}" for a in child.names])
                    else:
                        names = [child.module]
                    found.extend((rel, child.lineno, function, n) for n in names)
                else:
                    visit(child, function)

        visit(ast.parse(open(path, encoding="utf-8").read()), None)
    return found


def lazy_import_reason(rel, imported, allowed=LAZY_IMPORTS):
    """The allowlist entry (index) that lets ``rel`` import ``imported`` in a function, or None."""
    import fnmatch

    for i, (where, modules, _) in enumerate(allowed):
        if fnmatch.fnmatch(rel, where) and any(
                m == "*" or imported == m or imported.startswith(m + ".") for m in modules):
            return i
    return None


def test_imports_are_at_the_top_except_at_documented_boundaries():
    hits = function_imports(code_files(["ppvarlen"]))
    used = {lazy_import_reason(rel, imported) for rel, _, _, imported in hits}
    bad = [f"{rel}:{line}: `{imported}` imported inside {function}()"
           for rel, line, function, imported in hits if lazy_import_reason(rel, imported) is None]
    assert not bad, (
        "imports inside functions:\n" + "\n".join(bad) + "\nMove each to the top of its module. "
        "If one must stay lazy (the paddle-free serving path, an optional extra, a command "
        "module of cli.py), add an entry (module glob, imported module, reason) to LAZY_IMPORTS "
        "in tests/test_hygiene.py, with the reason in one line.")
    unused = [entry[:2] for i, entry in enumerate(LAZY_IMPORTS) if i not in used]
    assert not unused, f"no function imports these any more; delete from LAZY_IMPORTS: {unused}"


def test_function_import_scan_finds_the_forms_it_names(tmp_path):
    planted = tmp_path / "mod.py"
    planted.write_text("import os\n\n\ndef f():\n    import json\n    from . import sib\n\n\n"
                       "class C:\n    import re\n\n    def m(self):\n        from ..up import x\n"
                       "        return lambda: __import__('ast')\n")
    found = [(line, fn, mod) for _, line, fn, mod in function_imports([str(planted)])]
    package = os.path.relpath(str(tmp_path), REPO).replace(os.sep, ".")
    assert found == [(5, "f", "json"), (6, "f", package + ".sib"),
                     (13, "m", package.rsplit(".", 1)[0] + ".up")]
    assert lazy_import_reason("ppvarlen/tasks/base.py", "paddle.nn") is not None
    assert lazy_import_reason("ppvarlen/engine/trainer.py", "paddle") is None
    assert lazy_import_reason("ppvarlen/engine/trainer.py", "rayon") is None
