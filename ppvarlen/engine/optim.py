"""AdamW + warmup/decay schedule + global-norm clipping, built from the Optimizer section."""
import math

import paddle


def lr_factor(step, total_steps, warmup_steps, schedule):
    """Multiplier on the peak lr at optimizer step ``step`` (0-based)."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    decay_steps = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    if schedule == "linear":
        return 1.0 - progress
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"Optimizer.schedule: unknown schedule {schedule!r}; use linear, cosine or constant")


def decay_param_names(model):
    """Internal names of the parameters that get weight decay.

    Biases and normalisation scales/shifts (1-D tensors, or anything under a
    ``norm`` sub-layer) are excluded: decaying them only hurts.
    """
    return {p.name for n, p in model.named_parameters()
            if len(p.shape) >= 2 and "norm" not in n.lower()}


def build_optimizer(model, opt_cfg, total_steps):
    """-> (optimizer, scheduler).  ``scheduler.step()`` once per optimizer step."""
    warmup = opt_cfg.warmup_steps or int(round(opt_cfg.warmup_ratio * total_steps))
    scheduler = paddle.optimizer.lr.LambdaDecay(
        learning_rate=opt_cfg.lr,
        lr_lambda=lambda step: lr_factor(step, total_steps, warmup, opt_cfg.schedule))
    decay = decay_param_names(model)
    clip = paddle.nn.ClipGradByGlobalNorm(opt_cfg.clip_norm) if opt_cfg.clip_norm > 0 else None
    optimizer = paddle.optimizer.AdamW(
        learning_rate=scheduler, parameters=model.parameters(),
        beta1=opt_cfg.beta1, beta2=opt_cfg.beta2, epsilon=opt_cfg.epsilon,
        weight_decay=opt_cfg.weight_decay, apply_decay_param_fun=lambda name: name in decay,
        grad_clip=clip)
    return optimizer, scheduler
