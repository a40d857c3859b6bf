"""Server-side dynamic batching: texts from many requests share a forward pass.

Requests put encoded texts into one bounded queue.  Each worker thread owns one
predictor (Paddle predictors are not thread-safe) and repeatedly takes a batch:
it waits until the oldest text has waited ``max_wait_ms`` or enough texts are
queued to fill a batch, then splits the queue, in length order, into the groups
that cost least in total — each group costs a fixed ``overhead_tokens`` (the
backend's cost per run, measured at start-up) plus its padded size, batch x
longest — and runs the group holding the oldest text, so no text waits behind
an endless stream of better-fitting ones.  Mixing a 20-token review into a batch
of 250-token ones pads it 12x; when runs are cheap it is faster on its own.

Waiting for company is pointless once no company can come: with ``callers`` (a ``Callers``
the server counts its inference requests in), a batch also runs as soon as every caller the
server has seen lately is inside, their texts queued or running, none still being parsed or
encoded.  Closed-loop clients send their next request only after an answer, so waiting
longer then only adds latency.  "Seen lately" is the most requests held at once over the
last one to two ``Callers.window_s``: a client that is between requests counts, so the rule
cannot fire while it could still join; with fewer callers than that (load just fell) the
batcher waits ``max_wait_ms`` as without the rule.
"""
import threading
import time
from concurrent.futures import Future

from ppvarlen.config import ConfigError
from ppvarlen.utils.log import get_logger

log = get_logger("serve.batcher")
PLAN_WINDOW = 256  # the oldest queued texts a batch is planned over (bounds planning time)
ALL_QUEUED = "all queued"  # _ready's answer when only the Callers rule says go


def plan_groups(sorted_lengths, overhead_tokens, max_tokens, max_size, cost=None):
    """Cheapest split of length-sorted texts into consecutive batches: [(start, end)].

    Cost of a batch = ``overhead_tokens`` + size x longest (padding counted), or
    ``cost(size, longest)`` when given (an engine's measured seconds per batch shape, None
    for a batch it has no figure for: not formed, unless it is one text), with
    size <= ``max_size`` and size x longest <= ``max_tokens`` (a text longer than
    the budget goes alone).  Exact dynamic programme over the cut points, O(n x max_size).
    Plain Python: the queues it plans are a few hundred texts at most, where numpy's cost
    per call exceeds the arithmetic (the batcher thread plans while it holds the GIL).
    """
    lengths = [int(x) for x in sorted_lengths]
    n = len(lengths)
    if cost is not None:
        return _plan_with_costs(lengths, cost, max_tokens, max_size)
    best = [0] * (n + 1)  # best[i]: cheapest cost of the first i texts
    cut = [0] * (n + 1)  # where the last batch of that split starts
    for i in range(1, n + 1):
        longest = lengths[i - 1]
        fits = max(1, min(max_size, max_tokens // max(longest, 1)))
        # a last batch [j, i) costs best[j] + overhead + (i - j) x longest: minimise over j
        # best[j] - j x longest (ties: the first j, the larger last batch)
        start = max(0, i - fits)
        least, at = best[start] - start * longest, start
        for j in range(start + 1, i):
            cost = best[j] - j * longest
            if cost < least:
                least, at = cost, j
        best[i], cut[i] = least + overhead_tokens + i * longest, at
    groups, end = [], n
    while end > 0:
        groups.append((cut[end], end))
        end = cut[end]
    return groups[::-1]


def _plan_with_costs(lengths, cost, max_tokens, max_size):
    """``plan_groups`` with a cost per (size, longest) instead of the linear one."""
    n = len(lengths)
    alone = max((c for c in (cost(1, x) for x in lengths) if c is not None), default=1.0)
    best = [0.0] + [float("inf")] * n
    cut = [0] * (n + 1)
    for i in range(1, n + 1):
        longest = lengths[i - 1]
        fits = max(1, min(max_size, max_tokens // max(longest, 1)))
        for j in range(max(0, i - fits), i):
            c = cost(i - j, longest)
            if c is None:
                if i - j > 1:
                    continue
                c = alone
            if best[j] + c < best[i]:
                best[i], cut[i] = best[j] + c, j
    groups, end = [], n
    while end > 0:
        groups.append((cut[end], end))
        end = cut[end]
    return groups[::-1]


class Callers:
    """The inference requests a server holds, for the batcher's "no one else can come" rule
    (thread-safe: the REST and gRPC event loops both count here).

    ``arrive()`` when a request starts its way to a batcher, ``queued()`` once its texts are
    in the queue, ``leave(queued)`` when it has its answers (or was refused).  ``all_in()``:
    at least one request is held, none is still on its way to the queue, and as many are held
    as were held at most at once over the current and the previous window of ``window_s``
    seconds (the recent population of closed-loop callers)."""

    def __init__(self, window_s=1.0, clock=time.monotonic):
        self.window_s, self._clock = window_s, clock
        self._lock = threading.Lock()
        self.held = 0  # requests between arrive() and leave()
        self.preparing = 0  # of those, not queued yet
        self._peak, self._previous_peak = 0, 0
        self._window_start = clock()

    def arrive(self):
        with self._lock:
            self.held += 1
            self.preparing += 1
            now = self._clock()
            if now - self._window_start >= self.window_s:
                self._previous_peak, self._peak = self._peak, 0
                self._window_start = now
            if self.held > self._peak:
                self._peak = self.held

    def queued(self):
        with self._lock:
            self.preparing -= 1

    def leave(self, queued):
        with self._lock:
            self.held -= 1
            if not queued:
                self.preparing -= 1

    def population(self):
        with self._lock:
            return max(self._peak, self._previous_peak)

    def all_in(self):
        with self._lock:
            return (self.held > 0 and self.preparing == 0
                    and self.held >= max(self._peak, self._previous_peak))


class QueueFull(RuntimeError):
    """The bounded queue cannot take these texts now; the caller should retry later."""


class BatcherClosed(RuntimeError):
    """The batcher is shutting down and accepts no new work."""


class DeadlineExpired(RuntimeError):
    """A text's deadline passed while it waited in the queue (it never ran)."""


class Answered:
    """An answer delivered to an event loop: the result and its timings (seconds)."""

    __slots__ = ("result", "queue_s", "compute_s")

    def __init__(self, result, queue_s, compute_s):
        self.result, self.queue_s, self.compute_s = result, queue_s, compute_s


class _Job:
    __slots__ = ("item", "length", "future", "enqueued", "loop", "taken", "deadline")

    def __init__(self, item, length, loop=None, deadline=None):
        self.item = item
        self.length = length
        self.loop = loop
        self.deadline = deadline  # time.monotonic() after which it is refused unrun; None: never
        self.taken = False  # out of the queue: in a batch, or dropped
        # an asyncio future of ``loop`` (created in its thread: submit runs there), else a
        # thread-safe one
        self.future = loop.create_future() if loop is not None else Future()
        self.enqueued = time.monotonic()


def _resolve(outcomes):
    """In the event loop: set each (future, Answered or exception) not cancelled meanwhile."""
    for future, outcome in outcomes:
        if future.done():
            continue
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)


class DynamicBatcher:
    """Batch ``Predictor.predict_encoded`` calls across concurrent callers.

    ``predictors``: one per worker thread (e.g. ``[p, p.clone()]``).  Each item
    passed to ``submit`` must have a ``.num_tokens`` (its padded cost per row).
    Predictors of different math thread counts (``.threads``) split the cores by load: the
    widest takes a lone text when nothing else runs (all its threads on one text), the
    narrower ones take the batches that queue, as many at once as their threads fit in the
    widest one's count, the queue shared between those free to take it.
    ``on_batch(size, real_tokens, padded_tokens, queue_waits_s, compute_s)`` is called after
    each batch that ran (metrics and the statistics extension).  ``callers``: a ``Callers``
    whose ``all_in()`` runs the queue without waiting for company (the module's docstring).
    ``warmup(predictor)`` runs in each worker's own thread before it takes a batch (Paddle's
    oneDNN kernels are cached per thread: a warm-up elsewhere does not warm the worker), and
    the constructor returns once every worker is warm (re-raising a warm-up's error).
    """

    def __init__(self, predictors, max_wait_ms=5.0, max_batch_tokens=8192, max_batch_size=64,
                 queue_size=1024, overhead_tokens=256, on_batch=None, callers=None,
                 batch_cost=None, warmup=None):
        if not predictors:
            raise ConfigError("DynamicBatcher needs at least one predictor (one per worker)")
        for name, v in [("max_batch_tokens", max_batch_tokens), ("max_batch_size", max_batch_size),
                        ("queue_size", queue_size)]:
            if v < 1:
                raise ConfigError(f"Deploy.{name} must be >= 1, got {v}")
        if max_wait_ms < 0 or overhead_tokens < 0:
            raise ConfigError(f"Deploy.max_wait_ms and batch_overhead_tokens must be >= 0, got "
                             f"{max_wait_ms}, {overhead_tokens}")
        self.overhead_tokens = overhead_tokens
        self.batch_cost = batch_cost  # (size, longest) -> seconds: plan_groups' cost
        self.max_wait = max_wait_ms / 1000.0
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_size = max_batch_size
        self.queue_size = queue_size
        self._pending = []  # FIFO of _Job
        self._pending_tokens = 0  # their lengths' sum
        self._with_deadline = 0  # how many of them have a deadline
        self._cond = threading.Condition()
        self._closed = False
        self._predictors = list(predictors)
        self._on_batch = on_batch
        self._callers = callers
        # batches_all_queued: batches started early by the Callers rule (module docstring)
        # batches_narrow: batches run on a narrower predictor than the widest, under load
        self._stats = {"batches": 0, "items": 0, "failed_items": 0, "batches_all_queued": 0,
                       "batches_narrow": 0}
        self._warmup = warmup
        threads = [getattr(p, "threads", 1) for p in self._predictors]
        self._cores = max(threads)
        self._by_load = len(set(threads)) > 1  # the class docstring's split
        self._threads_running = 0
        self._warm = threading.Semaphore(0)
        self._warmup_errors = []
        self._workers = [threading.Thread(target=self._work, args=(p,), name=f"batcher-{i}",
                                          daemon=True) for i, p in enumerate(predictors)]
        for t in self._workers:
            t.start()
        for _ in self._workers:
            self._warm.acquire()
        if self._warmup_errors:
            self.close(timeout=5)
            raise self._warmup_errors[0]

    # ------------------------------------------------------------ callers
    def submit(self, items, loop=None, deadline=None):
        """Queue all ``items`` (or none: raises QueueFull) and return one future each: with
        ``loop`` (the running event loop; call from its thread) asyncio futures resolving to
        ``Answered``, resolved a batch at a time in one callback on the loop (one wake-up
        per batch, not per text); else ``concurrent.futures.Future`` resolving to the
        result.  ``deadline`` (a ``time.monotonic()``): a text still queued then is not run;
        its future gets ``DeadlineExpired``."""
        jobs = [_Job(it, int(it.num_tokens), loop, deadline) for it in items]
        with self._cond:
            if self._closed:
                raise BatcherClosed("server is shutting down")
            if len(self._pending) + len(jobs) > self.queue_size:
                raise QueueFull(f"queue holds {len(self._pending)} of {self.queue_size} texts; "
                                f"{len(jobs)} more do not fit")
            was_empty = not self._pending
            self._pending.extend(jobs)
            self._pending_tokens += sum(j.length for j in jobs)
            if deadline is not None:
                self._with_deadline += len(jobs)
            # a waiting worker's deadline is the oldest text's, which these do not change:
            # wake it only when the queue was empty (no deadline yet) or is ready now
            if was_empty or self._ready(time.monotonic()):
                self._cond.notify_all()
        return [j.future for j in jobs]

    def stop_waiting(self):
        """Shutdown has begun: run what is queued now instead of waiting for company
        (``max_wait_ms``), so in-flight requests finish before the server's drain deadline."""
        with self._cond:
            self.max_wait = 0.0
            self._cond.notify_all()

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
        # seq2seq: a batch runs until its longest output ends; the other rows idle meanwhile
        real = sum(getattr(p, "real_target_tokens", 0) for p in self._predictors)
        padded = sum(getattr(p, "padded_target_tokens", 0) for p in self._predictors)
        if padded:
            s["decode_steps_efficiency"] = real / padded
        return s

    def close(self, drain=True, timeout=30.0):
        """Stop taking work; with ``drain`` finish every queued text first."""
        with self._cond:
            self._closed = True
            if not drain:
                dropped, self._pending, self._pending_tokens = self._pending, [], 0
                self._with_deadline = 0
                for j in dropped:
                    j.taken = True
                self._deliver(dropped, [BatcherClosed("server shut down before this text ran")]
                              * len(dropped), time.monotonic(), 0.0)
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
        if self._pending_tokens >= self.max_batch_tokens:
            return True
        if now - self._pending[0].enqueued >= self.max_wait:
            return True
        if self._callers is not None and self._callers.all_in():
            return ALL_QUEUED  # no one else can join before an answer goes out
        return False

    def _plan(self, considered):
        """The cheapest-plan group holding the oldest of ``considered`` (the queue's head),
        in queue order.  Outside the lock: submits are not held up while it plans."""
        order = sorted(range(len(considered)), key=lambda i: (considered[i].length, i))
        groups = plan_groups([considered[i].length for i in order], self.overhead_tokens,
                             self.max_batch_tokens, self.max_batch_size, self.batch_cost)
        at = order.index(0)
        start, end = next((a, b) for a, b in groups if a <= at < b)
        return [considered[i] for i in sorted(order[start:end])]

    def _take(self, batch):
        """Under the lock: remove ``batch`` from the queue -> True, or False when one of its
        jobs was taken meanwhile (by another worker, or dropped by ``close``)."""
        if any(j.taken for j in batch):
            return False
        for j in batch:
            j.taken = True
        self._pending = [j for j in self._pending if not j.taken]
        self._pending_tokens -= sum(j.length for j in batch)
        self._with_deadline -= sum(j.deadline is not None for j in batch)
        return True

    def _expire(self, now):
        """Under the lock: refuse the queued texts whose deadline has passed (DeadlineExpired)
        -> the earliest deadline still pending, or None."""
        if not self._with_deadline:
            return None
        expired = [j for j in self._pending if j.deadline is not None and j.deadline <= now]
        if expired:
            self._take(expired)
            self._deliver(expired, [DeadlineExpired("its deadline passed in the queue")]
                          * len(expired), now, 0.0)
        return min((j.deadline for j in self._pending if j.deadline is not None), default=None)

    def _work(self, predictor):
        try:
            if self._warmup is not None:
                self._warmup(predictor)
        except Exception as e:  # noqa: BLE001 - the constructor re-raises it
            self._warmup_errors.append(e)
            return
        finally:
            self._warm.release()
        while True:
            with self._cond:
                while True:
                    next_deadline = self._expire(time.monotonic())
                    ready = self._pending and self._ready(time.monotonic())
                    if ready and self._may_take(predictor):
                        break
                    if self._closed and not self._pending:
                        return
                    timeout = None  # ready for another worker: woken as one finishes
                    if self._pending and not ready:
                        wake = self._pending[0].enqueued + self.max_wait
                        if next_deadline is not None:
                            wake = min(wake, next_deadline)
                        timeout = max(0.0, wake - time.monotonic())
                    self._cond.wait(timeout)
                considered = self._pending[:self._window(predictor)]
            batch = self._plan(considered)
            with self._cond:
                taken = self._take(batch)
                if taken and ready is ALL_QUEUED:
                    self._stats["batches_all_queued"] += 1
                if taken and self._by_load:
                    self._threads_running += predictor.threads
                    self._stats["batches_narrow"] += predictor.threads < self._cores
            if not taken:
                continue
            try:
                self._run(predictor, batch)
            finally:
                if self._by_load:
                    with self._cond:
                        self._threads_running -= predictor.threads
                        self._cond.notify_all()

    def _may_take(self, predictor):
        """Under the lock: whether ``predictor``'s worker takes a batch now (the class
        docstring's split by load; any worker, any time, otherwise)."""
        if not self._by_load:
            return True
        lone = self._threads_running == 0 and len(self._pending) == 1
        if predictor.threads == self._cores:
            return lone
        return not lone and self._threads_running + predictor.threads <= self._cores

    def _window(self, predictor):
        """Under the lock: how much of the queue's head ``predictor`` plans its batch from: a
        narrower predictor leaves a share to each other one free now."""
        if not self._by_load or predictor.threads == self._cores:
            return PLAN_WINDOW
        free = (self._cores - self._threads_running) // predictor.threads
        return min(PLAN_WINDOW, -(-len(self._pending) // max(1, free)))

    def _run(self, predictor, batch):
        started = time.monotonic()
        before = (predictor.real_tokens, predictor.padded_tokens)
        try:
            results, error = predictor.predict_encoded([j.item for j in batch]), None
        except Exception as e:  # noqa: BLE001 - isolate the bad text below
            results, error = None, e
        compute = time.monotonic() - started
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
            self._deliver(batch, [error], started, compute)
            return
        if self._on_batch is not None:
            try:
                self._on_batch(len(batch), predictor.real_tokens - before[0],
                               predictor.padded_tokens - before[1],
                               [started - j.enqueued for j in batch], compute)
            except Exception:  # noqa: BLE001 - a metrics bug must not lose the answers
                log.exception("on_batch callback failed")
        self._deliver(batch, results, started, compute)

    @staticmethod
    def _deliver(batch, outcomes, started, compute):
        """Hand each job its result (or exception); event-loop jobs get theirs in one
        callback per loop."""
        by_loop = {}
        for j, outcome in zip(batch, outcomes):
            if j.loop is None:
                if isinstance(outcome, BaseException):
                    j.future.set_exception(outcome)
                else:
                    j.future.set_result(outcome)
                continue
            if not isinstance(outcome, BaseException):
                outcome = Answered(outcome, started - j.enqueued, compute)
            by_loop.setdefault(j.loop, []).append((j.future, outcome))
        for loop, outcomes_of_loop in by_loop.items():
            try:
                loop.call_soon_threadsafe(_resolve, outcomes_of_loop)
            except RuntimeError:  # the loop closed (server gone): nobody waits for these
                pass
