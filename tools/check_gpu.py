"""Check every GPU configuration of an export on a CUDA machine; writes gpu_report.json.

    python tools/check_gpu.py --export output/export/sentiment_transformer \\
        [-c configs/sentiment/transformer.yaml] [--report gpu_report.json] [--gpu-id 0]

Paddle Inference fp32 / fp16 / bf16 / TensorRT fp16 and ONNX Runtime CUDA fp32 / fp16,
each compared with CPU fp32 on the export's shape grid (+ the config's test split with -c)
and timed.  Exit 0 all ok, 1 a configuration failed (named in the report), 2 no GPU here.
Logic: ppvarlen/export/gpu_check.py.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ppvarlen.export.gpu_check import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
