"""Checkpoint pieces: optimizer state by structured names, RNG state as JSON, rotation, resume lookup."""
import json
import os
import random

import numpy as np
import paddle
import pytest

from ppvarlen.config import ConfigError, load_config
from ppvarlen.engine import checkpoint as ckpt
from ppvarlen.engine.optim import build_optimizer
from ppvarlen.models.weights import load_weights, save_weights


class Tiny(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.proj = paddle.nn.Linear(4, 8)
        self.norm = paddle.nn.LayerNorm(8)
        self.out = paddle.nn.Linear(8, 2)

    def forward(self, x):
        return self.out(self.norm(self.proj(x)))


def _opt_cfg(**kw):
    return load_config(data={"Optimizer": dict({"lr": 0.01, "warmup_steps": 2}, **kw)}).Optimizer


def _step(model, opt, sched, x):
    loss = model(x).pow(2).mean()
    loss.backward()
    opt.step()
    opt.clear_grad()
    sched.step()
    return float(loss)


def test_optimizer_state_roundtrip_continues_identically(tmp_path):
    paddle.seed(0)
    x = paddle.to_tensor(np.random.default_rng(0).normal(size=(5, 4)).astype("float32"))
    a = Tiny()
    opt_a, sched_a = build_optimizer(a, _opt_cfg(), total_steps=10)
    for _ in range(3):
        _step(a, opt_a, sched_a, x)
    save_weights(a, tmp_path / "w.safetensors")
    arrays = ckpt.optimizer_arrays(opt_a, a)
    assert any(k.startswith("proj.weight/") for k in arrays)  # structured, not linear_12.w_0
    b = Tiny()  # new Paddle-internal names (linear_N advanced), same structure
    assert {p.name for p in b.parameters()} != {p.name for p in a.parameters()}
    opt_b, sched_b = build_optimizer(b, _opt_cfg(), total_steps=10)
    load_weights(b, tmp_path / "w.safetensors")
    ckpt.load_optimizer_arrays(opt_b, b, arrays, "test")
    sched_b.set_state_dict(sched_a.state_dict())
    losses_a = [_step(a, opt_a, sched_a, x) for _ in range(3)]
    losses_b = [_step(b, opt_b, sched_b, x) for _ in range(3)]
    assert losses_a == losses_b
    for (n, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
        np.testing.assert_array_equal(pa.numpy(), pb.numpy(), err_msg=n)


def test_optimizer_state_mismatch_names_keys():
    a = Tiny()
    opt_a, sched_a = build_optimizer(a, _opt_cfg(), total_steps=10)
    _step(a, opt_a, sched_a, paddle.ones([2, 4]))
    arrays = ckpt.optimizer_arrays(opt_a, a)
    arrays.pop(next(k for k in arrays if k.startswith("out.bias/")))
    b = Tiny()
    opt_b, _ = build_optimizer(b, _opt_cfg(), total_steps=10)
    with pytest.raises(ValueError, match=r"missing \['out\.bias/"):
        ckpt.load_optimizer_arrays(opt_b, b, arrays, "ckpt/optimizer.safetensors")


def test_rng_state_survives_json():
    paddle.seed(3)
    np.random.seed(3)
    random.seed(3)
    state = json.loads(json.dumps(ckpt.rng_state()))
    first = (paddle.rand([4]).numpy(), np.random.rand(4), [random.random() for _ in range(4)])
    paddle.seed(99)
    np.random.seed(99)
    random.seed(99)
    ckpt.set_rng_state(state)
    again = (paddle.rand([4]).numpy(), np.random.rand(4), [random.random() for _ in range(4)])
    np.testing.assert_array_equal(first[0], again[0])
    np.testing.assert_array_equal(first[1], again[1])
    assert first[2] == again[2]


def _fake_ckpt(out, step):
    path = os.path.join(out, f"ckpt-{step}")
    os.makedirs(path)
    open(os.path.join(path, "trainer_state.json"), "w").write("{}")
    return path


def test_rotation_last_pointer_and_resume_lookup(tmp_path):
    out = str(tmp_path)
    assert ckpt.resolve_resume("auto", out) is None  # fresh run
    for step in (10, 20, 30):
        ckpt.point_last(out, _fake_ckpt(out, step))
        ckpt.rotate(out, keep_last=2, just_written=os.path.join(out, f"ckpt-{step}"))
    assert [s for s, _ in ckpt.list_checkpoints(out)] == [20, 30]
    assert ckpt.resolve_resume("auto", out) == os.path.realpath(os.path.join(out, "ckpt-30"))
    assert ckpt.resolve_resume(os.path.join(out, "ckpt-20"), out).endswith("ckpt-20")
    with pytest.raises(ConfigError, match="not a checkpoint directory"):
        ckpt.resolve_resume(os.path.join(out, "nope"), out)
