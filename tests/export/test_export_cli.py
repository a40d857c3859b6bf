"""tools/export.py: usage and input errors are one clear line and exit code 2."""
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(REPO, "configs", "sentiment", "transformer.yaml")


def _run(*args):
    return subprocess.run([sys.executable, os.path.join(REPO, "tools", "export.py"), *args],
                          capture_output=True, text=True, cwd=REPO, timeout=300)


def test_missing_checkpoint_is_a_clear_error(tmp_path):
    r = _run("-c", CONFIG, "--checkpoint", str(tmp_path / "nope"), "--output", str(tmp_path / "o"))
    assert r.returncode == 2
    assert "not a checkpoint directory" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "o").exists()


def test_bad_format_and_precision_are_config_errors(tmp_path):
    from ppvarlen.config import ConfigError, load_config
    from ppvarlen.export.exporter import export_model

    cfg = load_config(data={})
    meta = {"task": "classification"}
    for formats, precisions, message in [(["tflite"], ["fp32"], "tflite"),
                                         (["paddle"], ["int8"], "int8"),
                                         (["onnx"], ["bf16"], "add paddle to --format"),
                                         (["paddle"], ["fp16"], "add onnx to --format")]:
        try:
            export_model(None, meta, None, cfg, str(tmp_path / "o"), formats, precisions)
        except ConfigError as e:
            assert message in str(e)
        else:
            raise AssertionError(f"{formats} {precisions} accepted")
    assert not (tmp_path / "o").exists()


def test_bad_format_fails_fast_before_loading(tmp_path):
    r = _run("-c", CONFIG, "--checkpoint", str(tmp_path / "nope"), "--output", str(tmp_path / "o"),
             "--format", "paddle,tflite")
    assert r.returncode == 2
    assert "['tflite'] not valid; choose from ['paddle', 'onnx']" in r.stderr
    assert "Traceback" not in r.stderr
