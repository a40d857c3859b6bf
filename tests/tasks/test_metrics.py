"""Metrics against hand-computed cases (and scikit-learn for macro-F1)."""
import numpy as np
import pytest

from ppvarlen.metrics import accuracy, bio_spans, entity_prf, macro_f1


def test_accuracy_and_macro_f1_by_hand():
    preds, labels = [0, 0, 1, 1], [0, 1, 1, 1]
    assert accuracy(preds, labels) == 0.75
    # class 0: tp=1 fp=1 fn=0 -> 2/3 ; class 1: tp=2 fp=0 fn=1 -> 4/5
    assert macro_f1(preds, labels, 2) == pytest.approx((2 / 3 + 4 / 5) / 2)


def test_macro_f1_matches_sklearn():
    f1_score = pytest.importorskip("sklearn.metrics").f1_score  # not a package dependency

    rng = np.random.default_rng(0)
    labels, preds = rng.integers(0, 3, 200), rng.integers(0, 3, 200)
    assert macro_f1(preds, labels, 3) == pytest.approx(f1_score(labels, preds, average="macro"))


def test_macro_f1_all_one_class_predicted():
    # predicting only class 0 on a 2-class problem: class 1 F1 = 0 pulls the mean down
    assert macro_f1([0, 0, 0, 0], [0, 0, 1, 1], 2) == pytest.approx((2 * 2 / (2 * 2 + 2) + 0) / 2)


def test_bio_spans_basic_and_adjacent():
    assert bio_spans(["B-PER", "I-PER", "O", "B-LOC"]) == {("PER", 0, 2), ("LOC", 3, 4)}
    assert bio_spans(["B-PER", "B-PER"]) == {("PER", 0, 1), ("PER", 1, 2)}
    assert bio_spans(["O", "O"]) == set()


def test_bio_spans_i_without_b_starts_entity():
    assert bio_spans(["O", "I-PER", "I-PER", "O"]) == {("PER", 1, 3)}
    assert bio_spans(["I-ORG"]) == {("ORG", 0, 1)}
    # type switch inside an entity ends it and starts a new one
    assert bio_spans(["B-PER", "I-LOC", "I-LOC"]) == {("PER", 0, 1), ("LOC", 1, 3)}


def test_bio_spans_rejects_non_bio():
    with pytest.raises(ValueError, match="not a BIO tag"):
        bio_spans(["B-PER", "X-LOC"])


def test_entity_prf_hand_computed():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "I-ORG", "I-ORG"]]
    pred = [["B-PER", "I-PER", "O", "O"],      # PER right, LOC missed
            ["B-ORG", "I-ORG", "O"]]          # ORG span too short: wrong
    out = entity_prf(pred, gold)
    # tp=1, predicted=2, gold=3
    assert out["precision"] == pytest.approx(1 / 2)
    assert out["recall"] == pytest.approx(1 / 3)
    assert out["f1"] == pytest.approx(2 * (1 / 2) * (1 / 3) / (1 / 2 + 1 / 3))
    assert out["per_type_f1"] == {"LOC": 0.0, "ORG": 0.0, "PER": 1.0}


def test_entity_prf_i_without_b_counts_as_entity_in_prediction():
    gold = [["O", "B-LOC", "I-LOC"]]
    pred = [["O", "I-LOC", "I-LOC"]]   # same span, seqeval default mode accepts it
    assert entity_prf(pred, gold)["f1"] == 1.0


def test_entity_prf_length_mismatch_is_an_error():
    with pytest.raises(ValueError, match="sequence 0"):
        entity_prf([["O"]], [["O", "O"]])
