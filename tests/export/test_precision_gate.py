"""Each reduced precision is gated on its own (the task's metric against fp32's, the serving
admission checks); one that fails is refused and left out while the rest of the export is
written.  ``auto`` exports what this host can verify and records what it cannot."""
import json
import logging

import numpy as np

from ppvarlen.export import parity, quantize
from ppvarlen.export.exporter import export_model
from test_export import CFG, _encoder, _meta
from test_quantize import TEST_ITEMS, spread_transformer

NOT_VERIFIABLE = "not verifiable here"  # precision_gate.NOT_VERIFIABLE, as the manifest says it


def _planted(monkeypatch, bad_precision, share=2):
    """The parity runner of ``bad_precision`` answers class 1 on every ``share``-th row: the
    test items are all labelled 0, so its accuracy drops by about a third of the rows."""
    served = parity.served_runner

    def runner(export_dir, manifest, backend, precision, threads, outputs, crf=None):
        run, settings = served(export_dir, manifest, backend, precision, threads, outputs, crf)
        if precision != bad_precision:
            return run, settings

        def flipped(*inputs):
            out = dict(run(*inputs))
            logits = out["logits"].copy()
            logits[::share] = np.array([-5.0, 5.0], dtype=logits.dtype)
            out["logits"] = logits
            return out
        return flipped, settings
    monkeypatch.setattr(parity, "served_runner", runner)


def _export(tmp_path, formats, precisions):
    return export_model(spread_transformer(TEST_ITEMS),
                        _meta("classification", "transformer_cls", ["a", "b"]), _encoder(), CFG,
                        str(tmp_path / "export"), formats, precisions, verify=True,
                        test_examples=TEST_ITEMS)


def test_a_variant_that_fails_the_metric_is_refused_and_the_rest_written(monkeypatch, tmp_path,
                                                                          caplog):
    _planted(monkeypatch, "bf16")
    with caplog.at_level(logging.WARNING):
        manifest = _export(tmp_path, ["paddle", "onnx"], ["fp32", "bf16", "int8"])
    out = tmp_path / "export"
    assert manifest["precisions"] == {"paddle": ["fp32"], "onnx": ["fp32", "int8"]}
    assert "bf16" not in manifest["backends"]["paddle"]["settings"]
    assert (out / "onnx" / "model_int8.onnx").exists()  # the good precision is written
    bf16 = manifest["precision_measured"]["paddle"]["bf16"]
    gate = bf16["metric_gate"]
    assert not bf16["verified"] and not gate["passed"] and gate["metric"] == "accuracy"
    assert gate["fp32_value"] - gate["value"] > 0.1  # the planted flips, measured
    assert f"{gate['value']:.4f} vs fp32 {gate['fp32_value']:.4f}" in bf16["refused"]
    assert manifest["precision_measured"]["onnx"]["int8"]["verified"]
    report = json.loads((out / "parity.json").read_text())
    assert report["passed"] and list(report["refused"]) == ["paddle/bf16"]
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("precision bf16" in m and "REFUSED" in m and "accuracy" in m for m in warned)
    on_disk = json.loads((out / "manifest.json").read_text())
    assert on_disk == manifest


def test_fp16_failing_does_not_throw_the_export_away(monkeypatch, tmp_path):
    _planted(monkeypatch, "fp16")
    manifest = _export(tmp_path, ["onnx"], ["fp32", "fp16"])
    out = tmp_path / "export"
    assert manifest["precisions"] == {"onnx": ["fp32"]}
    assert not (out / "onnx" / "model_fp16.onnx").exists()
    assert "onnx/model_fp16.onnx" not in manifest["files"] and (out / "onnx/model.onnx").exists()
    assert "accuracy" in manifest["precision_measured"]["onnx"]["fp16"]["refused"]


def test_auto_on_a_host_without_bf16_records_it_as_not_verifiable(monkeypatch, tmp_path):
    from paddle.base import core

    monkeypatch.setattr(core, "supports_bfloat16", lambda: False)
    manifest = _export(tmp_path, ["paddle"], ["auto"])
    assert manifest["precisions"] == {"paddle": ["fp32"]}
    bf16 = manifest["precision_measured"]["paddle"]["bf16"]
    assert bf16["verified"] is False and bf16["status"] == NOT_VERIFIABLE
    assert "bf16 instructions" in bf16["reason"]
    int8 = manifest["precision_measured"]["onnx"]["int8"]  # no onnx format: said so, not dropped
    assert int8["status"] == NOT_VERIFIABLE and "onnx" in int8["reason"]


def test_auto_exports_bf16_and_a_batch_invariant_int8(monkeypatch, tmp_path):
    from paddle.base import core

    monkeypatch.setattr(core, "supports_bfloat16", lambda: True)
    manifest = _export(tmp_path, ["paddle", "onnx"], ["auto"])
    assert manifest["precisions"] == {"paddle": ["fp32", "bf16"], "onnx": ["fp32", "int8"]}
    int8 = manifest["backends"]["onnx"]["int8"]
    assert int8["method"] == "static" and int8["calibrated_on"]["examples"] == len(TEST_ITEMS)
    # the export's admission ran on int8 (padding: alone == batched) and it was kept
    assert manifest["precision_measured"]["onnx"]["int8"]["verified"]
    assert manifest["precision_measured"]["onnx"]["fp16"]["status"] == "not offered by default"


def test_a_dynamic_int8_whose_answer_depends_on_the_batch_is_refused_naming_int8(monkeypatch,
                                                                                 tmp_path):
    monkeypatch.setitem(quantize.DEFAULT_INT8, "method", "dynamic")
    manifest = _export(tmp_path, ["onnx"], ["fp32", "int8"])
    assert manifest["precisions"] == {"onnx": ["fp32"]}
    assert not (tmp_path / "export" / "onnx" / "model_int8.onnx").exists()
    refused = manifest["precision_measured"]["onnx"]["int8"]["refused"]
    assert "int8" in refused and "padding check" in refused


def test_a_tagger_is_gated_by_entity_f1(tmp_path):
    """Tagging: bf16 judged by the entity F1 of its tags against fp32's on labelled items."""
    import paddle

    from test_export import _test_items
    from test_export_models import TinyCRFTagger

    paddle.seed(3)
    rng = np.random.RandomState(2)
    items = [dict(e, labels=list(rng.choice(5, len(e["input_ids"]), p=[.6, .1, .1, .1, .1])),
                  offset=0) for e in _test_items(30, seed=1)]
    manifest = export_model(TinyCRFTagger(), _meta("tagging", "bigru_crf",
                                                   ["O", "B", "I", "E", "S"]),
                            _encoder(), CFG, str(tmp_path / "export"), ["paddle"],
                            ["fp32", "bf16"], verify=True, test_examples=items)
    entry = manifest["precision_measured"]["paddle"]["bf16"]
    gate = entry["metric_gate"]
    assert gate["metric"] == "f1" and 0 < gate["fp32_value"] <= 1
    assert gate["passed"] == (gate["drop"] <= 0.005) == entry["verified"]
    report = json.loads((tmp_path / "export" / "parity.json").read_text())
    assert report["metric_gate"]["values"]["paddle_inference_onednn"] == gate["fp32_value"]


def test_auto_resolves_per_view_and_verification(monkeypatch):
    """Seq2seq (a view fixed at fp32) and an unverified export get fp32 from auto, each left-out
    precision with its reason; an explicit reduced precision stays for the view to refuse."""
    from paddle.base import core

    from ppvarlen.export.exporter import GreedyView
    from ppvarlen.export.precision_gate import resolve

    monkeypatch.setattr(core, "supports_bfloat16", lambda: True)
    chosen, left_out = resolve(["paddle", "onnx"], ["auto"], GreedyView.fixed_precision)
    assert chosen == ["fp32"] and set(left_out) == {"bf16", "fp16", "int8"}
    assert "seq2seq" in left_out["bf16"]["reason"]
    assert resolve(["paddle", "onnx"], ["auto", "bf16"], GreedyView.fixed_precision)[0] == \
        ["fp32", "bf16"]
    chosen, left_out = resolve(["paddle", "onnx"], ["auto"], None, verify=False)
    assert chosen == ["fp32"] and "--no-verify" in left_out["int8"]["reason"]
    assert resolve(["paddle", "onnx"], ["auto"])[0] == ["fp32", "bf16", "int8"]
