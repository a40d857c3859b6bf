"""Server-side dynamic batching: texts from many requests share a forward pass.

Requests put encoded texts into one bounded queue.  Each worker thread owns one
predictor (Paddle predictors are not thread-safe) and repeatedly takes a batch:
it waits until the oldest text has waited ``max_wait_ms`` or enough texts are
queued to fill a batch, then builds the batch around the oldest text (so no
text waits behind an endless stream of better-fitting ones), adding its
neighbours in length order while the padding a neighbour costs is below what a
separate forward pass costs (``overhead_tokens``: a backend's fixed cost per
run, in tokens; measured at start-up).  Mixing a 20-token review into a batch
of 250-token ones would pad it 12x; waiting for its own, cheaper batch is faster.
The token budget counts padding (batch size x longest text).
"""
import threading
import time
from concurrent.futures import Future

from ppvarlen.utils.log import get_logger

log = get_logger("deploy.batcher")


class QueueFull(RuntimeError):
    """The bounded queue cannot take these texts now; the caller should retry later."""


class BatcherClosed(RuntimeError):
    """The batcher is shutting down and accepts no new work."""


class _Job:
    __slots__ = ("item", "length", "future", "enqueued")

    def __init__(self, item, length):
        self.item = item
        self.length = length
        self.future = Future()
        self.enqueued = time.monotonic()


class DynamicBatcher:
    """Batch ``Predictor.predict_encoded`` calls across concurrent callers.

    ``predictors``: one per worker thread (e.g. ``[p, p.clone()]``).  Each item
    passed to ``submit`` must have a ``.num_tokens`` (its padded cost per row).
    """

    def __init__(self, predictors, max_wait_ms=5.0, max_batch_tokens=8192, max_batch_size=64,
                 queue_size=1024, overhead_tokens=256):
        if not predictors:
            raise ValueError("DynamicBatcher needs at least one predictor (one per worker)")
        for name, v in [("max_batch_tokens", max_batch_tokens), ("max_batch_size", max_batch_size),
                        ("queue_size", queue_size)]:
            if v < 1:
                raise ValueError(f"Deploy.{name} must be >= 1, got {v}")
        if max_wait_ms < 0 or overhead_tokens < 0:
            raise ValueError(f"Deploy.max_wait_ms and batch_overhead_tokens must be >= 0, got "
                             f"{max_wait_ms}, {overhead_tokens}")
        self.overhead_tokens = overhead_tokens
        self.max_wait = max_wait_ms / 1000.0
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_size = max_batch_size
        self.queue_size = queue_size
        self._pending = []  # FIFO of _Job
        self._cond = threading.Condition()
        self._closed = False
        self._predictors = list(predictors)
        self._stats = {"batches": 0, "items": 0, "failed_items": 0}
        self._workers = [threading.Thread(target=self._work, args=(p,), name=f"batcher-{i}",
                                          daemon=True) for i, p in enumerate(predictors)]
        for t in self._workers:
            t.start()

    # ------------------------------------------------------------ callers
    def submit(self, items):
        """Queue all ``items`` (or none: raises QueueFull) and return one Future each."""
        jobs = [_Job(it, int(it.num_tokens)) for it in items]
        with self._cond:
            if self._closed:
                raise BatcherClosed("server is shutting down")
            if len(self._pending) + len(jobs) > self.queue_size:
                raise QueueFull(f"queue holds {len(self._pending)} of {self.queue_size} texts; "
                                f"{len(jobs)} more do not fit")
            self._pending.extend(jobs)
            self._cond.notify_all()
        return [j.future for j in jobs]

    def queue_depth(self):
        with self._cond:
            return len(self._pending)

    def metrics(self):
        with self._cond:
            s = dict(self._stats)
            s["queue_depth"] = len(self._pending)
        s["mean_batch_size"] = s["items"] / s["batches"] if s["batches"] else 0.0
        # Each predictor counts the tokens of the arrays it really ran (windows included).
        s["real_tokens"] = sum(p.real_tokens for p in self._predictors)
        s["padded_tokens"] = sum(p.padded_tokens for p in self._predictors)
        s["padding_efficiency"] = (s["real_tokens"] / s["padded_tokens"]
                                   if s["padded_tokens"] else None)
        return s

    def close(self, drain=True, timeout=30.0):
        """Stop taking work; with ``drain`` finish every queued text first."""
        with self._cond:
            self._closed = True
            if not drain:
                dropped, self._pending = self._pending, []
                for j in dropped:
                    j.future.set_exception(BatcherClosed("server shut down before this text ran"))
            self._cond.notify_all()
        deadline = time.monotonic() + timeout
        for t in self._workers:
            t.join(max(0.0, deadline - time.monotonic()))
        return all(not t.is_alive() for t in self._workers)

    # ------------------------------------------------------------ workers
    def _ready(self, now):
        if self._closed:
            return True  # draining: no reason to wait for company
        if len(self._pending) >= self.max_batch_size:
            return True
        if sum(j.length for j in self._pending) >= self.max_batch_tokens:
            return True
        return now - self._pending[0].enqueued >= self.max_wait

    def _take_batch(self):
        """Under the lock: remove and return the batch grown around the oldest job."""
        pending = self._pending
        order = sorted(range(len(pending)), key=lambda i: (pending[i].length, i))
        lo = hi = order.index(0)  # the oldest job, at its place in length order
        size, longest = 1, pending[0].length
        while size < self.max_batch_size:
            # padding each neighbour would add: the shorter one pads itself up to
            # ``longest``; the longer one pads every text already in the batch
            options = []
            if lo > 0:
                options.append((longest - pending[order[lo - 1]].length, -1))
            if hi < len(order) - 1:
                options.append((size * (pending[order[hi + 1]].length - longest), 1))
            if not options:
                break
            waste, side = min(options)
            new = pending[order[lo - 1] if side < 0 else order[hi + 1]].length
            if waste > self.overhead_tokens or (size + 1) * max(longest, new) > self.max_batch_tokens:
                break
            lo, hi = (lo - 1, hi) if side < 0 else (lo, hi + 1)
            size, longest = size + 1, max(longest, new)
        chosen = set(order[lo:hi + 1])
        self._pending = [j for i, j in enumerate(pending) if i not in chosen]
        return [pending[i] for i in sorted(chosen)]

    def _work(self, predictor):
        while True:
            with self._cond:
                while True:
                    if self._pending and self._ready(time.monotonic()):
                        break
                    if self._closed and not self._pending:
                        return
                    timeout = None
                    if self._pending:
                        timeout = max(0.0, self._pending[0].enqueued + self.max_wait
                                      - time.monotonic())
                    self._cond.wait(timeout)
                batch = self._take_batch()
            self._run(predictor, batch)

    def _run(self, predictor, batch):
        try:
            results, error = predictor.predict_encoded([j.item for j in batch]), None
        except Exception as e:  # noqa: BLE001 - isolate the bad text below
            results, error = None, e
        if results is None and len(batch) > 1:
            # One bad text must not fail its batch-mates: rerun them one by one.
            for j in batch:
                self._run(predictor, [j])
            return
        with self._cond:
            self._stats["batches"] += 1
            self._stats["items"] += len(batch)
            if results is None:
                self._stats["failed_items"] += 1
        if results is None:
            log.warning("prediction failed for one text: %s", error)
            batch[0].future.set_exception(error)
            return
        for j, r in zip(batch, results):
            j.future.set_result(r)
