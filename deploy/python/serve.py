"""Serve an export directory over HTTP with dynamic batching.

    python deploy/python/serve.py --model-dir output/export [--host 127.0.0.1] [--port 8080]
        [--backend paddle|onnx] [-o Deploy.max_wait_ms=5 -o Deploy.max_batch_size=64 ...]

POST /predict {"texts": [...]}, GET /health, GET /metrics.  Ctrl-C / SIGTERM stop
taking requests and finish the queued ones before exiting.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", required=True, help="export directory (has manifest.json)")
    parser.add_argument("--backend", choices=["paddle", "onnx"], default=None,
                        help="default: Deploy.backend (paddle)")
    parser.add_argument("--host", default=None, help="default: Deploy.host (127.0.0.1)")
    parser.add_argument("--port", type=int, default=None, help="default: Deploy.port (8080)")
    parser.add_argument("-o", "--override", action="append", default=[], metavar="Deploy.KEY=V",
                        help="override a Deploy setting, e.g. -o Deploy.max_wait_ms=2")
    args = parser.parse_args(argv)

    from ppvarlen.config import ConfigError, load_config
    from ppvarlen.data.errors import DataError
    from ppvarlen.utils.log import setup_logging

    setup_logging()
    try:
        bad = [o for o in args.override if not o.startswith("Deploy.")]
        if bad:
            raise ConfigError(f"serve.py takes only Deploy.* overrides, got {bad}")
        cfg = load_config(overrides=args.override)
        from ppvarlen.deploy.server import serve

        serve(args.model_dir, cfg.Deploy, args.host, args.port, args.backend)
    except (ConfigError, DataError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
