"""Evaluate a checkpoint on a split.

    python tools/eval.py -c output/run/config.yaml --checkpoint output/run/best [--split test]

The model, vocabulary and label names come from the checkpoint; the data
options (corpus, files, max_len, long_text) from the config.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ppvarlen.config import ConfigError, add_config_args, load_config  # noqa: E402
from ppvarlen.data.errors import DataError  # noqa: E402


def main(argv=None):
    parser = add_config_args(argparse.ArgumentParser(description=__doc__,
                                                     formatter_class=argparse.RawDescriptionHelpFormatter))
    parser.add_argument("--checkpoint", required=True, help="checkpoint dir, e.g. output/run/best")
    parser.add_argument("--split", default="test", choices=["train", "dev", "test"])
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.config, args.override)
        from ppvarlen.engine import evaluate_checkpoint

        result = evaluate_checkpoint(cfg, args.checkpoint, args.split)
    except (ConfigError, DataError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
