"""Planning time of one token-budget epoch: 1M and 10M lengths, new samplers vs the original.

    PYTHONPATH=$PWD python benchmarks/sampler_planning.py [--sizes 1000000 10000000] \\
        [--old-size 100000] [--out output/bench/sampler_planning]

Lengths: lognormal (median 80, clipped to 10..500 tokens) as int32, like a review corpus,
and [n, 2] source/target pairs (target = source x U(0.5, 1.5)) for seq2seq; the shipped
sentiment settings (max_tokens 4096, pool_size 200) and g2p's pool_size 100.  For each
size: the sampler's construction (one global sort + pack: the eval order, and the pool
size in examples) and the planning of a new shuffled epoch (``set_epoch`` + ``len``, what
the trainer does), as wall and CPU seconds (the host is shared: CPU seconds are the
fairer number).  The original implementation (copied in tests/data/test_sampler_reference.py)
is timed on ``--old-size`` lengths only: it is O(N x pools).  Writes JSON + PNG.
"""
import argparse
import importlib.util
import json
import os
import time

import numpy as np

from machine import machine

HERE = os.path.dirname(os.path.abspath(__file__))


def synthetic(n, seed=0):
    rng = np.random.default_rng(seed)
    one = np.clip(np.round(rng.lognormal(np.log(80), 0.7, n)), 10, 500).astype(np.int32)
    two = np.stack([one, np.clip((one * rng.uniform(0.5, 1.5, n)).astype(np.int32), 1, 500)],
                   axis=1)
    return {"1d": (one, 200), "2d": (two, 100)}


def timed(fn):
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, round(time.perf_counter() - wall, 3), round(time.process_time() - cpu, 3)


def new_numbers(lengths, pool, max_tokens):
    from ppvarlen.data.samplers import TokenBudgetBatchSampler

    sampler, init_wall, init_cpu = timed(lambda: TokenBudgetBatchSampler(
        lengths, max_tokens, pool_size=pool, seed=1))

    def plan():
        sampler.set_epoch(1)
        return len(sampler)

    batches, wall, cpu = timed(plan)
    return {"construct_s": init_wall, "construct_cpu_s": init_cpu, "epoch_s": wall,
            "epoch_cpu_s": cpu, "batches": batches}


def old_numbers(lengths, pool, max_tokens):
    spec = importlib.util.spec_from_file_location(
        "sampler_reference", os.path.join(HERE, "..", "tests", "test_sampler_reference.py"))
    ref = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ref)
    # the original constructor packed the sorted split once, then each epoch again
    batches, wall, cpu = timed(lambda: ref._old_token_budget_natural(
        lengths, max_tokens, True, pool, None, 1, 1, 1))
    return {"construct_plus_epoch_s": wall, "construct_plus_epoch_cpu_s": cpu,
            "batches": len(batches)}


def plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for kind, color in (("1d", "C0"), ("2d", "C1")):
        rows = [r for r in results["new"] if r["kind"] == kind]
        ax.plot([r["n"] for r in rows], [r["epoch_cpu_s"] for r in rows], "o-", color=color,
                label=f"new, {kind} lengths: epoch (CPU s)")
        ax.plot([r["n"] for r in rows], [r["construct_cpu_s"] for r in rows], "s--",
                color=color, label=f"new, {kind} lengths: construction (CPU s)")
        old = [r for r in results["old"] if r["kind"] == kind]
        ax.plot([r["n"] for r in old], [r["construct_plus_epoch_cpu_s"] for r in old], "x",
                color=color, markersize=10, label=f"original, {kind}: construction + epoch")
    ax.axhline(10, color="grey", linestyle=":", label="10 s target")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("examples")
    ax.set_ylabel("CPU seconds")
    ax.set_title("token-budget sampler planning (shared 2-core host)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    from ppvarlen.utils.io import atomic_save_png

    atomic_save_png(fig, path, dpi=100)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 10_000_000])
    ap.add_argument("--old-size", type=int, default=100_000,
                    help="lengths for the original implementation (0 = skip)")
    ap.add_argument("--max-tokens", type=int, default=4096)
    ap.add_argument("--out", default="output/bench/sampler_planning")
    args = ap.parse_args()
    from ppvarlen.utils.io import atomic_write_json

    results = {"machine": machine(),
               "max_tokens": args.max_tokens, "new": [], "old": [],
               "note": "one run each; 2 cores shared with other jobs (CPU s are fairer than wall)"}
    sizes = sorted(set(args.sizes) | ({args.old_size} if args.old_size else set()))
    for n in sizes:
        for kind, (lengths, pool) in synthetic(n).items():
            row = {"n": n, "kind": kind, "pool_size": pool,
                   **new_numbers(lengths, pool, args.max_tokens)}
            results["new"].append(row)
            print(json.dumps(row), flush=True)
            if n == args.old_size:
                old = {"n": n, "kind": kind, "pool_size": pool,
                       **old_numbers(lengths, pool, args.max_tokens)}
                results["old"].append(old)
                print(json.dumps(old), flush=True)
    results["load_average_at_end"] = os.getloadavg()
    os.makedirs(args.out, exist_ok=True)
    atomic_write_json(os.path.join(args.out, "sampler_planning.json"), results)
    plot(results, os.path.join(args.out, "sampler_planning.png"))
    print(f"wrote {args.out}/sampler_planning.json and .png")


if __name__ == "__main__":
    main()
