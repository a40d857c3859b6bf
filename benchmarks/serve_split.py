"""What does ``Deploy.split_threads_under_load`` serve, and cost?  Servers side by side.

    python benchmarks/serve_split.py --export output/bench/prec_serve_epyc_f/export_serve \\
        --precision int8 [--concurrency 1 8 32] [--duration-s 20] [--rounds 2] \\
        [--out output/bench/serve_split]

Starts three ``ppvarlen-serve`` processes of ``--export`` on ONNX Runtime (``--precision``,
``Deploy.threads`` the usable cores): one worker whose batches all run on every thread,
one at a time (the default); one worker that splits them (``split_threads_under_load:
true``: a lone text on every thread, batches that queue one thread each, on a second
session); two workers of one thread each (``Deploy.workers: 2``).  Closed-loop clients, one
real text of the export's test split per request, drive them interleaved (round,
concurrency, then every server back to back, the order turned each round); per point:
texts/s, the mean batch, the server's CPU seconds per text.  Prints each server's texts/s
against the unsplit one's in the same round, and each server's resident memory (RSS, read
at the end).  Writes ``OUT/serve_split.json`` and ``.png``.  One run, ratios side by side;
no pass/fail gate.
"""
import argparse
import os
import time

import psutil

import precision_throughput as pt  # the sibling benchmark: one closed-loop point
from machine import machine
from plots import rounds_chart

from ppvarlen.serve import bench
from ppvarlen.utils.io import atomic_write_json
from ppvarlen.utils.parallel import usable_cores

SETTINGS = {"not split": {}, "split": {"split_threads_under_load": True},
            "2 workers": {"workers": 2}}


def main():
    ap = pt.side_by_side_args(argparse.ArgumentParser(description=__doc__.split("\n")[0]),
                              [1, 8, 32], "output/bench/serve_split")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "fp16", "int8"])
    args = ap.parse_args()
    texts = pt.side_by_side_texts(args)
    cores = usable_cores()
    if cores < 2:
        raise SystemExit("serve_split: one usable core, no threads to split")
    servers, rss = {}, {}
    try:
        health = pt.start_side_by_side(
            servers, args.export, "onnx", args.precision,
            {n: {"threads": cores // d.get("workers", 1), **d} for n, d in SETTINGS.items()},
            args.out, "serve_split")
        for name, h in health.items():
            print(f"{name}: ready, {h['threads']} thread(s) per worker, under load "
                  f"{h['threads_under_load']}", flush=True)
        points = pt.serve_rounds(servers, texts, args.concurrency, args.rounds, args.warmup_s,
                                 args.duration_s, args.seed, "setting")
        rss = {name: round(psutil.Process(proc.pid).memory_info().rss / 2**20, 1)
               for name, (proc, _) in servers.items()}
    finally:
        for proc, _ in servers.values():
            bench.stop_server(proc)

    summary = pt.ratios_per_round(points, "setting", lambda got: got["not split"],
                                  lambda name, c: f"{name} c={c}")
    result = {"export": args.export, "precision": args.precision, "usable_cores": cores,
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": machine(),
              "settings": SETTINGS, "rss_mib": rss, "points": points,
              "x_not_split_per_round": summary}
    atomic_write_json(os.path.join(args.out, "serve_split.json"), result)
    print("resident memory at the end, MiB: " + ", ".join(f"{k} {v}" for k, v in rss.items()))
    rounds_chart(
        os.path.join(args.out, "serve_split.png"),
        [(c, f"concurrency {c}") for c in args.concurrency],
        [(n, n) for n in servers],
        lambda name, c: [p["texts_per_s"] for p in points
                         if p["setting"] == name and p["concurrency"] == c],
        "texts/s (dots: rounds, bar: median)",
        f"onnx {args.precision}, Deploy.split_threads_under_load side by side "
        f"({cores} usable cores), {result['date']}")


if __name__ == "__main__":
    main()
