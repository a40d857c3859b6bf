"""Masked-character pretraining of the transformer_cls encoder (warm start for classifiers).

    python tools/pretrain.py -c configs/sentiment/pretrain_mlm.yaml [-o Section.key=value ...]

The same as tools/train.py with Train.task=masked_lm (the Trainer: resume, AMP, distributed,
checkpoints).  Trains on the TRAIN split of Data.corpus (+ Pretrain.extra_corpora); writes
Global.output_dir/encoder.safetensors and vocab.txt besides the usual checkpoints,
train_log.jsonl and metrics.json.  A classifier then starts from it with
-o Model.init_from=<output_dir>/encoder.safetensors (same Model and Data sections).
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
        cfg = load_config(args.config, list(args.override) + ["Train.task=masked_lm"])
        from ppvarlen.engine import train

        result = train(cfg)
    except (ConfigError, DataError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
