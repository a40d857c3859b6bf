"""What a Paddle oneDNN server plans with after starting on a busy host, and what it then serves.

    python benchmarks/busy_start.py --export output/bench/prec_serve_epyc_f/export_serve \\
        --variant before=/tmp/ppv_before --variant after=. [--precision bf16] \\
        [--concurrency 8 32] [--duration-s 30] [--rounds 2] [--out output/bench/busy_start]

A Paddle oneDNN server runs its batches on a grid of held shapes and plans them with each
shape's time measured at start-up (docs/PRECISION.md, Memory).  Here each ``--variant
NAME=CHECKOUT`` (a ppvarlen checkout, e.g. ``git archive main | tar -x -C DIR``) starts
``ppvarlen-serve --backend paddle`` on ``--export`` while ``--burners`` processes take the
CPU in bursts (``--burst-s`` busy, ``--gap-s`` idle, a seeded random phase each): the
variants one after the other under the same schedule, then one more server of the last
variant, ``quiet``, with the burners stopped (the reference).  Then closed-loop clients, one
real review of the export's test split per request, drive the servers interleaved (round,
concurrency, then every server back to back, the order turned each round); per point:
texts/s, the mean batch and the server's CPU seconds per text.

The JSON keeps each server's grid times from its ready line (what it started planning with)
and, where the checkout exposes them, ``/metrics.json``'s ``shape_grid_ms`` after the run
(what it plans with now); ``OUT/busy_start.json`` and ``.png``.  One run, ratios side by
side; nothing here is a pass/fail gate.
"""
import argparse
import multiprocessing
import os
import random
import re
import statistics
import time

import httpx

import precision_throughput as pt  # the sibling benchmark: one closed-loop point
from machine import machine
from plots import rounds_chart

from ppvarlen.serve import bench
from ppvarlen.utils.io import atomic_write_json, reap_dead_owners

READY_TIMES = re.compile(r"rows x width: ([^)]*)\)")


def burn(burst_s, gap_s, phase_s, stop):
    """Spin for ``burst_s``, sleep ``gap_s``, from ``phase_s`` on, until ``stop`` is set."""
    time.sleep(phase_s)
    while not stop.is_set():
        end = time.perf_counter() + burst_s
        while time.perf_counter() < end:
            pass
        stop.wait(gap_s)


def start_server(name, checkout, export, precision, threads, work, timeout_s=900):
    """``serve.py`` of ``checkout`` on ``export`` -> (process, url, log path) once /health
    answers."""
    log_path = os.path.join(work, f"serve_{name}.log")
    try:
        proc, url = bench.start_server(export, "paddle", {"threads": threads}, bench.free_port(),
                                       timeout_s, log_path=log_path,
                                       args=("--precision", precision), repo=checkout)
    except RuntimeError as e:
        raise SystemExit(f"{name}: {e}") from None
    return proc, url, log_path


def ready_times(log_path):
    """{"ROWSxWIDTH": ms} from the server's ready line (the times it started planning with)."""
    with open(log_path, encoding="utf-8", errors="replace") as f:
        found = READY_TIMES.search(f.read())
    if not found:
        return None
    return {k: float(v) for k, v in (item.split() for item in found.group(1).split(", "))}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--export", required=True, help="an export with a Paddle backend")
    ap.add_argument("--variant", action="append", required=True, metavar="NAME=CHECKOUT")
    ap.add_argument("--precision", default="bf16", choices=["fp32", "bf16"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--burners", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--burst-s", type=float, default=0.6)
    ap.add_argument("--gap-s", type=float, default=1.0)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--duration-s", type=float, default=30.0)
    ap.add_argument("--warmup-s", type=float, default=6.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="output/bench/busy_start")
    args = ap.parse_args()
    variants = [v.split("=", 1) for v in args.variant]
    if any(len(v) != 2 for v in variants):
        ap.error("--variant takes NAME=CHECKOUT")
    os.makedirs(args.out, exist_ok=True)
    reap_dead_owners(args.out)  # a killed run's half-written JSON or PNG
    texts = [t for t in bench.split_texts(args.export) if t.strip()]

    servers = {}
    rng = random.Random(args.seed)
    for name, checkout in variants:
        stop = multiprocessing.Event()
        burners = [multiprocessing.Process(target=burn, daemon=True, args=(
            args.burst_s, args.gap_s, rng.uniform(0, args.burst_s + args.gap_s), stop))
            for _ in range(args.burners)]
        for b in burners:
            b.start()
        try:
            servers[name] = start_server(name, checkout, args.export, args.precision,
                                         args.threads, args.out)
        finally:
            stop.set()
            for b in burners:
                b.join()
        print(f"{name}: ready, started under bursts", flush=True)
    servers["quiet"] = start_server("quiet", variants[-1][1], args.export, args.precision,
                                    args.threads, args.out)
    print("quiet: ready", flush=True)

    try:
        points = pt.serve_rounds({n: s[:2] for n, s in servers.items()}, texts, args.concurrency,
                                 args.rounds, args.warmup_s, args.duration_s, args.seed, "server")
        grids = {}
        for name, (proc, url, log_path) in servers.items():
            now = httpx.get(url + "/metrics.json", timeout=30).json().get("shape_grid_ms")
            grids[name] = {"at_start": ready_times(log_path), "after_run": now}
    finally:
        for proc, _, _ in servers.values():
            bench.stop_server(proc)

    result = {"export": args.export, "precision": args.precision,
              "variants": dict(variants), "burst": {"burners": args.burners,
                                                    "busy_s": args.burst_s, "idle_s": args.gap_s},
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "machine": machine(), "grid_ms": grids, "points": points}
    summary = {}
    for c in args.concurrency:
        ref = statistics.median(p["texts_per_s"] for p in points
                                if p["server"] == "quiet" and p["concurrency"] == c)
        for name in servers:
            mine = [p["texts_per_s"] for p in points if p["server"] == name and p["concurrency"] == c]
            summary[f"{name} c={c}"] = {"texts_per_s": mine,
                                        "vs_quiet": [round(v / ref, 2) for v in mine]}
    result["summary"] = summary
    atomic_write_json(os.path.join(args.out, "busy_start.json"), result)
    for key, value in summary.items():
        print(f"{key}: {value['texts_per_s']} texts/s, x quiet start {value['vs_quiet']}")
    for name, g in grids.items():
        print(f"{name} grid ms at start: {g['at_start']}\n{name} grid ms after the run: "
              f"{g['after_run']}")
    plot(result, list(servers), args.concurrency, os.path.join(args.out, "busy_start.png"))


def plot(result, names, concurrencies, path):
    rounds_chart(
        path, [(c, f"concurrency {c}") for c in concurrencies], [(n, n) for n in names],
        lambda name, c: [p["texts_per_s"] for p in result["points"]
                         if p["server"] == name and p["concurrency"] == c],
        "texts/s (dots: rounds, bar: median)",
        f"Paddle {result['precision']} servers started under CPU bursts, "
        f"{result['machine']['cpu_count']} cores, {result['date']}")


if __name__ == "__main__":
    main()
