"""Checkpoint -> export directory (Paddle Inference, ONNX, precisions, manifest, parity).

Layout and manifest fields: docs/DESIGN.md "Export directory".  The directory
is built in a temp dir and swapped in only when complete and (with ``verify``)
when the parity gates pass, so a failed re-export leaves the old one intact.

A model repository's version (``--output`` whose last part is a positive integer,
``models/NAME/4``) is never replaced: a server holding it would answer two models under one
number.  An existing one is refused, naming the next free number; ``models/NAME/next``
writes that number (``resolve_output``).  A full disk in any phase (the Paddle save, the
ONNX conversion in its subprocess, the manifest and parity files) is one ``DiskFullError``
naming the path, with the old export kept and no temp file left.  The temp directories of an
export that died (``.tmp-*`` next to the output, ``$TMPDIR/ppvarlen-export.*``) are removed by
the next export.
"""
import contextlib
import os
import tempfile

import numpy as np

from ..config import ConfigError, load_config
from ..data.collate import Collator
from ..data.lengths import length_stats
from ..data import readers
from ..data.sources import SUFFIX_FORMATS, format_of, formats_for
from ..data.vocab import TextEncoder
from ppvarlen.runtime.admission import admit
from ppvarlen.runtime.manifest import UnservableExportError, is_version_name
from ppvarlen.runtime.predictor import Predictor
from ..engine.checkpoint import load_for_inference
from ..models import build_model
from ..model_registry import MODELS
from ..models.paddlenlp_auto import FAMILY, label_names_of, model_name_for, read_config
from ..models.seq2seq import DecoderStepProgram, EncoderProgram, GreedyProgram
from ..store_build import build_datasets
from ..tasks import get_task
from ..utils.io import (DiskFullError, atomic_dir, atomic_write_json, is_disk_full, owned_prefix,
                        reap_dead_owners)
from ..utils.log import get_logger
from . import manifest as manifest_mod
from . import parity
from . import precision_gate, precision_speed
from .errors import ExportFailedError
from .onnx_export import check_loads, export_onnx
from .precision import PRECISIONS, convert_onnx_fp16
from .precision_gate import AUTO
from .quantize import DEFAULT_INT8, quantize_onnx
from .static import crf_matrix_of, save_inference, save_program

log = get_logger("export")
FORMATS = ("paddle", "onnx")
NEXT_VERSION = "next"  # --output models/NAME/next: the model's next free version number
WORK_PREFIX = "ppvarlen-export"  # the scratch directory's name in $TMPDIR (owned_prefix)
CALIBRATION_EXAMPLES = 256  # examples whose activation ranges fix int8's scales
CALIBRATION_BATCH_TOKENS = 4096


def _version_numbers(model_dir):
    try:
        return [int(v) for v in os.listdir(model_dir) if is_version_name(v)]
    except OSError:
        return []


def is_version_dir(path):
    """Whether ``path`` names a model repository's version (its last part a positive integer
    in ASCII digits, as the repository reads it)."""
    return is_version_name(os.path.basename(os.path.normpath(path)))


def resolve_output(output):
    """The directory an export to ``output`` writes: ``output`` itself; for ``MODEL_DIR/next``
    the model's next free version ``MODEL_DIR/<highest + 1>``.  ConfigError for a repository
    version that exists: its files never change in place (a plain directory is replaced
    atomically, as before)."""
    path = os.path.normpath(output)
    model_dir, last = os.path.split(path)
    if last == NEXT_VERSION:
        return os.path.join(model_dir, str(max(_version_numbers(model_dir), default=0) + 1))
    if is_version_dir(path) and os.path.lexists(path):
        free = max(_version_numbers(model_dir), default=0) + 1
        raise ConfigError(f"--output {output}: version {last} of the model {model_dir} exists; "
                          f"a repository version is never rewritten in place (a server holding "
                          f"it would answer two models under one version number). Write a new "
                          f"version: --output {os.path.join(model_dir, str(free))}, or --output "
                          f"{os.path.join(model_dir, NEXT_VERSION)} for the next free number")
    return path


def reap_export_debris(output):
    """Remove what exports that died left: temp directories next to ``output`` and scratch
    directories in $TMPDIR, each only when its owner process is gone."""
    parent = os.path.dirname(os.path.abspath(output))
    for path in reap_dead_owners(parent) + reap_dead_owners(tempfile.gettempdir(),
                                                            starts=(WORK_PREFIX,)):
        log.info("removed %s, left by an export that died", path)


@contextlib.contextmanager
def disk_full_told(output, tmp=None, work=None):
    """A disk-full error from any phase of the export -> one DiskFullError naming where: the
    export directory ``output`` and its file being written in ``tmp``, or $TMPDIR for the
    scratch files in ``work``.  Used inside the temp directories' lifetime, so the free space
    told is what the partial export left."""
    try:
        yield
    except DiskFullError as e:
        if tmp is None and work is None:
            raise  # told already, or a write outside the temp directories
        raise _told(os.fspath(e.path), e.needed, output, tmp, work) from None
    except OSError as e:
        if not is_disk_full(e):
            raise
        raise _told(os.fspath(e.filename or output), None, output, tmp, work) from None


def _told(path, needed, output, tmp, work):
    for top, shown, what in ((tmp, output, "writing {} in the export"),
                             (work, tempfile.gettempdir(), "writing the export's scratch file "
                              "{} (set TMPDIR to a disk with room)")):
        if top and (path + os.sep).startswith(top + os.sep):
            part = os.path.relpath(path, top) + (os.sep if os.path.isdir(path) else "")
            return DiskFullError(shown, needed, what.format(part))
    return DiskFullError(path, needed, "writing the export")


def _check_choices(name, values, allowed):
    bad = [v for v in values if v not in allowed]
    if bad or not values:
        raise ConfigError(f"{name}: {bad or values} not valid; choose from {list(allowed)} "
                          f"(comma-separated on the command line)")


def check_request(formats, precisions):
    """Validated (formats, precisions); fp32 is always exported (the reference files).
    ``auto`` stays in the list (``precision_gate.resolve`` expands it per host and view)."""
    formats, precisions = list(formats), list(precisions)
    _check_choices("--format / Export.format", formats, FORMATS)
    _check_choices("--precision / Export.precision", precisions, PRECISIONS + (AUTO,))
    if "fp32" not in precisions and AUTO not in precisions:
        precisions.insert(0, "fp32")  # bf16 runs the fp32 files, fp16 converts them
    if "paddle" not in formats and "bf16" in precisions:
        raise ConfigError("--precision bf16 runs the Paddle Inference files; add paddle to --format")
    if "onnx" not in formats and "fp16" in precisions:
        raise ConfigError("--precision fp16 on CPU is an ONNX variant; add onnx to --format")
    if "onnx" not in formats and "int8" in precisions:
        raise ConfigError("--precision int8 is an ONNX Runtime variant (Paddle Inference int8 is "
                          "not produced, docs/PRECISION.md); add onnx to --format")
    return formats, precisions


def export_model(model, meta, encoder, cfg, output, formats=("paddle", "onnx"),
                 precisions=("fp32",), verify=True, test_examples=None,
                 calibration_examples=None):
    """Write the export directory for an eval-mode ``model``; returns the manifest dict.

    ``meta`` is the checkpoint's meta.json dict, ``cfg`` the resolved Config
    (Data for tokenizer/long-text settings, Deploy for shape ranges, Export for
    opset and parity size).  ``test_examples``: encoded test items for the
    parity report (None = shape grid only).  ``calibration_examples``: encoded items (or a
    callable returning them, called only when int8 is exported) whose activation ranges fix the
    int8 scales; None = the test examples.  The task's ``export_view`` picks the
    programs written and the parity compared (``VIEWS``).  Raises ExportFailedError when
    fp32 parity fails; a reduced precision that fails its gate is left out (``_verify_export``).
    """
    formats, requested = check_request(formats, precisions)
    output = resolve_output(output)
    task, name = get_task(meta["task"]), meta.get("model_name", "model")
    if task.export_view is None:
        raise ExportFailedError(f"a {task.name} checkpoint is not exported (nothing serves it); "
                                f"fine-tune a model from what it wrote and export that")
    view = VIEWS[task.export_view]
    precisions, left_out = precision_gate.resolve(formats, requested, view.fixed_precision,
                                                  verify)
    view.check_precisions(precisions)
    calibration = None
    if "int8" in precisions:
        calibration, source = _calibration(calibration_examples, test_examples)
        if calibration is None:
            precisions.remove("int8")
            left_out["int8"] = {"status": precision_gate.NOT_VERIFIABLE, "reason": source}
        else:
            calibration = {"examples": calibration, "source": source}
    for precision, why in left_out.items():
        log.info("precision %s %s: %s", precision, why["status"], why["reason"])
    model.eval()
    reap_export_debris(output)
    with disk_full_told(output):  # making or swapping the temp directory
        manifest = _write_export(view, model, meta, encoder, cfg, output, formats, precisions,
                                 verify, test_examples, left_out, calibration)
    log.info("export written to %s (%s; precisions %s)", output,
             ", ".join(manifest["backends"]), manifest["precisions"])
    return manifest


def _calibration(calibration_examples, test_examples):
    """(examples the int8 activation ranges are calibrated on, where they come from) or
    (None, why int8 cannot be made)."""
    if callable(calibration_examples):
        calibration_examples = calibration_examples()
    if calibration_examples:
        return calibration_examples, "train"
    if test_examples:
        return test_examples, "test (no train split given)"
    return None, ("int8's activation scales are calibrated on examples and this export has "
                  "none (no train split, no test split or --verify-file)")


def calibration_batches(task, encoder, examples, limit=CALIBRATION_EXAMPLES, seed=0):
    """Up to ``limit`` of ``examples`` (a seeded sample) as length-sorted batches of the task's
    declared inputs, for ``quantize_onnx(method="static")``."""
    if len(examples) > limit:
        picked = np.random.RandomState(seed).choice(len(examples), limit, replace=False)
        examples = [examples[int(i)] for i in sorted(picked)]
    fields = task.store_fields()
    items = [{f.name: e[f.name] for f in fields if f.name in e} for e in examples]
    collate = Collator(encoder.pad_id, fields=fields)
    names = [s["name"] for s in task.input_specs]
    _, batches = parity.split_batches(items, collate, CALIBRATION_BATCH_TOKENS,
                                      length_field=next(f.name for f in collate.fields.values()
                                                        if f.length))
    return names, [tuple(b[n] for n in names) for b in batches]


def _write_export(view, model, meta, encoder, cfg, output, formats, precisions, verify,
                  test_examples, left_out=None, calibration=None):
    """The body of ``export_model``: the directory written in a temp dir and swapped in ->
    the manifest."""
    name = meta.get("model_name", "model")
    with atomic_dir(output) as tmp, \
            tempfile.TemporaryDirectory(prefix=owned_prefix(WORK_PREFIX)) as work, \
            disk_full_told(output, tmp, work):
        encoder.save(tmp)
        tokenizer_files = {"vocab_file": "vocab.txt", "encoder_file": "encoder.json",
                           "vocab_size": encoder.vocab_size}
        backends = view.write(model, meta, encoder, cfg, tmp, work, formats, precisions,
                              calibration)
        # Paddle fp16 is the GPU half-precision setting (settings.gpu_fp16), not a file.
        listed = {"paddle": [p for p in precisions if p != "int8"],
                  "onnx": [p for p in precisions if p in ("fp32", "fp16", "int8")]}
        precision_map = {b: listed[b] for b in backends}
        # the manifest first: parity runs the serving engines, which read the directory by it
        manifest = manifest_mod.build_manifest(tmp, meta, cfg.Data, cfg.Deploy, backends,
                                               precision_map, tokenizer_files,
                                               view.decoding(model))
        if verify:
            _verify_export(view, model, meta, encoder, cfg, output, tmp, work, manifest,
                           formats, precisions, test_examples, left_out or {})
        elif left_out:
            manifest["precision_measured"] = precision_speed.left_out_section(left_out)
        atomic_write_json(os.path.join(tmp, "manifest.json"), manifest)
        if is_version_dir(output):
            resolve_output(output)  # still free: another export may have taken it meanwhile
    return manifest


def _verify_export(view, model, meta, encoder, cfg, output, tmp, work, manifest, formats,
                   precisions, test_examples, left_out):
    """Parity, the task-metric gate and the serving admission of every backend and precision
    on the directory being written.  An fp32 failure fails the export
    (``ExportFailedError``, report beside the output); a reduced precision that fails is
    refused: its files are left out, the rest written, a warning names it and why."""
    name = meta.get("model_name", "model")
    report, table = view.verify(model, meta, encoder, cfg, tmp, work, manifest, formats,
                                precisions, test_examples)
    log.info("parity of %s (reference: dygraph eager)\n%s", name, table)
    failed = os.path.abspath(output) + ".parity-failed.json"
    if os.path.exists(failed):
        os.remove(failed)  # a stale report from an earlier attempt
    if not report["passed"]:
        atomic_write_json(failed, report)
        raise ExportFailedError(f"parity check failed for {name}; export not written "
                                f"(report: {failed}):\n  " + "\n  ".join(report["failures"]))
    served = precision_speed.PARITY_BACKENDS  # parity runner -> (backend, precision)
    refused = {served[n]: why for n, why in report.get("refused", {}).items() if n in served}
    for backend, precision in list(refused):
        drop_precision(tmp, manifest, backend, precision)
    manifest["files"] = manifest_mod.file_hashes(tmp)
    atomic_write_json(os.path.join(tmp, "manifest.json"), manifest)  # what admission loads
    for (backend, precision), why in admit_export(tmp, name, manifest["precisions"]).items():
        refused[backend, precision] = why
        drop_precision(tmp, manifest, backend, precision)
    report["refused"] = {f"{b}/{p}": why for (b, p), why in refused.items()}
    report["left_out"] = left_out
    for (backend, precision), why in refused.items():
        log.warning("%s: precision %s of the %s backend REFUSED and left out of the export "
                    "(the other precisions are written): %s", name, precision, backend, why)
    atomic_write_json(os.path.join(tmp, "parity.json"), report)
    manifest["files"] = manifest_mod.file_hashes(tmp)
    if report.get("speed"):  # verified + measured, per backend and precision
        manifest["precision_measured"] = precision_speed.manifest_section(report, refused,
                                                                          left_out)
    elif left_out:  # seq2seq: fp32 only, not timed
        manifest["precision_measured"] = precision_speed.left_out_section(left_out)


# the manifest's keys of a reduced precision's own files, per backend
VARIANT_KEYS = {("onnx", "fp16"): ("model_fp16",), ("onnx", "int8"): ("model_int8", "int8")}


def drop_precision(tmp, manifest, backend, precision):
    """Take a refused ``precision`` of ``backend`` out of the export being written: its files,
    its manifest entries and its place in ``manifest["precisions"]``."""
    entry = manifest["backends"][backend]
    for key in VARIANT_KEYS.get((backend, precision), ()):
        value = entry.pop(key, None)
        if isinstance(value, str) and os.path.exists(os.path.join(tmp, value)):
            os.remove(os.path.join(tmp, value))
    if precision == "bf16":
        (entry.get("settings") or {}).pop("bf16", None)
    listed = manifest["precisions"].get(backend, [])
    if precision in listed:
        listed.remove(precision)


def admit_export(export_dir, name, precisions):
    """The serving admission check on the directory being written, every backend and every
    precision it lists (``precisions``: the manifest's {backend: [precision]}): what export
    writes, the server admits.  -> {(backend, precision): why} of the reduced precisions
    refused; an fp32 refusal fails the export.  A list of backends: their fp32 only."""
    if not isinstance(precisions, dict):
        precisions = dict.fromkeys(precisions, ["fp32"])
    refused = {}
    for backend, listed in precisions.items():
        for precision in listed:
            if backend == "paddle" and precision == "fp16":
                continue  # the GPU half-precision setting: cannot run on this CPU host
            try:
                report = admit(Predictor(export_dir, backend, precision=precision))
            except UnservableExportError as e:
                if precision == "fp32":
                    raise ExportFailedError(f"{name}: the {backend} backend would be refused by "
                                            f"the server ({e}); export not written") from None
                refused[backend, precision] = (f"admission: the server would refuse {precision} "
                                               f"on {backend}: {e}")
                continue
            log.info("admission of %s (%s, %s): %s passed", name, backend, precision,
                     ", ".join(report))
    return refused


class ForwardView:
    """Classification / tagging: the model's forward as one program (Paddle, ONNX)."""

    fixed_precision = None  # every precision applies
    @staticmethod
    def check_precisions(precisions):
        """Every precision ``check_request`` accepts."""

    @staticmethod
    def decoding(model):
        return None

    @staticmethod
    def paddle_prefix(tmp, work, formats):
        """The saved static program (in the export when Paddle is exported, else aside)."""
        return os.path.join(tmp if "paddle" in formats else work, "paddle", "model")

    @staticmethod
    def write(model, meta, encoder, cfg, tmp, work, formats, precisions, calibration=None):
        """-> the manifest's backends.  ``calibration``: {"examples", "source"} for int8."""
        name = meta.get("model_name", "model")
        task = get_task(meta["task"])
        output_names = [o["name"] for o in task.output_specs]
        paddle_prefix = ForwardView.paddle_prefix(tmp, work, formats)
        os.makedirs(os.path.dirname(paddle_prefix), exist_ok=True)
        save_inference(model, paddle_prefix, task.input_specs)
        backends = {}
        if "paddle" in formats:
            backends["paddle"] = {
                "model": "paddle/model.json", "params": "paddle/model.pdiparams",
                "outputs": output_names, "decode": "in_graph",
                "settings": {"fp32": {"enable_onednn": True},
                             "bf16": {"enable_onednn": True, "enable_onednn_bfloat16": True},
                             "gpu_fp16": {"enable_use_gpu": [256, 0, "Half"],
                                          "tensorrt_precision": "Half",
                                          "tensorrt_shapes": "shape_ranges"}}}
        crf = crf_matrix_of(model)  # CRF taggers only; None for the others
        if "onnx" in formats:
            int8 = None
            if "int8" in precisions:
                names, batches = calibration_batches(task, encoder, calibration["examples"])
                int8 = {"names": names, "batches": batches, "source": calibration["source"],
                        "examples": min(len(calibration["examples"]), CALIBRATION_EXAMPLES)}
            backends["onnx"] = _export_onnx(model, name, tmp, work, paddle_prefix, output_names,
                                            crf, cfg.Export.opset, task.input_specs,
                                            "fp16" in precisions, int8)
        return backends

    @staticmethod
    def verify(model, meta, encoder, cfg, tmp, work, manifest, formats, precisions,
               test_examples):
        """-> (parity report, its table): the serving engines over ``tmp`` vs the eager model."""
        report = parity.verify_forward(model, meta, encoder, cfg, tmp, manifest,
                                       ForwardView.paddle_prefix(tmp, work, formats), formats,
                                       precisions, crf_matrix_of(model), test_examples)
        return report, parity.format_table(report["results"])


def _export_onnx(model, name, tmp, work, paddle_prefix, output_names, crf, opset, input_specs,
                 fp16, int8=None):
    """The ONNX files; ``int8``: {"names", "batches", "source", "examples"} of the calibration
    (None: no int8 file)."""
    os.makedirs(os.path.join(tmp, "onnx"), exist_ok=True)
    entry = {"model": "onnx/model.onnx", "outputs": output_names, "decode": "in_graph"}
    src = paddle_prefix
    if crf is not None:
        # paddle2onnx has no viterbi_decode: export the emission network, decode in numpy.
        src = os.path.join(work, "first_output", "model")
        save_inference(model, src, input_specs, emissions_only=True)
        np.save(os.path.join(tmp, "onnx", "crf_transitions.npy"), crf)
        entry.update(outputs=output_names[:1], decode="viterbi_numpy",
                     crf_transitions="onnx/crf_transitions.npy",
                     crf_layout="[T+2, T]: transitions[from, to]; row T stop; row T+1 start "
                                "(ppvarlen.utils.viterbi.crf_decode)")
    info = export_onnx(src, os.path.join(tmp, "onnx", "model.onnx"), name, entry["outputs"], opset)
    entry.update(info)
    if fp16:
        convert_onnx_fp16(os.path.join(tmp, "onnx", "model.onnx"),
                          os.path.join(tmp, "onnx", "model_fp16.onnx"))
        check_loads(os.path.join(tmp, "onnx", "model_fp16.onnx"), name + " (fp16)")
        entry["model_fp16"] = "onnx/model_fp16.onnx"
    if int8:
        int8_path = os.path.join(tmp, "onnx", "model_int8.onnx")
        entry["int8"] = quantize_onnx(os.path.join(tmp, "onnx", "model.onnx"), int8_path,
                                      calibration_batches=int8["batches"],
                                      input_names=int8["names"], **DEFAULT_INT8)
        entry["int8"]["calibrated_on"] = {"split": int8["source"], "examples": int8["examples"]}
        check_loads(int8_path, name + " (int8)")
        entry["model_int8"] = "onnx/model_int8.onnx"
    return entry


class GreedyView:
    """Seq2seq: Paddle Inference with the greedy loop in the graph; ONNX encoder + one cached
    decoder step with the loop in numpy; parity over the decoded ids (``parity.verify_greedy``).

    * ``paddle/model.json``: ``GreedyProgram`` through to_static (``InputSpec([None, None])``,
      traced once): (src_ids, src_len) -> tokens, the whole loop a PIR while op with early exit.
    * ``onnx/encoder.onnx`` (src_ids, src_len) -> (cross_k, cross_v) and
      ``onnx/decoder_step.onnx`` (tokens, src_len, self_k, self_v, cross_k, cross_v) ->
      (logp, new_self_k, new_self_v): paddle2onnx cannot take the while op, so
      ``ppvarlen.utils.search.greedy_search`` runs the loop.

    Only fp32 (``check_precisions`` says why; ``auto`` is fp32).  A paddle2onnx trap,
    checked: the step's int
    position arithmetic (``tokens * 0 + cache_len - 1``) is exported through float32 Casts;
    exact for ints < 2**24, i.e. any position table (tests/export/test_export_seq2seq.py).
    """

    fixed_precision = ("seq2seq exports are fp32 only: bf16 crashes Paddle Inference on the "
                       "greedy while-loop program, and one rounding-flipped argmax changes every "
                       "later token of a greedy output")

    @staticmethod
    def check_precisions(precisions):
        extra = [p for p in precisions if p != "fp32"]
        if extra:
            raise ConfigError(
                f"--precision / Export.precision: {extra} not supported for seq2seq exports, "
                f"only fp32. bf16: Paddle Inference 3.3.1 crashes (SIGSEGV in an oneDNN bf16 "
                f"pass) creating a predictor for the greedy while-loop program. fp16: not "
                f"exported; the contract is greedy outputs identical to the model, and one "
                f"rounding-flipped argmax changes every later token. Use --precision fp32")

    @staticmethod
    def decoding(model):
        """manifest ``decoding``: what the exported loops do (from the model, not the config)."""
        return {"strategy": "greedy", "max_len_a": float(model.max_len_a),
                "max_len_b": int(model.max_len_b), "max_position": int(model.max_position),
                "bos_id": int(model.bos_id), "eos_id": int(model.eos_id),
                "pad_id": int(model.pad_id)}

    @staticmethod
    def write(model, meta, encoder, cfg, tmp, work, formats, precisions, calibration=None):
        name = meta.get("model_name", "model")
        backends = {}
        if "paddle" in formats:
            os.makedirs(os.path.join(tmp, "paddle"), exist_ok=True)
            save_view(GreedyProgram(model), os.path.join(tmp, "paddle", "model"))
            backends["paddle"] = {"model": "paddle/model.json", "params": "paddle/model.pdiparams",
                                  "outputs": ["tokens"], "decode": "in_graph",
                                  "settings": {"fp32": {"enable_onednn": True}}}
        if "onnx" in formats:
            os.makedirs(os.path.join(tmp, "onnx"), exist_ok=True)
            for part, program, outputs in (
                    ("encoder", EncoderProgram(model), parity.ENCODER_OUTPUTS),
                    ("decoder_step", DecoderStepProgram(model), parity.STEP_OUTPUTS)):
                prefix = os.path.join(work, part, "model")
                save_view(program, prefix)
                info = export_onnx(prefix, os.path.join(tmp, "onnx", part + ".onnx"),
                                   f"{name} {part}", outputs, cfg.Export.opset, fix_rnn=False)
            backends["onnx"] = {
                "encoder": "onnx/encoder.onnx", "decoder_step": "onnx/decoder_step.onnx",
                "decode": "greedy_numpy", "opset": info["opset"], "session": info["session"],
                "encoder_outputs": parity.ENCODER_OUTPUTS,
                "decoder_step_outputs": parity.STEP_OUTPUTS,
                "cache": {"layers": len(model.decoder.layers), "heads": model.num_heads,
                          "head_dim": model.head_dim,
                          "layout": "[layers, B, heads, len, head_dim]; the self cache starts as "
                                    "ONE zero slot (masked), see ppvarlen.utils.search"}}
        return backends

    @staticmethod
    def verify(model, meta, encoder, cfg, tmp, work, manifest, formats, precisions,
               test_examples):
        report = parity.verify_greedy(model, meta, encoder, cfg, tmp, manifest, formats,
                                      GreedyView.decoding(model), test_examples)
        return report, parity.format_decoded_table(report)


def save_view(program, prefix):
    """An export view (GreedyProgram, EncoderProgram, ...) saved with its own input spec."""
    return save_program(program, prefix, program.input_spec())


# Task.export_view -> the programs an export of that task holds and how parity compares them
VIEWS = {"forward": ForwardView, "greedy": GreedyView}


def export_checkpoint(checkpoint, output, cfg=None, formats=None, precisions=None, verify=None):
    """``tools/export.py``: load a checkpoint, export it, verify on its test split."""
    if cfg is not None:  # fail on a bad request before the slow model and data loading
        check_request(formats or cfg.Export.format, precisions or cfg.Export.precision)
    model, meta, encoder, ckpt_cfg = load_for_inference(checkpoint)
    cfg = cfg or ckpt_cfg
    formats = formats or cfg.Export.format
    precisions = precisions or cfg.Export.precision
    verify = cfg.Export.verify if verify is None else verify
    test_examples = load_test_split(cfg, encoder, meta["task"]) if verify else None
    return export_model(model, meta, encoder, cfg, output, formats, precisions, verify,
                        test_examples,
                        lambda: load_train_sample(cfg, encoder, meta["task"]))


def load_test_split(cfg, encoder, task):
    """The config's test split, encoded with the checkpoint's own vocabulary."""
    bundle = build_datasets(cfg.Data, task_hint=task, encoder=encoder, splits=("test",))
    return [bundle.test[i] for i in range(len(bundle.test))]


def load_train_sample(cfg, encoder, task, limit=CALIBRATION_EXAMPLES, seed=0):
    """A seeded sample of the config's train split (int8 calibration), [] without one."""
    bundle = build_datasets(cfg.Data, task_hint=task, encoder=encoder, splits=("train",))
    train = bundle.train
    if train is None or not len(train):
        return []
    picked = np.random.RandomState(seed).choice(len(train), min(limit, len(train)),
                                                replace=False)
    return [train[int(i)] for i in sorted(picked)]


def export_pretrained_dir(directory, output, cfg, task=None, formats=None, precisions=None,
                          verify=None, verify_file=None, model_options=None):
    """``tools/export.py --pretrained-dir``: a PaddleNLP ``save_pretrained`` directory, with no
    ppvarlen training run behind it, exported like a checkpoint.

    The model family (models/paddlenlp_auto.py) comes from config.json's ``architectures``
    (``*ForSequenceClassification`` / ``*ForTokenClassification``) or from ``task`` (the
    embedder, which reads the encoder under any head, only from ``task``); the label names
    from its ``id2label`` (none for a headless family); the tokenizer is the directory's own
    (AutoTokenizer, files copied into the export).  ``verify_file``: a JSONL file of examples
    in the corpus format of the task ({"text", "label"} / {"tokens", "tags"} / ...) for the
    parity report besides the grid.  ``model_options``: {Model key: value or None} from the
    command line (``--pooling``, ``--normalize``), each a key the family must read, checked
    against the directory before any weight is loaded.
    """
    config = read_config(directory, key="--pretrained-dir")
    model_name, task_name = model_name_for(config, task, directory)
    task = get_task(task_name)
    model_class = FAMILY[model_name]
    options = {k: v for k, v in (model_options or {}).items() if v is not None}
    for key in options:
        if key not in MODELS[model_name].keys:
            readers = [n for n in FAMILY if key in MODELS[n].keys]
            raise ConfigError(f"--{key}: the {task.name} model {model_name} has no {key} "
                              f"setting (only {', '.join(readers)} reads it: --task "
                              f"{' / '.join(t for n in readers for t in MODELS[n].tasks)})")
    # the flags against the directory first, named as typed (the builder checks again, logged)
    model_class.options_of(directory, config, options,
                           keys={k: f"--{k}" for k in MODELS[model_name].keys}, log_choice=False)
    label_names = label_names_of(config) if model_class.has_head else []
    table = int(config.max_position_embeddings)
    max_len = min(int(cfg.Data.max_len), table)
    raw = cfg.to_dict()
    raw["Model"] = {"name": model_name, "pretrained_dir": directory, "max_position": table,
                    **options}
    # a PaddleNLP model was fine-tuned on tokenizer(text): [CLS] text [SEP]
    raw["Data"].update(tokenizer="pretrained", vocab_file=directory, max_len=max_len,
                       add_special_tokens=True, lowercase=False, label_names=label_names)
    cfg = load_config(data=raw)
    formats, precisions = check_request(formats or cfg.Export.format,
                                        precisions or cfg.Export.precision)
    encoder = TextEncoder.load(directory, "pretrained")
    model = build_model(cfg.Model, encoder.vocab_size, len(label_names), encoder.pad_id, task.name)
    model.eval()
    verify = cfg.Export.verify if verify is None else verify
    test_examples = profile = None
    if verify_file:
        test_examples = _encode_verify_file(cfg, encoder, task.name, verify_file, label_names)
        stats = length_stats([len(e["input_ids"]) for e in test_examples])
        profile = {k: stats[k] for k in ("p50", "p95", "p99", "max")}
    meta = {"task": task.name, "model_name": model_name, "label_names": label_names,
            "num_labels": len(label_names), "special_ids": dict(encoder.special_ids),
            "tokenizer": "pretrained", "max_len": max_len, "max_position": table,
            "long_text": cfg.Data.long_text, "buckets": [], "length_profile": profile,
            "step": 0, "metrics": {}, "source": {"pretrained_dir": os.path.abspath(directory)},
            **task.meta_extras(cfg), **task.model_meta(model)}
    return export_model(model, meta, encoder, cfg, output, formats, precisions, verify,
                        test_examples)


def _encode_verify_file(cfg, encoder, task, path, label_names):
    """The labelled file (a format training reads that holds the task's data, told by its
    suffix, ``.gz`` aside), read as training reads it (columns by name) and encoded with the
    directory's tokenizer (all of it: test)."""
    if not os.path.isfile(path):
        raise ConfigError(f"--verify-file {path}: file not found")
    fmt, fits = format_of(path), formats_for(task)
    if fmt not in fits:
        suffixes = ", ".join(s for s, f in SUFFIX_FORMATS.items() if f in fits)
        fields = ", ".join(readers.FORMATS[task].fields)
        got = f"a {fmt} file cannot hold them" if fmt else \
            f"cannot tell the format of {os.path.splitext(path)[1] or 'a file without suffix'}"
        raise ConfigError(f"--verify-file {path}: a {task} export is verified on labelled "
                          f"{task} examples ({fields}) in a format training reads, told by the "
                          f"suffix: {suffixes} (or the same + .gz); {got}")
    raw = cfg.to_dict()
    raw["Data"].update(corpus=fmt, train_file=path, test_file=path, task=task,
                       label_names=list(label_names))
    bundle = build_datasets(load_config(data=raw).Data, task_hint=task, encoder=encoder,
                            splits=("test",))
    return [bundle.test[i] for i in range(len(bundle.test))]
