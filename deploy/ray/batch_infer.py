"""Batch inference on Ray Data (see ppvarlen/integrations/ray_batch.py and docs/SCALING.md).

    python deploy/ray/batch_infer.py --model-dir output/export --input texts/ \
        --output-dir output/ray_infer [--backend onnx] [--actors 2] [--address auto]

Needs ppvarlen and its ray extra installed, or PYTHONPATH=<repo> (docs/SCALING.md).
"""
import sys

from ppvarlen.integrations.ray_batch import main

if __name__ == "__main__":
    sys.exit(main())
