"""benchmarks/precision_throughput.py's training of a random-init model (``--train-steps``),
on a toy classifier: the loss falls, the weights are kept (safetensors) and a second run
reuses them without training.  No export, no server."""
import types

import numpy as np
import paddle
import pytest
from script_loader import load_script


@pytest.fixture(scope="module")
def bench():
    return load_script("benchmarks/precision_throughput.py")


class Toy(paddle.nn.Layer):
    """The classifier signature the benchmark trains: (ids, seq_len, labels) -> (loss, logits)."""

    def __init__(self):
        super().__init__()
        paddle.seed(1)
        self.embed = paddle.nn.Embedding(8, 4)
        self.head = paddle.nn.Linear(4, 2)

    def forward(self, ids, seq_len, labels):
        logits = self.head(self.embed(ids).mean(axis=1))
        return paddle.nn.functional.cross_entropy(logits, labels), logits


def toy_train(n=64):
    """Token 2 in a text means class 0, token 3 class 1."""
    rng = np.random.RandomState(0)
    labels = rng.randint(0, 2, n)
    return [{"input_ids": [1] + [2 + int(y)] * int(rng.randint(1, 5)), "label": int(y)}
            for y in labels]


def test_train_steps_lowers_the_loss_and_leaves_the_model_in_eval(bench):
    model = Toy()
    losses = bench.train_steps(model, toy_train(), 60, pad_id=0, lr=0.05, rows=16)
    assert len(losses) == 10 and max(losses) < 0.3  # from ln 2 = 0.69 at the start
    assert not model.training


def test_trained_weights_are_kept_and_reused_without_training(bench, tmp_path, monkeypatch):
    args = types.SimpleNamespace(work=str(tmp_path), train_steps=30, train_lr=0.05)
    trained = Toy()
    assert bench.trained_weights(trained, toy_train(), args, 0) is not None
    kept = list(tmp_path.glob("trained_30_steps_lr0.05.safetensors"))
    assert len(kept) == 1
    monkeypatch.setattr(bench, "train_steps", lambda *a, **k: pytest.fail("trained again"))
    fresh = Toy()
    assert bench.trained_weights(fresh, toy_train(), args, 0) is None
    for name, value in trained.state_dict().items():
        np.testing.assert_array_equal(fresh.state_dict()[name].numpy(), value.numpy())
    from ppvarlen.models.weights import read_weights

    assert sorted(read_weights(kept[0])) == sorted(trained.state_dict())  # no pickle: safetensors
