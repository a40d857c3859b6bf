"""Serve an export on Ray Serve, replicas and resources from a Serve config file.

    python deploy/ray/serve.py [--config deploy/ray/serve.yaml] [--model-dir output/export]
        [--address auto]

Same HTTP API as deploy/python/serve.py (POST /predict, GET /health, GET /metrics).
Ctrl-C / SIGTERM shut Serve down (each replica drains its queue).  Needs ppvarlen and
its ray extra installed, or PYTHONPATH=<repo> (docs/SCALING.md).
"""
import sys

from ppvarlen.integrations.ray_serve import main

if __name__ == "__main__":
    sys.exit(main())
