"""GPU requests on a CPU machine: each is refused with a message, never silently run on CPU.

On a CUDA build the refusals do not apply (they are skipped); the ``gpu``-marked tests at
the end run tools/check_gpu.py's real path instead (skipped without a usable GPU).
"""
import json
import os
import subprocess
import sys

import onnxruntime as ort
import paddle
import pytest
from paddle.inference import PrecisionType

from ppvarlen.runtime import gpu
from ppvarlen.runtime.backends import build_engine
from ppvarlen.runtime.manifest import load_manifest
from ppvarlen.export import gpu_check
from test_precision_choice import export_dir, shared_export  # noqa: F401  (a tiny onnx export)
from test_quantize import int8_export  # noqa: F401

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CUDA_BUILD = paddle.device.is_compiled_with_cuda()
cpu_build_only = pytest.mark.skipif(CUDA_BUILD, reason="Paddle is built with CUDA here: the "
                                    "refusals do not apply; the gpu-marked tests run instead")


def test_gpu_precision_mapping_keeps_bf16():
    assert gpu.gpu_precision_type("bf16") == PrecisionType.Bfloat16
    assert gpu.gpu_precision_type("fp16") == PrecisionType.Half
    assert gpu.gpu_precision_type("fp32") == PrecisionType.Float32
    with pytest.raises(ValueError, match="cannot run on GPU"):
        gpu.gpu_precision_type("int8")


@cpu_build_only
@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_paddle_gpu_without_cuda_is_refused(int8_export, precision):  # noqa: F811
    out, _, _ = int8_export
    manifest = load_manifest(str(out))
    manifest["precisions"]["paddle"] = ["fp32", "bf16", "fp16"]  # as if exported with them
    with pytest.raises(ValueError, match="no CUDA"):
        build_engine(str(out), manifest, "paddle", device="gpu", precision=precision)


@cpu_build_only
def test_tensorrt_refused_off_gpu_and_without_paddle_tensorrt(int8_export, monkeypatch):  # noqa: F811
    out, _, _ = int8_export
    manifest = load_manifest(str(out))
    manifest["precisions"]["paddle"] = ["fp32", "fp16"]  # as if exported with GPU fp16
    with pytest.raises(ValueError, match="TensorRT runs only with --backend paddle --device gpu"):
        build_engine(str(out), manifest, "paddle", tensorrt=True, device="cpu")
    with pytest.raises(ValueError, match="no CUDA"):
        build_engine(str(out), manifest, "paddle", tensorrt=True, device="gpu", precision="fp16")
    # A CUDA build without paddle.tensorrt must refuse, not run plain GPU (this CPU build has
    # no paddle.tensorrt, so pretending CUDA reaches exactly that branch).
    monkeypatch.setattr(paddle.device, "is_compiled_with_cuda", lambda: True)
    with pytest.raises(ValueError, match="no paddle.tensorrt"):
        build_engine(str(out), manifest, "paddle", tensorrt=True, device="gpu", precision="fp16")
    with pytest.raises(ValueError, match="needs a PIR program"):
        gpu.convert_tensorrt(str(out / "paddle" / "model.pdmodel"), manifest,
                             ["input_ids", "seq_len"], "fp16", str(out))


def test_tensorrt_needs_shape_ranges():
    with pytest.raises(Exception, match="shape_ranges .*missing \\['seq_len'\\]"):
        gpu.tensorrt_shapes({"shape_ranges": {"input_ids": {"min": [1, 1], "opt": [4, 8],
                                                            "max": [8, 16]}}},
                            ["input_ids", "seq_len"])


@pytest.mark.skipif("CUDAExecutionProvider" in ort.get_available_providers(),
                    reason="onnxruntime-gpu is installed: the refusal does not apply")
def test_onnx_cuda_without_provider_is_refused(export_dir):  # noqa: F811
    manifest = load_manifest(str(export_dir))
    for precision in ("fp32", "fp16"):
        with pytest.raises(ValueError, match="no CUDAExecutionProvider"):
            build_engine(str(export_dir), manifest, "onnx", device="gpu", precision=precision)


@cpu_build_only
def test_check_gpu_exits_2_without_a_gpu(export_dir, tmp_path):  # noqa: F811
    report = tmp_path / "gpu_report.json"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "check_gpu.py"),
                           "--export", str(export_dir), "--report", str(report)],
                          capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=ROOT),
                          timeout=300)
    assert proc.returncode == 2
    assert "no usable GPU on this machine" in proc.stderr and "CPU build" in proc.stderr
    assert not report.exists()


@pytest.mark.gpu
@pytest.mark.timeout(900)
def test_check_gpu_passes_every_configuration_this_host_supports(int8_export, tmp_path):  # noqa: F811
    """tools/check_gpu.py on a small paddle+onnx export: each GPU configuration whose runtime
    is present here (Paddle CUDA, onnxruntime's CUDA provider, paddle.tensorrt) matches CPU
    fp32 within the parity gates; the others are named as failed, not skipped silently."""
    out, _, _ = int8_export
    report_path = tmp_path / "gpu_report.json"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "check_gpu.py"),
                           "--export", str(out), "--report", str(report_path)],
                          capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=ROOT),
                          timeout=900)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    report = json.loads(report_path.read_text())
    configs = report["configurations"]
    assert set(configs) == {name for name, *_ in gpu_check.CONFIGURATIONS}
    paddle_gpu = CUDA_BUILD and paddle.device.cuda.device_count() > 0
    ort_gpu = "CUDAExecutionProvider" in ort.get_available_providers()
    try:
        import paddle.tensorrt  # noqa: F401
        has_trt = True
    except ImportError:
        has_trt = False
    precisions = json.loads((out / "manifest.json").read_text())["precisions"]
    expected_ok = [name for name, backend, precision, trt in gpu_check.CONFIGURATIONS
                   if precision in precisions.get(backend, [])
                   and (paddle_gpu if backend == "paddle" else ort_gpu) and (has_trt or not trt)]
    assert expected_ok, f"no configuration this host can run: {report}"
    for name in expected_ok:
        assert configs[name]["status"] == "ok", (name, configs[name])
        assert configs[name]["examples_per_s"] > 0
    for name, entry in configs.items():
        assert entry["status"] in ("ok", "failed", "parity_failed")
        assert entry["status"] == "ok" or entry.get("error") or entry.get("failures"), name
    assert report["passed"] == (proc.returncode == 0)
