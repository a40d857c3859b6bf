"""Mutation testing (mutmut 3) of the modules whose mistakes lose data or padding silently.

    nice -n 10 python benchmarks/mutation.py                      # every module, one at a time
    nice -n 10 python benchmarks/mutation.py longtext collate     # some modules
    python benchmarks/mutation.py --list                          # modules and their test files
        [--json output/mutation/summary.json] [--workdir mutants] [--max-children 1]

Each module runs in a scratch copy of the project (``<workdir>/<module>/``, gitignored) with a
``setup.cfg [mutmut]`` written for it: only that module's file(s) are mutated and only its
test files run, so one module's slow tests never multiply into another's run.  mutmut copies
the scratch project into ``mutants/`` there and runs each mutant's covering tests in a forked
process.  Prints the kill rate per module and writes a JSON summary; surviving mutants are
listed (``mutmut show NAME`` in the module's scratch dir prints the diff).  Equivalent
mutants, with the reason, are listed in docs/mutation/<module>.md.

The kill rate counts killed (a test failed), timeout and segfault as killed; survived and
"no tests" (no test reaches the mutated function) as not killed; suspicious/skipped apart.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# module name -> (files mutated, test files run against them)
MODULES = {
    "longtext": (["ppvarlen/data/longtext.py"],
                 ["tests/test_longtext.py", "tests/test_longtext_edges.py"]),
    "collate": (["ppvarlen/data/collate.py"],
                ["tests/test_collate.py", "tests/test_collate_edges.py"]),
    "batcher": (["ppvarlen/deploy/batcher.py"],
                ["tests/test_deploy_batcher.py", "tests/test_batcher_edges.py"]),
    "tagging": (["ppvarlen/tasks/tagging.py", "ppvarlen/data/tagschemes.py"],
                ["tests/test_tagschemes.py", "tests/test_tagging_task.py"]),
    "order": (["ppvarlen/data/order.py"], ["tests/test_samplers.py"]),
    "samplers": (["ppvarlen/data/samplers.py"], ["tests/test_samplers.py"]),
}
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
    os.makedirs(proj)
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
             # mutmut's CPU-time limit never fires: a 60 s per-test wall limit ends it (counted
             # killed).  A mutant that spins hits the CPU limit, kept small (multiplier 3).
             # Ordering is mutmut's business (it passes -p no:randomly).
             "pytest_add_cli_args =", "    -p", "    no:cacheprovider", "    -o", "    timeout=60",
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


def run_module(name, workdir, max_children, timeout):
    proj = write_project(workdir, name)
    env = mutmut_env(proj)
    start = time.monotonic()
    log_path = os.path.join(proj, "mutmut-run.log")
    # mutmut 3.8 on a fresh mutants/ tree records no test for any mutant on its first pass
    # (it stops "early"); the second pass over the generated tree collects the stats.
    for attempt in range(2):
        with open(log_path, "a", encoding="utf-8") as log:
            r = subprocess.run([sys.executable, "-m", "mutmut", "run", "--max-children",
                                str(max_children)], cwd=proj, env=env, stdout=log,
                               stderr=subprocess.STDOUT, timeout=timeout)
        with open(log_path, encoding="utf-8", errors="replace") as log:
            stopped_early = "Stopping early" in log.read()
        if r.returncode == 0 or not stopped_early:
            break
        os.replace(log_path, log_path + ".first")
    seconds = time.monotonic() - start
    if r.returncode != 0:
        raise SystemExit(f"{name}: mutmut run exited {r.returncode}; see "
                         f"{os.path.join(proj, 'mutmut-run.log')}")
    status = results(proj, env)
    counts = {}
    for s in status.values():
        counts[s] = counts.get(s, 0) + 1
    killed = sum(counts.get(s, 0) for s in KILLED)
    scored = killed + sum(counts.get(s, 0) for s in NOT_KILLED)
    return {"module": name, "files": MODULES[name][0], "tests": MODULES[name][1],
            "mutants": len(status), "killed": killed, "scored": scored,
            "kill_rate": round(killed / scored, 4) if scored else None, "counts": counts,
            "not_killed": sorted(m for m, s in status.items() if s in NOT_KILLED),
            "seconds": round(seconds, 1), "workdir": proj}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("modules", nargs="*", help=f"default: all of {list(MODULES)}")
    parser.add_argument("--list", action="store_true", help="print modules and test files")
    parser.add_argument("--workdir", default=os.path.join(REPO, "mutants"))
    parser.add_argument("--json", default=os.path.join(REPO, "output", "mutation", "summary.json"))
    parser.add_argument("--max-children", type=int, default=1,
                        help="parallel mutant workers (default 1: one core, machine is shared)")
    parser.add_argument("--timeout", type=float, default=4 * 3600,
                        help="seconds one module's mutmut run may take")
    args = parser.parse_args(argv)
    if args.list:
        for name, (files, tests) in MODULES.items():
            print(f"{name:10s} {' '.join(files)}  <-  {' '.join(tests)}")
        return 0
    unknown = [m for m in args.modules if m not in MODULES]
    if unknown:
        parser.error(f"unknown module(s) {unknown}; known: {list(MODULES)}")
    summary = []
    for name in args.modules or list(MODULES):
        row = run_module(name, args.workdir, args.max_children, args.timeout)
        summary.append(row)
        rate = "n/a" if row["kill_rate"] is None else f"{100 * row['kill_rate']:.1f}%"
        print(f"{name:10s} kill rate {rate:>6s}  ({row['killed']}/{row['scored']} killed; "
              f"{row['counts']}; {row['seconds']:.0f} s)", flush=True)
        for m in row["not_killed"]:
            print(f"    not killed: {m}")
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    tmp = args.json + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"modules": summary}, f, indent=1)
    os.replace(tmp, args.json)
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
