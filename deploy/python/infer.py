"""Predict every line of a file with an exported model; JSONL out, in input order.

    python deploy/python/infer.py --model-dir output/export --backend paddle|onnx \
        --input texts.txt|texts.jsonl [--output preds.jsonl] [--precision fp32|bf16|fp16|int8|auto]

Bad lines are reported with their line number (and written as {"line", "error"}
records); the other lines are still predicted; the exit code is 1 if any line failed.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", required=True, help="export directory (has manifest.json)")
    parser.add_argument("--backend", choices=["paddle", "onnx"], default="paddle")
    parser.add_argument("--input", required=True, help=".txt (a text per line) or .jsonl")
    parser.add_argument("--output", default=None, help="JSONL predictions (default: stdout)")
    parser.add_argument("--precision", choices=["fp32", "bf16", "fp16", "int8", "auto"],
                        default="fp32")  # [precision]
    parser.add_argument("--device", choices=["cpu", "gpu"], default="cpu")
    parser.add_argument("--tensorrt", action="store_true", help="paddle on GPU: TensorRT")
    parser.add_argument("--threads", type=int, default=1,
                        help="CPU math threads (1 was fastest on 2 shared cores)")
    parser.add_argument("--max-batch-tokens", type=int, default=8192,
                        help="token budget per batch, padding counted")
    parser.add_argument("--max-batch-size", type=int, default=64)
    parser.add_argument("--split-long-sources", action="store_true",
                        help="seq2seq: cut a source longer than the export's max_len after clause "
                        "punctuation, decode the pieces and join them")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    args = parser.parse_args(argv)

    from ppvarlen.config import ConfigError
    from ppvarlen.data.errors import DataError
    from ppvarlen.deploy.infer import run_file
    from ppvarlen.deploy.predictor import Predictor

    try:
        predictor = Predictor(args.model_dir, args.backend, device=args.device,
                              precision=args.precision, threads=args.threads,
                              max_batch_tokens=args.max_batch_tokens,
                              max_batch_size=args.max_batch_size, tensorrt=args.tensorrt,
                              split_long_sources=args.split_long_sources)
        summary = run_file(predictor, args.input, args.output, progress=not args.no_progress)
    except (ConfigError, DataError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(summary, ensure_ascii=False), file=sys.stderr)
    return 1 if summary["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
