"""Encode a config's corpus into the store cache on a Ray cluster (see ppvarlen/integrations/ray_store.py).

    python deploy/ray/build_store.py -c configs/sentiment/transformer.yaml \
        -o Data.corpus=jsonl -o Data.train_file=big.jsonl [--address auto]

tools/train.py with the same -c/-o then reuses the store.  Needs ppvarlen and its ray extra
installed, or PYTHONPATH=<repo>.
"""
import sys

from ppvarlen.integrations.ray_store import main

if __name__ == "__main__":
    sys.exit(main())
