"""Server memory against the batch shapes it sees: RssAnon growth per backend/precision/bound.

    # an ERNIE-base-shaped export (12 x 768, random init; built once into OUT/export), batches
    # as a server forms them at concurrency 8 (1..8 texts of the corpus's lengths)
    python benchmarks/serve_memory.py -c configs/sentiment/transformer.yaml --out /tmp/serve_mem \
        --stream 12 --max-rows 8
    # an existing export, distinct shapes, some modes and bounds only
    python benchmarks/serve_memory.py --out /tmp/serve_mem --export output/export/sentiment \
        --modes paddle:fp32,onnx:fp32 --bounds old,budget,capacity1 --shapes 30

A server's batcher forms a batch of 1..``--max-rows`` texts padded to the longest one, so it
runs a new input shape for nearly every batch.  Every (mode, bound) runs in its own child
process (memory readings of that process only): the predictor is loaded, then two passes run:
either ``--shapes`` distinct (rows, length) shapes drawn at random (seeded) from rows
1..max_rows x lengths 1..``--max-len``, the same shapes twice; or, with ``--stream N``, N ragged
batches per pass of 1..max_rows texts whose lengths are drawn from the config's test split (a
new draw each pass).  ``RssAnon``/``VmRSS`` (/proc/self/status) are read after loading, along
pass 1 and after each pass.  Bounds:

``shared``     the default: oneDNN capacity 0 (one weight copy for every shape) on the shared
               grid (``backends.shared_grid_axes``)
``budget``     a capacity in weight copies, from ``ONEDNN_CACHE_BUDGET_BYTES``, and the grid that
               fits it (what a decode loop's export gets)
``old``        oneDNN shape-cache capacity 64 shapes whatever the model's size (no byte budget),
               every batch at its own shape
``capacity<N>`` a capacity of N shapes (no byte budget), every batch at its own shape
``trim``       glibc ``malloc_trim(0)`` after every batch
``no_onednn``  Paddle fp32 with oneDNN off (Paddle's plain CPU kernels)

Bounds combine with ``+`` (``trim+capacity2``).

The machine is shared: speeds are texts/s of each pass, wall clock (with ``--shapes``, pass 2
runs shapes seen once already; pass 1 includes creating every shape's kernels).
Writes ``OUT/serve_memory.json`` and ``OUT/serve_memory.png``.
"""
import argparse
import ctypes
import functools
import json
import os
import subprocess
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BOUNDS = ("shared", "budget", "old", "capacity<N>", "trim", "no_onednn")


def memory_mib():
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("RssAnon", "VmRSS"):
                out[key] = int(rest.split()[0]) / 1024
    return out


def draw_shapes(count, max_rows, max_len, seed=0):
    rng = np.random.RandomState(seed)
    pairs = [(r, n) for r in range(1, max_rows + 1) for n in range(1, max_len + 1)]
    picked = rng.choice(len(pairs), min(count, len(pairs)), replace=False)
    return [pairs[i] for i in picked]


def copies_per_shape(init):
    """``PaddleEngine.__init__`` that never shares one weight copy between shapes."""
    @functools.wraps(init)
    def wrapped(self, *args, **kwargs):
        kwargs["shared_weights"] = False
        return init(self, *args, **kwargs)
    return wrapped


def child(args):
    """One (mode, bound) in this process; prints one JSON line."""
    from ppvarlen.runtime import backends
    from ppvarlen.runtime import predictor as predictor_module
    from ppvarlen.runtime.predictor import Predictor

    backend, precision = args.mode.split(":")
    parts = args.bound.split("+")
    grid = True
    for part in parts:
        if part == "old" or part.startswith("capacity"):
            backends.ONEDNN_CACHE_BUDGET_BYTES = 1 << 62
            backends.ONEDNN_CACHE_CAPACITY = int(part[len("capacity"):] or 0) or 64
            grid = False
        if part in ("budget", "old") or part.startswith("capacity"):  # weight copies per shape
            backends.PaddleEngine.__init__ = copies_per_shape(backends.PaddleEngine.__init__)
    if "no_onednn" in parts:
        load = predictor_module.load_manifest

        def load_manifest(*a, **kw):
            m = load(*a, **kw)
            m["backends"]["paddle"]["settings"]["fp32"]["enable_onednn"] = False
            return m
        predictor_module.load_manifest = load_manifest
    trim = ctypes.CDLL("libc.so.6").malloc_trim if "trim" in parts else None
    start = memory_mib()
    p = Predictor(args.export, backend, precision=precision, threads=args.threads,
                  max_batch_size=args.max_rows, onednn_shape_grid=grid)
    loaded = memory_mib()
    max_len = min(args.max_len, p.max_len)
    rng = np.random.RandomState(1)
    if args.stream:  # ragged batches of corpus-length rows: a new draw each pass
        with open(os.path.join(args.out, "lengths.json")) as f:
            lengths = np.minimum(json.load(f), max_len)
        draws = [[rng.choice(lengths, rng.randint(1, args.max_rows + 1)).tolist()
                  for _ in range(args.stream)] for _ in (1, 2)]
    else:  # the same distinct (rows, length) shapes in both passes
        shapes = draw_shapes(args.shapes, args.max_rows, max_len)
        draws = [[[n] * rows for rows, n in shapes]] * 2
    low = max(p.encoder.unk_id, p.encoder.pad_id) + 1
    curve, passes = [], []
    for pass_no, batches in enumerate(draws, 1):
        t0 = time.perf_counter()
        for k, row_lengths in enumerate(batches):
            p.run_engine([rng.randint(low, p.encoder.vocab_size, size=n).tolist()
                          for n in row_lengths])
            if trim is not None:
                trim(0)
            if pass_no == 1 and (k + 1) % max(1, len(batches) // 10) == 0:
                curve.append({"shapes": k + 1, **memory_mib()})
        passes.append({"seconds": time.perf_counter() - t0, "texts": sum(map(len, batches)),
                       **memory_mib()})
    print(json.dumps({"mode": args.mode, "bound": args.bound, "start": start, "loaded": loaded,
                      "curve": curve, "passes": passes,
                      "padded_tokens": p.padded_tokens, "real_tokens": p.real_tokens,
                      "engine_settings": p.engine.settings,
                      "texts_per_s_pass1": passes[0]["texts"] / passes[0]["seconds"],
                      "texts_per_s_pass2": passes[1]["texts"] / passes[1]["seconds"]}),
          flush=True)


def write_lengths(config, path):
    """The token lengths of the config's test split (special tokens included), as JSON."""
    from ppvarlen.config import load_config
    from ppvarlen.store_build import build_datasets
    from ppvarlen.utils.io import atomic_write_json

    test = build_datasets(load_config(config, []).Data, splits=("test",)).test
    atomic_write_json(path, [len(test[i]["input_ids"]) for i in range(len(test))])


def build_ernie_base(config, out):
    """An ERNIE-base-shaped export (random init) in ``out`` (fp32 + bf16 + int8, unverified)."""
    import importlib.util

    import paddle

    spec = importlib.util.spec_from_file_location(
        "precision_throughput", os.path.join(REPO, "benchmarks", "precision_throughput.py"))
    precision_throughput = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(precision_throughput)
    ERNIE_BASE, ernie_medium = precision_throughput.ERNIE_BASE, precision_throughput.ernie_medium

    from ppvarlen.config import load_config
    from ppvarlen.export.exporter import export_model
    from ppvarlen.store_build import build_datasets

    paddle.set_device("cpu")
    cfg = load_config(config, [])
    bundle = build_datasets(cfg.Data, splits=("train",))
    lengths = [len(bundle.train[i]["input_ids"]) for i in range(len(bundle.train))]
    model, meta = ernie_medium(cfg, bundle.encoder, bundle.label_names, lengths, ERNIE_BASE,
                               "ernie_base_random")
    export_model(model, meta, bundle.encoder, cfg, out, ["paddle", "onnx"],
                 ["fp32", "bf16", "int8"], verify=False)


def plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5))
    for r in results:
        xs = [0] + [c["shapes"] for c in r["curve"]]
        ys = [r["loaded"]["RssAnon"]] + [c["RssAnon"] for c in r["curve"]]
        ax.plot(xs, ys, marker=".", label=f"{r['mode']} {r['bound']}")
    ax.set_xlabel("batches run in pass 1 (with --shapes: each a new shape)")
    ax.set_ylabel("RssAnon MiB")
    ax.legend(fontsize=7)
    fig.tight_layout()
    from ppvarlen.utils.io import atomic_save_png

    atomic_save_png(fig, path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-c", "--config", default=os.path.join(REPO, "configs/sentiment/transformer.yaml"))
    ap.add_argument("--out", required=True, help="JSON + PNG (and a built export) go here")
    ap.add_argument("--export", help="an export directory (default: build ERNIE-base in OUT)")
    ap.add_argument("--modes", default="paddle:fp32,paddle:bf16,onnx:fp32,onnx:int8")
    ap.add_argument("--bounds", default="old,budget,shared")
    ap.add_argument("--shapes", type=int, default=200)
    ap.add_argument("--max-rows", type=int, default=8, help="concurrency 8: batches of 1..8")
    ap.add_argument("--max-len", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--stream", type=int, default=0,
                    help="instead of distinct shapes: this many ragged batches per pass, rows "
                         "1..max_rows of the config's test-split text lengths")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    ap.add_argument("--bound", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    os.makedirs(args.out, exist_ok=True)
    if args.export is None:
        args.export = os.path.join(args.out, "export")
        if not os.path.exists(os.path.join(args.export, "manifest.json")):
            build_ernie_base(args.config, args.export)
    if args.stream:
        write_lengths(args.config, os.path.join(args.out, "lengths.json"))
    flags = next(line for line in open("/proc/cpuinfo") if line.startswith("flags"))
    results = []
    for mode in args.modes.split(","):
        for bound in args.bounds.split(","):
            parts = bound.split("+")
            if any(p not in BOUNDS and not p[len("capacity"):].isdigit() for p in parts):
                raise SystemExit(f"--bounds: unknown {bound!r}; choose from {BOUNDS} "
                                 f"(or several joined by '+')")
            if mode.startswith("onnx") and any(p.startswith("capacity") or p in
                                               ("no_onednn", "budget") for p in parts):
                continue  # Paddle settings
            cmd = [sys.executable, os.path.abspath(__file__), "--child", "--mode", mode,
                   "--bound", bound, "--export", args.export, "--out", args.out,
                   "--shapes", str(args.shapes), "--max-rows", str(args.max_rows),
                   "--max-len", str(args.max_len), "--threads", str(args.threads),
                   "--stream", str(args.stream)]
            env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
            run = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if run.returncode != 0:
                print(f"{mode} {bound}: failed rc {run.returncode}\n{run.stderr[-2000:]}",
                      flush=True)
                continue
            r = json.loads(run.stdout.strip().splitlines()[-1])
            results.append(r)
            grow = r["passes"][-1]["RssAnon"] - r["loaded"]["RssAnon"]
            print(f"{mode:<12}{bound:<10} RssAnon loaded {r['loaded']['RssAnon']:8.0f} MiB -> "
                  f"pass1 {r['passes'][0]['RssAnon']:8.0f} -> pass2 {r['passes'][1]['RssAnon']:8.0f}"
                  f" (+{grow:.0f} MiB)  texts/s pass1 {r['texts_per_s_pass1']:.1f} "
                  f"pass2 {r['texts_per_s_pass2']:.1f}", flush=True)
    summary = {"export": args.export, "shapes": args.shapes, "stream": args.stream, "max_rows": args.max_rows,
               "max_len": args.max_len, "threads": args.threads, "cpu_count": os.cpu_count(),
               "load_average": list(os.getloadavg()), "date": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                              time.gmtime()),
               "cpu_flags": [f for f in flags.split() if "avx" in f or "amx" in f],
               "results": results}
    from ppvarlen.utils.io import atomic_write_json

    atomic_write_json(os.path.join(args.out, "serve_memory.json"), summary)
    plot(results, os.path.join(args.out, "serve_memory.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
