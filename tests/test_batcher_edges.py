"""deploy/batcher.py at its edges: exact messages, metrics values, full batches that do not
wait, close with and without draining.

Written against the mutants benchmarks/mutation.py found alive (docs/mutation/batcher.md).
A gate holds the worker where a test needs the queue to stay put (no timing races).
"""
import threading
import time

import pytest
from test_deploy_batcher import FakePredictor, Item

from ppvarlen.deploy.batcher import BatcherClosed, DynamicBatcher, QueueFull

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
