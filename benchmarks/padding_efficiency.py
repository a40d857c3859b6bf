"""Padding efficiency of each batching strategy, and what it buys in training speed.

    python benchmarks/padding_efficiency.py -c configs/sentiment/transformer.yaml \
        -o Data.max_len=512 -o Model.max_position=512 [--epochs 3] [--time-batches 12] \
        [--json output/bench/padding_efficiency.json]

1. Efficiency (real tokens / computed tokens) of every strategy of
   ``ppvarlen.data.report`` over ``--epochs`` shuffles: mean, min, max.
2. Speed: forward + backward of the config's model on the first ``--time-batches``
   batches of each strategy (CPU, one process), as real tokens per second and the
   implied seconds per epoch.  Batches are padded exactly as the strategy pads.
"""
import argparse
import time

from ppvarlen.config import add_config_args, load_config

TIMED = ["pad_to_max_len", "random_dynamic", "group_by_length", "optimal_buckets",
         "token_budget_pool100", "fairseq"]


def time_strategy(task, model, dataset, batches, pads, n):
    from ppvarlen.data.collate import Collator

    real = 0
    t0 = time.perf_counter()
    for idx, pad in list(zip(batches, pads))[:n]:
        # a single boundary at the strategy's pad length: padded exactly as the strategy pads
        batch = Collator(dataset.pad_id, bucket_boundaries=[pad])([dataset[i] for i in idx])
        task.loss(model, batch).backward()
        model.clear_gradients()
        real += task.token_counts(batch)[0]
    return real / (time.perf_counter() - t0)


def main():
    ap = add_config_args(argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter))
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--time-batches", type=int, default=12, help="0 = skip the speed part")
    ap.add_argument("--json", default="output/bench/padding_efficiency.json")
    args = ap.parse_args()
    import numpy as np

    from ppvarlen.store_build import build_datasets
    from ppvarlen.data.report import compare_strategies, strategy_batches
    from ppvarlen.tasks import get_task
    from ppvarlen.utils.io import atomic_write_json

    cfg = load_config(args.config, args.override)
    d = cfg.Data
    if d.max_tokens is None:
        raise SystemExit("set Data.max_tokens (e.g. -o Data.max_tokens=4096)")
    bundle = build_datasets(d)
    ds = bundle.train
    runs = [compare_strategies(ds.lengths, d.max_len, 32, d.max_tokens, d.num_buckets,
                               seed=seed)[0] for seed in range(args.epochs)]
    result = {"corpus": d.corpus, "split": "train", "examples": len(ds), "max_len": d.max_len,
              "max_tokens": d.max_tokens, "batch_size": 32, "epochs": args.epochs, "strategies": {}}
    print(f"{d.corpus} train: {len(ds)} examples, max_len {d.max_len}, max_tokens {d.max_tokens}")
    print(f"  {'strategy':<24}{'mean eff':>9}{'min':>8}{'max':>8}{'batches':>9}{'real tok/s':>12}"
          f"{'s/epoch':>9}")
    timed = {}
    task = get_task(bundle.task)
    if args.time_batches and not task.pairs:  # the strategies batch one length per example
        import paddle

        from ppvarlen.models import build_model

        paddle.seed(0)
        model = build_model(cfg.Model, bundle.encoder.vocab_size,
                            task.num_labels(bundle.encoder, bundle.label_names),
                            bundle.encoder.pad_id, bundle.task)
        model.train()
        batches, _ = strategy_batches(ds.lengths, d.max_len, 32, d.max_tokens, d.num_buckets)
        for name in TIMED:
            timed[name] = time_strategy(task, model, ds, *batches[name], args.time_batches)
    for name in runs[0]:
        eff = np.array([r[name]["padding_efficiency"] for r in runs])
        row = {"padding_efficiency": round(float(eff.mean()), 4), "min": float(eff.min()),
               "max": float(eff.max()), "num_batches": runs[0][name]["num_batches"]}
        speed = ""
        if name in timed:
            row["real_tokens_per_s"] = round(timed[name], 1)
            row["seconds_per_epoch"] = round(int(ds.lengths.sum()) / timed[name], 1)
            speed = f"{row['real_tokens_per_s']:>12.0f}{row['seconds_per_epoch']:>9.0f}"
        result["strategies"][name] = row
        print(f"  {name:<24}{100 * row['padding_efficiency']:>8.1f}%{100 * row['min']:>7.1f}%"
              f"{100 * row['max']:>7.1f}%{row['num_batches']:>9}{speed}")
    atomic_write_json(args.json, result)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
