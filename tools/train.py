"""Train a model from a config.

    python tools/train.py -c configs/sentiment/transformer.yaml [-o Section.key=value ...]
    python -m paddle.distributed.launch --nproc_per_node 2 tools/train.py -c CONFIG   # data-parallel

Writes Global.output_dir: config.yaml, train_log.jsonl, metrics.json, curves.png,
ckpt-N/ (+ last -> newest), best/.  Ctrl-C saves a checkpoint; continue with
-o Train.resume=auto.
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
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.config, args.override)
        from ppvarlen.engine import train

        result = train(cfg)
    except (ConfigError, DataError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if result.get("interrupted"):
        print(f"interrupted at step {result['step']}; checkpoint saved, resume with "
              f"-o Train.resume=auto", file=sys.stderr)
        return 130
    if os.environ.get("PADDLE_TRAINER_ID", "0") != "0":
        return 0  # data-parallel: rank 0 reports
    print(json.dumps({"best_step": result["best_step"], "dev": result["dev"], "test": result["test"],
                      "train_time_s": result["train_time_s"]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
