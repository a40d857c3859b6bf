"""Load-test the HTTP server: dynamic batching on vs off (max_batch_size=1) in one run.

    python deploy/python/bench_client.py --model-dir output/export [--backend paddle|onnx]
        [--concurrency 16] [--requests 2000] [--duration 30] [--output-dir output/bench]
        [-o Deploy.threads=1 ...]   (server settings for both runs)

Starts serve.py itself on free 127.0.0.1 ports (one per setting), drives it with
concurrent clients sending texts from the test split of the export's task (sentiment
reviews, or g2p sources for a seq2seq export), and writes
bench.json + bench.png (QPS, P50/P95/P99 latency, errors, batch size, padding).
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
    parser.add_argument("--concurrency", type=int, default=16, help="concurrent clients")
    parser.add_argument("--requests", type=int, default=2000, help="max requests per setting")
    parser.add_argument("--duration", type=float, default=30.0, help="max seconds per setting")
    parser.add_argument("--output-dir", default="output/bench")
    parser.add_argument("-o", "--override", action="append", default=[], metavar="Deploy.KEY=V",
                        help="a server setting for both runs, e.g. -o Deploy.threads=1")
    args = parser.parse_args(argv)
    if args.concurrency < 1 or args.requests < 1 or args.duration <= 0:
        parser.error("--concurrency, --requests and --duration must be positive")

    from ppvarlen.config import ConfigError, load_config, parse_override
    from ppvarlen.data.errors import DataError
    from ppvarlen.deploy.bench import run_benchmark
    from ppvarlen.utils.log import setup_logging

    setup_logging()
    try:
        bad = [o for o in args.override if not o.startswith("Deploy.") or "=" not in o]
        if bad:
            raise ConfigError(f"bench_client.py takes only Deploy.KEY=VALUE overrides, got {bad}")
        load_config(overrides=args.override)  # unknown key / bad value: fail here, not in the server
        # Forwarded verbatim to serve.py's -o, which parses them the same way.
        common = {parse_override(o)[0][1]: o.split("=", 1)[1] for o in args.override}
        results = run_benchmark(args.model_dir, args.output_dir, args.backend, args.concurrency,
                                args.requests, args.duration, common_overrides=common)
    except (ConfigError, DataError, ValueError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(results, indent=2, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
