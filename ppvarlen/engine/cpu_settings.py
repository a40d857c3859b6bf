"""A CPU training process's math threads and C heap.

``Train.cpu_threads`` and ``Train.keep_freed_memory``, set once when a Trainer starts.

Two of Paddle 3.3.1's CPU defaults cost every training step, eager and ``Train.to_static``
alike (``benchmarks/train_throughput.py --what cpu`` measures each, interleaved):

* Math threads.  Paddle runs MKL's GEMMs and its OpenMP kernels on ONE thread
  (``FLAGS_paddle_num_threads=1``): the other cores idle.  ``Train.cpu_threads`` (null = the
  usable cores / the training processes on this host, so 2-process data parallel on 2 cores
  keeps one each) is set through Paddle's own ``SetNumThreads`` (``paddle.base.core.
  set_num_threads``: MKL's and OpenMP's thread counts; Paddle has no public training API for it).
* The C heap.  A step allocates and frees tensors of up to tens of MB.  glibc's malloc returns
  large freed blocks to the OS (mmap'd blocks at once, the heap top past 128 KB), so every step
  page-faults its working set back in, a visible share of each step spent in the kernel.
  ``Train.keep_freed_memory`` raises glibc's thresholds (``mallopt``) so blocks up to 32 MB
  come from the heap and up to 1 GiB of freed heap stays in the process for the next step
  (far fewer faults).  The resident size then stays near the run's peak.

Both are process-wide and stay after training (an export in the same process keeps them; the
last Trainer started in a process sets them).  Only on CPU: on a GPU the device does the math
and these are left as they are.
"""
import ctypes
import ctypes.util
import os
import platform

from paddle.base import core

from ..config import ConfigError
from ..utils.parallel import usable_cores

# glibc's mallopt parameters (malloc.h) and the values set; glibc accepts at most 32 MB
# (HEAP_MAX_SIZE / 2) as the mmap threshold, and setting any of them ends its own
# adjustment of the thresholds, so all three are set together
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
HEAP_SETTINGS = ((M_MMAP_THRESHOLD, 32 << 20), (M_TRIM_THRESHOLD, 1 << 30), (M_TOP_PAD, 64 << 20))




def processes_on_host(world_size, environ=os.environ):
    """Training processes sharing this host: paddle.distributed.launch's PADDLE_LOCAL_SIZE."""
    return max(1, int(environ.get("PADDLE_LOCAL_SIZE", world_size)))


def math_threads(setting, world_size, op_pool=False, cores=None, environ=os.environ):
    """``Train.cpu_threads`` -> the thread count: the setting, or cores / processes on the host.

    ``op_pool``: the ops already run on Paddle's thread pool (Train.static_executor: threaded),
    which takes the cores; math threads on top of it oversubscribe them (measured slower), so
    null means 1 there."""
    return _thread_choice(setting, world_size, op_pool, cores, environ)[0]


def _thread_choice(setting, world_size, op_pool, cores=None, environ=os.environ):
    """(thread count, why) -- the one place the decision is made, for math_threads and the log."""
    if setting is not None:
        if setting < 1:
            raise ConfigError(f"Train.cpu_threads={setting}: use a thread count >= 1, or null "
                              f"for the usable cores / the training processes on this host")
        return setting, "Train.cpu_threads"
    if op_pool:
        return 1, "Train.static_executor: threaded runs the ops on Paddle's thread pool"
    cores, processes = cores or usable_cores(), processes_on_host(world_size, environ)
    return (max(1, cores // processes),
            f"{cores} usable cores / {processes} process(es) on this host")


def keep_freed_memory():
    """Apply HEAP_SETTINGS with glibc's mallopt; -> what was done, for the log."""
    if platform.libc_ver()[0] != "glibc":
        return "not glibc: the C heap keeps its own policy"
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    refused = [param for param, value in HEAP_SETTINGS if libc.mallopt(param, value) != 1]
    if refused:  # glibc answers 0 for a value out of its range: say so rather than pretend
        raise RuntimeError(f"glibc mallopt refused parameters {refused} of {HEAP_SETTINGS}")
    mmap, trim, pad = (value >> 20 for _, value in HEAP_SETTINGS)
    return (f"glibc malloc keeps freed memory (mmap threshold {mmap} MB, trim threshold {trim} "
            f"MB, top pad {pad} MB; Train.keep_freed_memory: false leaves glibc's defaults)")


def configure(train_cfg, world_size, device):
    """Set this process's math threads and heap per ``train_cfg``; -> the lines to log."""
    op_pool = train_cfg.to_static and train_cfg.static_executor == "threaded"
    threads, how = _thread_choice(train_cfg.cpu_threads, world_size, op_pool)  # refused anywhere
    if device != "cpu":
        return [f"CPU settings: device {device}: math threads and heap left as Paddle sets them"]
    core.set_num_threads(threads)
    lines = [f"CPU math threads: {threads} ({how})"]
    if train_cfg.keep_freed_memory:
        lines.append("C heap: " + keep_freed_memory())
    else:
        lines.append("C heap: glibc's defaults (Train.keep_freed_memory: false)")
    return lines
