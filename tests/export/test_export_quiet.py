"""An export keeps ONNX Runtime's known noise off the terminal.

paddle2onnx graphs carry constants no node uses; every ONNX Runtime session over one logs a
yellow "Removing initializer ... It is not used by any node" warning unless told otherwise.
The int8 quantizer opens sessions of its own (shape inference, calibration): their warnings
reached the user on every default export.  Captured at the file descriptor: ONNX Runtime
writes from C++, past Python's sys.stderr.
"""
import os

import numpy as np
import onnx
import paddle
import pytest
from onnx import numpy_helper

from ppvarlen.config import load_config
from ppvarlen.data.vocab import TextEncoder
from ppvarlen.export.exporter import export_model
from ppvarlen.export.quantize import quantize_onnx
from ppvarlen.models import build_model

TEXTS = ["这部电影真好看", "服务很差，再也不来了", "今天天气不错", "质量一般般"]


@pytest.fixture(scope="module")
def onnx_file(tmp_path_factory):
    """A tiny random transformer_cls as paddle2onnx converts it (unused initializers and all)."""
    encoder = TextEncoder.build(TEXTS, kind="char")
    paddle.seed(0)
    model = build_model({"name": "transformer_cls", "hidden_size": 16, "num_layers": 1,
                         "num_heads": 2, "ffn_size": 32, "dropout": 0.0, "max_position": 32,
                         "pooling": "mean"},  # mean pooling leaves unused shape constants
                        encoder.vocab_size, 2, encoder.pad_id, "classification")
    meta = {"task": "classification", "model_name": "transformer_cls",
            "label_names": ["negative", "positive"], "special_ids": encoder.special_ids,
            "max_len": 16, "max_position": 32, "long_text": "truncate",
            "length_profile": {"p50": 8, "p95": 12, "p99": 14, "max": 16}}
    out = str(tmp_path_factory.mktemp("quiet") / "export")
    export_model(model, meta, encoder, load_config(overrides=["Data.max_len=16"]), out,
                 ("onnx",), ("fp32",), verify=False)
    return os.path.join(out, "onnx", "model.onnx")


def test_int8_quantization_logs_no_unused_initializer_warnings(onnx_file, tmp_path, capfd):
    import onnxruntime as ort

    capfd.readouterr()
    info = quantize_onnx(onnx_file, str(tmp_path / "int8.onnx"), method="dynamic")
    err = capfd.readouterr().err
    assert info["quantized_nodes"] > 0  # it did quantize
    assert "Removing initializer" not in err and "[W:onnxruntime" not in err, err[:1000]
    # the quiet setting is the quantizer's alone: a session opened afterwards over a graph
    # with an unused initializer warns as ONNX Runtime always does
    proto = onnx.load(onnx_file)
    proto.graph.initializer.append(numpy_helper.from_array(np.zeros(2, np.float32), "unused_x"))
    ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    assert "Removing initializer 'unused_x'" in capfd.readouterr().err
