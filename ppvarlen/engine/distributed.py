"""Data-parallel plumbing over ``paddle.distributed``.

Started by ``python -m paddle.distributed.launch --nproc_per_node N tools/train.py ...``,
each process sees ``PADDLE_TRAINERS_NUM`` / ``PADDLE_TRAINER_ID``.  On a CPU
build of Paddle, ``init_parallel_env`` picks the gloo backend by itself (the
launcher also exports ``PADDLE_DISTRI_BACKEND=gloo`` when no GPU is selected);
on a CUDA build it picks NCCL.  A plain ``python tools/train.py`` is world size 1
and never touches the collective API.
"""
import os

import numpy as np
import paddle
import paddle.distributed as dist


def init_distributed():
    """-> (world_size, rank); initialises the process group when launched with N > 1."""
    world = int(os.environ.get("PADDLE_TRAINERS_NUM", "1"))
    if world > 1:
        dist.init_parallel_env()
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


def wrap_model(model, world_size):
    """Gradients are all-reduced (averaged) by ``paddle.DataParallel`` during backward."""
    return paddle.DataParallel(model) if world_size > 1 else model


def all_reduce_sum(values, world_size):
    """Sum a list of floats over ranks (float64 on the wire)."""
    if world_size == 1:
        return [float(v) for v in values]
    t = paddle.to_tensor(np.asarray(values, dtype="float64"))
    dist.all_reduce(t)
    return [float(v) for v in t.numpy()]


def all_gather_objects(obj, world_size):
    """Every rank's ``obj`` (picklable, in-memory only), in rank order."""
    if world_size == 1:
        return [obj]
    out = []
    dist.all_gather_object(out, obj)
    return out


def barrier(world_size):
    if world_size > 1:
        dist.barrier()
