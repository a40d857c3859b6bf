"""deploy/batcher.py at its edges: exact messages, metrics values, full batches that do not
wait, close with and without draining.

Written against the mutants benchmarks/mutation.py found alive (docs/mutation/batcher.md).
A gate holds the worker where a test needs the queue to stay put (no timing races).
"""
import logging
import threading
import time
import types

import pytest
from test_batcher import FakePredictor, Item

from ppvarlen.config import ConfigError
from ppvarlen.config_schema import SCHEMA
from ppvarlen.serve import batcher as batcher_module
from ppvarlen.serve.batcher import BatcherClosed, DynamicBatcher, QueueFull, plan_groups

NEVER_MS = 600_000  # a max_wait no test waits out: a batch must go for another reason


def wait_until_taken(pred, n=1):
    deadline = time.monotonic() + 120
    while len(pred.batches) < n:
        assert time.monotonic() < deadline, "the worker never took the batch"
        time.sleep(0.001)


def test_refusals_say_why():
    pred = FakePredictor(gate=threading.Event())
    b = DynamicBatcher([pred], max_wait_ms=0, max_batch_size=1, queue_size=2)
    b.submit([Item(0, 2)])
    wait_until_taken(pred)
    b.submit([Item(1, 2)])
    with pytest.raises(QueueFull, match=r"^queue holds 1 of 2 texts; 2 more do not fit$"):
        b.submit([Item(2, 2), Item(3, 2)])
    pred.gate.set()
    assert b.close()
    with pytest.raises(BatcherClosed, match=r"^server is shutting down$"):
        b.submit([Item(4, 2)])


def test_metrics_values():
    pred = FakePredictor(gate=threading.Event())
    b = DynamicBatcher([pred], max_wait_ms=0, max_batch_size=2, max_batch_tokens=1000)
    m = b.metrics()
    assert m["mean_batch_size"] == 0.0 and m["padding_efficiency"] is None
    assert "decode_steps_efficiency" not in m  # not a seq2seq predictor
    b.submit([Item(0, 4)])
    wait_until_taken(pred)
    b.submit([Item(1, 2), Item(2, 4), Item(3, 4)])
    assert b.metrics()["queue_depth"] == 3
    pred.gate.set()
    assert b.close()
    m = b.metrics()
    assert m["queue_depth"] == 0 and m["items"] == 4
    assert m["batches"] == len(pred.batches) and m["mean_batch_size"] == 4 / len(pred.batches)
    assert m["real_tokens"] == 14 and m["padding_efficiency"] == 14 / pred.padded_tokens


def test_decode_steps_efficiency_sums_every_worker():
    class Seq2SeqFake(FakePredictor):
        def __init__(self, real, padded):
            super().__init__()
            self.real_target_tokens, self.padded_target_tokens = real, padded

    b = DynamicBatcher([Seq2SeqFake(3, 4), Seq2SeqFake(1, 4)], max_wait_ms=0)
    assert b.metrics()["decode_steps_efficiency"] == 0.5  # (3 + 1) / (4 + 4)
    assert b.close()


@pytest.mark.parametrize("limits, items", [
    ({"max_batch_size": 2}, [Item(0, 3), Item(1, 3)]),  # exactly the row limit
    ({"max_batch_tokens": 10}, [Item(0, 5), Item(1, 5)]),  # exactly the token budget
])
def test_a_full_batch_goes_without_waiting(limits, items):
    pred = FakePredictor()
    b = DynamicBatcher([pred], max_wait_ms=NEVER_MS, **{"max_batch_size": 64,
                                                         "max_batch_tokens": 1000, **limits})
    futures = b.submit(items)
    assert [f.result(60) for f in futures] == [("echo", 0), ("echo", 1)]
    assert pred.batches == [[0, 1]]
    assert b.close()


def test_close_drains_by_default_and_drops_with_a_reason_otherwise():
    pred = FakePredictor(gate=threading.Event())
    b = DynamicBatcher([pred], max_wait_ms=0, max_batch_size=1)
    first = b.submit([Item(0, 2)])
    wait_until_taken(pred)
    queued = b.submit([Item(1, 2)])
    closing = threading.Thread(target=b.close, daemon=True)  # the default: drain
    closing.start()
    pred.gate.set()
    closing.join(120)
    assert not closing.is_alive()
    assert [f.result(0) for f in first + queued] == [("echo", 0), ("echo", 1)]

    pred = FakePredictor(gate=threading.Event())
    b = DynamicBatcher([pred], max_wait_ms=0, max_batch_size=1)
    first = b.submit([Item(0, 2)])
    wait_until_taken(pred)
    queued = b.submit([Item(1, 2)])
    closing = threading.Thread(target=b.close, kwargs={"drain": False}, daemon=True)
    closing.start()
    with pytest.raises(BatcherClosed, match=r"^server shut down before this text ran$"):
        queued[0].result(60)
    pred.gate.set()
    closing.join(120)
    assert first[0].result(0) == ("echo", 0)  # the running batch still finishes
    assert pred.batches == [[0]]


class _Busy:
    """A batcher whose one worker is held inside a gated batch, so the test owns the queue."""

    def __init__(self, **options):
        self.pred = FakePredictor(gate=threading.Event())
        self.batcher = DynamicBatcher([self.pred], max_wait_ms=0, **options)
        self.batcher.submit([Item("hold", 1)])
        wait_until_taken(self.pred)


def test_ready_once_the_oldest_text_has_waited_exactly_max_wait():
    busy = _Busy()
    b = busy.batcher
    b.max_wait = 600.0  # the rule under test, on a clock the test chooses (no sleeping)
    job = batcher_module._Job(Item(0, 1), 1)
    job.enqueued = 1000.0
    with b._cond:
        b._pending = [job]
        assert not b._ready(1599.5)  # waited 599.5 s of 600
        assert b._ready(1600.0)      # waited exactly max_wait
        b._pending = []
    busy.pred.gate.set()
    assert b.close()


class _RecordingCondition(threading.Condition):
    """A Condition that remembers every timeout the worker waits with."""

    def __init__(self):
        super().__init__()
        self.timeouts = []

    def wait(self, timeout=None):
        self.timeouts.append(timeout)
        return super().wait(timeout)


@pytest.mark.parametrize("max_wait_ms", [400, 60_000])
def test_a_lone_text_waits_at_most_the_rest_of_max_wait(monkeypatch, max_wait_ms):
    monkeypatch.setattr(batcher_module, "threading",
                        types.SimpleNamespace(Condition=_RecordingCondition,
                                              Thread=threading.Thread,
                                              Semaphore=threading.Semaphore))
    pred = FakePredictor()
    b = DynamicBatcher([pred], max_wait_ms=max_wait_ms)
    future = b.submit([Item(0, 1)])[0]
    deadline = time.monotonic() + 120
    # until the worker waits for company (or, on a stalled host, has already run the text)
    while not (future.done() or any(t is not None for t in b._cond.timeouts)):
        assert time.monotonic() < deadline, "the worker never waited"
        time.sleep(0.001)
    assert b.close()  # closing: the lone text goes now
    assert future.result(60) == ("echo", 0)
    timed = [t for t in b._cond.timeouts if t is not None]
    # the time left until the text has waited max_wait: never more than max_wait itself
    assert all(0 <= t <= max_wait_ms / 1000 for t in timed), timed
    if max_wait_ms == 60_000:  # a minute after submit the worker has surely looked
        assert timed and timed[0] > 0, timed  # with time left, so it waited (no busy loop)


def test_the_batch_holding_the_oldest_text_runs_first_when_it_starts_a_later_group():
    # queued while the worker is busy: the oldest text (10 tokens) and two 1-token ones.
    # Sorted by length: [1, 1, 10]; with no per-run overhead the cheapest plan is
    # [1, 1] (cost 2 x 1) + [10] (cost 10) = 12 < [1, 1, 10] together (3 x 10 = 30).
    # The oldest text is at sorted position 2, the start of the second group.
    busy = _Busy(overhead_tokens=0)
    futures = busy.batcher.submit([Item(0, 10), Item(1, 1), Item(2, 1)])
    busy.pred.gate.set()
    assert [f.result(60) for f in futures] == [("echo", 0), ("echo", 1), ("echo", 2)]
    assert busy.batcher.close()
    assert busy.pred.batches == [["hold"], [0], [1, 2]]


def test_settings_refusals_name_the_setting():
    with pytest.raises(ConfigError, match=r"^DynamicBatcher needs at least one predictor \(one "
                                          r"per worker\)$"):
        DynamicBatcher([])
    for name in ("max_batch_tokens", "max_batch_size", "queue_size"):
        with pytest.raises(ConfigError, match=rf"^Deploy\.{name} must be >= 1, got 0$"):
            DynamicBatcher([FakePredictor()], **{name: 0})
    for wait, overhead in ((-1, 0), (0, -1)):  # either one negative is refused
        with pytest.raises(ConfigError, match=rf"^Deploy\.max_wait_ms and batch_overhead_tokens "
                                              rf"must be >= 0, got {wait}, {overhead}$"):
            DynamicBatcher([FakePredictor()], max_wait_ms=wait, overhead_tokens=overhead)


def test_defaults_are_the_deploy_config_defaults():
    deploy = SCHEMA["Deploy"]
    b = DynamicBatcher([FakePredictor()])
    assert b.max_wait == deploy["max_wait_ms"].default / 1000
    assert b.max_batch_tokens == deploy["max_batch_tokens"].default
    assert b.max_batch_size == deploy["max_batch_size"].default
    assert b.queue_size == deploy["queue_size"].default
    assert b.close()


def test_workers_are_named_daemon_threads():
    # daemon: a worker stuck in a predictor must not keep the process alive at exit
    b = DynamicBatcher([FakePredictor(), FakePredictor()])
    assert [(t.name, t.daemon) for t in b._workers] == [("batcher-0", True), ("batcher-1", True)]
    assert b.close()


class _Records(logging.Handler):
    """Keeps the batcher logger's records (whatever the package's propagate setting)."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append(record)


@pytest.fixture()
def batcher_log():
    handler = _Records()
    logger = logging.getLogger("ppvarlen.serve.batcher")
    logger.addHandler(handler)
    yield handler.records
    logger.removeHandler(handler)


def test_on_batch_gets_the_batch_size_its_tokens_and_waits():
    calls = []
    pred = FakePredictor(gate=threading.Event())
    b = DynamicBatcher([pred], max_wait_ms=0,
                       on_batch=lambda *args: calls.append(args))
    first_submit = time.monotonic()
    # the held batch: lengths 1 and 3 run 4 tokens padded to 2 x 3 = 6 (real != padded, so
    # the deltas below cannot mix the two counters up)
    b.submit([Item("h1", 1), Item("h2", 3)])
    wait_until_taken(pred)
    # queued together behind it: lengths 3 and 5 share one batch (overhead 256 > the 2
    # padding tokens), which runs 3 + 5 = 8 tokens padded to 2 x 5 = 10
    futures = b.submit([Item(0, 3), Item(1, 5)])
    pred.gate.set()
    assert [f.result(60) for f in futures] == [("echo", 0), ("echo", 1)]
    assert b.close()
    all_done = time.monotonic()
    assert pred.batches == [["h1", "h2"], [0, 1]]
    assert [c[:3] for c in calls] == [(2, 4, 6), (2, 8, 10)]  # per batch, not cumulative
    assert all(0 <= c[4] <= all_done - first_submit for c in calls), calls  # forward time
    waits = [c[3] for c in calls]
    assert [len(w) for w in waits] == [2, 2]
    # a queue wait lies within the time the test has been running (no speed is asserted)
    assert all(0 <= w <= all_done - first_submit for ws in waits for w in ws), waits


def test_failures_are_counted_per_text_and_logged(batcher_log):
    pred = FakePredictor(gate=threading.Event())
    b = DynamicBatcher([pred], max_wait_ms=0)
    b.submit([Item("hold", 1)])
    wait_until_taken(pred)
    futures = b.submit([Item(0, 2, bad=True), Item(1, 2, bad=True), Item(2, 2)])
    pred.gate.set()
    for f in futures[:2]:
        with pytest.raises(RuntimeError, match="^bad item$"):
            f.result(60)
    assert futures[2].result(60) == ("echo", 2)
    assert b.close()
    assert b.metrics()["failed_items"] == 2
    warnings = [r.getMessage() for r in batcher_log if r.levelno == logging.WARNING]
    assert warnings == ["prediction failed for one text: bad item"] * 2


def test_a_failing_on_batch_is_logged_and_loses_no_answer(batcher_log):
    def broken(*args):
        raise RuntimeError("metrics down")

    b = DynamicBatcher([FakePredictor()], max_wait_ms=0, on_batch=broken)
    assert b.submit([Item(0, 2)])[0].result(60) == ("echo", 0)
    assert b.close()
    errors = [(r.getMessage(), str(r.exc_info[1])) for r in batcher_log
              if r.levelno == logging.ERROR]
    assert errors == [("on_batch callback failed", "metrics down")]


class _JoinRecorder:
    """Wraps a worker thread; remembers the timeout of every join."""

    def __init__(self, thread):
        self.thread, self.timeouts = thread, []

    def join(self, timeout=None):
        self.timeouts.append(timeout)
        self.thread.join(timeout)

    def is_alive(self):
        return self.thread.is_alive()


def test_close_waits_for_workers_at_most_its_timeout():
    pred = FakePredictor(gate=threading.Event())
    b = DynamicBatcher([pred], max_wait_ms=0)
    b.submit([Item("hold", 1)])
    wait_until_taken(pred)
    b._workers = [_JoinRecorder(t) for t in b._workers]
    assert b.close(timeout=0.2) is False  # the worker is still inside its batch
    (recorder,) = b._workers
    assert recorder.timeouts and all(t is not None and 0 <= t <= 0.2 for t in recorder.timeouts)
    pred.gate.set()
    recorder.timeouts.clear()
    assert b.close() is True  # default timeout: 30 s, from the moment close is called
    assert all(t is not None and 25 < t <= 30 for t in recorder.timeouts), recorder.timeouts


def test_one_token_texts_fill_the_whole_budget():
    # four 1-token texts, budget 4 tokens, overhead 1: together they cost 1 + 4 x 1 = 5 and fit
    # the budget exactly; any split pays the overhead twice (2 + 4 = 6)
    assert plan_groups([1, 1, 1, 1], 1, 4, 64) == [(0, 4)]
    # budget 3: two groups are needed and enough (which two is a tie: 2 x 1 + 4 = 6 each)
    groups = plan_groups([1, 1, 1, 1], 1, 3, 64)
    assert len(groups) == 2 and all(b - a <= 3 for a, b in groups)
    assert groups[0][0] == 0 and groups[-1][1] == 4 and groups[0][1] == groups[1][0]


def test_a_batch_of_two_with_one_bad_text_still_answers_the_other():
    pred = FakePredictor(gate=threading.Event())
    b = DynamicBatcher([pred], max_wait_ms=0)
    b.submit([Item("hold", 1)])
    wait_until_taken(pred)
    bad, good = b.submit([Item(0, 2, bad=True), Item(1, 2)])
    pred.gate.set()
    assert good.result(60) == ("echo", 1)
    with pytest.raises(RuntimeError, match="^bad item$"):
        bad.result(60)
    assert b.close()
    assert pred.batches == [["hold"], [0, 1], [0], [1]]  # the pair, then each text alone


class ManualClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_callers_all_in_only_when_every_recent_caller_is_queued():
    clock = ManualClock()
    callers = batcher_module.Callers(window_s=1.0, clock=clock)
    assert not callers.all_in()  # nobody held: nothing to run early
    for _ in range(3):
        callers.arrive()
    callers.queued()
    callers.queued()
    assert not callers.all_in()  # one of the three is still being parsed / encoded
    callers.queued()
    assert callers.all_in() and callers.population() == 3
    callers.leave(queued=True)  # answered; its client sends its next request later
    assert not callers.all_in()  # two held of three seen: the third may join
    callers.arrive()
    assert not callers.all_in()
    callers.leave(queued=False)  # refused before its texts were queued
    assert callers.held == 2 and callers.preparing == 0
    assert not callers.all_in()
    clock.now = 1.5  # a new window: the old peak still counts ...
    callers.arrive()
    callers.queued()
    assert callers.population() == 3 and callers.all_in()
    for _ in range(3):
        callers.leave(queued=True)
    clock.now = 3.0  # ... until two windows have passed without three callers
    callers.arrive()
    callers.queued()
    assert callers.population() == 3 and not callers.all_in()  # the previous window's peak
    clock.now = 4.5
    callers.arrive()
    callers.queued()
    assert callers.population() == 2 and callers.all_in()


def test_a_batch_runs_without_waiting_once_every_caller_is_queued():
    pred = FakePredictor()
    callers = batcher_module.Callers()
    b = DynamicBatcher([pred], max_wait_ms=NEVER_MS, max_batch_size=64, callers=callers)
    for _ in range(3):
        callers.arrive()
    callers.queued()
    callers.queued()
    futures = b.submit([Item(0, 2), Item(1, 2)])
    assert not b._ready(time.monotonic())  # the third caller could still join
    callers.queued()
    futures += b.submit([Item(2, 2)])
    wait_until_taken(pred)
    assert [f.result(120) for f in futures] == [("echo", i) for i in range(3)]
    assert pred.batches == [[0, 1, 2]]  # one batch: no one had run early
    assert b.close()
    assert b.metrics()["batches_all_queued"] == 1


def test_without_callers_the_batcher_waits_for_company():
    pred = FakePredictor()
    b = DynamicBatcher([pred], max_wait_ms=NEVER_MS, max_batch_size=64)
    b.submit([Item(0, 2)])
    assert not b._ready(time.monotonic())
    assert b.close()  # draining runs it
    assert pred.batches == [[0]] and b.metrics()["batches_all_queued"] == 0


def test_a_submit_wakes_the_workers_only_when_it_changes_what_they_wait_for():
    pred = FakePredictor()
    b = DynamicBatcher([pred], max_wait_ms=NEVER_MS, max_batch_size=3)
    wakes = []
    notify_all = b._cond.notify_all
    b._cond.notify_all = lambda: (wakes.append(len(b._pending)), notify_all())
    futures = b.submit([Item(0, 2)])  # into an empty queue: the worker needs a deadline
    futures += b.submit([Item(1, 2)])  # same oldest text, same deadline: no wake-up
    assert wakes == [1]
    futures += b.submit([Item(2, 2)])  # a full batch: ready now
    assert wakes == [1, 3]
    assert [f.result(120) for f in futures] == [("echo", i) for i in range(3)]
    assert pred.batches == [[0, 1, 2]]
    assert b.close()
