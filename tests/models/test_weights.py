"""safetensors weights: round trip, bfloat16, clear mismatch errors, no pickle."""
import os

import ppvarlen  # noqa: F401  (quiet imports before paddle)
import numpy as np
import paddle
import paddle.nn as nn
import pytest
from safetensors import safe_open

from ppvarlen.models import build_model
from ppvarlen.models.weights import load_weights, save_weights

TINY = dict(name="bigru_crf", emb_size=8, hidden_size=8, num_layers=1, dropout=0.0)


def _model(seed, **over):
    paddle.seed(seed)
    return build_model(dict(TINY, **over), 20, 3, 0, "tagging")


def test_round_trip_restores_outputs_exactly(tmp_path):
    path = tmp_path / "ckpt" / "model.safetensors"
    source, target = _model(0), _model(1)
    save_weights(source, path)
    assert sorted(os.listdir(path.parent)) == ["model.safetensors"]  # no temp file left behind
    load_weights(target, path)
    ids = paddle.to_tensor([[3, 4, 5, 0], [6, 7, 0, 0]], dtype="int64")
    seq_len = paddle.to_tensor([3, 2], dtype="int64")
    source.eval(), target.eval()
    for a, b in zip(source(ids, seq_len), target(ids, seq_len)):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    with safe_open(str(path), "np") as f:  # a plain safetensors file any reader opens
        assert set(f.keys()) == set(source.state_dict())
    save_weights(target, path)  # overwriting in place works
    load_weights(source, path)


def test_bfloat16_parameters_survive(tmp_path):
    paddle.seed(0)
    layer = nn.Linear(3, 4)
    layer.to(dtype="bfloat16")  # casting works on CPU; bf16 compute does not (not needed here)
    assert layer.weight.dtype == paddle.bfloat16
    path = tmp_path / "bf16.safetensors"
    save_weights(layer, path)
    with safe_open(str(path), "np") as f:
        assert '"weight": "bfloat16"' in f.metadata()["ppvarlen_dtypes"]
    fresh = nn.Linear(3, 4)
    fresh.to(dtype="bfloat16")
    load_weights(fresh, path)
    assert fresh.weight.dtype == paddle.bfloat16
    np.testing.assert_array_equal(fresh.weight.astype("float32").numpy(),
                                  layer.weight.astype("float32").numpy())
    as_fp32 = load_weights(nn.Linear(3, 4), path)  # into float32: the exact bf16 values
    np.testing.assert_array_equal(as_fp32.weight.numpy(), layer.weight.astype("float32").numpy())


def test_mismatch_lists_missing_unexpected_and_shapes(tmp_path):
    path = tmp_path / "model.safetensors"
    save_weights(_model(0), path)
    with pytest.raises(ValueError) as err:
        load_weights(_model(0, hidden_size=6, num_layers=2), path)
    message = str(err.value)
    assert str(path) in message
    assert "shape mismatch: rnn.0.cell_fw.weight_ih file [24, 8] vs model [18, 8]" in message
    assert "missing: rnn.1.cell_fw.weight_ih [18, 12]" in message
    with pytest.raises(ValueError, match=r"unexpected: rnn\.0\.cell_fw\.weight_ih \[24, 8\]"):
        load_weights(nn.Linear(2, 2), path)


def test_not_a_safetensors_file_is_a_clear_error(tmp_path):
    bogus = tmp_path / "model_state.pdparams"
    bogus.write_bytes(b"\x80\x04\x95pickle bytes, never unpickled")
    with pytest.raises(ValueError, match="not a readable safetensors file"):
        load_weights(_model(0), bogus)
    with pytest.raises(ValueError, match="not found"):
        load_weights(_model(0), tmp_path / "missing.safetensors")


@pytest.mark.parametrize("config_name", ["config.json", "model_config.json"])
def test_ernie_pretrained_dir_reads_safetensors_and_refuses_pickle(tmp_path, config_name):
    ernie_config = dict(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16,
                        type_vocab_size=2, max_position_embeddings=32)
    paddle.seed(0)
    source = build_model(dict(name="ernie_cls", ernie_config=ernie_config), 20, 2, 0, "classification")
    directory = tmp_path / "ernie"
    directory.mkdir()
    fields = ('{"vocab_size": 20, "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2, '
              '"intermediate_size": 16, "type_vocab_size": 2, "max_position_embeddings": 32}')
    if config_name == "model_config.json":  # legacy PaddleNLP layout
        fields = '{"init_args": [' + fields + '], "init_class": "ErnieModel"}'
    (directory / config_name).write_text(fields)
    (directory / "model_state.pdparams").write_bytes(b"\x80\x04pickle")
    with pytest.raises(ValueError, match="does not unpickle"):
        build_model(dict(name="ernie_cls", pretrained_dir=str(directory)), 20, 2, 0, "classification")
    save_weights(source, directory / "model.safetensors")  # keys "ernie.*" plus our head "classifier.*"
    loaded = build_model(dict(name="ernie_cls", pretrained_dir=str(directory)), 20, 2, 0, "classification")
    for name, value in source.ernie.state_dict().items():
        np.testing.assert_array_equal(loaded.ernie.state_dict()[name].numpy(), value.numpy())
    with pytest.raises(ValueError, match="vocab_size=20 but the data vocabulary has 21"):
        build_model(dict(name="ernie_cls", pretrained_dir=str(directory)), 21, 2, 0, "classification")
