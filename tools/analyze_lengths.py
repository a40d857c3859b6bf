"""Length profile of a split and the padding efficiency of each batching strategy.

    python tools/analyze_lengths.py -c configs/sentiment/transformer.yaml [--split train]
        [--json OUT.json] [--png OUT.png] [-o Data.max_len=512 ...]

Prints the length table (count, min, mean, p50-p99, max, share over max_len) and,
side by side, one simulated epoch of: pad-to-max_len, random batches with dynamic
padding, group_by_length megabatches, quantile and optimal buckets (padded to the
boundary), token budget with pools of --pool-sizes batches, and fairseq-style
global sorting: padding efficiency, number of batches, max tokens per batch.
--png writes the histogram + CDF; --json the report (strategies.<name>.padding_efficiency).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ppvarlen.config import ConfigError, add_config_args, load_config  # noqa: E402
from ppvarlen.data.errors import DataError  # noqa: E402


def main(argv=None):
    parser = add_config_args(argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter))
    parser.add_argument("--split", default="train", choices=["train", "dev", "test"])
    parser.add_argument("--json", metavar="OUT", help="write the report as JSON")
    parser.add_argument("--png", metavar="OUT", help="write the length histogram + CDF")
    parser.add_argument("--batch-size", type=int, default=32,
                        help="examples per batch for the fixed-size strategies (default 32)")
    parser.add_argument("--pool-sizes", type=int, nargs="+", default=[50, 100, 200],
                        help="token-budget pool sizes in batches (default 50 100 200)")
    args = parser.parse_args(argv)
    if args.batch_size < 1 or min(args.pool_sizes) < 1:
        parser.error("--batch-size and --pool-sizes must be positive")
    try:
        cfg = load_config(args.config, args.override)
        from ppvarlen.data.report import analyze_lengths, format_report
        from ppvarlen.utils.io import atomic_write_json
        from ppvarlen.utils.log import setup_logging

        setup_logging(cfg.Global.log_level)
        report = analyze_lengths(cfg, args.split, args.png, args.batch_size, args.pool_sizes)
    except (ConfigError, DataError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(format_report(report))
    if args.json:
        atomic_write_json(args.json, report)
        print(f"wrote {args.json}")
    if args.png:
        print(f"wrote {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
