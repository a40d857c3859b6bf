"""Checkpoint -> export directory (Paddle Inference, ONNX, precisions, manifest, parity).

Layout and manifest fields: docs/DESIGN.md "Export directory".  The directory
is built in a temp dir and swapped in only when complete and (with ``verify``)
when the parity gates pass, so a failed re-export leaves the old one intact.
"""
import os
import tempfile

import numpy as np

from ..config import ConfigError
from ..utils.io import atomic_dir, atomic_write_json
from ..utils.log import get_logger
from . import manifest as manifest_mod
from . import parity
from . import precision_speed  # [precision/measured]
from .errors import ExportError
from .precision import PRECISIONS, convert_onnx_fp16
from .static import crf_matrix_of, save_inference

log = get_logger("export")
FORMATS = ("paddle", "onnx")


def _check_choices(name, values, allowed):
    bad = [v for v in values if v not in allowed]
    if bad or not values:
        raise ConfigError(f"{name}: {bad or values} not valid; choose from {list(allowed)} "
                          f"(comma-separated on the command line)")


def check_request(formats, precisions):
    """Validated (formats, precisions); fp32 is always exported (the reference files)."""
    formats, precisions = list(formats), list(precisions)
    _check_choices("--format / Export.format", formats, FORMATS)
    _check_choices("--precision / Export.precision", precisions, PRECISIONS)
    if "fp32" not in precisions:
        precisions.insert(0, "fp32")  # bf16 runs the fp32 files, fp16 converts them
    if "paddle" not in formats and "bf16" in precisions:
        raise ConfigError("--precision bf16 runs the Paddle Inference files; add paddle to --format")
    if "onnx" not in formats and "fp16" in precisions:
        raise ConfigError("--precision fp16 on CPU is an ONNX variant; add onnx to --format")
    if "onnx" not in formats and "int8" in precisions:  # [precision/int8]
        raise ConfigError("--precision int8 is an ONNX Runtime variant (Paddle Inference int8 is "
                          "not produced, docs/PRECISION.md); add onnx to --format")
    return formats, precisions


def export_model(model, meta, encoder, cfg, output, formats=("paddle", "onnx"),
                 precisions=("fp32",), verify=True, test_examples=None):
    """Write the export directory for an eval-mode ``model``; returns the manifest dict.

    ``meta`` is the checkpoint's meta.json dict, ``cfg`` the resolved Config
    (Data for tokenizer/long-text settings, Deploy for shape ranges, Export for
    opset and parity size).  ``test_examples``: encoded test items for the
    parity report (None = shape grid only).  Raises ExportError when parity fails.
    """
    formats, precisions = check_request(formats, precisions)
    task, name = meta["task"], meta.get("model_name", "model")
    output_names = [o["name"] for o in manifest_mod.output_specs(task)]
    if task == "seq2seq":
        from . import seq2seq
        seq2seq.check_precisions(precisions)
    model.eval()

    with atomic_dir(output) as tmp, tempfile.TemporaryDirectory(prefix="ppvarlen-export-") as work:
        encoder.save(tmp)
        tokenizer_files = {"vocab_file": "vocab.txt", "encoder_file": "encoder.json",
                           "vocab_size": encoder.vocab_size}
        if task == "seq2seq":  # own programs and parity (greedy outputs): export/seq2seq.py
            backends = seq2seq.write_backends(model, name, tmp, work, formats, cfg.Export.opset)
            report = (seq2seq.verify_export(model, meta, encoder, cfg, tmp, formats, test_examples)
                      if verify else None)
            table = seq2seq.format_table(report) if verify else ""
            decoding = seq2seq.decoding_of(model)
        else:
            backends, report, table = _export_classic(
                model, meta, encoder, cfg, tmp, work, formats, precisions, verify, test_examples,
                output_names)
            decoding = None
        # Paddle fp16 is the GPU half-precision setting (settings.gpu_fp16), not a file.
        listed = {"paddle": [p for p in precisions if p != "int8"],  # [precision/int8]
                  "onnx": [p for p in precisions if p in ("fp32", "fp16", "int8")]}
        precision_map = {b: listed[b] for b in backends}

        if verify:
            atomic_write_json(os.path.join(tmp, "parity.json"), report)
            log.info("parity of %s (reference: dygraph eager)\n%s", name, table)
            failed = os.path.abspath(output) + ".parity-failed.json"
            if os.path.exists(failed):
                os.remove(failed)  # a stale report from an earlier attempt
            if not report["passed"]:
                atomic_write_json(failed, report)
                raise ExportError(f"parity check failed for {name}; export not written "
                                  f"(report: {failed}):\n  " + "\n  ".join(report["failures"]))
        manifest = manifest_mod.build_manifest(tmp, meta, cfg.Data, cfg.Deploy, backends,
                                               precision_map, tokenizer_files, decoding)
        if verify and report.get("speed"):  # [precision/measured] verified + measured per backend
            manifest["precision_measured"] = precision_speed.manifest_section(report)
        atomic_write_json(os.path.join(tmp, "manifest.json"), manifest)
    log.info("export written to %s (%s; precisions %s)", output, ", ".join(backends), precisions)
    return manifest


def _export_classic(model, meta, encoder, cfg, tmp, work, formats, precisions, verify,
                    test_examples, output_names):
    """Classification / tagging backends -> (backends, parity report or None, its table)."""
    task, name = meta["task"], meta.get("model_name", "model")
    paddle_prefix = os.path.join(tmp if "paddle" in formats else work, "paddle", "model")
    os.makedirs(os.path.dirname(paddle_prefix), exist_ok=True)
    save_inference(model, paddle_prefix)
    backends = {}
    if "paddle" in formats:
        backends["paddle"] = {"model": "paddle/model.json", "params": "paddle/model.pdiparams",
                              "outputs": output_names, "decode": "in_graph",
                              "settings": {"fp32": {"enable_onednn": True},
                                           "bf16": {"enable_onednn": True,
                                                    "enable_onednn_bfloat16": True},
                                           "gpu_fp16": {"enable_use_gpu": [256, 0, "Half"],
                                                        "tensorrt_precision": "Half",
                                                        "tensorrt_shapes": "shape_ranges"}}}
    crf = crf_matrix_of(model) if task == "tagging" else None
    if "onnx" in formats:
        backends["onnx"] = _export_onnx(model, name, tmp, work, paddle_prefix, output_names,
                                        crf, cfg.Export.opset, "fp16" in precisions,
                                        "int8" in precisions)  # [precision/int8]
    if not verify:
        return backends, None, ""
    report = verify_export(model, meta, encoder, cfg, tmp, paddle_prefix, formats, precisions,
                           crf, test_examples)
    return backends, report, parity.format_table(report["results"])


def _export_onnx(model, name, tmp, work, paddle_prefix, output_names, crf, opset, fp16,
                 int8=False):
    from .onnx_export import check_loads, export_onnx

    os.makedirs(os.path.join(tmp, "onnx"), exist_ok=True)
    entry = {"model": "onnx/model.onnx", "outputs": output_names, "decode": "in_graph"}
    src = paddle_prefix
    if crf is not None:
        # paddle2onnx has no viterbi_decode: export the emission network, decode in numpy.
        src = os.path.join(work, "emissions", "model")
        save_inference(model, src, emissions_only=True)
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
    if int8:  # [precision/int8]
        from .quantize import DEFAULT_INT8, quantize_onnx

        int8_path = os.path.join(tmp, "onnx", "model_int8.onnx")
        entry["int8"] = quantize_onnx(os.path.join(tmp, "onnx", "model.onnx"), int8_path,
                                      **DEFAULT_INT8)
        check_loads(int8_path, name + " (int8)")
        entry["model_int8"] = "onnx/model_int8.onnx"
    return entry


def verify_export(model, meta, encoder, cfg, export_dir, paddle_prefix, formats, precisions,
                  crf=None, test_examples=None):
    """Parity of every exported backend/precision against the eager model -> parity.json dict."""
    from ..data.collate import Collator
    from ..utils.inputs import validate_batch

    max_position = meta.get("max_position")
    max_len = int(min(meta["max_len"], max_position or meta["max_len"]))
    backends, precision_of = {"static": parity.static_runner(paddle_prefix)}, {"static": "fp32"}
    model_dir = os.path.dirname(paddle_prefix)
    if "paddle" in formats:
        backends["paddle_inference"] = parity.paddle_inference_runner(model_dir, onednn=False)
        backends["paddle_inference_onednn"] = parity.paddle_inference_runner(model_dir)
        precision_of.update(paddle_inference="fp32", paddle_inference_onednn="fp32")
        if "bf16" in precisions:
            backends["paddle_inference_onednn_bf16"] = parity.paddle_inference_runner(model_dir, "bf16")
            precision_of["paddle_inference_onednn_bf16"] = "bf16"
    if "onnx" in formats:
        onnx_dir = os.path.join(export_dir, "onnx")
        backends["onnx"] = parity.onnx_runner(os.path.join(onnx_dir, "model.onnx"), crf)
        precision_of["onnx"] = "fp32"
        if "fp16" in precisions:
            backends["onnx_fp16"] = parity.onnx_runner(os.path.join(onnx_dir, "model_fp16.onnx"), crf)
            precision_of["onnx_fp16"] = "fp16"
        if "int8" in precisions:  # [precision/int8]
            backends["onnx_int8"] = parity.onnx_runner(os.path.join(onnx_dir, "model_int8.onnx"), crf)
            precision_of["onnx_int8"] = "int8"

    def validate(ids, sl):
        validate_batch(ids, sl, max_position=max_position, vocab_size=encoder.vocab_size,
                       pad_id=encoder.pad_id)

    first_id = min(6, encoder.vocab_size - 1)  # skip the special ids ([PAD]..[EOS] = 0..5)
    grid = parity.grid_batches(max_len, meta.get("buckets"), encoder.vocab_size, first_id)
    test_batches = None
    if test_examples is not None:
        limit = cfg.Export.parity_max_examples
        items = [dict(input_ids=list(e["input_ids"])) for e in
                 (test_examples if limit is None else test_examples[:limit])]
        collate = Collator(encoder.pad_id)
        _, batches = parity.split_batches(items, collate, cfg.Data.eval_max_tokens)
        test_batches = [(b["input_ids"], b["seq_len"]) for b in batches]
    report = parity.run_parity(parity.dygraph_runner(model), backends, precision_of, grid,
                               test_batches, validate)
    # [precision/measured] short interleaved timing of every verified backend, same batches
    report["speed"] = precision_speed.measure(backends, test_batches or
                                              [(ids, sl) for _, _, ids, sl in grid])
    report["model_name"] = meta.get("model_name")
    return report


def export_checkpoint(checkpoint, output, cfg=None, formats=None, precisions=None, verify=None):
    """``tools/export.py``: load a checkpoint, export it, verify on its test split."""
    from ..engine.checkpoint import load_for_inference

    if cfg is not None:  # fail on a bad request before the slow model and data loading
        check_request(formats or cfg.Export.format, precisions or cfg.Export.precision)
    model, meta, encoder, ckpt_cfg = load_for_inference(checkpoint)
    cfg = cfg or ckpt_cfg
    formats = formats or cfg.Export.format
    precisions = precisions or cfg.Export.precision
    verify = cfg.Export.verify if verify is None else verify
    test_examples = load_test_split(cfg, encoder, meta["task"]) if verify else None
    return export_model(model, meta, encoder, cfg, output, formats, precisions, verify,
                        test_examples)


def load_test_split(cfg, encoder, task):
    """The config's test split, encoded with the checkpoint's own vocabulary."""
    from ..data.dataset import build_datasets

    bundle = build_datasets(cfg.Data, task_hint=task, encoder=encoder, splits=("test",))
    return [bundle.test[i] for i in range(len(bundle.test))]
