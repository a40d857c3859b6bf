"""Mutation testing (mutmut 3) of the modules whose mistakes lose data or padding silently.

    nice -n 10 python benchmarks/mutation.py                      # every module, one at a time
    nice -n 10 python benchmarks/mutation.py longtext collate     # some modules
    nice -n 10 python benchmarks/mutation.py order --sample 120   # a seeded uniform sample
    python benchmarks/mutation.py --list                          # modules and their test files
    python benchmarks/mutation.py --table                         # the summary as markdown
    python benchmarks/mutation.py --rescore order                 # re-count after listing equivalents
        [--json output/bench/mutation.json] [--workdir mutants] [--max-children 1]
        [--sample N --seed S]

Each module runs in a scratch copy of the project (``<workdir>/<module>/``, gitignored) with a
``setup.cfg [mutmut]`` written for it: only that module's file(s) are mutated and only its
test files run, so one module's slow tests never multiply into another's run.  mutmut copies
the scratch project into ``mutants/`` there and runs each mutant's covering tests in a forked
process.  Prints the kill rate per module and writes a JSON summary; surviving mutants are
listed (``mutmut show NAME`` in the module's scratch dir prints the diff).  Equivalent
mutants, with the reason, are listed in benchmarks/mutation_equivalents.json (and explained in
docs/mutation/<module>.md); a surviving mutant listed there counts as "equivalent", and the
rate excluding equivalents is reported next to the raw one.  The JSON summary keeps the rows
of modules not run this time, so modules can be run one per invocation.

``--sample N`` runs a uniform random sample of N mutants per module
(``random.Random(seed).sample`` over the sorted mutant names): mutmut first generates every
mutant and records which tests cover which function (a run filtered to a name that matches
nothing), then runs only the sampled names.  The rate is then an estimate for the module.

The kill rate counts killed (a test failed), timeout and segfault as killed; survived and
"no tests" (no test reaches the mutated function) as not killed; suspicious/skipped apart.
"""
import argparse
import fnmatch
import json
import os
import random
import shutil
import subprocess
import sys
import time
from importlib.metadata import version

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# module name -> (files mutated, test files run against them)
MODULES = {
    "longtext": (["ppvarlen/data/longtext.py"],
                 ["tests/data/test_longtext.py", "tests/data/test_longtext_edges.py"]),
    "collate": (["ppvarlen/data/collate.py"],
                ["tests/data/test_collate.py", "tests/data/test_collate_edges.py"]),
    "batcher": (["ppvarlen/serve/batcher.py"],
                ["tests/serve/test_batcher.py", "tests/serve/test_batcher_edges.py"]),
    "tagging": (["ppvarlen/tasks/tagging.py", "ppvarlen/data/tagschemes.py"],
                ["tests/data/test_tagschemes.py", "tests/tasks/test_tagging_task.py",
                 "tests/tasks/test_tagging_edges.py"]),
    "order": (["ppvarlen/data/order.py"],
              ["tests/data/test_samplers.py", "tests/data/test_sampler_reference.py",
               "tests/data/test_order_edges.py"]),
    "samplers": (["ppvarlen/data/samplers.py"],
                 ["tests/data/test_samplers.py", "tests/data/test_sampler_reference.py"]),
}
# Mutants scored per module when not all of its files' functions are in scope (fnmatch on
# mutant names): tasks/tagging.py is mutated for its chunk path only -- the chunks as
# character offsets in an answer (entities, response, answer_counts), the per-document chunk
# report and the windowed labels; its model, schema and health plumbing are not in scope.
SCOPE = {"tagging": ["ppvarlen.data.tagschemes.*",
                     "ppvarlen.tasks.tagging.x_entities__mutmut_*",
                     *(f"ppvarlen.tasks.tagging.x\u01c1TaggingTask\u01c1{method}__mutmut_*"
                       for method in ("example_ids", "window_item", "report", "response",
                                      "answer_counts"))]}
# Per-test wall limit (s): a mutant that deadlocks a worker thread uses no CPU, so only this
# ends it.  The batcher's tests take well under a second each; 20 s spares the run from
# waiting a minute per deadlocked mutant while leaving a loaded host room.
TEST_TIMEOUT = {"batcher": 20}
EQUIVALENTS = os.path.join(REPO, "benchmarks", "mutation_equivalents.json")
# matches no mutant: ``mutmut run`` generates the tree and collects the stats, then stops
NO_MUTANT = "no-such-mutant-*"
# What the tests read besides ppvarlen/ and tests/ (mutmut copies tests/ itself).
ALSO_COPY = ["pytest.ini", "setup.py", "configs", "deploy", "docs", "README.md", "tools",
             "benchmarks", "examples", ".ci"]
KILLED = {"killed", "timeout", "segfault"}
NOT_KILLED = {"survived", "no tests"}


def write_project(workdir, name):
    """A scratch copy of the project with the [mutmut] section for module ``name``."""
    files, tests = MODULES[name]
    proj = os.path.join(workdir, name)
    if os.path.isdir(proj):
        shutil.rmtree(proj)
    # mutants/ exists before mutmut starts: a PYTHONPATH entry that does not exist yet is
    # cached as "nothing here", and the tests would import the editable install's ppvarlen
    os.makedirs(os.path.join(proj, "mutants"))
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache", ".hypothesis")
    for item in ["ppvarlen", "tests", *ALSO_COPY]:
        src = os.path.join(REPO, item)
        if os.path.isdir(src):
            shutil.copytree(src, os.path.join(proj, item), ignore=ignore)
        elif os.path.exists(src):
            shutil.copy2(src, os.path.join(proj, item))
    missing = [t for t in tests if not os.path.exists(os.path.join(REPO, t))]
    if missing:
        raise SystemExit(f"{name}: test file(s) {missing} do not exist; fix MODULES in {__file__}")
    lines = ["[mutmut]", "source_paths = ppvarlen",
             "only_mutate =", *(f"    {f}" for f in files),
             "also_copy =", *(f"    {a}" for a in ALSO_COPY if os.path.exists(os.path.join(REPO, a))),
             "pytest_add_cli_args_test_selection =", *(f"    {t}" for t in tests),
             # A mutant that deadlocks (a batcher worker that never wakes) uses no CPU, so
             # mutmut's CPU-time limit never fires: a per-test wall limit ends it (counted
             # killed).  A mutant that spins hits the CPU limit, kept small (multiplier 3).
             # Ordering is mutmut's business (it passes -p no:randomly).
             "pytest_add_cli_args =", "    -p", "    no:cacheprovider", "    -o",
             f"    timeout={TEST_TIMEOUT.get(name, 60)}",
             "timeout_multiplier = 3",
             ""]
    with open(os.path.join(proj, "setup.cfg"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines))
    return proj


def mutmut_env(proj):
    env = dict(os.environ)
    # tests that start subprocesses must import the mutated copy, never this checkout
    env["PYTHONPATH"] = os.path.join(proj, "mutants")
    env.setdefault("CUDA_VISIBLE_DEVICES", "")
    return env


def results(proj, env):
    """{mutant name: status} from ``mutmut results --all true``."""
    r = subprocess.run([sys.executable, "-m", "mutmut", "results", "--all", "true"], cwd=proj,
                       env=env, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise SystemExit(f"mutmut results failed in {proj}:\n{r.stdout}\n{r.stderr}")
    status = {}
    for line in r.stdout.splitlines():
        if ":" in line:
            mutant, _, state = line.strip().rpartition(":")
            status[mutant.strip()] = state.strip()
    return status


def mutmut_run(proj, env, names, max_children, timeout):
    """``mutmut run [names]``, its output appended to ``<proj>/mutmut-run.log``."""
    log_path = os.path.join(proj, "mutmut-run.log")
    with open(log_path, "a", encoding="utf-8") as log:
        log.write(f"\n=== mutmut run {' '.join(names[:5])}{' ...' if len(names) > 5 else ''}\n")
        log.flush()
        r = subprocess.run([sys.executable, "-m", "mutmut", "run", "--max-children",
                            str(max_children), *names], cwd=proj, env=env, stdout=log,
                           stderr=subprocess.STDOUT, timeout=timeout)
    with open(log_path, encoding="utf-8", errors="replace") as log:
        text = log.read()
    return r.returncode, text


def generate(proj, env, max_children, timeout):
    """Generate the mutants and collect the per-test stats without running any mutant."""
    # a second pass in case mutmut 3.8 records no test on a fresh tree (it "stops early")
    for _ in range(2):
        code, text = mutmut_run(proj, env, [NO_MUTANT], max_children, timeout)
        tail = text.rsplit("=== mutmut run", 1)[-1]
        if "nothing matches" in tail:
            return
    raise SystemExit(f"mutmut could not generate the mutants (exit {code}); see "
                     f"{os.path.join(proj, 'mutmut-run.log')}")


def load_equivalents():
    with open(EQUIVALENTS, encoding="utf-8") as f:
        return json.load(f)


def in_scope_of(name, mutants):
    return [m for m in mutants if any(fnmatch.fnmatchcase(m, p) for p in SCOPE.get(name, ["*"]))]


def run_module(name, workdir, max_children, timeout, sample=0, seed=20261202):
    proj = write_project(workdir, name)
    env = mutmut_env(proj)
    start = time.monotonic()
    generate(proj, env, max_children, timeout)
    in_scope = in_scope_of(name, sorted(results(proj, env)))
    chosen = in_scope
    if sample and sample < len(in_scope):
        chosen = sorted(random.Random(seed).sample(in_scope, sample))
    # in chunks: a command line of hundreds of names is fine, thousands may not be
    for i in range(0, len(chosen), 200):
        code, _ = mutmut_run(proj, env, chosen[i:i + 200], max_children, timeout)
        if code != 0:
            raise SystemExit(f"{name}: mutmut run exited {code}; see "
                             f"{os.path.join(proj, 'mutmut-run.log')}")
    row = score(name, proj, seed)
    row["seconds"] = round(time.monotonic() - start, 1)
    return row


def score(name, proj, seed):
    """The summary row of module ``name`` from the mutmut results in its scratch dir: every
    in-scope mutant that was run (a sample when not all of them were)."""
    status = results(proj, mutmut_env(proj))
    generated = len(status)
    in_scope = in_scope_of(name, sorted(status))
    chosen = [m for m in in_scope if status[m] != "not checked"]
    status = {m: status[m] for m in chosen}
    equivalent = load_equivalents().get(name, {})
    counts = {}
    for m, s in status.items():
        if s in NOT_KILLED and m in equivalent:
            s = "equivalent"
        counts[s] = counts.get(s, 0) + 1
    killed = sum(counts.get(s, 0) for s in KILLED)
    not_killed = sum(counts.get(s, 0) for s in NOT_KILLED)
    n_equivalent = counts.get("equivalent", 0)
    scored = killed + not_killed + n_equivalent
    return {"module": name, "files": MODULES[name][0], "tests": MODULES[name][1],
            "scope": SCOPE.get(name), "mutants_generated": generated,
            "mutants_in_scope": len(in_scope), "mutants_run": len(chosen),
            "sample": {"size": len(chosen), "seed": seed} if len(chosen) < len(in_scope)
            else None,
            "killed": killed, "equivalent": n_equivalent, "not_killed": not_killed,
            "scored": scored,
            "kill_rate": round(killed / scored, 4) if scored else None,
            "kill_rate_excluding_equivalent":
                round(killed / (scored - n_equivalent), 4) if scored > n_equivalent else None,
            "counts": counts,
            "not_killed_names": sorted(m for m, s in status.items()
                                       if s in NOT_KILLED and m not in equivalent),
            "equivalent_names": sorted(m for m, s in status.items()
                                       if s in NOT_KILLED and m in equivalent),
            "workdir": os.path.relpath(proj, REPO)}


def pct(rate):
    return "  n/a" if rate is None else f"{100 * rate:5.1f}%"


def cpu_model():
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next((line.split(":", 1)[1].strip() for line in f
                         if line.startswith("model name")), "unknown")
    except OSError:
        return "unknown"


def mutmut_version():
    return version("mutmut")


def write_json_atomic(path, data):
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def markdown_table(rows):
    lines = ["| module | mutants run | killed (timeout) | survived / no tests | equivalent | "
             "kill rate | excluding equivalents |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        run = str(r["mutants_run"])
        if r["sample"]:
            run += f" (sample of {r['mutants_in_scope']}, seed {r['sample']['seed']})"
        elif r["mutants_in_scope"] != r["mutants_generated"]:
            run += f" (in scope, of {r['mutants_generated']})"
        timeouts = r["counts"].get("timeout", 0) + r["counts"].get("segfault", 0)
        lines.append(f"| {r['module']} | {run} | {r['killed']} ({timeouts}) | "
                     f"{r['not_killed']} | {r['equivalent']} | {pct(r['kill_rate']).strip()} | "
                     f"{pct(r['kill_rate_excluding_equivalent']).strip()} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("modules", nargs="*", help=f"default: all of {list(MODULES)}")
    parser.add_argument("--list", action="store_true", help="print modules and test files")
    parser.add_argument("--table", action="store_true",
                        help="print the --json summary as a markdown table (runs nothing)")
    parser.add_argument("--workdir", default=os.path.join(REPO, "mutants"))
    parser.add_argument("--json", default=os.path.join(REPO, "output", "bench", "mutation.json"),
                        help="the summary (gitignored); the one docs/mutation/ shows is "
                             "docs/assets/mutation.json")
    parser.add_argument("--max-children", type=int, default=1,
                        help="parallel mutant workers (default 1: one core, machine is shared)")
    parser.add_argument("--timeout", type=float, default=4 * 3600,
                        help="seconds one module's mutmut run may take")
    parser.add_argument("--sample", type=int, default=0,
                        help="run a uniform random sample of this many mutants per module "
                             "(default 0: every mutant)")
    parser.add_argument("--seed", type=int, default=20261202, help="seed of --sample")
    parser.add_argument("--rescore", action="store_true",
                        help="recompute the summary rows from the mutmut results already in "
                             "--workdir (after editing the equivalents file; runs nothing)")
    args = parser.parse_args(argv)
    if args.list:
        for name, (files, tests) in MODULES.items():
            print(f"{name:10s} {' '.join(files)}  <-  {' '.join(tests)}")
        return 0
    if args.table:
        with open(args.json, encoding="utf-8") as f:
            print(markdown_table(json.load(f)["modules"]))
        return 0
    unknown = [m for m in args.modules if m not in MODULES]
    if unknown:
        parser.error(f"unknown module(s) {unknown}; known: {list(MODULES)}")
    summary = {}
    if os.path.exists(args.json):  # keep the rows of the modules not run this time
        with open(args.json, encoding="utf-8") as f:
            summary = {row["module"]: row for row in json.load(f)["modules"]}
    for name in args.modules or list(MODULES):
        if args.rescore:
            old = summary.get(name, {})
            row = score(name, os.path.join(args.workdir, name),
                        (old.get("sample") or {}).get("seed", args.seed))
            row["seconds"], row["cpu"] = old.get("seconds"), old.get("cpu")
        else:
            row = run_module(name, args.workdir, args.max_children, args.timeout, args.sample,
                             args.seed)
            row["cpu"] = cpu_model()
        summary[name] = row
        print(f"{name:10s} kill rate {pct(row['kill_rate'])} raw, "
              f"{pct(row['kill_rate_excluding_equivalent'])} excluding equivalents  "
              f"({row['killed']}/{row['scored']} killed of {row['mutants_run']} run; "
              f"{row['counts']}; {row['seconds'] or 0:.0f} s)", flush=True)
        for m in row["not_killed_names"]:
            print(f"    not killed: {m}")
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    rows = [summary[m] for m in MODULES if m in summary]
    write_json_atomic(args.json, {"mutmut": mutmut_version(), "modules": rows})
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
