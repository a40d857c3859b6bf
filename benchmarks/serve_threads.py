"""Does ``Deploy.threads: auto`` serve as well as the better fixed count?  Servers side by side.

    python benchmarks/serve_threads.py --export output/bench/prec_serve_epyc_f/export_serve \\
        --backend onnx --precision int8 [--concurrency 8 32] [--duration-s 20] [--rounds 2] \\
        [--out output/bench/serve_threads]

Starts three ``ppvarlen-serve`` processes of ``--export`` (``--backend``, ``--precision``):
``Deploy.threads`` 1, the usable cores, and ``auto`` (the default: one of the two, chosen at
load by the rule in ppvarlen/runtime/threads_choice.py; its choice and the timings it decided
on are read from ``/health``).  Closed-loop clients, one real text of the export's test split
per request, drive them interleaved (round, concurrency, then every server back to back, the
order turned each round); per point: texts/s, the mean batch and the server's CPU seconds per
text.  Prints each server's texts/s against the best fixed count's in the same round.  Writes
``OUT/serve_threads.json`` and ``.png``.  One run, ratios side by side; no pass/fail gate.
"""
import argparse
import os
import time

import precision_throughput as pt  # the sibling benchmark: one closed-loop point
from machine import machine
from plots import rounds_chart

from ppvarlen.serve import bench
from ppvarlen.utils.io import atomic_write_json
from ppvarlen.utils.parallel import usable_cores


def main():
    ap = pt.side_by_side_args(argparse.ArgumentParser(description=__doc__.split("\n")[0]),
                              [8, 32], "output/bench/serve_threads")
    ap.add_argument("--backend", default="paddle", choices=["paddle", "onnx"])
    # one precision for all three: with auto each server could choose another one
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16", "int8"])
    args = ap.parse_args()
    texts = pt.side_by_side_texts(args)
    cores = usable_cores()
    settings = {"1": 1, str(cores): cores, "auto": "auto"} if cores > 1 else {"1": 1,
                                                                             "auto": "auto"}
    servers = {}
    try:
        health = pt.start_side_by_side(servers, args.export, args.backend, args.precision,
                                       {n: {"threads": t} for n, t in settings.items()},
                                       args.out, "serve_threads")
        for name, h in health.items():
            print(f"threads {name}: ready, serving {h['threads']} thread(s), {h['precision']} "
                  f"({h['threads_reason']})", flush=True)
        points = pt.serve_rounds(servers, texts, args.concurrency, args.rounds, args.warmup_s,
                                 args.duration_s, args.seed, "threads")
    finally:
        for proc, _ in servers.values():
            bench.stop_server(proc)

    print(f"auto chose {health['auto']['threads']} thread(s): {health['auto']['threads_reason']}")
    summary = pt.ratios_per_round(  # against the better fixed count
        points, "threads", lambda got: max(v for k, v in got.items() if k != "auto"),
        lambda name, c: f"threads {name} c={c}")
    result = {"export": args.export, "backend": args.backend, "precision": args.precision,
              "usable_cores": cores, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "machine": machine(), "auto": {k: health["auto"].get(k) for k in (
                  "threads", "threads_reason", "precision")},
              "points": points, "x_best_fixed_per_round": summary}
    atomic_write_json(os.path.join(args.out, "serve_threads.json"), result)
    rounds_chart(
        os.path.join(args.out, "serve_threads.png"),
        [(c, f"concurrency {c}") for c in args.concurrency],
        [(n, f"threads {n}") for n in servers],
        lambda name, c: [p["texts_per_s"] for p in points
                         if p["threads"] == name and p["concurrency"] == c],
        "texts/s (dots: rounds, bar: median)",
        f"{args.backend} {health['auto']['precision']}, Deploy.threads side by side "
        f"({cores} usable cores), {result['date']}")


if __name__ == "__main__":
    main()
