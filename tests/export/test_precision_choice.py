"""What --precision auto may pick (the verified precisions this CPU runs; GPU: fp32); an explicit
precision measured slower than fp32 on CPU is warned about.  The choice itself is timed on the
serving host: tests/serve/test_precision_auto.py, tests/runtime/test_predictor_auto.py."""
import json
import logging
import shutil

import pytest

from ppvarlen.runtime import precision_choice
from ppvarlen.runtime.predictor import Predictor
from ppvarlen.export.exporter import export_model
from test_export import CFG, _encoder, _meta, _test_items
from test_quantize import spread_transformer

# texts of the test encoder's characters (ids 6.. are U+4E00..) and their ids as the
# predictor feeds them to a transformer ([CLS] text [SEP]): the test split of the export
TEXTS = ["".join(chr(0x4E00 + i - 6) for i in x["input_ids"][:-2] or [6])
         for x in _test_items(40)]
ITEMS = [{"input_ids": [2] + [ord(c) - 0x4E00 + 6 for c in t] + [3], "label": 0, "doc_id": k}
         for k, t in enumerate(TEXTS)]


def _measured(fp32, fp16, int8, int8_verified=True):
    return {"onnx": {"fp32": {"verified": True, "examples_per_s": fp32},
                     "fp16": {"verified": True, "examples_per_s": fp16},
                     "int8": {"verified": int8_verified, "examples_per_s": int8}}}


def spread_export(out, precisions):
    """A verified ONNX export of the spread-logits transformer in ``precisions`` -> ``out``."""
    export_model(spread_transformer(ITEMS), _meta("classification", "transformer_cls", ["a", "b"]),
                 _encoder(), CFG, str(out), ["onnx"], precisions, verify=True,
                 test_examples=ITEMS)
    return out


@pytest.fixture(scope="module")
def shared_export(tmp_path_factory):
    """One export per module; tests get their own copy (``export_dir``), so a test that
    rewrites the manifest never changes what another test reads, in any order."""
    return spread_export(tmp_path_factory.mktemp("choice") / "export", ["fp32", "fp16", "int8"])


@pytest.fixture
def export_dir(shared_export, tmp_path):
    copy = tmp_path / "export"
    shutil.copytree(shared_export, copy)
    return copy


def _force(export_dir, measured):
    """Rewrite the manifest's measurements (manifest.json is not in its own hash list)."""
    path = export_dir / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["precision_measured"].update(measured)
    path.write_text(json.dumps(manifest))


def test_export_records_every_onnx_precision_as_verified_and_timed(export_dir):
    measured = json.loads((export_dir / "manifest.json").read_text())["precision_measured"]
    assert set(measured["onnx"]) == {"fp32", "fp16", "int8"}
    for entry in measured["onnx"].values():
        assert entry["verified"] and entry["examples_per_s"] > 0 and entry["agreement"] >= 0.995


def test_auto_candidates_are_the_verified_precisions_and_gpu_auto_is_fp32():
    manifest = {"precision_measured": _measured(100.0, 50.0, 900.0, int8_verified=False)}
    # export-host speeds decide nothing: every verified precision is timed on the serving host
    assert precision_choice.host_candidates(manifest, "onnx") == ["fp16"]
    assert precision_choice.host_candidates({}, "onnx") == []  # nothing verified
    assert precision_choice.resolve(manifest, "onnx", "auto", device="gpu") == "fp32"


def test_precision_measured_slower_than_fp32_logs_a_warning(export_dir, caplog):
    _force(export_dir, _measured(200.0, 80.0, 300.0))
    caplog.set_level(logging.WARNING, logger="ppvarlen.runtime.precision")
    logging.getLogger("ppvarlen").propagate = True
    predictor = Predictor(str(export_dir), backend="onnx", precision="fp16")
    assert predictor.precision == "fp16"  # served as asked, not swapped
    warned = [r.getMessage() for r in caplog.records if "SLOWER than fp32" in r.getMessage()]
    # one warning (captured twice when an earlier test left a handler on the propagating
    # "ppvarlen" logger)
    assert len(set(warned)) == 1 and "80.0 vs 200.0" in warned[0]
    caplog.clear()
    Predictor(str(export_dir), backend="onnx", precision="int8")  # faster: no warning
    assert not [r for r in caplog.records if "SLOWER" in r.getMessage()]


def test_unmeasured_fp16_on_cpu_warns_but_measured_faster_does_not():
    assert "not measured" in precision_choice.warn_if_slower({}, "onnx", "fp16")
    manifest = {"precision_measured": _measured(100.0, 150.0, 90.0)}
    assert precision_choice.warn_if_slower(manifest, "onnx", "fp16") is None
    assert "SLOWER" in precision_choice.warn_if_slower(manifest, "onnx", "int8")


def test_export_timing_uses_a_bounded_spread_of_batches():
    import numpy as np

    from ppvarlen.export.precision_speed import _spread

    batches = [(None, np.full(10, n)) for n in range(1, 101)]  # 10 rows of length n
    picked = _spread(batches, 16, max_tokens=3000)
    lengths = [int(sl[0]) for _, sl in picked]
    assert len(picked) <= 16 and sum(10 * n for n in lengths) <= 3000
    assert lengths[0] == 1 and lengths == sorted(lengths) and len(set(lengths)) == len(lengths)


def test_bf16_without_cpu_support_is_warned_and_never_auto(monkeypatch, caplog):
    manifest = {"precision_measured": {"paddle": {
        "fp32": {"verified": True, "examples_per_s": 100.0},
        "bf16": {"verified": True, "examples_per_s": 120.0, "cpu_bf16": True}}}}
    caplog.set_level(logging.WARNING, logger="ppvarlen.runtime.precision")
    logging.getLogger("ppvarlen").propagate = True
    monkeypatch.setattr(precision_choice, "cpu_supports_bf16", lambda: True)
    assert precision_choice.host_candidates(manifest, "paddle") == ["bf16"]
    assert precision_choice.resolve(manifest, "paddle", "bf16") == "bf16"
    assert not [r for r in caplog.records if "no bf16 instructions" in r.getMessage()]
    monkeypatch.setattr(precision_choice, "cpu_supports_bf16", lambda: False)
    assert precision_choice.host_candidates(manifest, "paddle") == []
    precision_choice.resolve(manifest, "paddle", "bf16")
    assert [r for r in caplog.records if "no bf16 instructions" in r.getMessage()]
