"""DynamicBatcher with a stand-in predictor: grouping, bounds, isolation, draining (no model)."""
import threading
import time

import numpy as np
import pytest

from ppvarlen.serve.batcher import BatcherClosed, DynamicBatcher, QueueFull


class Item:
    def __init__(self, value, num_tokens, bad=False):
        self.value, self.num_tokens, self.bad = value, num_tokens, bad


class FakePredictor:
    """Echoes each item's value; records every batch; fails the whole batch on a bad item."""

    def __init__(self, gate=None):
        self.batches, self.gate = [], gate  # a batch waits at ``gate`` until the test opens it
        self.real_tokens = self.padded_tokens = 0

    def predict_encoded(self, items):
        self.batches.append([it.value for it in items])
        if self.gate is not None:
            assert self.gate.wait(300), "the test never opened the gate"
        if any(it.bad for it in items):
            raise RuntimeError("bad item")
        self.real_tokens += sum(it.num_tokens for it in items)
        self.padded_tokens += max(it.num_tokens for it in items) * len(items)
        return [("echo", it.value) for it in items]


def test_results_match_callers_and_batches_form_under_concurrency():
    # the first batch waits at the gate until all 20 callers have submitted, so the rest
    # queue up together however slowly the threads run on a loaded machine
    pred = FakePredictor(gate=threading.Event())
    b = DynamicBatcher([pred], max_wait_ms=50, max_batch_tokens=1000, max_batch_size=8)
    futures = {}

    def client(k):
        futures[k] = b.submit([Item(k, 5 + k % 7)])[0]

    threads = [threading.Thread(target=client, args=(k,)) for k in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
        assert not t.is_alive(), "submit blocked"
    pred.gate.set()
    assert {k: f.result(120) for k, f in futures.items()} == {k: ("echo", k) for k in range(20)}
    assert b.close()
    sizes = [len(x) for x in pred.batches]
    assert sum(sizes) == 20 and max(sizes) > 1, sizes  # texts shared forward passes
    assert max(sizes) <= 8
    m = b.metrics()
    assert m["items"] == 20 and m["batches"] == len(pred.batches)
    assert 0 < m["padding_efficiency"] <= 1


def test_token_budget_counts_padding_and_groups_by_length():
    pred = FakePredictor()
    b = DynamicBatcher([pred], max_wait_ms=200, max_batch_tokens=40, max_batch_size=100)
    lengths = [20, 2, 19, 3, 18, 2]
    futs = b.submit([Item(i, n) for i, n in enumerate(lengths)])
    for f in futs:
        f.result(120)
    b.close()
    for batch in pred.batches:
        assert max(lengths[i] for i in batch) * len(batch) <= 40
    # the short texts share a batch rather than being padded to 20
    assert any(set(batch) >= {1, 5} for batch in pred.batches), pred.batches


def test_padding_must_be_cheaper_than_a_separate_pass():
    def batches(overhead):
        pred = FakePredictor()
        b = DynamicBatcher([pred], max_wait_ms=100, max_batch_tokens=10_000, max_batch_size=100,
                           overhead_tokens=overhead)
        lengths = [200, 20, 21, 199, 22, 200]
        for f in b.submit([Item(i, n) for i, n in enumerate(lengths)]):
            f.result(120)
        b.close()
        return sorted(sorted(x) for x in pred.batches)

    assert batches(0) == [[0, 5], [1], [2], [3], [4]]       # only equal lengths share a pass
    assert batches(10) == [[0, 3, 5], [1, 2, 4]]             # short and long kept apart
    assert batches(100_000) == [[0, 1, 2, 3, 4, 5]]          # passes so costly: one batch


def test_plan_groups_is_the_cheapest_split():
    import itertools

    from ppvarlen.serve.batcher import plan_groups

    def cost(groups, lengths, overhead):
        return sum(overhead + (b - a) * lengths[b - 1] for a, b in groups)

    rng = np.random.default_rng(0)
    for _ in range(30):
        lengths = sorted(int(x) for x in rng.integers(1, 60, rng.integers(1, 8)))
        overhead, max_size = int(rng.integers(0, 80)), int(rng.integers(1, 5))
        plan = plan_groups(lengths, overhead, 120, max_size)
        assert [a for a, _ in plan][1:] == [b for _, b in plan][:-1] and plan[-1][1] == len(lengths)
        assert all(b - a <= max_size and ((b - a) * lengths[b - 1] <= 120 or b - a == 1)
                   for a, b in plan)
        # brute force over every set of cut points that respects the limits
        n, best = len(lengths), None
        for k in range(n):
            for cuts in itertools.combinations(range(1, n), k):
                bounds = list(zip((0,) + cuts, cuts + (n,)))
                if all(b - a <= max_size and ((b - a) * lengths[b - 1] <= 120 or b - a == 1)
                       for a, b in bounds):
                    c = cost(bounds, lengths, overhead)
                    best = c if best is None else min(best, c)
        assert cost(plan, lengths, overhead) == best


def test_plan_groups_with_measured_costs_is_the_cheapest_split_on_the_grid():
    """A grid engine's cost per (size, longest): sizes it has no figure for are not formed
    (a text alone always is), and the plan is the cheapest by those costs."""
    import itertools

    from ppvarlen.runtime.backends import ShapeGrid
    from ppvarlen.serve.batcher import plan_groups

    grid = ShapeGrid([1, 4, 16], [16, 32, 64])
    grid.costs = {(r, w): 0.02 + 0.001 * r * w for r, w in grid.shapes()}
    rng = np.random.default_rng(1)
    for _ in range(30):
        lengths = sorted(int(x) for x in rng.integers(1, 65, rng.integers(1, 9)))
        plan = plan_groups(lengths, 0, 4096, 64, grid.cost)
        assert [a for a, _ in plan][1:] == [b for _, b in plan][:-1] and plan[-1][1] == len(lengths)
        n, best = len(lengths), None
        for k in range(n):
            for cuts in itertools.combinations(range(1, n), k):
                bounds = list(zip((0,) + cuts, cuts + (n,)))
                c = sum(grid.cost(b - a, lengths[b - 1]) for a, b in bounds)
                best = c if best is None else min(best, c)
        assert sum(grid.cost(b - a, lengths[b - 1]) for a, b in plan) == pytest.approx(best)
    # 17 texts: no grid shape holds them together
    assert all(b - a <= 16 for a, b in plan_groups([5] * 17, 0, 4096, 64, grid.cost))
    # a cost function with no figure at all still places every text, alone
    assert plan_groups([3, 4], 0, 4096, 64, lambda size, longest: None) == [(0, 1), (1, 2)]


def test_each_worker_warms_up_in_its_own_thread_before_the_batcher_is_ready():
    """Paddle caches oneDNN kernels per thread: a warm-up counts only in the thread that
    runs the batches; the constructor returns once every worker is warm."""
    seen = []

    def warm(predictor):
        time.sleep(0.05)
        seen.append((predictor, threading.current_thread().name))

    predictors = [FakePredictor(), FakePredictor()]
    b = DynamicBatcher(predictors, warmup=warm)
    assert sorted(name for _, name in seen) == ["batcher-0", "batcher-1"]
    assert {id(p) for p, _ in seen} == {id(p) for p in predictors}
    assert b.submit([Item(1, 3)])[0].result(30) == ("echo", 1)
    assert b.close()

    def broken(predictor):
        raise RuntimeError("no kernels for this shape")

    with pytest.raises(RuntimeError, match="no kernels for this shape"):
        DynamicBatcher([FakePredictor()], warmup=broken)


def test_wait_is_bounded_for_a_lone_request():
    # a lone request is answered although no batchmate ever comes (no wall-clock bound: a
    # batcher that waited for a full batch would never answer and hit the generous timeout)
    pred = FakePredictor()
    b = DynamicBatcher([pred], max_wait_ms=30, max_batch_tokens=1000, max_batch_size=64)
    assert b.submit([Item(1, 4)])[0].result(120) == ("echo", 1)
    assert pred.batches == [[1]]
    b.close()


def test_bad_item_fails_alone():
    pred = FakePredictor()
    b = DynamicBatcher([pred], max_wait_ms=100, max_batch_tokens=1000, max_batch_size=8)
    futs = b.submit([Item(0, 3), Item(1, 3, bad=True), Item(2, 3)])
    assert futs[0].result(120) == ("echo", 0) and futs[2].result(120) == ("echo", 2)
    with pytest.raises(RuntimeError, match="bad item"):
        futs[1].result(120)
    b.close()
    assert b.metrics()["failed_items"] == 1


def test_queue_full_is_all_or_nothing_and_close_drains():
    pred = FakePredictor(gate=threading.Event())  # item 0's batch holds the worker
    b = DynamicBatcher([pred], max_wait_ms=0, max_batch_tokens=1000, max_batch_size=1,
                       queue_size=3)
    first = b.submit([Item(0, 2)])
    deadline = time.monotonic() + 120
    while not pred.batches:  # the worker has taken item 0 and waits at the gate
        assert time.monotonic() < deadline, "the worker never took item 0"
        time.sleep(0.001)
    accepted = b.submit([Item(1, 2), Item(2, 2), Item(3, 2)])
    with pytest.raises(QueueFull):
        b.submit([Item(4, 2)])
    assert b.queue_depth() == 3  # all or nothing: none of the refused request was queued
    pred.gate.set()
    assert b.close(drain=True)  # returns only when the queue is empty
    assert [f.result(0) for f in first + accepted] == [("echo", k) for k in range(4)]
    with pytest.raises(BatcherClosed):
        b.submit([Item(5, 2)])


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="max_batch_size"):
        DynamicBatcher([FakePredictor()], max_batch_size=0)
    with pytest.raises(ValueError, match="predictor"):
        DynamicBatcher([])


def test_several_workers_run_every_text_exactly_once():
    # workers plan outside the lock, on a copy of the queue's head: two may plan the same
    # text, and only one of them may run it
    preds = [FakePredictor() for _ in range(3)]
    b = DynamicBatcher(preds, max_wait_ms=1, max_batch_tokens=60, max_batch_size=4)
    futures = {}

    def client(k):
        for j in range(25):
            futures[(k, j)] = b.submit([Item((k, j), 1 + (k * j) % 13)])[0]
            time.sleep(0.0005 * (j % 3))

    threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert {key: f.result(120) for key, f in futures.items()} == {
        key: ("echo", key) for key in futures}
    assert b.close()
    ran = [v for p in preds for batch in p.batches for v in batch]
    assert sorted(ran) == sorted(futures) and len(ran) == 200
    assert b.metrics()["items"] == 200 and b.queue_depth() == 0


class ThreadedFake(FakePredictor):
    """A FakePredictor of ``threads`` math threads whose batches take ``hold_s``, noting the
    threads running at once (``tally``, shared by the predictors of one batcher)."""

    def __init__(self, threads, tally, hold_s=0.05):
        super().__init__()
        self.threads, self.tally, self.hold_s = threads, tally, hold_s

    def predict_encoded(self, items):
        with self.tally["lock"]:
            self.tally["running"].append(self)
            self.tally["seen"].append(sorted(p.threads for p in self.tally["running"]))
        time.sleep(self.hold_s)
        with self.tally["lock"]:
            self.tally["running"].remove(self)
        return super().predict_encoded(items)


def test_a_lone_text_runs_on_all_threads_and_queued_batches_one_thread_each():
    """Deploy.split_threads_under_load: the 2-thread predictor takes a text that is alone
    with nothing running; batches that queue run on the 1-thread ones, two at once, never
    beside the wide one (the threads in use never pass 2); every answer is its own text's."""
    tally = {"lock": threading.Lock(), "running": [], "seen": []}
    wide, narrow = ThreadedFake(2, tally), [ThreadedFake(1, tally), ThreadedFake(1, tally)]
    b = DynamicBatcher([wide] + narrow, max_wait_ms=1, max_batch_tokens=1000,
                       max_batch_size=64)
    try:
        for k in range(3):  # one caller at a time: all on the wide predictor
            assert b.submit([Item(k, 5)])[0].result(60) == ("echo", k)
        assert wide.batches == [[0], [1], [2]] and not any(p.batches for p in narrow)
        # 40 callers at once: the queue splits between the narrow predictors
        futures = {k: b.submit([Item(k, 3 + k % 5)])[0] for k in range(100, 140)}
        assert {k: f.result(60) for k, f in futures.items()} == \
            {k: ("echo", k) for k in futures}
    finally:
        b.close()
    assert all(sum(threads) <= 2 for threads in tally["seen"]), tally["seen"]
    assert [1, 1] in tally["seen"]  # two narrow batches ran at once
    assert all(threads in ([2], [1], [1, 1]) for threads in tally["seen"]), tally["seen"]
    ran = sorted(v for p in narrow for batch in p.batches for v in batch)
    ran_wide = sorted(v for batch in wide.batches for v in batch if v >= 100)
    assert sorted(ran + ran_wide) == list(range(100, 140))
    assert b.metrics()["batches_narrow"] == sum(len(p.batches) for p in narrow) >= 2
