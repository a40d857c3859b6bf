"""The command-line entry points, with one argument style and one error policy.

Each ``main_*`` function is a console script (setup.py) and the ``main`` of a PaddleClas-style
shim (``tools/*.py``, ``deploy/python/*.py``); it takes ``argv`` and returns the exit code.

Error policy (``run_command``): the typed errors a user can fix -- ``ConfigError``,
``DataError``, ``UnservableExportError`` (an export directory that cannot be served),
``ModelLoadError`` (a model ppvarlen-doctor cannot load) and ``DiskFullError`` (a write found the
disk full; it names the path and the bytes) -- print one paragraph on stderr and exit 2;
``ExportFailedError`` (an export that could not be produced or failed its parity check; the old
export is kept) and ``WorkerLost`` (a worker process died or stalled, e.g. killed for memory;
nothing half-written is kept) exit 1.  Ctrl-C (``KeyboardInterrupt``) prints one line and ends
the process by SIGINT.  Anything else is a bug and keeps its traceback.

Each command imports its own module (the trainer, the exporter, the server, ...) when it runs,
the one kind of import inside a function here: ``--help`` and config errors stay instant and
paddle-free.

Process-wide settings (``command_settings``: the known-harmless import warnings silenced,
Hugging Face probes offline, MKL's AVX2 kernels on AMD) are made here, when a command starts
and before it imports paddle, never at ``import ppvarlen``: a user's script that imports one
helper keeps its own process as it was.
"""
import argparse
import functools
import inspect
import json
import logging
import os
import signal
import sys
import textwrap
import warnings

import yaml

from . import _mkl, _quiet
from .config import ConfigError, add_config_args, load_config, parse_override
from .config_schema import MODEL_KEYS, SCHEMA, iter_keys
from .data.columns import COLUMN_KEYS, column_keys
from .data.errors import DataError
from .runtime.embedding_files import FORMATS as EMBEDDING_FORMATS
from .runtime.infer import WINDOW, run_file
from .runtime.manifest import UnservableExportError
from .runtime.precision_choice import load_admitted
from .runtime.predictor import Predictor
from .runtime import threads_choice
from .doctor.errors import ModelLoadError
from .export.errors import ExportFailedError
from .models.sentence_transformers_dir import PADDLENLP_EMBED_POOLINGS
from .tasks import get_task
from .utils.io import DiskFullError, atomic_write_json
from .utils.log import get_logger, setup_logging
from .utils.parallel import WorkerLost, die_by

# (typed error, exit code, what the message starts with); the first match wins
ERROR_POLICY = (
    (ExportFailedError, 1, "export failed"),
    (WorkerLost, 1, "stopped"),
    (ConfigError, 2, "error"),
    (DataError, 2, "error"),
    (UnservableExportError, 2, "error"),
    (ModelLoadError, 2, "error"),
    (DiskFullError, 2, "error"),
)
USER_ERRORS = tuple(cls for cls, _, _ in ERROR_POLICY)


class _BelowWarning(logging.Filter):
    def filter(self, record):
        return record.levelno >= logging.WARNING


def quiet_third_party_output():
    """Keep Paddle's and PaddleNLP's known noise out of a ppvarlen command's output.

    Called by each command before it imports Paddle (never at import of ppvarlen, so a
    library user's process is left alone):

    * Paddle's C++ (glog) warnings, e.g. "PIR not support input out tensor for now!!!!!" on
      every to_static trace: GLOG_minloglevel=2 (errors still show), unless the user set it;
      ``GLOG_minloglevel=0`` brings them back.
    * Paddle's "Tensor do not have 'place' interface for pir graph mode" UserWarning, raised
      when a model reads ``.place`` while it is traced (harmless: export never runs on it).
    * PaddleNLP's coloured INFO lines (its "PaddleNLP" logger): only its warnings and errors.
    """
    os.environ.setdefault("GLOG_minloglevel", "2")
    warnings.filterwarnings("ignore", message=r"(Tensor|Variable) do not have 'place' interface",
                            category=UserWarning)
    paddlenlp_logger = logging.getLogger("PaddleNLP")
    if not any(isinstance(f, _BelowWarning) for f in paddlenlp_logger.filters):
        paddlenlp_logger.addFilter(_BelowWarning())


def run_command(parser, argv, command):
    """Parse ``argv`` and run ``command(args)`` under the error policy -> exit code (the commands
    here and the Ray commands of ``ppvarlen.integrations``, deploy/ray/*.py)."""
    args = parser.parse_args(argv)
    command_settings()
    quiet_third_party_output()
    setup_logging()  # every command logs in one format (the trainer re-applies its log_level)
    try:
        return command(args)
    except USER_ERRORS as e:
        code, what = next((c, w) for cls, c, w in ERROR_POLICY if isinstance(e, cls))
        paragraph = " ".join(line.strip() for line in str(e).splitlines() if line.strip())
        print(f"{parser.prog}: {what}: {paragraph}", file=sys.stderr)
        return code
    except KeyboardInterrupt:
        # the user's own stop: one line, not a traceback from wherever the command was; the
        # process ends by SIGINT as Python's own exit on it does (a shell's loop stops too)
        print(f"{parser.prog}: stopped by Ctrl-C (SIGINT)", file=sys.stderr, flush=True)
        logging.shutdown()
        die_by(signal.SIGINT)


def _run(parser, argv, command):  # tools/gen_docs.py swaps it to read the commands' parsers
    return run_command(parser, argv, command)


def command_settings():
    """The process-wide settings of a ppvarlen command, made before the command imports paddle
    (MKL reads its variable then); each is logged at DEBUG (the trainer logs MKL's at INFO)."""
    lines = [_quiet.apply(), _mkl.apply()]
    for line in lines:
        get_logger("ppvarlen.cli").debug("%s", line)
    return lines


def _parser(main, config=True):
    """An argument parser whose help is ``main``'s docstring; ``-c``/``-o`` when ``config``."""
    parser = argparse.ArgumentParser(description=inspect.getdoc(main),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    return add_config_args(parser) if config else parser


def _positive(kind):
    def parse(text):
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {text}")
        return value
    return parse


def _threads(text):
    if text == "auto":
        return text
    try:
        return _positive(int)(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a count >= 1 or auto, got {text!r}") from None


def _non_negative(kind):
    def parse(text):
        value = kind(text)
        if value < 0:
            raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
        return value
    return parse


positive_int = _positive(int)


def _csv(text):
    return [t.strip() for t in text.split(",") if t.strip()]


def _checkpoint_dir(path):
    """Fail on a path that is not a checkpoint before the slow model and data loading."""
    if not os.path.isfile(os.path.join(path, "meta.json")):
        raise ConfigError(f"--checkpoint {path}: not a checkpoint directory (no meta.json); "
                          f"pass e.g. output/run/best")
    return path


def _deploy_overrides(overrides, command):
    """``-o`` texts of the serving commands: Deploy.KEY=VALUE only, checked like a config."""
    bad = [o for o in overrides if not o.startswith("Deploy.") or "=" not in o]
    if bad:
        raise ConfigError(f"{command} takes only Deploy.KEY=VALUE overrides, got {bad}")
    return load_config(overrides=overrides)


def _print_json(obj):
    print(json.dumps(obj, indent=2, ensure_ascii=False))


# ---------------------------------------------------------------- training side

def main_train(argv=None):
    """Train a model from a config.

        ppvarlen-train -c configs/sentiment/transformer.yaml [-o Section.key=value ...]
        python tools/train.py -c CONFIG ...                        # the same command
        python -m paddle.distributed.launch --nproc_per_node 2 tools/train.py -c CONFIG   # data-parallel

    Writes Global.output_dir: config.yaml, train_log.jsonl, metrics.json, curves.png,
    ckpt-N/ (+ last -> newest), best/.  Ctrl-C saves a checkpoint; continue with
    -o Train.resume=auto.  A directory holding another run is refused: continue it with
    -o Train.resume=auto, or replace it with -o Global.overwrite_output_dir=true.
    """
    return _run(_parser(main_train), argv, _train)


def _train(args):
    cfg = load_config(args.config, args.override)
    from .engine import train

    result = train(cfg)
    if result.get("interrupted"):
        print(f"interrupted at step {result['step']}; checkpoint saved, resume with "
              f"-o Train.resume=auto", file=sys.stderr)
        return 130
    if os.environ.get("PADDLE_TRAINER_ID", "0") != "0":
        return 0  # data-parallel: rank 0 reports
    _print_json({k: result[k] for k in ("best_step", "dev", "test", "train_time_s")})
    return 0


def main_pretrain(argv=None):
    """Masked-character pretraining of the transformer_cls encoder (warm start for classifiers).

        ppvarlen-pretrain -c configs/sentiment/pretrain_mlm.yaml [-o Section.key=value ...]
        python tools/pretrain.py -c CONFIG ...                     # the same command

    The same as ppvarlen-train with Train.task=masked_lm (the Trainer: resume, AMP,
    distributed, checkpoints).  Trains on the TRAIN split of Data.corpus (+
    Pretrain.extra_corpora); writes Global.output_dir/encoder.safetensors and vocab.txt
    besides the usual checkpoints, train_log.jsonl and metrics.json.  A classifier then
    starts from it with -o Model.init_from=<output_dir>/encoder.safetensors (same Model and
    Data sections).
    """
    return _run(_parser(main_pretrain), argv, _pretrain)


def _pretrain(args):
    cfg = load_config(args.config, list(args.override) + ["Train.task=masked_lm"])
    from .engine import train

    _print_json(train(cfg))
    return 0


def main_eval(argv=None):
    """Evaluate a checkpoint on a split.

        ppvarlen-eval -c output/run/config.yaml --checkpoint output/run/best [--split test]
        python tools/eval.py -c CONFIG --checkpoint DIR ...        # the same command

    The model, vocabulary and label names come from the checkpoint; the data
    options (corpus, files, max_len, long_text) from the config.  The metrics go to stdout
    (JSON) and to RUN/eval/CHECKPOINT-SPLIT/metrics.json (--output-dir); classification and
    text pairs also print a per-class table (precision, recall, F1, support) and write
    confusion_matrix.json and confusion_matrix.png there.
    """
    parser = _parser(main_eval)
    parser.add_argument("--checkpoint", required=True, help="checkpoint dir, e.g. output/run/best")
    parser.add_argument("--split", default="test", choices=["train", "dev", "test"])
    parser.add_argument("--output-dir", default=None,
                        help="where metrics.json (and for classification confusion_matrix.json "
                             "and .png) are written; default RUN/eval/CHECKPOINT-SPLIT beside "
                             "the checkpoint")
    return _run(parser, argv, _eval)


def _eval(args):
    cfg = load_config(args.config, args.override)
    checkpoint = _checkpoint_dir(args.checkpoint)
    from .engine.evaluate import (eval_dir, evaluate_checkpoint, format_class_report,
                                  write_eval_report)

    result = evaluate_checkpoint(cfg, checkpoint, args.split, progress=True)
    for warning in result["warnings"]:
        print(f"warning: {warning}", file=sys.stderr)
    if result.get("per_class"):
        print(format_class_report(result["per_class"], result.get("accuracy"),
                                  result.get("macro_f1")), file=sys.stderr)
    written = write_eval_report(result, args.output_dir or eval_dir(checkpoint, args.split))
    print(f"report: {', '.join(written)}", file=sys.stderr)
    _print_json(result)
    return 0


def main_export(argv=None):
    """Export a trained checkpoint for serving: Paddle Inference + ONNX, precisions, parity report.

        ppvarlen-export -c configs/sentiment/transformer.yaml \\
            --checkpoint output/sentiment_transformer/best --output output/export/sentiment_transformer \\
            [--format paddle,onnx] [--precision auto|fp32,bf16,fp16,int8] [--verify | --no-verify]
        python tools/export.py ...                                 # the same command

    Writes OUTPUT/ (atomically): manifest.json, vocab.txt, encoder.json, paddle/model.json +
    model.pdiparams, onnx/model.onnx (+ model_fp16.onnx, crf_transitions.npy), parity.json.
    Into a model repository: --output MODELS/NAME/next writes the next free version number;
    an existing MODELS/NAME/VERSION is refused (exit 2), never rewritten under a server.  A
    full disk is one error naming the path and the bytes (exit 2), the old export kept.
    Seq2seq: paddle/model.json holds the whole greedy loop; onnx/encoder.onnx + decoder_step.onnx;
    --verify then requires greedy outputs identical to the eager model (fp32 only).
    --precision auto (the default, Export.precision) is every precision this host can verify:
    fp32, bf16 (Paddle, on a CPU with bf16 instructions), int8 (ONNX, activation scales
    calibrated on the train split); fp16 only when asked.  --verify compares every backend with
    the eager model on a shape grid and the test split and fails (exit 1, old export kept) if
    fp32 differs by > 1e-4 or any argmax differs.  Each reduced precision must keep the task's
    metric within its tolerance of fp32's on the test split (accuracy / entity F1: 0.5 points)
    and pass the server's admission checks; one that fails is left out of the export with a
    WARNING naming it and the numbers, the other precisions written (exit 0).  Defaults come
    from the config's Export section.

    Straight from a PaddleNLP save_pretrained directory (no ppvarlen training run behind it):

        ppvarlen-export --pretrained-dir DIR --output OUT [--task classification|tagging]
            [--verify-file labelled.jsonl] [-c CONFIG] [--format ...] [--precision ...]
        ppvarlen-export --pretrained-dir DIR --output OUT --task embedding
            [--pooling cls|mean|last] [--normalize | --no-normalize]

    DIR holds config.json, model.safetensors (pickle-only model_state.pdparams is refused)
    and the tokenizer files; the head and label names (id2label) are the directory's, the
    task comes from config.json's architectures (*ForSequenceClassification /
    *ForTokenClassification) or --task; the tokenizer is AutoTokenizer's on DIR, texts are
    encoded as [CLS] text [SEP].  -c is optional here (Data.max_len, Deploy shape ranges,
    Export settings); parity runs on the shape grid and, with --verify-file, on that labelled
    file ({"text", "label"} or {"tokens", "tags"} JSONL lines, a .tsv/.csv/.parquet table or a
    .conll file, read as training reads it; labels from id2label).
    --task embedding exports DIR's bare encoder (AutoModel) pooled over the real tokens:
    pooling and normalisation from a sentence-transformers layout in DIR (modules.json,
    1_Pooling/config.json, 2_Normalize), else --pooling / --normalize; a flag contradicting
    the directory, or a pooling ppvarlen lacks (max, weightedmean, ...), is an error.
    """
    parser = _parser(main_export)
    parser._option_string_actions["-c"].required = False  # --pretrained-dir needs no config
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint", help="checkpoint dir, e.g. OUTPUT_DIR/best (needs -c)")
    source.add_argument("--pretrained-dir", help="a PaddleNLP save_pretrained directory")
    parser.add_argument("--task", choices=["classification", "tagging", "embedding"],
                        help="--pretrained-dir: the head's task when config.json's architectures "
                        "do not say it; embedding: the directory's encoder (AutoModel, any "
                        "head dropped) pooled into one vector per text")
    parser.add_argument("--pooling", choices=PADDLENLP_EMBED_POOLINGS,
                        help="--pretrained-dir --task embedding: pooling over the real tokens "
                        "when the directory does not say it (sentence-transformers "
                        "modules.json / 1_Pooling/config.json); one contradicting the "
                        "directory is an error")
    parser.add_argument("--normalize", action=argparse.BooleanOptionalAction, default=None,
                        help="--pretrained-dir --task embedding: L2-normalise after pooling "
                        "(default: the directory's modules.json Normalize module, else off); "
                        "one contradicting the directory is an error")
    parser.add_argument("--verify-file", help="--pretrained-dir: a labelled file for the "
                        "parity report besides the shape grid, in any format training reads "
                        "(told by its suffix: .jsonl, .tsv, .csv, .conll, .parquet)")
    parser.add_argument("--output", required=True,
                        help="export directory to write (an existing one is replaced once the "
                        "new one is complete). In a model repository: MODELS/NAME/VERSION, a "
                        "version that does not exist yet (an existing version is refused: a "
                        "served version's files never change in place), or MODELS/NAME/next "
                        "for the next free version number")
    parser.add_argument("--format", type=_csv, help="paddle,onnx (default: Export.format)")
    parser.add_argument("--precision", type=_csv,
                        help="auto or fp32,bf16,fp16,int8 (default: Export.precision, auto: "
                        "every precision this host can verify)")
    parser.add_argument("--verify", action=argparse.BooleanOptionalAction, default=None,
                        help="run the parity report (default: Export.verify)")
    return _run(parser, argv, _export)


def _export(args):
    if args.checkpoint and not args.config:
        raise ConfigError("--checkpoint needs -c CONFIG (its Data section gives the test split "
                          "of the parity report), e.g. -c OUTPUT_DIR/config.yaml")
    if args.pretrained_dir is None and (args.task or args.verify_file or args.pooling
                                        or args.normalize is not None):
        raise ConfigError("--task, --verify-file, --pooling and --normalize go with "
                          "--pretrained-dir")
    cfg = load_config(args.config, args.override)
    from .export.exporter import (check_request, export_checkpoint, export_pretrained_dir,
                                  resolve_output)

    setup_logging()
    # a bad request fails before the checkpoint is even looked at
    check_request(args.format or cfg.Export.format, args.precision or cfg.Export.precision)
    args.output = resolve_output(args.output)
    if args.pretrained_dir:
        manifest = export_pretrained_dir(args.pretrained_dir, args.output, cfg, args.task,
                                         args.format, args.precision, args.verify,
                                         args.verify_file,
                                         {"pooling": args.pooling, "normalize": args.normalize})
    else:
        manifest = export_checkpoint(_checkpoint_dir(args.checkpoint), args.output, cfg,
                                     args.format, args.precision, args.verify)
    print(f"exported {manifest['model_name']} to {args.output}: backends "
          f"{sorted(manifest['backends'])}, precisions {manifest['precisions']}")
    for backend, entries in (manifest.get("precision_measured") or {}).items():
        for precision, entry in (entries if isinstance(entries, dict) else {}).items():
            if isinstance(entry, dict) and entry.get("refused"):
                print(f"refused {backend} {precision} (left out): {entry['refused']}")
    return 0


def main_lengths(argv=None):
    """Length profile of a split and the padding efficiency of each batching strategy.

        ppvarlen-lengths -c configs/sentiment/transformer.yaml [--split train]
            [--json OUT.json] [--png OUT.png] [-o Data.max_len=512 ...]
        python tools/analyze_lengths.py -c CONFIG ...              # the same command

    Prints the length table (count, min, mean, p50-p99, max, share over max_len) and,
    side by side, one simulated epoch of: pad-to-max_len, random batches with dynamic
    padding, group_by_length megabatches, quantile and optimal buckets (padded to the
    boundary), token budget with pools of --pool-sizes batches, and fairseq-style
    global sorting: padding efficiency, number of batches, max tokens per batch.
    --png writes the histogram + CDF; --json the report (strategies.<name>.padding_efficiency).
    """
    parser = _parser(main_lengths)
    parser.add_argument("--split", default="train", choices=["train", "dev", "test"])
    parser.add_argument("--json", metavar="OUT", help="write the report as JSON")
    parser.add_argument("--png", metavar="OUT", help="write the length histogram + CDF")
    parser.add_argument("--batch-size", type=_positive(int), default=32,
                        help="examples per batch for the fixed-size strategies (default 32)")
    parser.add_argument("--pool-sizes", type=_non_negative(int), nargs="+", default=[50, 100, 200],
                        help="token-budget pool sizes in batches, as Data.pool_size (default 50 "
                        "100 200); 0 = the whole split, always reported as 'fairseq'")
    return _run(parser, argv, _lengths)


def _lengths(args):
    cfg = load_config(args.config, args.override)
    from .length_report import analyze_lengths, format_report

    setup_logging(cfg.Global.log_level)
    # pool 0 (the whole split) is always in the report, as "fairseq"
    pools = [p for p in dict.fromkeys(args.pool_sizes) if p > 0]
    report = analyze_lengths(cfg, args.split, args.png, args.batch_size, pools)
    print(format_report(report))
    if args.json:
        atomic_write_json(args.json, report)
        print(f"wrote {args.json}")
    if args.png:
        print(f"wrote {args.png}")
    return 0


# ---------------------------------------------------------------- serving side

PRECISION_CHOICES = SCHEMA["Deploy"]["precision"].choices
INFER_DEPLOY_KEY = "Deploy.max_text_chars"  # the other Deploy settings have flags of their own
# and the keys naming a training data file's columns, read as training reads them
INFER_KEYS = (INFER_DEPLOY_KEY,) + tuple(f"Data.{k}" for k in COLUMN_KEYS)


def main_infer(argv=None):
    """Predict every line of a file with an exported model; JSONL out, in input order.

        ppvarlen-infer --model-dir output/export --backend paddle|onnx|auto \\
            --input texts.txt|texts.jsonl [--output preds.jsonl]
            [--precision auto|fp32|bf16|fp16|int8]
        python deploy/python/infer.py ...                          # the same command

    Each line is one request item in the task's fields: {"text": ...} (or a .txt line;
    seq2seq also {"source": ...}), text pairs {"text_a": ..., "text_b": ...}, extractive QA
    {"question": ..., "context": ...}; other fields are ignored (a corpus file reads as is).
    An embedding export writes its vectors to --output X.npy (float32 [N, D], row i = line
    i + 1: every line must be usable) or X.parquet (columns line, embedding, num_tokens,
    truncated; needs pyarrow: the extra ppvarlen[parquet]), streamed the same way.

    The file is streamed: --window lines at a time are sorted by length into token-budget
    batches and their records written in input order, so memory stays bounded on any file.
    Bad lines (a field missing or not a string, a text the export refuses) are reported
    with their line number (and written as {"line", "error"} records); the other lines are
    still predicted; the exit code is 1 if any line failed.  A text over
    Deploy.max_text_chars characters (the server's limit, each text of an item; -o to raise
    it) is such a bad line, and so is a line longer than such texts take (read no further).
    A training data file (.tsv, .csv, .conll, .parquet) is streamed the same way, its text
    columns found by name as training finds them (-o Data.text_field=..., Data.columns=[...]),
    a label column not needed (a headerless table: one column, the text, or text,label; a
    CoNLL file: tokens with or without tags); a bad record is its first line's error record.
    The summary (stderr, JSON) counts truncated and windowed texts and warns on truncation.
    The export is admitted first, as the server admits it (docs/SERVING.md, Admission): one
    that fails a check predicts nothing, exit 2 with the check and why.
    """
    parser = _parser(main_infer, config=False)
    parser.add_argument("--model-dir", required=True, help="export directory (has manifest.json)")
    parser.add_argument("--backend", choices=["paddle", "onnx", "auto"], default="auto",
                        help="auto (default): the backend (and precision) this CPU runs "
                        "fastest, timed here; paddle or onnx: that engine")
    parser.add_argument("--input", required=True, help=".jsonl (a request item per line, in "
                        "the task's fields), .txt (a text per line; one-text tasks), or a "
                        "training data file (.tsv, .csv, .conll, .parquet, plain or .gz: read "
                        "as training reads it, columns by name, no label column needed; "
                        "streamed, a bad record is its line's error record)")
    parser.add_argument("--output", default=None, help="JSONL predictions (default: stdout); "
                        "an embedding export also .npy (float32 [N, D], a row per line) or "
                        ".parquet (line, embedding, num_tokens, truncated columns)")
    parser.add_argument("--format", choices=list(EMBEDDING_FORMATS), default=None,
                        dest="output_format", help="the output's format (default: by the "
                        "--output suffix: .npy, .parquet, else jsonl)")
    parser.add_argument("--precision", choices=PRECISION_CHOICES, default="auto",
                        help="auto (default, as the server): of the precisions the export "
                        "verified, the fastest on this host (each admitted, then timed for a "
                        "few seconds at load; the choice is kept for the next run)")
    parser.add_argument("--no-choice-cache", action="store_true",
                        help="with auto: time the candidates on every run (default: the choice "
                        "timed on this host for this export and these settings is kept and "
                        "reused, as the server's Deploy.choice_cache)")
    parser.add_argument("--device", choices=["cpu", "gpu"], default="cpu")
    parser.add_argument("--tensorrt", action="store_true", help="paddle on GPU: TensorRT")
    parser.add_argument("--threads", type=_threads, default="auto",
                        help="CPU math threads, or auto (default): the usable cores (affinity "
                        "mask, cgroup CPU quota, OMP_NUM_THREADS), not timed: a file's batches "
                        "are large and no network front end needs a core")
    parser.add_argument("--max-batch-tokens", type=_positive(int), default=8192,
                        help="token budget per batch, padding counted")
    parser.add_argument("--max-batch-size", type=_positive(int), default=64)
    parser.add_argument("--split-long-sources", action="store_true",
                        help="seq2seq: cut a source longer than the export's max_len after clause "
                        "punctuation, decode the pieces and join them")
    parser.add_argument("--window", type=_positive(int), default=WINDOW,
                        help=f"lines read, sorted by length and batched together (default "
                        f"{WINDOW}); memory grows with it, padding shrinks")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.add_argument("-o", "--override", action="append", default=[],
                        metavar="KEY=VALUE",
                        help=f"the one server setting this command reads: the longest text in "
                        f"characters ({INFER_DEPLOY_KEY}, default "
                        f"{SCHEMA['Deploy']['max_text_chars'].default}); and for a training "
                        f"data file the Data keys naming its columns, as in training "
                        f"(Data.text_field=body, Data.columns=[label,text], ...)")
    return _run(parser, argv, _infer)


def _infer(args):
    other = [o for o in args.override if o.partition("=")[0].strip() not in INFER_KEYS]
    if other:
        raise ConfigError(f"ppvarlen-infer takes only -o {INFER_DEPLOY_KEY}=N and the Data keys "
                          f"naming a data file's columns ({', '.join(INFER_KEYS[1:])}), got "
                          f"{other}; its other settings are flags (--threads, "
                          f"--max-batch-tokens, --max-batch-size, --precision, ...)")
    cfg = load_config(overrides=args.override)
    deploy = cfg.Deploy
    load = functools.partial(Predictor, backend=args.backend, device=args.device,
                             threads=threads_choice.count(args.threads) if args.device == "cpu"
                             else args.threads,
                             max_batch_tokens=args.max_batch_tokens,
                             max_batch_size=args.max_batch_size, tensorrt=args.tensorrt,
                             split_long_sources=args.split_long_sources)
    # admitted (and with auto, chosen on this host) as the server admits an export
    predictor = load_admitted(load, args.model_dir, requested=args.precision,
                              device=args.device, cache=not args.no_choice_cache)
    get_logger("ppvarlen.infer").info("export %s admitted in %s: %s", args.model_dir,
                                      predictor.precision, ", ".join(predictor.admission))
    summary = run_file(predictor, args.input, args.output, progress=not args.no_progress,
                       window=args.window, max_text_chars=deploy.max_text_chars,
                       output_format=args.output_format, column_keys=column_keys(cfg.Data))
    print(json.dumps(summary, ensure_ascii=False), file=sys.stderr)
    return 1 if summary["failed"] else 0


def main_serve(argv=None):
    """Serve an export directory over HTTP with dynamic batching.

        ppvarlen-serve --model-dir output/export [--host 127.0.0.1] [--port 8080]
            [--backend paddle|onnx|auto] [--precision auto|fp32|bf16|fp16|int8]
            [-o Deploy.max_wait_ms=5 -o Deploy.max_batch_size=64 ...]
        python deploy/python/serve.py ...                          # the same command

    POST /predict {"texts": [...]}, GET /health, GET /metrics (Prometheus), /metrics.json,
    the Open Inference Protocol v2 under /v2 (docs/SERVING.md).  Ctrl-C / SIGTERM stop
    taking requests and finish the queued ones before exiting.  --precision auto (the
    default) serves the fastest precision the export verified, timed on this host at load;
    --backend auto chooses the backend the same way.
    """
    parser = _parser(main_serve, config=False)
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--model-dir", help="export directory (has manifest.json)")
    where.add_argument("--model-repository", help="directory of NAME/VERSION/ export "
                       "directories: the newest verified version serves, new ones hot-reload "
                       "(docs/SERVING.md)")
    parser.add_argument("--backend", choices=["paddle", "onnx", "auto"], default=None,
                        help="default: Deploy.backend (auto: the backend, and precision, "
                        "this CPU runs fastest, timed at load)")
    parser.add_argument("--host", default=None, help="default: Deploy.host (127.0.0.1)")
    parser.add_argument("--port", type=int, default=None,
                        help="default: Deploy.port (8080); 0 takes a free port (see --port-file)")
    parser.add_argument("--port-file", default=None,
                        help="write the bound port to this file once listening (for --port 0)")
    parser.add_argument("--grpc-port", type=int, default=None,
                        help="also serve the Open Inference Protocol over gRPC on this port "
                        "(default: Deploy.grpc_port, null = no gRPC)")
    parser.add_argument("--precision", choices=PRECISION_CHOICES, default=None,
                        help="the same as -o Deploy.precision=P (default: Deploy.precision, "
                        "auto: the fastest verified precision, timed on this host at load)")
    parser.add_argument("--model-name", default=None, metavar="NAME",
                        help="the same as -o Deploy.model_name=NAME: the name --model-dir is "
                        "served under (/v2/models/NAME, the OpenAI model id; default: the "
                        "manifest's model_name)")
    parser.add_argument("-o", "--override", action="append", default=[], metavar="Deploy.KEY=V",
                        help="override a Deploy setting, e.g. -o Deploy.max_wait_ms=2")
    return _run(parser, argv, _serve)


def _flag_override(overrides, flag, key, value):
    """A flag that means ``-o key=value``, added to ``overrides``; ConfigError when an
    ``-o`` of the same key says otherwise."""
    if value is None:
        return
    given = {o.partition("=")[2].strip() for o in overrides if o.partition("=")[0].strip() == key}
    if given - {value}:
        raise ConfigError(f"{flag} {value} and -o {key}={sorted(given)[0]} disagree; give one "
                          f"of them")
    overrides.append(f"{key}={value}")


def _serve(args):
    setup_logging()
    overrides = list(args.override)
    _flag_override(overrides, "--precision", "Deploy.precision", args.precision)
    _flag_override(overrides, "--model-name", "Deploy.model_name", args.model_name)
    cfg = _deploy_overrides(overrides, "serve")
    from .serve.server import serve

    serve(args.model_dir, cfg.Deploy, args.host, args.port, args.backend, args.model_repository,
          args.port_file, args.grpc_port)
    return 0


def main_check_gpu(argv=None):
    """Check every GPU configuration of an export on a CUDA machine; writes gpu_report.json.

        ppvarlen-check-gpu --export output/export/sentiment [-c CONFIG] [--report gpu_report.json]
        python tools/check_gpu.py ...                                  # the same command

    Paddle Inference fp32 / fp16 / bf16 / TensorRT fp16 and ONNX Runtime CUDA fp32 / fp16, each
    compared with CPU fp32 on the export's shape grid (+ the config's test split with -c) and
    timed.  Exit 0 all ok, 1 a configuration failed (named in the report), 2 no GPU here (or a
    bad export / config).
    """
    parser = _parser(main_check_gpu, config=False)
    parser.add_argument("-c", "--config", help="training config: adds its test split")
    parser.add_argument("-o", "--override", action="append", default=[], metavar="KEY=VALUE",
                        help="override a key of that config")
    parser.add_argument("--export", required=True, help="export directory (tools/export.py)")
    parser.add_argument("--report", default="gpu_report.json")
    parser.add_argument("--gpu-id", type=int, default=0)
    return _run(parser, argv, _check_gpu)


def _check_gpu(args):
    from .export.gpu_check import NoGpu, run

    setup_logging()
    cfg = load_config(args.config, args.override) if args.config else None
    try:
        return 0 if run(args.export, args.report, cfg, args.gpu_id) else 1
    except NoGpu as e:
        print(f"{os.path.basename(sys.argv[0])}: {e}", file=sys.stderr)
        return 2


def main_bench(argv=None):
    """Load-test the HTTP server: dynamic batching on vs off (max_batch_size=1) in one run.

        ppvarlen-bench --model-dir output/export [--backend auto|paddle|onnx]
            [--concurrency 16] [--requests 2000] [--duration 30] [--output-dir output/bench]
            [-o Deploy.threads=1 ...]   (server settings for both runs)
        python deploy/python/bench_client.py ...                   # the same command

    Starts serve.py itself on free 127.0.0.1 ports (one per setting: the first chooses the
    engine, precision and threads the defaults leave to the host, the second serves the
    same), drives it with concurrent clients sending texts from the test split of the
    export's task (sentiment reviews, or g2p sources for a seq2seq export), and writes
    bench.json + bench.png (QPS, P50/P95/P99 latency, errors, batch size, padding).
    """
    parser = _parser(main_bench, config=False)
    parser.add_argument("--model-dir", required=True, help="export directory (has manifest.json)")
    parser.add_argument("--backend", choices=["auto", "paddle", "onnx"], default="auto",
                        help="as ppvarlen-serve's (default auto: the first server chooses)")
    parser.add_argument("--concurrency", type=_positive(int), default=16, help="concurrent clients")
    parser.add_argument("--requests", type=_positive(int), default=2000,
                        help="max requests per setting")
    parser.add_argument("--duration", type=_positive(float), default=30.0,
                        help="max seconds per setting")
    parser.add_argument("--output-dir", default="output/bench")
    parser.add_argument("-o", "--override", action="append", default=[], metavar="Deploy.KEY=V",
                        help="a server setting for both runs, e.g. -o Deploy.threads=1")
    return _run(parser, argv, _bench)


def _bench(args):
    from .serve.bench import run_benchmark

    setup_logging()
    _deploy_overrides(args.override, "bench")  # unknown key / bad value: fail here, not in the server
    # forwarded verbatim to the server's -o, which parses them the same way
    common = {parse_override(o)[0][1]: o.split("=", 1)[1] for o in args.override}
    _print_json(run_benchmark(args.model_dir, args.output_dir, args.backend, args.concurrency,
                              args.requests, args.duration, common_overrides=common))
    return 0


def main_doctor(argv=None):
    """Find the variable-length bugs in a model you already have; exit 0 none failed, 1 one did.

        ppvarlen-doctor MODEL [--tokenizer DIR] [--texts FILE] [--json REPORT] [--backend paddle|onnx]
        python tools/doctor.py MODEL ...                           # the same command

    MODEL: a ppvarlen export directory (manifest.json), a PaddleNLP save_pretrained directory
    (config.json + model.safetensors), a Paddle inference model (MODEL.json PIR or legacy
    MODEL.pdmodel, + MODEL.pdiparams) or an ONNX file.  It is loaded the way it is deployed
    (Paddle Inference, ONNX Runtime, the PaddleNLP dygraph model called with what its tokenizer
    returns), fed controlled batches, and each check reported pass / warn / fail / n/a with
    the measured evidence and the fix (warn: a choice an export's manifest records, such as
    long_text: truncate, reported with its advice; exit 0): 1 dynamic dimensions, 2 padding invariance, 3 batch
    invariance, 4 empty and 1-token rows, 5 float16 masks, 6 position limits, 7 tokenizer <->
    model, 8 truncation on --texts (a text per line, or JSONL with "text").  Graph inputs are
    fed by name (input_ids, token_type_ids, attention_mask, seq_len, position_ids); the report
    says what went to which input, and a graph whose inputs cannot be mapped gets its
    model-running checks marked n/a.  Exit 2 when MODEL cannot be loaded (the error names the
    file and what is missing).  docs/guide/doctor.md maps each check to its pitfall.
    """
    parser = _parser(main_doctor, config=False)
    parser.add_argument("model", metavar="MODEL", help="export dir, PaddleNLP dir, Paddle "
                        "inference model (.json / .pdmodel) or .onnx file")
    parser.add_argument("--tokenizer", metavar="DIR", help="tokenizer directory (vocab.txt, "
                        "tokenizer_config.json; a config.json there gives the position table); "
                        "default: the model's own, or one saved beside a graph file")
    parser.add_argument("--texts", metavar="FILE", help="your texts (.txt, one per line, or "
                        ".jsonl with \"text\"): truncation and padding cost on them")
    parser.add_argument("--json", metavar="REPORT", help="write the report as JSON")
    parser.add_argument("--backend", choices=["paddle", "onnx"], default=None,
                        help="an export's backend to check (default: paddle when exported)")
    return _run(parser, argv, _doctor)


def _doctor(args):
    from .doctor.diagnose import run_doctor

    return run_doctor(args.model, args.tokenizer, args.texts, args.json, args.backend)


# ---------------------------------------------------------------- the schema itself

def main_config(argv=None):
    """Print the config keys of a section or a model: type, default, allowed values, meaning.

        ppvarlen-config show Model --model rnn_cls     # the keys rnn_cls reads
        ppvarlen-config show Data                      # every Data key
        ppvarlen-config show                           # every section

    The list is ppvarlen/config_schema.py's, the one the config loader checks against.
    """
    parser = _parser(main_config, config=False)
    sub = parser.add_subparsers(dest="action", required=True)
    show = sub.add_parser("show", help="print keys, types, defaults and meanings")
    show.add_argument("section", nargs="?", help="a config section, e.g. Data or Model "
                      "(default: Model with --model, else every section)")
    show.add_argument("--model", help="only the Model keys this Model.name reads")
    return _run(parser, argv, _config_show)


def _config_show(args):
    section = args.section or ("Model" if args.model else None)
    if section is not None and section not in SCHEMA:
        raise ConfigError(f"section {section!r} is not one of {list(SCHEMA)}")
    if args.model is not None:
        if args.model not in MODEL_KEYS:
            raise ConfigError(f"--model {args.model!r} is not one of {sorted(MODEL_KEYS)}")
        if section != "Model":
            raise ConfigError(f"--model selects Model keys; drop the section {section!r} or "
                              f"write: ppvarlen-config show Model --model {args.model}")
    keys = [k for k in iter_keys() if section in (None, k.section)
            and (args.model is None or args.model in k.models)]
    print(format_keys(keys, args.model))
    return 0


def format_keys(keys, model=None):
    """The text table of ``ppvarlen-config show``: one block per key, meaning wrapped."""
    lines = []
    for section in dict.fromkeys(k.section for k in keys):
        title = f"{section} keys" + (f" read by Model.name: {model}" if model else "")
        lines += ["", title, "-" * len(title)]
        for k in (k for k in keys if k.section == section):
            default = yaml.safe_dump(k.default, default_flow_style=True).strip()
            default = default.removesuffix("\n...").removesuffix("...").strip()
            head = f"{k.path}  ({k.type_name}, default {default}"
            head += f"; one of {', '.join(k.choices)})" if k.choices else ")"
            lines.append(head)
            lines += textwrap.wrap(k.meaning, 92, initial_indent="    ", subsequent_indent="    ")
            if k.models is not None and model is None:
                lines.append(f"    read by: {', '.join(k.models)}")
    return "\n".join(lines).lstrip("\n")
