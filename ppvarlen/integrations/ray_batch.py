"""Offline batch inference on Ray Data: shards of texts in, predictions + rejects + summary out.

    run_batch(export_dir, "texts/", "out/", backend="onnx", actors=8)

The driver lists the input units (``text_shards.plan_units``: a JSONL file or a Parquet
row group each); Ray tasks read them into rows with their file and row number; a pool
of actors, each holding one ``Predictor``, takes windows of ``window`` rows.  Within a
window the predictor sorts texts by length into token-budget batches (its own
``max_batch_tokens`` / ``max_batch_size``), so a forward pass holds texts of similar
length: a larger window gives denser batches (the summary reports the padding
efficiency reached).  The driver streams the answers into ``out/``:

* ``predictions.jsonl``: ``{"file", "row", "id", **prediction}`` per predicted row;
* ``rejects.jsonl``: ``{"file", "row", "id", "reason"}`` per row that could not be used
  (not UTF-8, not JSON, text missing / not a string / empty, or refused by the export);
* ``summary.json``: rows in / out / rejected, padding efficiency, rows/s (overall, and
  after the first answers, i.e. once the actors have started).

Lines are in completion order unless ``preserve_order``; ``file`` + ``row`` identify
each input row.  A predictor actor that dies is restarted by Ray and its unfinished
window re-run (Ray Data's actor defaults: unlimited restarts and task retries); only
finished windows reach the driver, so every row is answered exactly once.
"""
import argparse
import functools
import json
import os
import time

import numpy as np

from ppvarlen.cli import positive_int, run_command
from ppvarlen.config import ConfigError
from ppvarlen.data.errors import DataError
from ppvarlen.runtime.manifest import load_manifest
from ppvarlen.runtime.precision_choice import load_admitted
from ppvarlen.runtime.predictor import Predictor
from ppvarlen.utils.log import get_logger
from ppvarlen.utils.io import atomic_dir, atomic_write_json

from .ray_cluster import add_cluster_args, ray_cluster
from .text_shards import plan_units, read_unit

OUTPUTS = ("predictions.jsonl", "rejects.jsonl", "summary.json")
log = get_logger(__name__)


class PredictWindows:
    """Ray Data callable class: one predictor per actor; a window of rows in, JSON lines out.

    Output columns: ``line`` (the JSON record), ``rejected`` (bool), and the window's
    real / padded token counts on its first row (0 on the others), so that summing the
    columns over the whole job gives exact totals however windows are split into blocks.
    ``crash_once_marker`` is a test hook: the first actor to reach its second window
    creates that file and kills its own process, as a lost machine would.
    """

    def __init__(self, export_dir, backend, predictor_kwargs, crash_once_marker=None):
        self.predictor = Predictor(export_dir, backend, **predictor_kwargs)
        self.crash_once_marker = crash_once_marker
        self.windows = 0

    def __call__(self, batch):
        self.windows += 1
        if self.crash_once_marker and self.windows == 2:
            try:
                os.close(os.open(self.crash_once_marker, os.O_CREAT | os.O_EXCL))
                os._exit(1)
            except FileExistsError:
                pass  # already crashed once (this is the restarted actor or another one)
        p = self.predictor
        n = len(batch["row"])
        keys = [{"file": str(batch["file"][k]), "row": int(batch["row"][k]),
                 "id": json.loads(batch["id"][k])} for k in range(n)]
        lines, rejected = [None] * n, np.zeros(n, dtype=bool)
        good, items = [], []
        for k in range(n):
            reason = str(batch["error"][k])
            if not reason:
                try:
                    items.append(p.encode(str(batch["text"][k])))
                    good.append(k)
                    continue
                except DataError as e:  # e.g. too long for an export whose policy is 'error'
                    reason = str(e)
            lines[k], rejected[k] = json.dumps({**keys[k], "reason": reason}), True
        real0, padded0 = p.real_tokens, p.padded_tokens
        for k, result in zip(good, self._predict(items) if items else []):
            if isinstance(result, Exception):
                reason = f"prediction failed: {type(result).__name__}: {result}"
                lines[k], rejected[k] = json.dumps({**keys[k], "reason": reason}), True
            else:
                lines[k] = json.dumps({**keys[k], **result}, ensure_ascii=False)
        real, padded = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
        if n:
            real[0], padded[0] = p.real_tokens - real0, p.padded_tokens - padded0
        return {"line": np.array(lines, dtype=object), "rejected": rejected,
                "real_tokens": real, "padded_tokens": padded}

    def _predict(self, items):
        """Results in order; if the window fails, each text alone (an Exception for a bad one)."""
        try:
            return self.predictor.predict_encoded(items)
        except Exception:  # noqa: BLE001 - one bad text must not fail its window-mates
            out = []
            for it in items:
                try:
                    out.extend(self.predictor.predict_encoded([it]))
                except Exception as e:  # noqa: BLE001 - reported as this row's reject reason
                    out.append(e)
            return out


def _read_rows(unit, text_field, id_field):
    return read_unit(unit, text_field, id_field)


def check_output_dir(path):
    """Refuse to replace a directory that holds anything but a previous run's outputs."""
    if os.path.exists(path):
        other = sorted(set(os.listdir(path)) - set(OUTPUTS)) if os.path.isdir(path) else [path]
        if other:
            raise DataError(f"{path}: output directory exists and holds {other[:3]}; choose a "
                            f"new directory (it is replaced as a whole when the job finishes)")


def admit_here(export_dir, backend, precision, predictor_kwargs):
    """Load the export as the actors will and run the admission check on it, here, so a bad
    export stops the job with its reason before any actor starts (an actor that failed in its
    constructor would be restarted by Ray) -> (backend, precision) for the actors.  ``auto``
    (backend or precision) is chosen here, by the rule the server uses, and every actor loads
    that choice: one engine and precision for the whole job, timed once (on this, the
    driver's, CPU).  A GPU job is checked only for its manifest (the driver need not hold a
    GPU); its actors apply the off-CPU rule themselves."""
    if predictor_kwargs.get("device", "cpu") != "cpu":
        load_manifest(export_dir)
        log.info("%s: the admission check runs on CPU jobs; a GPU job's actors are not "
                 "checked (GPU paths are unverified)", export_dir)
        return backend, precision
    load = functools.partial(Predictor, backend=backend, **predictor_kwargs)
    predictor = load_admitted(load, export_dir, requested=precision)
    log.info("export %s admitted in %s %s: %s", export_dir, predictor.backend,
             predictor.precision, ", ".join(predictor.admission))
    return predictor.backend, predictor.precision


def run_batch(export_dir, input_path, output_dir, backend="paddle", actors=2, actor_cpus=1.0,
              actor_gpus=0, window=1024, text_field="text", id_field="id", preserve_order=False,
              predictor_kwargs=None, unit_bytes=8 << 20, crash_once_marker=None):
    """Predict every row of ``input_path`` on the running Ray cluster; returns the summary."""
    import ray

    predictor_kwargs = dict(predictor_kwargs or {})
    requested = {"backend": backend, "precision": predictor_kwargs.pop("precision", "fp32")}
    backend, precision = admit_here(export_dir, backend, requested["precision"],
                                    predictor_kwargs)  # before any actor starts
    predictor_kwargs["precision"] = precision
    check_output_dir(output_dir)
    units = plan_units(input_path, unit_bytes)
    if not units:
        raise DataError(f"{input_path}: no rows to predict (the input files are empty)")
    if window < 1 or actors < 1:
        raise ConfigError(f"window and actors must be >= 1, got {window}, {actors}")
    ctx = ray.data.DataContext.get_current()
    saved_order = ctx.execution_options.preserve_order
    ctx.execution_options.preserve_order = preserve_order
    counts = {"predicted": 0, "rejected": 0, "real_tokens": 0, "padded_tokens": 0}
    first = None  # (seconds until the first answers arrived, rows in them)
    start = time.perf_counter()
    try:
        ds = ray.data.from_items(units, override_num_blocks=len(units))
        # Reading is a small share of the work: reserving a CPU for it would deadlock a
        # pool whose actors hold every CPU (seen with 2 x 1 CPU on num_cpus=2).
        ds = ds.flat_map(_read_rows, fn_kwargs={"text_field": text_field, "id_field": id_field},
                         num_cpus=0)
        ds = ds.map_batches(PredictWindows, batch_size=window, batch_format="numpy",
                            compute=ray.data.ActorPoolStrategy(size=actors),
                            num_cpus=actor_cpus, num_gpus=actor_gpus,
                            fn_constructor_kwargs={"export_dir": os.path.abspath(export_dir),
                                                   "backend": backend,
                                                   "predictor_kwargs": predictor_kwargs or {},
                                                   "crash_once_marker": crash_once_marker})
        with atomic_dir(output_dir) as tmp:
            with open(os.path.join(tmp, OUTPUTS[0]), "w", encoding="utf-8") as ok, \
                    open(os.path.join(tmp, OUTPUTS[1]), "w", encoding="utf-8") as bad:
                for b in ds.iter_batches(batch_size=None, batch_format="numpy"):
                    if first is None:  # actors are up: what follows is the steady rate
                        first = (time.perf_counter() - start, int(len(b["line"])))
                    for line, rejected in zip(b["line"], b["rejected"]):
                        (bad if rejected else ok).write(line + "\n")
                    counts["rejected"] += int(b["rejected"].sum())
                    counts["predicted"] += int(len(b["line"]) - b["rejected"].sum())
                    counts["real_tokens"] += int(b["real_tokens"].sum())
                    counts["padded_tokens"] += int(b["padded_tokens"].sum())
            seconds = time.perf_counter() - start
            summary = {"input": os.path.abspath(input_path), "export_dir": export_dir,
                       "backend": backend, "precision": precision, "requested": requested,
                       "actors": actors, "window": window,
                       "units": len(units), "rows_in": counts["predicted"] + counts["rejected"],
                       "rows_out": counts["predicted"], "rejected": counts["rejected"],
                       "seconds": round(seconds, 3),
                       "rows_per_s": round(counts["predicted"] / seconds, 2),
                       "first_answers_after_s": round(first[0], 3) if first else None,
                       # after the first answers: the rate once actors have started
                       "rows_per_s_after_first": round(
                           (counts["predicted"] + counts["rejected"] - first[1])
                           / (seconds - first[0]), 2) if first and seconds > first[0] else None,
                       "real_tokens": counts["real_tokens"],
                       "padded_tokens": counts["padded_tokens"],
                       "padding_efficiency": round(counts["real_tokens"] / counts["padded_tokens"],
                                                   4) if counts["padded_tokens"] else None}
            atomic_write_json(os.path.join(tmp, OUTPUTS[2]), summary)
    finally:
        ctx.execution_options.preserve_order = saved_order
    return summary


def main(argv=None):
    """``deploy/ray/batch_infer.py``: exit 0, 1 if rows were rejected, 2 on a bad setup
    (ppvarlen.cli's error policy)."""
    parser = argparse.ArgumentParser(description="Batch inference on a Ray cluster: JSONL / "
                                     "Parquet (file or directory of shards) -> predictions.jsonl, "
                                     "rejects.jsonl, summary.json")
    parser.add_argument("--model-dir", required=True, help="export directory (has manifest.json)")
    parser.add_argument("--input", required=True, help=".jsonl / .parquet file or a directory")
    parser.add_argument("--output-dir", required=True, help="written when the job finishes")
    parser.add_argument("--backend", choices=["paddle", "onnx", "auto"], default="auto",
                        help="auto: the backend (and precision) this CPU runs fastest, timed "
                        "here on the driver; every actor runs the choice")
    parser.add_argument("--precision", choices=["auto", "fp32", "bf16", "fp16", "int8"],
                        default="auto", help="any precision the export verified for the "
                        "backend; auto: the fastest, timed here on the driver (as "
                        "ppvarlen-serve chooses)")
    parser.add_argument("--device", choices=["cpu", "gpu"], default="cpu",
                        help="gpu: one GPU per actor")
    parser.add_argument("--threads", type=positive_int, default=1, help="math threads per actor")
    parser.add_argument("--max-batch-tokens", type=positive_int, default=8192,
                        help="token budget per forward pass, padding counted")
    parser.add_argument("--max-batch-size", type=positive_int, default=64)
    parser.add_argument("--actors", type=positive_int, default=2,
                        help="predictor actors in the pool")
    parser.add_argument("--actor-cpus", type=float, default=1.0, help="CPUs reserved per actor")
    parser.add_argument("--window", type=positive_int, default=1024,
                        help="rows an actor sorts by length and batches at once")
    parser.add_argument("--unit-mb", type=float, default=8.0,
                        help="a read task takes about this much of a JSONL file")
    parser.add_argument("--text-field", default="text", help="JSON key / Parquet column")
    parser.add_argument("--id-field", default="id", help="copied to the output when present")
    parser.add_argument("--preserve-order", action="store_true",
                        help="write lines in input order (slower: a slow window holds back "
                        "the rest)")
    add_cluster_args(parser)
    return run_command(parser, argv, _batch_infer)


def _batch_infer(args):
    with ray_cluster(args):
        summary = run_batch(args.model_dir, args.input, args.output_dir, args.backend,
                            args.actors, args.actor_cpus, 1 if args.device == "gpu" else 0,
                            args.window, args.text_field, args.id_field, args.preserve_order,
                            {"precision": args.precision, "device": args.device,
                             "threads": args.threads, "max_batch_tokens": args.max_batch_tokens,
                             "max_batch_size": args.max_batch_size},
                            int(args.unit_mb * (1 << 20)))
    print(json.dumps(summary, ensure_ascii=False))
    return 1 if summary["rejected"] else 0
