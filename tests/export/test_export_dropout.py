"""Eval-mode dropouts are left out of the saved inference program (export/static.py)."""
import json

import numpy as np
import paddle
from paddle import nn

from ppvarlen.tasks.base import INPUTS
from ppvarlen.export import parity
from ppvarlen.export.static import save_inference
from test_export_models import VOCAB


class DropoutModel(nn.Layer):
    """Every kind of dropout a model may hold: upscale_in_train layers, attention-weight
    dropout inside MultiHeadAttention, and a downscale_in_infer layer (scales in eval)."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 8)
        self.drop = nn.Dropout(0.3)
        self.attn = nn.MultiHeadAttention(8, 2, dropout=0.2)
        self.scaled = nn.Dropout(0.5, mode="downscale_in_infer")
        self.head = nn.Linear(8, 2)

    def forward(self, input_ids, seq_len, labels=None):
        x = self.drop(self.emb(input_ids))
        x = self.attn(x, x, x)
        pooled = self.scaled(x).sum(axis=1) / seq_len.astype("float32").unsqueeze(-1)
        return self.head(pooled)


def _dropout_ops(json_path):
    """Names of the dropout ops in a saved PIR program (model.json)."""
    found = []

    def walk(node):
        if isinstance(node, dict):
            if "dropout" in str(node.get("#", "")):
                found.append(node["#"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)
    with open(json_path) as f:
        walk(json.load(f))
    return found


def test_eval_dropouts_are_left_out_of_the_program_and_restored(tmp_path):
    paddle.seed(0)
    model = DropoutModel()
    model.eval()
    model_json, _ = save_inference(model, str(tmp_path / "model"), INPUTS)
    # only the downscale_in_infer dropout (x * 0.5 in eval) stays in the program
    assert len(_dropout_ops(model_json)) == 1
    assert (model.drop.p, model.attn.dropout, model.scaled.p) == (0.3, 0.2, 0.5)
    ids = np.random.RandomState(0).randint(6, VOCAB, (3, 7)).astype(np.int64)
    lens = np.array([7, 5, 2], dtype=np.int64)
    eager = parity.dygraph_runner(model, ["logits"])(ids, lens)["logits"]
    served = parity.paddle_inference_runner(str(tmp_path), ["logits"], "fp32")(ids, lens)["logits"]
    np.testing.assert_allclose(served, eager, atol=1e-5)
    model.train()  # training still drops: the layers were restored, not replaced
    paddle.seed(1)
    assert not np.allclose(model(paddle.to_tensor(ids), paddle.to_tensor(lens)).numpy(), eager)
