"""Export a trained checkpoint for serving: Paddle Inference + ONNX, precisions, parity report.

    python tools/export.py -c configs/sentiment/transformer.yaml \\
        --checkpoint output/sentiment_transformer/best --output output/export/sentiment_transformer \\
        [--format paddle,onnx] [--precision fp32,bf16,fp16] [--verify | --no-verify]

Writes OUTPUT/ (atomically): manifest.json, vocab.txt, encoder.json, paddle/model.json +
model.pdiparams, onnx/model.onnx (+ model_fp16.onnx, crf_transitions.npy), parity.json.
Seq2seq: paddle/model.json holds the whole greedy loop; onnx/encoder.onnx + decoder_step.onnx;
--verify then requires greedy outputs identical to the eager model (fp32 only).
--verify compares every backend with the eager model on a shape grid and the test split and
fails (exit 1, old export kept) if fp32 differs by > 1e-4 or any argmax differs, or bf16/fp16
agree on < 99.5% of the test split.  Defaults come from the config's Export section.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ppvarlen.config import ConfigError, add_config_args, load_config  # noqa: E402
from ppvarlen.data.errors import DataError  # noqa: E402


def _csv(text):
    return [t.strip() for t in text.split(",") if t.strip()]


def main(argv=None):
    parser = add_config_args(argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter))
    parser.add_argument("--checkpoint", required=True, help="checkpoint dir, e.g. OUTPUT_DIR/best")
    parser.add_argument("--output", required=True, help="export directory to write")
    parser.add_argument("--format", type=_csv, help="paddle,onnx (default: Export.format)")
    parser.add_argument("--precision", type=_csv, help="fp32,bf16,fp16 (default: Export.precision)")
    parser.add_argument("--verify", action=argparse.BooleanOptionalAction, default=None,
                        help="run the parity report (default: Export.verify)")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.config, args.override)
        from ppvarlen.export import ExportError
        from ppvarlen.export.exporter import export_checkpoint
        from ppvarlen.utils.log import setup_logging

        setup_logging()
        try:
            manifest = export_checkpoint(args.checkpoint, args.output, cfg, args.format,
                                         args.precision, args.verify)
        except ExportError as e:
            print(f"export failed: {e}", file=sys.stderr)
            return 1
    except (ConfigError, DataError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"exported {manifest['model_name']} to {args.output}: backends "
          f"{sorted(manifest['backends'])}, precisions {manifest['precisions']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
