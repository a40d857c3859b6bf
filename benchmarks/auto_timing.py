"""Does ``auto``'s timing rank the engines as serving does?  Its two workloads side by side.

    python benchmarks/auto_timing.py --export output/bench/prec_serve_eb68/export_serve \\
        [--rounds 2] [--budget-s 10] [--threads 2] [--out output/bench/auto_timing]

``--backend auto`` / ``--precision auto`` time every candidate (each backend's verified
precisions) on the batches of what the caller will run (``precision_choice.WORKLOADS``):

* ``files`` (``ppvarlen-infer``, a library caller's ``Predictor``): the admission batches, the
  admission check's smoke rows and, per length of the export's grid, 4 rows of which 3 have
  random lengths up to ``max_len``, so nearly every batch is padded to about ``max_len``;
* ``requests`` (a server): lengths drawn from the manifest's ``length_profile`` (half up to p50,
  45% between p50 and p95, 4% to p99, 1% to max, uniform within each band, seeded), sorted and
  cut into groups of 1, 2 and 4 texts in turn (what the length-aware batcher forms for a few
  concurrent callers), random ids.

Each (round, workload) is one ``precision_choice.choose`` in a fresh process (Paddle's oneDNN
shape cache is per process), workloads alternating, the order turned each round.  Prints each
candidate's texts per CPU second and its ratio to ONNX fp32 per run; compare them with the
served ratios of ``precision_throughput.py --serve`` on the same export.  Writes
``OUT/auto_timing.json`` and ``.png``.  One run, ratios side by side; no pass/fail gate.
"""
import argparse
import functools
import json
import os
import subprocess
import sys
import time

from machine import machine
from plots import rounds_chart

from ppvarlen.runtime import precision_choice
from ppvarlen.runtime.precision_choice import WORKLOADS
from ppvarlen.runtime.predictor import Predictor
from ppvarlen.utils.io import atomic_write_json, reap_dead_owners

def child(args):
    """One ``choose`` on ``args.workload``: its texts/CPU-s per candidate as JSON on stdout."""
    precision_choice.TIME_BUDGET_S = args.budget_s
    choice = precision_choice.choose(functools.partial(Predictor, backend="auto",
                                                       threads=args.threads), args.export,
                                     workload=args.workload)
    print(json.dumps(choice))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--export", required=True, help="an export with both backends")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--budget-s", type=float, default=10.0,
                    help="timing budget of each choose (auto's own: 3 s)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="output/bench/auto_timing")
    ap.add_argument("--workload", choices=list(WORKLOADS), help=argparse.SUPPRESS)  # a child's
    args = ap.parse_args()
    if args.workload:
        return child(args)
    os.makedirs(args.out, exist_ok=True)
    reap_dead_owners(args.out)  # a killed run's half-written JSON or PNG
    runs = []
    order = list(WORKLOADS)
    for rnd in range(args.rounds):
        for workload in order:
            cmd = [sys.executable, os.path.abspath(__file__), "--export", args.export,
                   "--budget-s", str(args.budget_s), "--threads", str(args.threads),
                   "--workload", workload]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
            if done.returncode != 0:
                raise SystemExit(f"{workload}: the timing child failed: {done.stderr[-2000:]}")
            choice = json.loads(done.stdout.strip().splitlines()[-1])
            speeds = choice["texts_per_cpu_s"]
            ref = speeds.get("onnx fp32")
            run = {"round": rnd + 1, "workload": workload, "texts_per_cpu_s": speeds,
                   "vs_onnx_fp32": {k: round(v / ref, 2) for k, v in speeds.items()} if ref
                   else None, "chose": f"{choice['backend']} {choice['precision']}",
                   "loadavg_1m": round(os.getloadavg()[0], 2)}
            runs.append(run)
            print(f"round {rnd + 1} {workload}: chose {run['chose']}; texts/CPU-s {speeds}; "
                  f"x ONNX fp32 {run['vs_onnx_fp32']}", flush=True)
        order.reverse()
    result = {"export": args.export, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "machine": machine(), "budget_s": args.budget_s, "threads": args.threads,
              "runs": runs}
    atomic_write_json(os.path.join(args.out, "auto_timing.json"), result)
    plot(result, os.path.join(args.out, "auto_timing.png"))


def plot(result, path):
    runs = [r for r in result["runs"] if r["vs_onnx_fp32"]]
    names = sorted({k for r in runs for k in r["vs_onnx_fp32"]})
    rounds_chart(
        path, [(n, n) for n in names], [(w, w) for w in WORKLOADS],
        lambda workload, name: [r["vs_onnx_fp32"][name] for r in runs
                                if r["workload"] == workload and name in r["vs_onnx_fp32"]],
        "texts per CPU-s / ONNX fp32's (dots: rounds)",
        f"auto's timing workloads, {result['machine']['cpu_model']}, {result['date']}")


if __name__ == "__main__":
    main()
