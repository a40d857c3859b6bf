"""data/longtext.py at its edges: exact messages, boundaries, dtypes and the split log.

Written against the mutants benchmarks/mutation.py found alive (docs/mutation/longtext.md):
each expected value is worked out by hand from the module's contract.
"""
import logging

import numpy as np
import pytest

from ppvarlen.data.errors import DataError
from ppvarlen.data.longtext import (LongTextStats, aggregate_classification, aggregate_tokens,
                                    clause_spans, plan_spans, window_spans)


def test_window_spans_messages_and_the_exact_fit():
    with pytest.raises(ValueError, match=r"^window must be >= 1 token, got 0$"):
        window_spans(5, 0, 0)
    with pytest.raises(ValueError, match=r"Data.stride \(window overlap\) must be in \[0, 4\)"
                                         r" for windows of 4 content tokens, got 4"):
        window_spans(9, 4, 4)
    assert window_spans(4, 4, 1) == [(0, 4)]  # exactly one window: no second, aligned one
    assert window_spans(5, 4, 1) == [(0, 4), (1, 5)]
    assert window_spans(10, 4, 1) == [(0, 4), (3, 7), (6, 10)]


def test_clause_spans_cut_after_punctuation_that_ends_the_text_exactly():
    tokens = list("ab，cd")  # 5 tokens, max 5: fits whole, no cut at the comma
    assert clause_spans(tokens, 5) == [(0, 5)]
    assert clause_spans(list("ab，cdef"), 5) == [(0, 3), (3, 7)]
    with pytest.raises(ValueError, match=r"^clause_spans: max_content must be >= 1, got 0$"):
        clause_spans(tokens, 0)


def test_plan_spans_messages_and_the_one_token_budget():
    with pytest.raises(ValueError, match=r"^Data.long_text must be one of \('truncate', "
                                         r"'window', 'error'\), got 'cut'$"):
        plan_spans(3, 5, "cut", 0, "x")
    with pytest.raises(ValueError, match=r"^Data.max_len leaves 0 tokens for content after "
                                         r"special tokens; raise Data.max_len$"):
        plan_spans(3, 0, "truncate", 0, "x")
    assert plan_spans(3, 1, "truncate", 0, "x") == [(0, 1)]  # one content token is enough
    assert plan_spans(3, 1, "window", 0, "x") == [(0, 1), (1, 2), (2, 3)]
    with pytest.raises(DataError, match=r"^train.txt line 2: 3 tokens > 1 allowed"):
        plan_spans(3, 1, "error", 0, "train.txt line 2")


def test_stats_count_windows_offsets_and_two_window_documents():
    stats = LongTextStats("dev", "window")
    stats.add(6, [(2, 6)])  # a span starting at 2: 4 of 6 kept
    stats.add(8, [(0, 5), (3, 8)])  # two windows cover all 8
    stats.add(3, [(0, 3)])
    assert stats.as_dict() == {"policy": "window", "documents": 3, "long_documents": 2,
                               "truncated": 0, "tokens_lost": 0, "windows": 4}
    trunc = LongTextStats("train", "truncate")
    trunc.add(6, [(2, 6)])
    assert trunc.as_dict()["tokens_lost"] == 2 and trunc.as_dict()["truncated"] == 1


def test_stats_log_says_what_was_done():
    # a handler of the test's own on the module's logger: what other tests did to the logging
    # tree (propagation, handlers, caplog) can neither add nor hide records
    seen = []
    handler = logging.Handler(logging.INFO)
    handler.emit = seen.append
    logger = logging.getLogger("ppvarlen.data.longtext")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        trunc = LongTextStats("train", "truncate")
        trunc.add(10, [(0, 4)])
        trunc.add(3, [(0, 3)])
        trunc.log()
        windows = LongTextStats("dev", "window")
        windows.add(8, [(0, 5), (3, 8)])
        windows.log()
        quiet = LongTextStats("test", "window")
        quiet.add(3, [(0, 3)])
        quiet.log()
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    records = [(r.levelname, r.getMessage()) for r in seen]
    assert records == [
        ("WARNING", "train: truncated 1 of 2 examples to Data.max_len (6 tokens lost); set "
                    "Data.long_text: window to keep them"),
        ("INFO", "dev: 1 long documents split into windows (2 items from 1 documents)")]


def test_aggregate_classification_types_shapes_and_message():
    ids, mean = aggregate_classification([3, 1, 3], [[1, 2], [5, 5], [3, 4]])
    assert ids.dtype == np.int64 and mean.dtype == np.float32
    np.testing.assert_array_equal(ids, [1, 3])
    np.testing.assert_array_equal(mean, [[5, 5], [2, 3]])
    # integer logits are averaged as floats (7/2 = 3.5, not floor 3)
    _, halves = aggregate_classification([0, 0], [[3], [4]])
    assert halves.tolist() == [[3.5]]
    # 1-d scores: one per window
    _, flat = aggregate_classification(["2", "2", "5"], [1.0, 2.0, 7.0])
    assert flat.tolist() == [1.5, 7.0]
    with pytest.raises(ValueError, match=r"^aggregate_classification: 2 doc ids but 3 logit "
                                         r"rows$"):
        aggregate_classification([0, 1], np.zeros((3, 2)))


def test_aggregate_tokens_keeps_dtype_and_row_shape_and_names_the_gap():
    ids, docs = aggregate_tokens([0, 0], [0, 2], [np.array([[1, 1], [2, 2], [3, 3]], np.int8),
                                                  np.array([[4, 4], [5, 5]], np.int8)])
    assert docs[0].dtype == np.int8 and docs[0].shape == (4, 2)
    # position 2: centrality 0 in window 0, 0 in window 1 -> the earlier window wins the tie
    assert docs[0].tolist() == [[1, 1], [2, 2], [3, 3], [5, 5]]
    _, floats = aggregate_tokens([7], [0], [np.array([0.25, 0.5])])
    assert floats[0].dtype == np.float64 and floats[0].tolist() == [0.25, 0.5]
    with pytest.raises(ValueError, match=r"^aggregate_tokens: doc_ids, offsets and "
                                         r"window_outputs differ in length$"):
        aggregate_tokens([0], [0, 1], [[1]])
    with pytest.raises(ValueError, match=r"^aggregate_tokens: document 4 position 1 is covered "
                                         r"by no window; pass every window of the document$"):
        aggregate_tokens([4, 4], [0, 2], [[1], [2, 3]])
    with pytest.raises(ValueError, match="document 4 position 0 is covered by no window"):
        aggregate_tokens([4], [1], [[1]])


def test_aggregate_classification_returns_int64_doc_ids_for_any_integer_input():
    # doc ids are int64 everywhere (the collator's doc_id field); an int32 array in is no exception
    ids, mean = aggregate_classification(np.array([7, 2, 7], dtype=np.int32),
                                         np.array([[1.0], [4.0], [2.0]], dtype=np.float32))
    assert ids.dtype == np.int64 and ids.tolist() == [2, 7]
    assert mean.tolist() == [[4.0], [1.5]]
