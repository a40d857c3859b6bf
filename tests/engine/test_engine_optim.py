"""LR schedule by hand, weight-decay exclusions, global-norm clipping."""
import math

import paddle
import pytest

from ppvarlen.config import load_config
from ppvarlen.engine.optim import build_optimizer, decay_param_names, lr_factor


def test_lr_factor_warmup_then_decay():
    assert [lr_factor(s, 10, 2, "linear") for s in (0, 1)] == [0.5, 1.0]
    assert lr_factor(2, 10, 2, "linear") == 1.0
    assert lr_factor(6, 10, 2, "linear") == pytest.approx(0.5)
    assert lr_factor(10, 10, 2, "linear") == 0.0
    assert lr_factor(6, 10, 2, "cosine") == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lr_factor(7, 10, 0, "constant") == 1.0


def test_weight_decay_skips_biases_and_norms():
    model = paddle.nn.Sequential(paddle.nn.Embedding(10, 4), paddle.nn.LayerNorm(4),
                                 paddle.nn.Linear(4, 3))
    decay = decay_param_names(model)
    named = dict(model.named_parameters())
    assert decay == {named["0.weight"].name, named["2.weight"].name}


def _optimizer(clip_norm):
    cfg = load_config(data={"Optimizer": {"clip_norm": clip_norm}}).Optimizer
    return build_optimizer(paddle.nn.Linear(3, 3), cfg, total_steps=1)[0]


def test_global_norm_clipping_on_and_off():
    clip = _optimizer(0.5)._grad_clip
    assert isinstance(clip, paddle.nn.ClipGradByGlobalNorm) and clip.clip_norm == 0.5
    assert _optimizer(0.0)._grad_clip is None
    # what that object does to a gradient list: global norm scaled down to clip_norm
    params = paddle.nn.Linear(3, 2).parameters()
    grads = [(p, paddle.full(p.shape, 10.0)) for p in params]
    clipped = clip(grads)
    total = math.sqrt(sum(float((g ** 2).sum()) for _, g in clipped))
    assert total == pytest.approx(0.5, rel=1e-5)
