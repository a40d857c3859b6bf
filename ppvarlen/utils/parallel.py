"""Run a function over chunks of a sequence on ``Data.num_proc`` worker processes, in order.

Workers are forked after the shared state (the examples, the encoder, the task's encode
function) exists in this process, so nothing but the jobs (small descriptions, e.g. a byte
range of a file) goes to a worker and only a job's result (numpy arrays, counters) comes back.
Results are yielded in job order, so the output is the same for any worker count, and the first
failing job in input order is the error raised.  Hand-written over ``os`` pipes rather than
``datasets.map(num_proc>1)`` (dill fails in this stack; a fork needs no pickled tokenizer) and
rather than ``multiprocessing.Pool``, whose rules could hang a build:

* Pool's worker-handler thread forks a replacement for a worker that died (the out-of-memory
  killer, a crash, Ctrl-C) while the parent's other threads run and may hold locks the child
  then waits for forever, and the dead worker's job never comes back: ``imap`` waits for good.
  Here every worker is forked up front by the thread that asked for the map, before anything
  else of the map runs, and never again; a worker that ends before it is told to is an error
  (``WorkerLost``, naming the signal).
* Workers share no lock (Pool's queue lock stays taken by a worker killed while it reads): each
  has its own job pipe and result pipe, and the parent never blocks on a pipe: it waits in one
  place (``select``) for a result, a worker's exit, or room to write a job.
* A worker that holds a job, uses no CPU and sends nothing for ``STALL_SECONDS`` is stuck: an
  error too, rather than an idle build.
* A worker writes to new ``sys.stdout``/``sys.stderr`` objects: the inherited ones may be
  locked by a parent's thread that was writing at the fork (their flush at exit waited forever).
  A worker that does not exit when told to is killed after ``_STOP_SECONDS``.
* Ctrl-C reaches the waiting parent (the workers ignore SIGINT): it kills its workers and the
  KeyboardInterrupt goes on, so the caller's cleanup runs (e.g. the store writer's temp dir).
"""
import collections
import contextlib
import ctypes
import fcntl
import gc
import mmap
import multiprocessing
import os
import queue
import selectors
import signal
import struct
import sys
import time
from multiprocessing.pool import ExceptionWithTraceback
# the pickler of multiprocessing's own pipes: the frames here are messages between this
# process and the workers it forked, never a file
from multiprocessing.reduction import ForkingPickler

import ppvarlen

_MAPPER = []  # a mapper set by ``use_mapper`` (e.g. the Ray one) runs the chunks instead
_CAN_FORK = "fork" in multiprocessing.get_all_start_methods()
STALL_SECONDS = 300  # a worker with a job that uses no CPU and sends nothing this long is stuck
_HELD_PER_WORKER = 2  # jobs a worker holds: the one it runs and the next, ready when it ends
_STOP_SECONDS = 5  # how long a stopped map waits for each worker to be reaped
_PIPE_BYTES = 1 << 20  # pipe capacity asked for (Linux): fewer wake-ups for a result of MBs


class WorkerLost(RuntimeError):
    """A worker process of a map ended before it was told to (killed by a signal, crashed) or
    stopped making progress: the map cannot finish.  Not the data's fault: rerunning helps."""


CGROUP_CPU_MAX = "/sys/fs/cgroup/cpu.max"  # cgroup v2: "QUOTA PERIOD" or "max PERIOD"
OMP_VARIABLE = "OMP_NUM_THREADS"


def paddle_wrote_omp(environ=None):
    """Whether the process's ``OMP_NUM_THREADS`` is the "1" Paddle's import writes into it when
    it is unset (``paddle.base``'s bootstrap), not a limit a user or a launcher set (Ray sets
    it in its workers' environment before their code runs): Paddle is imported here, and when
    ppvarlen was imported, before Paddle, the variable was unset.  With Paddle imported first
    that is unknown, and a "1" is a limit.  (Set to 1 between ppvarlen's import and Paddle's,
    it reads the same and is taken as Paddle's.)"""
    environ = os.environ if environ is None else environ
    return (environ.get(OMP_VARIABLE) == "1" and "paddle.base" in sys.modules
            and ppvarlen.OMP_BEFORE_PADDLE is None)


def omp_limit(environ=None):
    """The thread limit ``OMP_NUM_THREADS`` sets (an int >= 1), or None: unset, not a count,
    or Paddle's own "1" (``paddle_wrote_omp``).  ``environ``: a mapping to read instead of
    this process's environment (taken as set by the user)."""
    if environ is None:
        environ = os.environ
        if paddle_wrote_omp(environ):
            return None
    value = environ.get(OMP_VARIABLE, "").strip()
    return int(value) if value.isdigit() and int(value) >= 1 else None


def child_environ(**extra):
    """The environment for a child process: this one's plus ``extra``, without Paddle's own
    ``OMP_NUM_THREADS=1`` (inherited, it reads as a user's limit: every ``threads auto`` in the
    child would serve one thread)."""
    env = dict(os.environ)
    if paddle_wrote_omp(env):
        del env[OMP_VARIABLE]
    env.update(extra)
    return env


def usable_cores(cpu_max=CGROUP_CPU_MAX):
    """Cores this process may keep busy: its affinity mask (a container's cpuset, taskset),
    lowered to a cgroup v2 CPU quota rounded up (a container limited to 1.5 CPUs: 2)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    try:
        with open(cpu_max) as f:
            quota, period = f.read().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, -(-int(quota) // int(period))))
    except (OSError, ValueError):  # no cgroup v2 here, or a line this does not know
        pass
    return cores


def resolve_num_proc(num_proc):
    return usable_cores() if num_proc is None else max(1, int(num_proc))


def ordered_map(fn, jobs, num_proc):
    """Yield ``fn(job)`` for each of ``jobs`` (small picklable descriptions, e.g. a byte range
    of a file) in order, on ``num_proc`` forked workers.  ``jobs`` may be a generator: it is
    read as the workers need it (a few jobs per worker ahead), so the parent never holds all
    of it."""
    if _MAPPER:
        yield from _MAPPER[-1](fn, jobs)
        return
    if num_proc <= 1 or not _CAN_FORK:
        for job in jobs:
            yield fn(job)
        return
    yield from _forked_map(fn, jobs, num_proc, window=2 * _HELD_PER_WORKER * num_proc)


def ordered_map_in_rooms(fn, jobs, num_proc, room_bytes):
    """``ordered_map`` for results too big for a pipe (pickled, copied through the kernel twice
    and unpickled): yield ``(fn(job, room), room)`` per job in order, where ``room`` is
    ``room_bytes`` of memory shared by this process and the workers, which ``fn`` may write
    into and name in its result.  A room is given to the next job once the caller asks for the
    next result, so it holds the bytes until then.  On one process or a mapper's workers
    ``room`` is None and ``fn`` returns everything itself."""
    if _MAPPER or num_proc <= 1 or not _CAN_FORK:
        for result in ordered_map(_WithoutRoom(fn), jobs, num_proc):
            yield result, None
        return
    window = 2 * num_proc  # a job running and one queued per worker
    rooms = _Rooms(window + 1, room_bytes)  # and the room the caller holds
    results = _forked_map(_InRoom(fn, rooms.views), rooms.placed(jobs), num_proc, window)
    try:
        for slot, result in results:
            yield result, rooms.views[slot]
            rooms.free.put(slot)
    finally:
        results.close()


class _WithoutRoom:
    def __init__(self, fn):
        self.fn = fn

    def __call__(self, job):
        return self.fn(job, None)


class _InRoom:
    def __init__(self, fn, views):
        self.fn, self.views = fn, views

    def __call__(self, placed):
        slot, job = placed
        return slot, self.fn(job, self.views[slot])


class _Rooms:
    """Slots of one anonymous shared mapping, made before the workers fork (so they share it;
    nothing to clean up if the build dies); a job takes a free one before it is sent."""

    def __init__(self, count, size):
        self.memory = mmap.mmap(-1, max(count * size, 1))  # mmap refuses 0 bytes
        self.views = [memoryview(self.memory)[k * size:(k + 1) * size] for k in range(count)]
        self.free = queue.SimpleQueue()
        for k in range(count):
            self.free.put(k)

    def placed(self, jobs):
        """(slot, job) per job.  The map reads a job only while fewer jobs than rooms are
        out (sent, or yielded and not yet given back), so a room is always free here: waiting
        for one would wait for this very thread."""
        for job in jobs:
            try:
                slot = self.free.get_nowait()
            except queue.Empty:
                raise RuntimeError("ordered_map_in_rooms: a job was read with every room "
                                   "taken (the map's window is larger than its rooms)") from None
            yield slot, job


def trim_heap():
    """Return the heap glibc keeps after frees to the OS."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass


def release_memory():
    """Collect what a dropped engine leaves in reference cycles, then ``trim_heap``."""
    gc.collect()
    trim_heap()


def _forked_map(fn, jobs, num_proc, window):
    """Yield ``fn(job)`` in order from ``num_proc`` workers forked now, with at most ``window``
    jobs read and not yet yielded.  The workers are killed if the map ends early (an error, the
    caller stops, Ctrl-C), and exit on their own (end of their job pipe) when it is done."""
    trim_heap()  # a forked worker maps all of its parent's heap: trimmed first, it maps less
    # The parent's objects frozen while it forks (Python's gc docs, for fork without exec): a
    # worker's collections then never walk them, which would write to (copy) every page that
    # holds one.  No full collection first: it walks every object of the process, a second
    # or more in a large one (a test runner), and what a build drops is freed by reference
    # counts.
    # A process that froze its objects itself (a single export's server) keeps them frozen:
    # gc.unfreeze would thaw them all.
    ours = gc.get_freeze_count() == 0
    if ours:
        gc.freeze()
    try:
        pool = _Workers(fn, num_proc)
    finally:
        if ours:
            gc.unfreeze()
    finished = False
    try:
        yield from pool.ordered(jobs, window)
        finished = True
    finally:
        pool.stop(kill=not finished)


# ---------------------------------------------------------------- the pipes' frames
_FRAME = struct.Struct("!Q")  # a frame: its length, then its pickled bytes


def _frame(obj):
    data = ForkingPickler.dumps(obj)
    return _FRAME.pack(len(data)) + data


def _read_exact(fd, size):
    """``size`` bytes from ``fd`` (blocking) -> a bytearray, or None at an end of file before
    the first byte; an end of file within them is ``EOFError``."""
    buf = bytearray(size)
    view, got = memoryview(buf), 0
    while got < size:
        n = os.readv(fd, [view[got:]])
        if n == 0:
            if got == 0:
                return None
            raise EOFError(f"a pipe ended after {got} of {size} bytes")
        got += n
    return buf


def _read_frame(fd):
    """The next object on ``fd`` (blocking), or None at its end."""
    header = _read_exact(fd, _FRAME.size)
    if header is None:
        return None
    (size,) = _FRAME.unpack(header)
    data = _read_exact(fd, size)
    if data is None:
        raise EOFError(f"a pipe ended before a frame's {size} bytes")
    return ForkingPickler.loads(data)


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _grow_pipe(fd):
    try:
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, _PIPE_BYTES)
    except (AttributeError, OSError):  # not Linux, or above the system's limit
        pass


# ---------------------------------------------------------------- a worker
def _resolve_prctl():
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux
        return None


_PRCTL = _resolve_prctl()  # looked up here: a forked child loads no library (its loader lock
                           # may be held by a thread of the parent that the child lacks)
_PR_SET_PDEATHSIG = 1


def die_by(sig):
    """End the process as ``sig``'s default action does (exit status 128 + sig to a shell),
    at once: no handler, no unwinding, whatever the other threads are doing."""
    signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
    signal.raise_signal(sig)


def die_with_parent(parent_pid):
    """Have the kernel kill this process when its parent dies (Linux), so a parent killed
    outright leaves no child running -> False when the parent is already gone."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL)
    return os.getppid() == parent_pid


def _serve(fn, parent_pid, jobs_fd, results_fd, parents_fds):
    """A worker: ``fn`` of each job read from ``jobs_fd`` -> ``(index, ok, value)`` on
    ``results_fd``, until the parent closes its end."""
    _fresh_stdio()
    for fd in parents_fds:  # the parent's ends of its pipes and of the earlier workers': closed,
        os.close(fd)        # so a pipe ends when the parent closes (or loses) its end
    # Ctrl-C is the parent's to handle; SIGTERM ends a worker without a word (paddle's handler,
    # inherited by the fork, prints a fatal-error report, as if the worker had crashed)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # blocked by _fork: now ignored
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if not die_with_parent(parent_pid):  # it died before that
        return
    while True:
        job = _read_frame(jobs_fd)
        if job is None:
            return
        index, job = job
        try:
            reply = _frame((index, True, fn(job)))
        except Exception as e:
            reply = _frame((index, False, _sendable(e)))
        _write_all(results_fd, reply)


_INHERITED_STDIO = []  # kept alive: closing one (its last reference gone) would flush it


def _fresh_stdio():
    """New ``sys.stdout``/``sys.stderr`` over the same descriptors.  Another thread of the
    parent may have been writing to the inherited ones at the fork (a progress bar's monitor
    thread, a log handler): their lock is then held for good in this process, and the first
    write here -- or the flush at exit -- would wait forever.  (Their unwritten bytes are the
    parent's to write, not this process's.)"""
    for name, fd in (("stdout", 1), ("stderr", 2)):
        old = getattr(sys, name)
        if old is None:
            continue
        _INHERITED_STDIO.append(old)
        try:
            setattr(sys, name, open(fd, "w", buffering=1, encoding=getattr(old, "encoding", None),
                                    errors=getattr(old, "errors", None), closefd=False))
        except (OSError, ValueError, LookupError):  # no such descriptor: keep it
            pass


def _sendable(e):
    """``e`` with its traceback, as the parent unpickles it (``__cause__``: the worker's
    traceback), or a RuntimeError saying what it was when it does not pickle."""
    wrapped = ExceptionWithTraceback(e, e.__traceback__)
    try:
        ForkingPickler.dumps(wrapped)
        return wrapped
    except Exception:
        error = RuntimeError(f"a worker's {type(e).__name__} could not be sent back: {e}")
        return ExceptionWithTraceback(error, e.__traceback__)


class _Worker:
    """The parent's side of one worker: its process, the jobs it holds (sent, no result yet),
    the bytes of jobs not yet written to its job pipe, and its CPU time last seen."""

    def __init__(self, process, jobs_fd, results_fd):
        self.process, self.jobs_fd, self.results_fd = process, jobs_fd, results_fd
        self.held = collections.deque()
        self.unwritten = bytearray()
        self.cpu = None


class _Workers:
    """``num_proc`` workers forked now running ``fn``; ``ordered`` hands them jobs."""

    def __init__(self, fn, num_proc):
        ctx = multiprocessing.get_context("fork")
        self.workers, self.selector = [], None
        # Ctrl-C is held back while the workers fork: in a child, Python's after-fork hooks
        # (random's reseed) run before _serve ignores SIGINT, and one arriving then printed an
        # "Exception ignored" traceback from the worker; held, it stays pending in the child
        # until ignored, and reaches this process once every worker it forked is in the list
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            for k in range(num_proc):
                self.workers.append(self._fork(ctx, fn, k))
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        except BaseException:
            self.stop(kill=True)
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            raise
        self.selector = selectors.DefaultSelector()  # made after the forks: not inherited
        for w in self.workers:
            self.selector.register(w.results_fd, selectors.EVENT_READ, (self._on_result, w))
            self.selector.register(w.process.sentinel, selectors.EVENT_READ, (self._on_exit, w))
        self.results = {}  # index -> (ok, value) of results not yet yielded
        self.progress_at = time.monotonic()

    def _fork(self, ctx, fn, k):
        jobs_r, jobs_w = os.pipe()
        results_r, results_w = os.pipe()
        for fd in (jobs_w, results_w):
            _grow_pipe(fd)
        parents = [jobs_w, results_r] + [fd for w in self.workers
                                         for fd in (w.jobs_fd, w.results_fd)]
        process = ctx.Process(target=_serve, name=f"ppvarlen-worker-{k}", daemon=True,
                              args=(fn, os.getpid(), jobs_r, results_w, parents))
        try:
            process.start()
        finally:
            os.close(jobs_r)
            os.close(results_w)
        os.set_blocking(jobs_w, False)
        return _Worker(process, jobs_w, results_r)

    def ordered(self, jobs, window):
        """Yield each job's result in order; read ``jobs`` while fewer than ``window`` are out."""
        jobs, self.read, done, self.more = iter(jobs), 0, 0, True
        while True:
            self._hand_out(jobs, window - (self.read - done))
            if done in self.results:
                ok, value = self.results.pop(done)
                done += 1
                if not ok:
                    raise value
                yield value
                self.progress_at = time.monotonic()  # the caller's time is not the workers'
            elif not self.more and done == self.read:
                return
            else:
                self._wait()

    def _hand_out(self, jobs, room):
        """Send up to ``room`` more jobs, each to the least busy worker that can hold one."""
        for _ in range(room):
            worker = self._least_busy()
            if not self.more or worker is None:
                return
            try:
                job = next(jobs)
            except StopIteration:
                self.more = False
                return
            except Exception as e:  # raised in order, after the jobs read before it
                self.results[self.read] = (False, e)
                self.more = False
            else:
                self._send(worker, self.read, job)
            self.read += 1

    def _least_busy(self):
        worker = min(self.workers, key=lambda w: len(w.held))
        return worker if len(worker.held) < _HELD_PER_WORKER else None

    def _send(self, worker, index, job):
        if not worker.unwritten:
            self.selector.register(worker.jobs_fd, selectors.EVENT_WRITE, (self._on_room, worker))
        worker.unwritten += _frame((index, job))
        worker.held.append(index)
        self._on_room(worker)

    def _wait(self):
        """Wait for a result, a worker's exit or room in a job pipe, and handle what came; raise
        ``WorkerLost`` when the busy workers have made no progress for ``STALL_SECONDS``."""
        tick = min(1.0, STALL_SECONDS / 4)
        events = self.selector.select(timeout=tick)
        for key, _ in events:
            handle, worker = key.data
            handle(worker)
        if not events:
            self._check_progress()

    def _on_room(self, worker):
        try:
            written = os.write(worker.jobs_fd, worker.unwritten)
        except BlockingIOError:
            return
        except BrokenPipeError:  # it ended: its sentinel says how
            self._on_exit(worker)
            return
        del worker.unwritten[:written]
        if not worker.unwritten:
            self.selector.unregister(worker.jobs_fd)

    def _on_result(self, worker):
        try:
            reply = _read_frame(worker.results_fd)
        except EOFError:
            reply = None
        if reply is None:  # it ended: its sentinel says how
            self._on_exit(worker)
            return
        index, ok, value = reply
        worker.held.remove(index)
        self.results[index] = (ok, value)
        self.progress_at = time.monotonic()

    def _on_exit(self, worker):
        """A worker ended before it was told to: an error, which names the jobs it still
        held (the results it sent before it ended are read first)."""
        while True:
            try:
                reply = _read_frame(worker.results_fd)
            except EOFError:
                break
            if reply is None:
                break
            index, ok, value = reply
            worker.held.remove(index)
            self.results[index] = (ok, value)
        worker.process.join(_STOP_SECONDS)
        raise WorkerLost(_lost_message(worker))

    def _check_progress(self):
        busy = [w for w in self.workers if w.held]
        moved = False
        for w in busy:
            cpu = _cpu_ticks(w.process.pid)
            if cpu is None or cpu != w.cpu:  # unknown (not Linux) counts as moving
                moved = True
            w.cpu = cpu
        if moved or not busy:
            self.progress_at = time.monotonic()
        elif time.monotonic() - self.progress_at > STALL_SECONDS:
            raise WorkerLost(_stalled_message(busy))

    def stop(self, kill):
        """End the workers: ``kill`` them (the map ended early), or close their job pipes so
        they exit once idle; then reap them."""
        for w in self.workers:
            if kill and w.process.exitcode is None:
                w.process.kill()
            with contextlib.suppress(OSError):
                os.close(w.jobs_fd)
        for w in self.workers:
            w.process.join(_STOP_SECONDS)
            if w.process.exitcode is None:  # an idle worker that did not end: it does now
                w.process.kill()
                w.process.join(_STOP_SECONDS)
            with contextlib.suppress(OSError):
                os.close(w.results_fd)
            with contextlib.suppress(ValueError):  # still running (stuck in the kernel)
                w.process.close()
        if self.selector is not None:
            self.selector.close()


def _lost_message(worker):
    code, pid = worker.process.exitcode, worker.process.pid
    if code is None:
        how = "closed its pipes and did not exit"
    elif code < 0:
        how = f"was killed by {_signal_name(-code)}"
        if -code == signal.SIGKILL:
            how += (" (the kernel's out-of-memory killer sends it when memory runs out: see "
                    "`dmesg`)")
    else:
        how = f"exited with code {code}"
    held = f"with {len(worker.held)} job(s) unfinished" if worker.held else "before the end"
    return (f"worker process {pid} {how} {held}, so this parallel step cannot finish and "
            "stopped. Rerun it; if memory ran out, with fewer worker processes (Data.num_proc).")


def _signal_name(number):
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _stalled_message(busy):
    where = ", ".join(f"{w.process.pid} ({_wait_state(w.process.pid)})" for w in busy)
    return (f"worker process(es) {where} held a job, used no CPU and sent no result for "
            f"{STALL_SECONDS} s, so this parallel step stopped: a worker stuck like this waits "
            "for a lock it inherited at fork, or for a file that does not answer (a hung "
            "network mount). Rerun it; if it happens again, report it with the state above.")


def _cpu_ticks(pid):
    """User + system CPU time of ``pid`` in clock ticks (``/proc/<pid>/stat``), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return None


def _wait_state(pid):
    """What the kernel says ``pid`` waits in (``/proc/<pid>/wchan``), e.g. ``futex_wait``."""
    try:
        with open(f"/proc/{pid}/wchan") as f:
            return f"waiting in {f.read().strip() or 'unknown'}"
    except OSError:
        return "state unknown"


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
