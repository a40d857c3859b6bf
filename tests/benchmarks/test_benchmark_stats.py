"""The statistics benchmarks/sentiment_splits.py reports (an exact McNemar test, a paired summary)."""
import pytest
from scipy.stats import binomtest
from script_loader import load_script


def _module():
    return load_script("benchmarks/sentiment_splits.py")


@pytest.mark.parametrize("a,b", [(76, 53), (53, 76), (10, 0), (3, 4), (120, 80), (1, 1)])
def test_mcnemar_exact_equals_the_two_sided_binomial_test(a, b):
    assert _module().mcnemar_exact(a, b) == pytest.approx(binomtest(a, a + b, 0.5).pvalue, rel=1e-9)


def test_mcnemar_without_discordant_pairs_is_one():
    assert _module().mcnemar_exact(0, 0) == 1.0


def test_summary_pools_discordant_pairs_and_counts_wins():
    rows = [{"difference": d, "model_accuracy": 0.8 + d, "baseline_accuracy": 0.8,
             "only_model_right": m, "only_baseline_right": b}
            for d, m, b in ((0.02, 30, 10), (-0.01, 10, 15), (0.03, 40, 10))]
    s = _module().summarize(rows)
    assert s["splits_model_better"] == 2 and s["splits"] == 3
    assert s["mean_difference"] == pytest.approx(0.04 / 3)
    assert s["sd_difference"] == pytest.approx(0.0208167, rel=1e-5)
    assert (s["pooled_only_model_right"], s["pooled_only_baseline_right"]) == (80, 35)
    assert s["pooled_mcnemar_p"] == pytest.approx(binomtest(80, 115, 0.5).pvalue, rel=1e-9)
