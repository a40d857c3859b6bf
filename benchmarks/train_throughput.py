"""Real tokens/s of the sentiment Transformer under three batching schemes, side by side.

    python benchmarks/train_throughput.py [--steps 10] [--out output/bench]

* pad_to_512   — every example padded to Data.max_len=512 (32 per batch): the naive baseline;
* random       — shuffled fixed batches of 32, padded to the batch's longest (dynamic padding);
* token_budget — length-sorted pools packed to Data.max_tokens padded tokens (the default).

Each scheme trains the same model (configs/sentiment/transformer.yaml, max_len 512) for
--steps optimizer steps after 2 warm-up steps and counts REAL (non-pad) tokens per second
of step time.  Writes train_throughput.json and train_throughput.png under --out.
The CPU may be shared with other jobs: the JSON records the load average before and after.
"""
import argparse
import json
import os
import time


SCHEMES = {
    "pad_to_512": ["Data.sampler=bucket", "Data.buckets=[512]", "Data.pad_to_bucket=true",
                   "Data.max_tokens=16384"],
    "random": ["Data.sampler=random", "Data.batch_size=32"],
    "token_budget": ["Data.sampler=token_budget", "Data.max_tokens=4096"],
}


def measure(config, overrides, steps, out_dir):
    from ppvarlen.config import load_config
    from ppvarlen.engine.trainer import Trainer

    cfg = load_config(config, ["Data.max_len=512", "Model.max_position=512", "Train.progress_bar=false",
                               f"Global.output_dir={out_dir}"] + overrides)
    t = Trainer(cfg)
    t.ddp_model.train()
    real = padded = examples = 0
    secs = 0.0
    for i, idxs in enumerate(t.sampler):
        if i >= steps + 2:
            break
        batch = t.collate([t.data.train[j] for j in idxs])
        t0 = time.perf_counter()
        t.train_step(batch)
        dt = time.perf_counter() - t0
        if i >= 2:  # skip warm-up steps (allocator, first kernels)
            secs += dt
            real += int(batch["seq_len"].sum())
            padded += int(batch["input_ids"].size)
            examples += len(idxs)
    return {"steps": steps, "seconds": round(secs, 3), "real_tokens": real, "padded_tokens": padded,
            "real_tokens_per_s": real / secs, "examples_per_s": examples / secs,
            "padding_efficiency": real / padded}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-c", "--config", default="configs/sentiment/transformer.yaml")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--out", default="output/bench")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    load_before = os.getloadavg()
    results = {name: measure(args.config, ov, args.steps, os.path.join(args.out, "train_throughput_runs", name))
               for name, ov in SCHEMES.items()}
    base = results["pad_to_512"]["real_tokens_per_s"]
    for r in results.values():
        r["speedup_vs_pad_to_512"] = r["real_tokens_per_s"] / base
    report = {"config": args.config, "cpu_count": os.cpu_count(), "loadavg_before": load_before,
              "loadavg_after": os.getloadavg(), "schemes": results}
    with open(os.path.join(args.out, "train_throughput.json"), "w") as f:
        json.dump(report, f, indent=2)
    for name, r in results.items():
        print(f"{name:>13}: {r['real_tokens_per_s']:8.0f} real tok/s  {r['examples_per_s']:6.1f} ex/s  "
              f"padding eff {r['padding_efficiency']:.3f}  x{r['speedup_vs_pad_to_512']:.2f}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    names = list(results)
    ax.bar(names, [results[n]["real_tokens_per_s"] for n in names], color=["C3", "C1", "C2"])
    for i, n in enumerate(names):
        ax.text(i, results[n]["real_tokens_per_s"], f"x{results[n]['speedup_vs_pad_to_512']:.1f}\n"
                f"pad eff {results[n]['padding_efficiency']:.2f}", ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("real tokens / s (training)")
    ax.set_title("sentiment Transformer, CPU")
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "train_throughput.png"), dpi=100)


if __name__ == "__main__":
    main()
