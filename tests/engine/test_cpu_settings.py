"""ppvarlen/engine/cpu_settings.py: a CPU training process's math threads and C heap."""
import os
import subprocess
import sys

import pytest

from ppvarlen.config import ConfigError, load_config
from ppvarlen.engine import cpu_settings

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_threads_default_to_the_cores_each_process_on_the_host_gets():
    assert cpu_settings.math_threads(None, 1, cores=2, environ={}) == 2
    assert cpu_settings.math_threads(None, 1, cores=8, environ={}) == 8
    # 2-process data parallel on 2 cores: one thread each, not two processes x two threads
    assert cpu_settings.math_threads(None, 2, cores=2, environ={}) == 1
    assert cpu_settings.math_threads(None, 4, cores=2, environ={}) == 1
    # multi-host: the launcher says how many processes share THIS host
    assert cpu_settings.math_threads(None, 8, cores=16, environ={"PADDLE_LOCAL_SIZE": "2"}) == 8


def test_the_threaded_executor_keeps_one_math_thread_unless_told():
    assert cpu_settings.math_threads(None, 1, op_pool=True, cores=8, environ={}) == 1
    assert cpu_settings.math_threads(3, 1, op_pool=True, cores=8, environ={}) == 3


def test_an_explicit_thread_count_is_used_and_a_bad_one_refused():
    assert cpu_settings.math_threads(5, 2, cores=2, environ={}) == 5
    with pytest.raises(ConfigError, match="Train.cpu_threads=0: use a thread count >= 1"):
        cpu_settings.math_threads(0, 1, cores=2, environ={})


def _train_cfg(**train):
    return load_config(data={"Train": train}).Train


def test_configure_sets_paddles_threads_and_says_what_it_did(monkeypatch):
    from paddle.base import core

    calls = []
    monkeypatch.setattr(core, "set_num_threads", calls.append)
    monkeypatch.setattr(cpu_settings, "keep_freed_memory", lambda: "kept (test)")
    monkeypatch.setattr(cpu_settings, "usable_cores", lambda: 6)
    monkeypatch.delenv("PADDLE_LOCAL_SIZE", raising=False)
    lines = cpu_settings.configure(_train_cfg(), 2, "cpu")
    assert calls == [3]
    assert lines == ["CPU math threads: 3 (6 usable cores / 2 process(es) on this host)",
                     "C heap: kept (test)"]
    lines = cpu_settings.configure(_train_cfg(cpu_threads=4, keep_freed_memory=False,
                                              to_static=True, static_executor="threaded"), 1, "cpu")
    assert calls == [3, 4]
    assert lines == ["CPU math threads: 4 (Train.cpu_threads)",
                     "C heap: glibc's defaults (Train.keep_freed_memory: false)"]
    lines = cpu_settings.configure(_train_cfg(to_static=True, static_executor="threaded"), 1, "cpu")
    assert calls[-1] == 1 and "thread pool" in lines[0]


def test_on_a_gpu_nothing_is_changed(monkeypatch):
    from paddle.base import core

    monkeypatch.setattr(core, "set_num_threads", lambda n: pytest.fail("threads set on a GPU run"))
    monkeypatch.setattr(cpu_settings, "keep_freed_memory", lambda: pytest.fail("heap set on GPU"))
    assert "left as Paddle sets them" in cpu_settings.configure(_train_cfg(), 1, "gpu")[0]


# A step's pattern: several large tensors alive at once, then all freed.  glibc returns such
# memory to the OS and the next step faults every page back in; kept, the pages stay mapped.
FAULTS = """
import resource, sys
import numpy as np
if sys.argv[1] == "keep":
    from ppvarlen.engine.cpu_settings import keep_freed_memory
    print(keep_freed_memory(), file=sys.stderr)
def step():
    tensors = [np.ones(4 << 20, dtype=np.float32) for _ in range(4)]  # 4 x 16 MB, pages touched
    del tensors
step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    step()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 10)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="glibc's malloc")
def test_kept_freed_memory_is_not_faulted_in_again_each_step():
    faults = {}
    for mode in ("default", "keep"):
        r = subprocess.run([sys.executable, "-c", FAULTS, mode], capture_output=True, text=True,
                           cwd=REPO, timeout=120)
        assert r.returncode == 0, r.stderr
        faults[mode] = float(r.stdout.split()[-1])
    pages = 4 * (16 << 20) // 4096
    assert faults["default"] > pages / 16  # glibc's policy: the memory went back to the OS
    assert faults["keep"] < pages / 300, faults  # kept: (almost) no page is faulted in again
