"""``runtime.timing.interleaved``: the one loop precision auto and threads auto time engines
with.  A fake clock: nothing here depends on this machine's speed."""
from ppvarlen.runtime import timing


class Clock:
    now = 0.0

    def __call__(self):
        return self.now


class Timed:
    """A predictor whose every batch takes ``cost`` seconds of ``clock``; ``ran`` records it."""

    def __init__(self, name, cost, clock, ran):
        self.name, self.cost, self.clock, self.ran = name, cost, clock, ran

    def run_engine(self, rows):
        self.ran.append(self.name)
        self.clock.now += self.cost

    def _reset_counters(self):
        pass


def test_min_rounds_outlasts_the_budget_and_a_warm_engine_skips_its_untimed_pass():
    clock, ran = Clock(), []
    engines = {1: Timed("one", 1.0, clock, ran), 2: Timed("two", 0.5, clock, ran)}
    best, rounds, took = timing.interleaved(engines, [[[5]]], 0.0, 5, (clock,), clock,
                                            min_rounds=2, warm={2})
    # only "one" warms up; then two rounds although the budget ran out before the first
    assert ran == ["one", "one", "two", "two", "one"]
    assert rounds == 2 and took == 4.0
    assert best == {1: [1.0], 2: [0.5]}


def test_a_burst_in_one_round_is_not_what_is_kept():
    clock, ran = Clock(), []
    engine = Timed("e", 1.0, clock, ran)
    costs = iter([1.0, 3.0, 1.0])  # untimed pass, a round slowed by other work, a quiet round

    def run_engine(rows):
        clock.now += next(costs)

    engine.run_engine = run_engine
    best, rounds, _ = timing.interleaved({"e": engine}, [[[5]]], 0.0, 5, (clock,), clock,
                                         min_rounds=2)
    assert rounds == 2 and best == {"e": [1.0]}
    clock.now, costs = 0.0, iter([1.0, 3.0])
    best, rounds, _ = timing.interleaved({"e": engine}, [[[5]]], 0.0, 5, (clock,), clock)
    assert rounds == 1 and best == {"e": [3.0]}  # one round: the burst is the timing
