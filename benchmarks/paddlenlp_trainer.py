"""Stock PaddleNLP Trainer vs Trainer + ppvarlen token budget: same model, data, examples.

    python benchmarks/paddlenlp_trainer.py [--train 1500 --dev 400 --epochs 3 --rounds 1 --lr 2e-3]

* stock        — ``paddlenlp.trainer.Trainer``: its default shuffled sampler (batches of
                 --batch-size) + ``DataCollatorWithPadding`` (pads to the batch's longest);
* token_budget — ``LengthBatchingTrainer``: ppvarlen's ``TokenBudgetBatchSampler`` (sorted
                 within shuffled pools of --pool-size batches) with the smallest budget that
                 gives no more batches per epoch than stock (so both take about the same
                 optimizer steps over the same examples) + ``ModelInputCollator``;
* bucket       — ``LengthBatchingTrainer`` with 8 optimal length buckets and a fixed 32
                 examples per batch (random within a bucket).

Same random-init ERNIE (examples/paddlenlp_trainer_sentiment.py's model: no weights can be
downloaded here), the sentiment corpus tokenised at max_length 512, same seed and learning
rate.  Reported per scheme: real (non-pad) tokens per second of ``train()`` wall time and
per CPU-second of this process (less sensitive to other jobs on a shared CPU), padding
efficiency (real / padded tokens), dev accuracy after the same examples.  The schemes run
in alternating order for --rounds rounds (the CPU is shared: medians, and the load average
before/after each run, are recorded).  Writes paddlenlp_trainer.json (after every run) and
.png under --out.
"""
import argparse
import os
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import numpy as np
from paddlenlp.data import DataCollatorWithPadding
from paddlenlp.trainer import Trainer, TrainingArguments
from paddlenlp.transformers import AutoModelForSequenceClassification, AutoTokenizer

from ppvarlen.data.lengths import optimal_boundaries
from ppvarlen.data.samplers import TokenBudgetBatchSampler
from ppvarlen.integrations.paddlenlp_trainer import (LengthBatchingTrainer,
                                                     ModelInputCollator, lengths_of,
                                                     make_random_model_dir)
from ppvarlen.utils.io import atomic_save_png, atomic_write_json


def _example():
    """examples/paddlenlp_trainer_sentiment.py, loaded by path: the benchmark trains exactly
    the example's model on the example's data."""
    import importlib.util

    path = os.path.join(ROOT, "examples", "paddlenlp_trainer_sentiment.py")
    spec = importlib.util.spec_from_file_location("paddlenlp_trainer_sentiment", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_EXAMPLE = _example()
accuracy, encode, sentiment_splits = _EXAMPLE.accuracy, _EXAMPLE.encode, _EXAMPLE.sentiment_splits

MAX_LENGTH = 512
SEED = 42


class CountingCollator:
    """Counts real and padded input_ids tokens of every training batch it builds."""

    def __init__(self, collate):
        self.collate = collate
        self.real = self.padded = 0

    def __call__(self, items):
        batch = self.collate(items)
        self.real += sum(len(item["input_ids"]) for item in items)
        self.padded += int(np.prod(batch["input_ids"].shape))
        return batch


def budget_for_batches(lengths, num_batches, max_sentences, pool_size, epochs, seed):
    """Smallest token budget whose pooled packing has <= num_batches batches in each of the
    run's epochs (the trainer's sampler, same seed)."""
    lo, hi = int(lengths.max()), int(lengths.max()) * len(lengths)
    while lo < hi:
        mid = (lo + hi) // 2
        sampler = TokenBudgetBatchSampler(lengths, mid, pool_size=pool_size, seed=seed,
                                          max_sentences=max_sentences)
        if max(sampler.batch_counts(range(epochs))) <= num_batches:
            hi = mid
        else:
            lo = mid + 1
    return lo


def run(scheme, model_dir, train, dev, args, out_dir, max_tokens):
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir)
    targs = TrainingArguments(output_dir=out_dir, device="cpu", report_to=[],
                              num_train_epochs=args.epochs, learning_rate=args.lr,
                              per_device_train_batch_size=args.batch_size,
                              per_device_eval_batch_size=args.batch_size, logging_steps=10 ** 6,
                              save_strategy="no", disable_tqdm=True, seed=SEED)
    if scheme == "stock":
        train_collate = CountingCollator(DataCollatorWithPadding(tokenizer))
        trainer = Trainer(model=model, args=targs, train_dataset=train, eval_dataset=dev,
                          data_collator=train_collate, compute_metrics=accuracy)
        eval_collate = DataCollatorWithPadding(tokenizer)
    elif scheme == "bucket":
        train_collate = CountingCollator(ModelInputCollator(tokenizer, model))
        trainer = LengthBatchingTrainer(model=model, args=targs, train_dataset=train,
                                        eval_dataset=dev, data_collator=train_collate,
                                        compute_metrics=accuracy,
                                        bucket_boundaries=optimal_boundaries(
                                            lengths_of(train), args.buckets))
        eval_collate = ModelInputCollator(tokenizer, model)
    else:
        train_collate = CountingCollator(ModelInputCollator(tokenizer, model))
        trainer = LengthBatchingTrainer(model=model, args=targs, train_dataset=train,
                                        eval_dataset=dev, data_collator=train_collate,
                                        compute_metrics=accuracy, max_tokens=max_tokens,
                                        max_sentences=args.max_sentences,
                                        pool_size=args.pool_size,
                                        eval_max_tokens=4 * max_tokens)
        eval_collate = ModelInputCollator(tokenizer, model)
    load_before = os.getloadavg()
    t0, cpu0 = time.perf_counter(), time.process_time()
    result = trainer.train()
    seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - cpu0
    trainer.data_collator = eval_collate  # evaluation is not part of the throughput
    dev_acc = trainer.evaluate()["eval_accuracy"]
    return {"seconds": round(seconds, 2), "cpu_seconds": round(cpu_seconds, 2),
            "steps": result.global_step,
            "real_tokens": train_collate.real, "padded_tokens": train_collate.padded,
            "real_tokens_per_s": train_collate.real / seconds,
            "real_tokens_per_cpu_s": train_collate.real / cpu_seconds,
            "padding_efficiency": train_collate.real / train_collate.padded,
            "dev_accuracy": dev_acc, "loadavg_before": load_before,
            "loadavg_after": os.getloadavg()}


def plot(report, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(report["median"])
    panels = [("real_tokens_per_s", "real tokens / s (wall)"),
              ("real_tokens_per_cpu_s", "real tokens / CPU-s"),
              ("padding_efficiency", "padding efficiency"), ("dev_accuracy", "dev accuracy")]
    fig, axes = plt.subplots(1, 4, figsize=(14, 3.4))
    for ax, (key, title) in zip(axes, panels):
        values = [report["median"][n][key] for n in names]
        ax.bar(names, values, color=["#999999", "#2a7ab0", "#e07b39"][:len(names)])
        ax.set_title(title)
        for i, v in enumerate(values):
            ax.text(i, v, f"{v:.3g}", ha="center", va="bottom")
    fig.suptitle(f"PaddleNLP Trainer, sentiment, max_length {MAX_LENGTH} "
                 f"(shared CPU, load {report['loadavg_start'][0]:.1f})")
    fig.tight_layout()
    atomic_save_png(fig, path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train", type=int, default=1500, help="training examples")
    ap.add_argument("--dev", type=int, default=400, help="dev examples")
    ap.add_argument("--epochs", type=float, default=3)
    ap.add_argument("--batch-size", type=int, default=32, help="stock Trainer batch size")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--max-sentences", type=int, default=64,
                    help="cap on examples per token-budget batch (uncapped, the whole-split "
                         "sort packs hundreds of the shortest texts into one batch)")
    ap.add_argument("--pool-size", type=int, default=16,
                    help="token budget: sort within shuffled pools of this many batches")
    ap.add_argument("--buckets", type=int, default=8, help="length buckets of the bucket scheme")
    ap.add_argument("--schemes", default="stock,token_budget,bucket")
    ap.add_argument("--out", default="output/bench")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    loadavg_start = os.getloadavg()

    splits, label_names = sentiment_splits()
    texts = [ex["text"] for ex in splits["train"][:args.train]]
    model_dir = make_random_model_dir(os.path.join(args.out, "paddlenlp_trainer_init"), texts,
                                      num_labels=len(label_names))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    train = encode(tokenizer, splits["train"][:args.train], MAX_LENGTH)
    dev = encode(tokenizer, splits["dev"][:args.dev], MAX_LENGTH)
    stock_batches = -(-len(train) // args.batch_size)
    max_tokens = budget_for_batches(lengths_of(train), stock_batches, args.max_sentences,
                                    args.pool_size, int(np.ceil(args.epochs)), SEED)

    setup = {"max_length": MAX_LENGTH, "train_examples": len(train), "dev_examples": len(dev),
             "epochs": args.epochs, "stock_batch_size": args.batch_size,
             "token_budget_max_tokens": max_tokens, "batches_per_epoch": stock_batches,
             "token_budget_max_sentences": args.max_sentences,
             "token_budget_pool_size": args.pool_size, "lr": args.lr,
             "cpu_count": os.cpu_count(), "loadavg_start": loadavg_start,
             "omp_num_threads": os.environ.get("OMP_NUM_THREADS")}
    runs = {name: [] for name in args.schemes.split(",")}
    for r in range(args.rounds):
        order = list(runs) if r % 2 == 0 else list(runs)[::-1]
        for scheme in order:
            res = run(scheme, model_dir, train, dev, args,
                      os.path.join(args.out, "paddlenlp_trainer_runs", scheme), max_tokens)
            print(f"round {r} {scheme:>12}: {res['real_tokens_per_s']:8.0f} real tok/s  "
                  f"{res['real_tokens_per_cpu_s']:8.0f} per CPU-s  "
                  f"padding eff {res['padding_efficiency']:.3f}  dev acc "
                  f"{res['dev_accuracy']:.4f}  {res['seconds']}s  load {res['loadavg_after'][0]:.1f}",
                  flush=True)
            runs[scheme].append(res)
            report = write_report(args.out, setup, runs)  # after every run: partial results
    for key in sorted(k for k in report if k.startswith("speedup_")):
        print(f"{key}: x{report[key]:.2f}")


def write_report(out, setup, runs):
    keys = ("real_tokens_per_s", "real_tokens_per_cpu_s", "padding_efficiency", "dev_accuracy",
            "seconds", "cpu_seconds")
    median = {s: {k: float(np.median([r[k] for r in rs])) for k in keys}
              for s, rs in runs.items() if rs}
    report = dict(setup, loadavg_end=os.getloadavg(), runs=runs, median=median, note=(
        "CPU shared with other jobs: wall-clock numbers are contended (load average recorded "
        "per run); tokens per CPU-second of this process are less sensitive to the other "
        "jobs. Schemes alternate when rounds > 1"))
    if "stock" in median and len(median) > 1:
        for name in set(median) - {"stock"}:
            for key in ("real_tokens_per_s", "real_tokens_per_cpu_s"):
                report[f"speedup_{key}_{name}"] = median[name][key] / median["stock"][key]
        plot(report, os.path.join(out, "paddlenlp_trainer.png"))
    atomic_write_json(os.path.join(out, "paddlenlp_trainer.json"), report)
    return report

if __name__ == "__main__":
    main()
