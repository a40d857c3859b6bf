"""data/order.py at its edges: the batch-by-batch path's first batch of a run, float lengths,
the per-run sortedness test.  Written against the mutants benchmarks/mutation.py left alive
(docs/mutation/order_samplers.md); every expected value is worked out by hand below."""
import numpy as np

from ppvarlen.data.order import _sorted_within, batch_cost, budget_cuts


def test_zero_length_rows_still_cut_after_the_first_example_that_fits_alone():
    # [n, 2] rows with a zero (the batch-by-batch path): example 0 costs 0; with example 1
    # the batch costs 2 x (60 + 40) = 200 > 150, so example 1 opens the second batch
    rows = np.array([[0, 0], [60, 40]])
    assert budget_cuts(rows, 150).tolist() == [1, 2]
    assert budget_cuts(rows, 200).tolist() == [2]  # exactly the budget: one batch


def test_float_lengths_are_truncated_when_packed_and_costed():
    # [2.7, 1.2, 3.9] packs as [2, 1, 3]: [2, 1] costs 2 x 2 = 4 <= 6, adding 3 costs
    # 3 x 3 = 9 > 6, so the batches are [0, 1] and [2]
    assert budget_cuts(np.array([2.7, 1.2, 3.9]), 6).tolist() == [2, 3]
    # the cost of a batch counts the same truncated lengths: 2 x max(2, 1) = 4
    assert batch_cost([0, 1], [2.5, 1.0]) == 4


def test_sorted_within_checks_each_run_apart():
    rows = np.array([1, 5, 2, 3])
    assert _sorted_within(rows, np.array([2, 4]))      # runs [1, 5] and [2, 3]
    assert not _sorted_within(rows, np.array([4]))     # one run: 5 then 2
    assert not _sorted_within(rows, np.array([1, 4]))  # run [5, 2, 3]
    assert _sorted_within(np.array([5, 1]), np.array([1, 2]))
