"""Run a function over chunks of a sequence on ``Data.num_proc`` worker processes, in order.

Workers are forked after the shared state (the examples, the encoder, the task's encode
function) is set in this module, so nothing but chunk bounds goes to a worker and only the
chunk's result (numpy arrays, counters) comes back.  Results are yielded in chunk order, so
the output is the same for any worker count, and the first failing chunk in input order is
the error raised.  Hand-written over ``multiprocessing`` because ``datasets.map(num_proc>1)``
fails in this stack (dill) and a fork pool needs no pickling of the tokenizer.
"""
import contextlib
import ctypes
import gc
import mmap
import multiprocessing
import os
import queue
import signal

_STATE = {}
_MAPPER = []  # a mapper set by ``use_mapper`` (e.g. the Ray one) runs the chunks instead


def usable_cores():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def resolve_num_proc(num_proc):
    return usable_cores() if num_proc is None else max(1, int(num_proc))


def _run_job(job):
    return _STATE["fn"](job)


def ordered_map(fn, jobs, num_proc):
    """Yield ``fn(job)`` for each of ``jobs`` (small picklable descriptions, e.g. a byte range
    of a file) in order, on ``num_proc`` forked workers.  ``jobs`` may be a generator: the
    pool takes it as the workers need it, so the parent never holds all of it."""
    if _MAPPER:
        yield from _MAPPER[-1](fn, jobs)
        return
    if num_proc <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        for job in jobs:
            yield fn(job)
        return
    owner = _take_state(fn=fn)
    try:
        yield from _pool_imap(_run_job, jobs, num_proc)
    finally:
        _release_state(owner)


def _take_state(**state):
    """Set what the workers of the next pool read -> the token its map releases it with."""
    owner = object()
    _STATE.clear()
    _STATE.update(state, owner=owner)
    return owner


def _release_state(owner):
    """Clear the workers' state if it is still ``owner``'s: a map its caller left unfinished
    ends when it is garbage-collected, maybe after another map has set its own."""
    if _STATE.get("owner") is owner:
        _STATE.clear()


def ordered_map_in_rooms(fn, jobs, num_proc, room_bytes):
    """``ordered_map`` for results too big for the pool's pipe (pickled, copied through the
    kernel twice and unpickled): yield ``(fn(job, room), room)`` per job in order, where
    ``room`` is ``room_bytes`` of memory shared by this process and the workers, which ``fn``
    may write into and name in its result.  A room is given to the next job once the caller
    asks for the next result, so it holds the bytes until then.  On one process or a mapper's
    workers ``room`` is None and ``fn`` returns everything itself."""
    if _MAPPER or num_proc <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        for result in ordered_map(_WithoutRoom(fn), jobs, num_proc):
            yield result, None
        return
    rooms = _Rooms(2 * num_proc + 1, room_bytes)  # a job running and one queued per worker
    owner = _take_state(fn=fn, rooms=rooms.views)
    results = _pool_imap(_run_in_room, rooms.placed(jobs), num_proc, rooms.close)
    try:
        for slot, result in results:
            yield result, rooms.views[slot]
            rooms.free.put(slot)
    finally:
        rooms.close()
        results.close()
        _release_state(owner)


class _WithoutRoom:
    def __init__(self, fn):
        self.fn = fn

    def __call__(self, job):
        return self.fn(job, None)


def _run_in_room(placed):
    slot, job = placed
    return slot, _STATE["fn"](job, _STATE["rooms"][slot])


class _Rooms:
    """Slots of one anonymous shared mapping, made before the workers fork (so they share it;
    nothing to clean up if the build dies); a job takes a free one before it is sent."""

    def __init__(self, count, size):
        self.memory = mmap.mmap(-1, max(count * size, 1))  # mmap refuses 0 bytes
        self.views = [memoryview(self.memory)[k * size:(k + 1) * size] for k in range(count)]
        self.free = queue.SimpleQueue()
        for k in range(count):
            self.free.put(k)

    def close(self):
        """No more jobs are placed: the pool's task thread stops waiting for a room, so it can
        tell the workers to stop (a pool terminated while it waits would wait for it)."""
        self.free.put(None)

    def placed(self, jobs):
        """(slot, job) per job; waits for a free slot (so a fast reader of jobs stops a few
        jobs ahead of the caller) until the map is closed."""
        for job in jobs:
            slot = self.free.get()
            if slot is None:
                return
            yield slot, job


def release_memory():
    """Return freed heap to the OS (glibc keeps it otherwise): a forked worker maps all of its
    parent's heap, so a parent that trims first forks smaller workers."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass


def _quiet_on_sigterm():
    """A worker's SIGTERM ends it without a word: the handler paddle installed in the parent
    (inherited by the fork) prints a fatal-error report, as if the worker had crashed."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _pool_imap(run, jobs, num_proc, before_terminate=None):
    """``Pool.imap`` whose workers exit on their own when all is done: ``with Pool`` would
    SIGTERM them.  On an error (a bad line stops the build) they are terminated, quietly, after
    ``before_terminate()`` (which must let the pool's task thread finish with ``jobs``)."""
    release_memory()
    pool = multiprocessing.get_context("fork").Pool(num_proc, initializer=_quiet_on_sigterm)
    try:
        yield from pool.imap(run, jobs)
        pool.close()
    except BaseException:
        if before_terminate is not None:
            before_terminate()
        pool.terminate()
        raise
    finally:
        pool.join()


def has_mapper():
    """Whether a ``use_mapper`` block is active (its workers may not see this machine's files)."""
    return bool(_MAPPER)


@contextlib.contextmanager
def use_mapper(mapper):
    """Within the block, ``ordered_map`` hands its jobs to ``mapper(fn, jobs)``, which must
    yield ``fn(job)`` per job in order (the Ray store build: ``integrations/ray_store.py``);
    the chunks, and so the store's bytes, stay the same."""
    _MAPPER.append(mapper)
    try:
        yield
    finally:
        _MAPPER.pop()
