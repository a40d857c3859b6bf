"""Ordered maps over forked workers (utils/parallel.py): results in job order for any worker
count; ``ordered_map_in_rooms`` hands big results back through memory shared with the workers,
reuses its few rooms, and ends its pool on an error or when the caller stops early.  The
usable cores and child environments see through the OMP_NUM_THREADS=1 Paddle's import writes."""
import gc
import json
import os
import subprocess
import sys

import pytest

import ppvarlen
from ppvarlen.utils import parallel
from ppvarlen.utils.parallel import ordered_map, ordered_map_in_rooms


def _fill(job, room):
    """Job k's result is k bytes of value k: written into the room when there is one."""
    data = bytes([job % 256]) * job
    if room is None:
        return data
    room[:job] = data
    return job


def _read(result, room):
    return bytes(room[:result]) if room is not None else result


@pytest.mark.parametrize("num_proc", [1, 2])
def test_results_come_back_in_order_through_reused_rooms(num_proc):
    got = [_read(res, room) for res, room in ordered_map_in_rooms(_fill, range(1, 60), num_proc,
                                                                   room_bytes=64)]
    assert got == [bytes([k]) * k for k in range(1, 60)]


def _fail_at_7(job, room):
    if job == 7:
        raise ValueError("job 7 is bad")
    return _fill(job, room)


@pytest.mark.timeout(60)  # a pool left waiting for a room would hang here
def test_an_error_is_raised_in_order_and_the_pool_ends():
    seen = []
    with pytest.raises(ValueError, match="job 7 is bad"):
        for res, room in ordered_map_in_rooms(_fail_at_7, range(1, 200), 2, room_bytes=256):
            seen.append(len(_read(res, room)))
    assert seen == [1, 2, 3, 4, 5, 6]


@pytest.mark.timeout(60)
def test_a_caller_that_stops_early_ends_the_pool():
    out = ordered_map_in_rooms(_fill, range(1, 1000), 2, room_bytes=1024)
    first = [_read(*next(out)) for _ in range(3)]
    out.close()
    assert first == [b"\x01", b"\x02\x02", b"\x03\x03\x03"]


def _frozen_here(job):
    return gc.get_freeze_count()


def test_a_forked_map_walks_no_object_of_its_process_to_fork():
    """No full collection in the parent before the workers fork (it walks every object of the
    process: seconds in a large one), and in the workers the parent's objects are frozen, so
    their collections never walk (write to, copy) the pages that hold them.  The parent's
    objects are collectable again afterwards."""
    full = []

    def note(phase, info):
        if phase == "start" and info["generation"] == 2:
            full.append(info)

    gc.disable()  # only what the map asks for, not what allocations happen to trigger
    gc.callbacks.append(note)
    try:
        frozen_in_workers = list(ordered_map(_frozen_here, range(8), 2))
    finally:
        gc.callbacks.remove(note)
        gc.enable()
    assert full == []
    assert min(frozen_in_workers) > 1000  # the interpreter's and the test runner's objects
    assert gc.get_freeze_count() == 0
    gc.freeze()  # a process that froze its objects itself (a server) keeps them frozen
    try:
        frozen = gc.get_freeze_count()
        assert list(ordered_map(_double, range(4), 2)) == [0, 2, 4, 6]
        assert gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()


def _double(job):
    return 2 * job


@pytest.mark.timeout(60)
def test_a_map_left_unfinished_and_collected_later_leaves_the_next_map_alone():
    """A caller that stops reading a map without closing it (an error raised by the caller)
    leaves it to the garbage collector, which may end it when the next map starts (its fork
    collects first): its workers are killed and the next map's are left alone."""
    left = ordered_map(_double, range(100), 2)
    assert next(left) == 0
    cycle = [left]
    cycle.append(cycle)  # only a collection finds it
    del left, cycle
    assert list(ordered_map(_double, range(1000, 1030), 2)) == [2 * k for k in range(1000, 1030)]


_CTRL_C_AT_FORK = """
import os, signal, sys
from ppvarlen.utils.parallel import ordered_map
# a Ctrl-C that lands in a worker while Python's after-fork hooks still run (before the worker
# ignores SIGINT): here sent by a hook of its own, in every forked child
os.register_at_fork(after_in_child=lambda: os.kill(os.getpid(), signal.SIGINT))
print(sum(ordered_map(abs, range(-50, 50), 2)))
"""


@pytest.mark.timeout(120)
def test_a_ctrl_c_that_reaches_a_worker_while_it_forks_is_ignored_without_a_word():
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, "-c", _CTRL_C_AT_FORK], env=env, capture_output=True,
                         text=True, timeout=100)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == [str(sum(abs(k) for k in range(-50, 50)))]
    assert "KeyboardInterrupt" not in run.stderr and "Exception ignored" not in run.stderr, \
        run.stderr


# ------------------------------------------------------------------ OMP_NUM_THREADS
def test_paddles_own_omp_num_threads_is_no_limit_and_not_passed_on(monkeypatch):
    import paddle  # noqa: F401 - the rule holds only once Paddle's import could have written it

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setattr(ppvarlen, "OMP_BEFORE_PADDLE", None)  # unset before: Paddle's "1"
    assert parallel.paddle_wrote_omp() and parallel.omp_limit() is None
    assert "OMP_NUM_THREADS" not in parallel.child_environ(X="y")
    assert parallel.child_environ(X="y")["X"] == "y"
    monkeypatch.setattr(ppvarlen, "OMP_BEFORE_PADDLE", "1")  # a launcher's limit (Ray's)
    assert not parallel.paddle_wrote_omp() and parallel.omp_limit() == 1
    assert parallel.child_environ()["OMP_NUM_THREADS"] == "1"
    monkeypatch.setattr(ppvarlen, "OMP_BEFORE_PADDLE", ppvarlen.UNKNOWN)  # Paddle came first
    assert not parallel.paddle_wrote_omp() and parallel.omp_limit() == 1
    monkeypatch.setattr(ppvarlen, "OMP_BEFORE_PADDLE", None)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # set later in-process: Paddle keeps a count
    assert parallel.omp_limit() == 2 and parallel.child_environ()["OMP_NUM_THREADS"] == "2"
    assert parallel.omp_limit({"OMP_NUM_THREADS": "1"}) == 1  # a mapping is read as given
    assert parallel.omp_limit({"OMP_NUM_THREADS": "all"}) is None


_AFTER_PADDLE = """
import json, os, subprocess, sys
if sys.argv[1] == "paddle-first":
    import paddle
from ppvarlen.runtime import threads_choice
from ppvarlen.utils.parallel import child_environ, usable_cores
import paddle
child = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('OMP_NUM_THREADS'))"],
                       env=child_environ(), capture_output=True, text=True, check=True)
print(json.dumps([os.environ.get("OMP_NUM_THREADS"), threads_choice.math_cores(), usable_cores(),
                  child.stdout.strip()]))
"""


@pytest.mark.parametrize("case", ["unset", "set to 1", "paddle-first"])
def test_a_process_that_imported_paddle_keeps_its_cores_and_its_children_too(case):
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    if case == "set to 1":
        env["OMP_NUM_THREADS"] = "1"
    out = subprocess.run([sys.executable, "-c", _AFTER_PADDLE, case], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    omp, math_cores, cores, childs = json.loads(out.stdout.strip().splitlines()[-1])
    assert omp == "1"  # what Paddle's import leaves in the environment in every case
    if case == "unset":  # ppvarlen saw it unset before Paddle wrote it: no limit, not inherited
        assert (math_cores, childs) == (cores, "None")
    else:  # a limit that was set, or Paddle first (cannot be told apart): kept
        assert (math_cores, childs) == (1, "1")
