"""Exported Paddle Inference (oneDNN, N threads) vs dygraph eager, on the test split, one run.

    python benchmarks/export_throughput.py -c configs/sentiment/transformer.yaml \\
        --checkpoint output/sentiment_transformer/best --export output/export/sentiment_transformer \\
        [--threads 2] [--repeats 3] [--json output/bench/export_throughput.json]

Both sides run the same length-sorted token-budget batches (``Data.eval_max_tokens``)
with the same thread count; each is warmed up on one pass, then timed over
``--repeats`` passes, interleaved (eager, predictor, ...) so that load from other
processes falls on both alike.  Prints examples/s per backend and the ratios.
"""
import argparse
import json
import os

from ppvarlen.config import add_config_args, load_config
from ppvarlen.export.precision_speed import one_pass


def timed(runners, batches, repeats):
    """Seconds per runner; passes interleaved so load from other processes hits all alike."""
    for run in runners.values():  # warm-up: oneDNN primitive caches, allocator
        one_pass(run, batches)
    seconds = dict.fromkeys(runners, 0.0)
    for _ in range(repeats):
        for name, run in runners.items():
            seconds[name] += one_pass(run, batches)
    return seconds


def main():
    parser = add_config_args(argparse.ArgumentParser(description=__doc__))
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--export", required=True, help="export dir from tools/export.py")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # eager's math threads, before paddle loads
    import paddle

    from ppvarlen.data.collate import Collator
    from ppvarlen.engine.checkpoint import load_for_inference
    from ppvarlen.export import parity
    from ppvarlen.export.exporter import load_test_split
    from ppvarlen.utils.io import atomic_write_json

    paddle.set_device("cpu")
    cfg = load_config(args.config, args.override)
    model, meta, encoder, _ = load_for_inference(args.checkpoint)
    items = [{"input_ids": e["input_ids"]} for e in load_test_split(cfg, encoder, meta["task"])]
    _, batches = parity.split_batches(items, Collator(encoder.pad_id), cfg.Data.eval_max_tokens)
    batches = [(b["input_ids"], b["seq_len"]) for b in batches]
    model_dir = os.path.join(args.export, "paddle")
    runners = {"dygraph_eager": parity.dygraph_runner(model),
               "paddle_inference_onednn": parity.paddle_inference_runner(
                   model_dir, threads=args.threads),
               "paddle_inference_no_onednn": parity.paddle_inference_runner(
                   model_dir, onednn=False, threads=args.threads)}
    result = {"model_name": meta["model_name"], "examples": len(items), "batches": len(batches),
              "threads": args.threads, "repeats": args.repeats, "cpu_count": os.cpu_count()}
    for name, seconds in timed(runners, batches, args.repeats).items():
        result[name] = {"seconds": seconds, "examples_per_s": args.repeats * len(items) / seconds}
    eager = result["dygraph_eager"]["examples_per_s"]
    result["speedup_onednn_vs_eager"] = result["paddle_inference_onednn"]["examples_per_s"] / eager
    result["speedup_no_onednn_vs_eager"] = (result["paddle_inference_no_onednn"]["examples_per_s"]
                                            / eager)
    print(json.dumps(result, indent=2))
    if args.json:
        atomic_write_json(args.json, result)


if __name__ == "__main__":
    main()
