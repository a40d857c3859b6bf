"""The most any batcher could serve with an engine at a closed-loop concurrency, from the
engine's measured cost per batch shape.

    # the ERNIE-base export precision_throughput.py --serve writes, Paddle bf16 against ONNX fp32
    python benchmarks/served_ceiling.py --export output/bench/prec_serve_base/export_serve \
        --engines paddle:bf16,onnx:fp32 --threads 2 --out output/bench/served_ceiling

At concurrency c, closed-loop clients keep at most c texts in flight, so a batch never holds
more than c texts.  A round here is the best case: c texts of the export's test split (their
token lengths, drawn at random, seeded) all waiting at once, sorted by length and cut into the
groups that cost least in total (exact shapes, no padding across groups).  Each engine runs in
a child process of its own (Paddle's oneDNN cache is per process) and times a grid of batch
shapes (rows x width): the first run of a shape ("new": kernels and, for Paddle oneDNN, a
weight reorder) and the median of three more ("held"); a group's cost is interpolated between
the grid's shapes.  Texts/s of a round = c / its total cost; the engine's "ceiling" assumes
every shape is held, its "all new" figure that every group is a new shape.  An engine's
ceiling over the last engine's is the largest served ratio a batcher could reach on this host
with these engines, whatever it does (tokenizing, HTTP and queueing cost both servers more on
top).  ``--grid ROWS:WIDTHS`` also prices the first engine with every group padded up to that
grid of held shapes (what ``Deploy.onednn_shape_grid`` serves; its grid is in the server's log).

Writes ``OUT/served_ceiling.json`` and ``OUT/served_ceiling.png``.  One run, ratios side by
side; nothing here is a pass/fail gate.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

from machine import machine

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROWS = (1, 2, 4, 8, 16, 32)
WIDTHS = (16, 32, 64, 128, 192, 256)


def interpolated_cost(times):
    """``{(rows, width): seconds}`` measured on a grid -> cost(rows, width): linear between
    the grid's widths, then between its rows (a cost model fitted to the grid missed small
    shapes by half); past the largest rows, proportional to the rows."""
    rows = sorted({r for r, _ in times})
    widths = sorted({w for _, w in times})
    table = np.array([[times[(r, w)] for w in widths] for r in rows])

    def cost(r, w):
        per_row = [np.interp(w, widths, line) for line in table]
        if r > rows[-1]:
            return per_row[-1] * r / rows[-1]
        return float(np.interp(r, rows, per_row))
    return cost


def parse_grid(text):
    """"1,4,16:64,128,256" -> ((1, 4, 16), (64, 128, 256))."""
    try:
        rows, widths = text.split(":")
        grid = (tuple(sorted(int(x) for x in rows.split(","))),
                tuple(sorted(int(x) for x in widths.split(","))))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give ROWS:WIDTHS, e.g. 1,4,16:64,128,256")
    if min(grid[0] + grid[1]) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: rows and widths must be at least 1")
    return grid


def on_grid(cost, grid):
    """``cost`` of the grid shape a group is padded up to; None past the grid's largest."""
    from ppvarlen.runtime.backends import grid_cover

    rows, widths = grid

    def padded(r, w):
        up_r, up_w = grid_cover(rows, r), grid_cover(widths, w)
        return None if up_r is None or up_w is None else cost(up_r, up_w)
    return padded


def best_split_cost(lengths, cost):
    """The least total ``cost(rows, width)`` over cuts of the sorted ``lengths`` into
    contiguous groups, each padded to its longest (dynamic programming over cut points); a
    group ``cost`` gives None for is not formed."""
    lengths = sorted(lengths)
    best = [0.0] + [float("inf")] * len(lengths)
    for end in range(1, len(lengths) + 1):
        for start in range(end):
            c = cost(end - start, lengths[end - 1])
            if c is not None:
                best[end] = min(best[end], best[start] + c)
    return best[-1]


def child(export_dir, backend, precision, threads, rows, widths):
    """Time each (rows, width) shape: first run and the median of three held runs."""
    from ppvarlen.runtime.predictor import Predictor

    # exact shapes: no grid padding them up (Deploy.onednn_shape_grid)
    p = Predictor(export_dir, backend, precision=precision, threads=threads,
                  onednn_shape_grid=False)
    rng = np.random.default_rng(0)
    low = max(p.encoder.pad_id, p.encoder.unk_id) + 1
    out = []
    for r in rows:
        for w in widths:
            ids = rng.integers(low, p.encoder.vocab_size, size=(r, w)).tolist()
            t0 = time.perf_counter()
            p.run_engine(ids)  # exact shape: run_engine never pads up to a held one
            first = time.perf_counter() - t0
            held = []
            for _ in range(3):
                t0 = time.perf_counter()
                p.run_engine(ids)
                held.append(time.perf_counter() - t0)
            out.append({"rows": r, "width": w, "first_s": first, "held_s": sorted(held)[1]})
    print(json.dumps({"shapes": out, "precision": p.precision,
                      "settings": getattr(p.engine, "settings", None)}))


def token_lengths(export_dir):
    from ppvarlen.runtime.predictor import Predictor
    from ppvarlen.serve.bench import split_texts

    p = Predictor(export_dir, "onnx" if "onnx" in _backends(export_dir) else "paddle")
    return [len(p.encode(t).windows[0]) for t in split_texts(export_dir) if t.strip()]


def _backends(export_dir):
    with open(os.path.join(export_dir, "manifest.json")) as f:
        return set(json.load(f)["backends"])


def plot(result, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    engines = list(result["engines"])
    concurrencies = [p["concurrency"] for p in result["points"]]
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / (2 * len(engines))
    for i, name in enumerate(engines):
        for j, kind in enumerate(("ceiling", "all_new")):
            values = [p["texts_per_s"][name][kind] for p in result["points"]]
            xs = [k + (2 * i + j) * width for k in range(len(concurrencies))]
            ax.bar(xs, values, width, label=f"{name} ({kind.replace('_', ' ')})",
                   alpha=1.0 if kind == "ceiling" else 0.5)
    ax.set_xticks([k + 0.4 - width / 2 for k in range(len(concurrencies))])
    ax.set_xticklabels([f"concurrency {c}" for c in concurrencies])
    ax.set_ylabel("texts/s, best split of each round")
    ax.set_title("served ceiling from measured batch costs")
    ax.legend(fontsize=8)
    fig.tight_layout()
    from ppvarlen.utils.io import atomic_save_png

    atomic_save_png(fig, path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--export", required=True, help="an export directory (its test split's "
                    "texts give the lengths)")
    ap.add_argument("--engines", default="paddle:bf16,onnx:fp32",
                    help="backend:precision, comma-separated; ratios are against the last")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--rounds", type=int, default=300, help="rounds drawn per concurrency")
    ap.add_argument("--grid", action="append", default=[], type=parse_grid,
                    metavar="ROWS:WIDTHS", help="e.g. 1,4,16:64,128,256 (repeatable)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--_child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._child:
        child(args.export, args._child[0], args._child[1], int(args._child[2]), ROWS, WIDTHS)
        return
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    measured, costs = {}, {}
    for name in engines:
        backend, _, precision = name.partition(":")
        run = subprocess.run([sys.executable, __file__, "--export", args.export, "--out",
                              args.out, "--_child", backend, precision, str(args.threads)],
                             capture_output=True, text=True)
        if run.returncode:
            sys.exit(f"{name}: the timing child failed:\n{run.stderr[-2000:]}")
        measured[name] = json.loads(run.stdout.strip().splitlines()[-1])
        costs[name] = {kind: interpolated_cost({(s["rows"], s["width"]): s[f"{kind}_s"]
                                                for s in measured[name]["shapes"]})
                       for kind in ("held", "first")}
        print(f"{name}: {len(measured[name]['shapes'])} shapes timed", flush=True)
    lengths = token_lengths(args.export)
    rng = np.random.default_rng(0)
    points = []
    for c in args.concurrency:
        rounds = [rng.choice(lengths, c) for _ in range(args.rounds)]
        point = {"concurrency": c, "texts_per_s": {}}
        for name in engines:
            per = {}
            for kind, cost in (("ceiling", costs[name]["held"]),
                               ("all_new", costs[name]["first"])):
                total = sum(best_split_cost(r, cost) for r in rounds)
                per[kind] = round(c * len(rounds) / total, 2)
            point["texts_per_s"][name] = per
        for grid in args.grid:
            label = f"{engines[0]} grid {','.join(map(str, grid[0]))}:{','.join(map(str, grid[1]))}"
            total = sum(best_split_cost(r, on_grid(costs[engines[0]]["held"], grid))
                        for r in rounds)
            point.setdefault("grids", {})[label] = round(c * len(rounds) / total, 2)
        base = point["texts_per_s"][engines[-1]]["ceiling"]
        point["ceiling_ratio"] = {n: round(point["texts_per_s"][n]["ceiling"] / base, 2)
                                  for n in engines}
        points.append(point)
        print(f"c={c}: " + "; ".join(
            f"{n} ceiling {point['texts_per_s'][n]['ceiling']} texts/s (all new "
            f"{point['texts_per_s'][n]['all_new']}), {point['ceiling_ratio'][n]}x"
            for n in engines), flush=True)
        for label, value in point.get("grids", {}).items():
            print(f"c={c}: {label}: {value} texts/s, {value / base:.2f}x", flush=True)
    result = {"export": args.export, "engines": measured, "threads": args.threads,
              "rounds": args.rounds, "texts": len(lengths),
              "mean_length": round(float(np.mean(lengths)), 1), "points": points,
              "machine": machine()}
    from ppvarlen.utils.io import atomic_write_json

    os.makedirs(args.out, exist_ok=True)
    atomic_write_json(os.path.join(args.out, "served_ceiling.json"), result)
    plot(result, os.path.join(args.out, "served_ceiling.png"))
    print(f"wrote {os.path.join(args.out, 'served_ceiling.json')} and .png")


if __name__ == "__main__":
    main()
