"""A build's worker processes never hang it (utils/parallel.py): a worker killed or ended on
its own is an error naming how it ended, a stuck one is an error after ``STALL_SECONDS``,
Ctrl-C ends a build and its workers within seconds, and a thread of the parent holding locks
(logging's, an allocator's, ``sys.stderr``'s mid-write) at the fork hangs no worker."""
import json
import logging
import os
import select
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from ppvarlen import store_build
from ppvarlen.config import load_config
from ppvarlen.data import chunks, sources
from ppvarlen.utils import parallel
from ppvarlen.utils.parallel import WorkerLost, ordered_map, ordered_map_in_rooms

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _write_corpus(path, n=600):
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            f.write(json.dumps({"text": f"评论 {i} 质量很好" * (1 + i % 3),
                                "label": ["neg", "pos"][i % 2]}, ensure_ascii=False) + "\n")
    return str(path)


def _plan(train):
    return sources.plan(load_config(data={"Data": {"corpus": "jsonl", "train_file": train}}).Data)


@pytest.fixture
def small_chunks(monkeypatch):
    """A tiny corpus cut into a few dozen chunks, so a map has jobs for every worker."""
    monkeypatch.setattr(chunks, "CHUNK_BYTES", 2048)


def _once(marker):
    """True in the one process (of all the workers) that gets here first."""
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False


class _Forks:
    """Records which thread of this process forks (os.fork wrapped)."""

    def __init__(self, monkeypatch):
        self.threads, self.real = [], os.fork
        monkeypatch.setattr(os, "fork", self)

    def __call__(self):
        thread = threading.current_thread().name
        pid = self.real()
        if pid:
            self.threads.append(thread)
        return pid


# ------------------------------------------------------------------ a worker that ends early
@pytest.mark.timeout(60)  # the old pool forked a replacement and waited for the lost job
def test_a_worker_killed_mid_scan_stops_the_build_naming_the_signal(tmp_path, small_chunks,
                                                                    monkeypatch):
    train = _write_corpus(tmp_path / "train.jsonl")
    marker = str(tmp_path / "killed")
    scan_chunk = sources.Scanner.__call__

    def killed_at_a_middle_chunk(self, job):
        chunk = job[0] if isinstance(job, tuple) else job
        if chunk.first_line > 200 and _once(marker):
            os.kill(os.getpid(), signal.SIGKILL)  # as the out-of-memory killer does
        return scan_chunk(self, job)

    monkeypatch.setattr(sources.Scanner, "__call__", killed_at_a_middle_chunk)
    forks = _Forks(monkeypatch)
    with pytest.raises(WorkerLost, match=r"worker process \d+ was killed by SIGKILL .*Rerun"):
        sources.scan(_plan(train), None, num_proc=2)
    assert forks.threads == [threading.current_thread().name] * 2  # none forked again


@pytest.mark.timeout(60)
def test_a_worker_killed_mid_encode_stops_the_build_naming_the_signal(tmp_path, small_chunks,
                                                                      monkeypatch):
    train = _write_corpus(tmp_path / "train.jsonl")
    marker = str(tmp_path / "killed")
    encode_job = store_build._ChunkEncoder.__call__

    def killed_at_a_middle_job(self, job, room=None):
        if job[0].get("train", 0) > 200 and _once(marker):
            os.kill(os.getpid(), signal.SIGKILL)
        return encode_job(self, job, room)

    monkeypatch.setattr(store_build._ChunkEncoder, "__call__", killed_at_a_middle_job)
    cfg = load_config(data={"Data": {"corpus": "jsonl", "train_file": train, "num_proc": 2,
                                     "cache_dir": str(tmp_path / "cache")}}).Data
    with pytest.raises(WorkerLost, match=r"worker process \d+ was killed by SIGKILL"):
        store_build.build_datasets(cfg)
    monkeypatch.setattr(store_build._ChunkEncoder, "__call__", encode_job)
    assert store_build.build_datasets(cfg)  # a rerun builds the store


@pytest.mark.timeout(60)
@pytest.mark.parametrize("rooms", [False, True])
def test_a_worker_that_exits_on_its_own_is_an_error_and_none_is_forked_again(tmp_path,
                                                                             monkeypatch, rooms):
    """The old pool's worker-handler thread forked a replacement while the caller's thread ran
    (the fork inherits whatever lock that thread held) and the job never came back."""
    marker = str(tmp_path / "exited")

    def exits_at_job_7(job, room=None):
        if job == 7 and _once(marker):
            os._exit(3)
        return job * 2

    forks = _Forks(monkeypatch)
    with pytest.raises(WorkerLost, match=r"exited with code 3 with [12] job"):
        if rooms:
            for _ in ordered_map_in_rooms(exits_at_job_7, range(40), 2, room_bytes=16):
                pass
        else:
            list(ordered_map(exits_at_job_7, range(40), 2))
    assert forks.threads == [threading.current_thread().name] * 2


def _deadlocks_at_job_5(job):
    if job == 5:
        lock = threading.Lock()
        lock.acquire()
        lock.acquire()  # waits forever, using no CPU: a lock inherited held at the fork
    return job


@pytest.mark.timeout(60)
def test_a_worker_stuck_with_a_job_stops_the_map_after_the_stall_bound(monkeypatch):
    monkeypatch.setattr(parallel, "STALL_SECONDS", 2, raising=False)
    seen = []
    with pytest.raises(WorkerLost, match=r"held a job, used no CPU and sent no result for 2 s"):
        for result in ordered_map(_deadlocks_at_job_5, range(20), 2):
            seen.append(result)
    assert seen == [0, 1, 2, 3, 4]


# ------------------------------------------------------------------ Ctrl-C
_SLOW_BUILD = textwrap.dedent("""
    import os, sys, time
    from ppvarlen import store_build
    from ppvarlen.config import load_config
    from ppvarlen.data import chunks, sources
    train, started, cache, slowed = sys.argv[1:]
    chunks.CHUNK_BYTES = 2048
    cls = sources.Scanner if slowed == "scan" else store_build._ChunkEncoder
    run_job = cls.__call__
    def slow(self, job, *room):
        open(started, "a").close()  # a worker is at work
        time.sleep(0.5)
        return run_job(self, job, *room)
    cls.__call__ = slow
    store_build.build_datasets(load_config(data={"Data": {
        "corpus": "jsonl", "train_file": train, "cache_dir": cache, "num_proc": 2}}).Data)
    print("the build was not interrupted")
""")


def _as_started_from_a_terminal():
    """A command typed at a terminal starts with Ctrl-C at its default; one this suite runs may
    inherit it ignored (a CI job started in the background by a shell without job control:
    such shells ignore SIGINT in asynchronous commands, and a forked child keeps that)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _children(pid):
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry))
    return found


def _alive(pid):
    """Running (a zombie, exited and not yet reaped by init, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


@pytest.mark.timeout(120)
@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
@pytest.mark.parametrize("slowed", ["scan", "encode"])  # pass 1's map, pass 2's map in rooms
def test_ctrl_c_ends_a_build_within_seconds_and_no_worker_is_left(tmp_path, slowed):
    train = _write_corpus(tmp_path / "train.jsonl")
    started = tmp_path / "started"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, "-c", _SLOW_BUILD, train, str(started),
                             str(tmp_path / "cache"), slowed],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True,  # its own process group, as a terminal's
                            preexec_fn=_as_started_from_a_terminal)
    try:
        deadline = time.monotonic() + 90
        while not started.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert started.exists(), proc.communicate()
        workers = _children(proc.pid)
        assert len(workers) == 2
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole group
        out, err = proc.communicate(timeout=30)  # a hang guard, not a speed test
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode != 0 and "the build was not interrupted" not in out
    assert err.count("Traceback") == 1 and err.rstrip().endswith("KeyboardInterrupt"), err
    deadline = time.monotonic() + 30
    while any(map(_alive, workers)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(map(_alive, workers))


# ------------------------------------------------------------------ threads holding locks
class _LockHolders:
    """Threads that keep taking locks a forked worker might need: logging's module lock, the
    allocator's (an allocation-heavy loop) and ``sys.stderr``'s, held while a write waits for
    a slow reader of its pipe (a terminal or ``| tee`` that does not keep up)."""

    def __init__(self, monkeypatch):
        self.stop = threading.Event()
        read_fd, write_fd = os.pipe()
        self.read_fd = read_fd
        self.stderr = open(write_fd, "w", buffering=1 << 16)
        monkeypatch.setattr(sys, "stderr", self.stderr)
        self.threads = [threading.Thread(target=self._hold_logging, daemon=True),
                        threading.Thread(target=self._allocate, daemon=True),
                        threading.Thread(target=self._write_stderr, daemon=True),
                        threading.Thread(target=self._read_slowly, daemon=True)]

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(10)
        self.stderr.close()
        os.close(self.read_fd)

    def _hold_logging(self):
        while not self.stop.is_set():
            with logging._lock:
                time.sleep(0.002)

    def _allocate(self):
        while not self.stop.is_set():
            junk = [bytearray(1 << 12) for _ in range(256)]
            del junk

    def _write_stderr(self):
        while not self.stop.is_set():
            self.stderr.write("x" * (1 << 16))
            self.stderr.flush()
            time.sleep(0.002)

    def _read_slowly(self):
        writer = self.threads[2]
        while writer.is_alive():  # once stopping, fast: the writer's last write must end
            if select.select([self.read_fd], [], [], 0.1)[0]:
                os.read(self.read_fd, 1 << 12)
            if not self.stop.is_set():
                time.sleep(0.001)


@pytest.mark.timeout(120)  # a worker hung on an inherited lock would hang the whole run
def test_builds_in_a_row_while_threads_hold_locks_never_hang(tmp_path, small_chunks,
                                                             monkeypatch):
    train = _write_corpus(tmp_path / "train.jsonl", n=300)
    plan = _plan(train)
    expected = sources.scan(plan, None, num_proc=1)
    expected.close()
    runs, deadline = 0, time.monotonic() + 15
    with _LockHolders(monkeypatch):
        # at least 5 builds however busy the machine is (a hang is the timeout's to catch)
        while runs < 5 or (runs < 200 and time.monotonic() < deadline):
            scanned = sources.scan(plan, None, num_proc=2)
            scanned.close()
            assert scanned.corpus.splits == expected.corpus.splits
            runs += 1
