"""Engines timed against each other on the same batches: the one loop ``precision auto``
(``precision_choice.measure``) and ``threads auto`` (``threads_choice.time_per_text``) time with.

One untimed pass each (oneDNN builds its kernels per new shape; ``warm``: keys that already
ran these batches skip it), then interleaved rounds, the order turned each round so a burst of
load elsewhere hits them all; each clock keeps each engine's fastest round.  Rounds stop at the
first after ``min_rounds`` that ends past ``budget_s`` of ``wall`` time (the untimed pass
counted), or after ``max_rounds``.
"""
import time


def interleaved(predictors, batches, budget_s, max_rounds, clocks, wall=time.monotonic,
                min_rounds=1, warm=()):
    """{key: [fastest round's seconds per clock]}, rounds, wall seconds taken."""
    order = list(predictors)
    start = wall()
    for key in order:
        if key in warm:
            continue
        for rows in batches:
            predictors[key].run_engine(rows)
    best = {key: [float("inf")] * len(clocks) for key in order}
    rounds = 0
    while rounds < max_rounds:
        for key in order:
            before = [clock() for clock in clocks]
            for rows in batches:
                predictors[key].run_engine(rows)
            best[key] = [min(b, clock() - t0) for b, clock, t0 in zip(best[key], clocks, before)]
        rounds += 1
        order = order[1:] + order[:1]
        if rounds >= min_rounds and wall() - start >= budget_s:
            break
    for predictor in predictors.values():
        predictor._reset_counters()  # timing is not traffic
    return best, rounds, wall() - start
