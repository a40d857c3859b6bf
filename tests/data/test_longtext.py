"""Long-text policies on documents longer than max_len: counts, coverage, aggregation."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ppvarlen.data.errors import DataError
from ppvarlen.data.longtext import (CLAUSE_END, LongTextStats, aggregate_classification,
                                    aggregate_tokens, clause_spans, plan_spans, window_spans)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(n=st.integers(1, 400), window=st.integers(1, 64), data=st.data())
def test_windows_cover_every_token_with_the_overlap(n, window, data):
    overlap = data.draw(st.integers(0, window - 1))
    spans = window_spans(n, window, overlap)
    covered = np.zeros(n, dtype=int)
    for s, e in spans:
        assert 0 <= s < e <= n and e - s == min(window, n)
        covered[s:e] += 1
    assert covered.min() >= 1
    for (s0, e0), (s1, e1) in zip(spans, spans[1:]):
        assert s1 > s0 and e0 - s1 >= overlap  # neighbours overlap by at least `overlap`


def test_truncate_counts_examples_and_lost_tokens():
    stats = LongTextStats("train", "truncate")
    for n in (10, 50, 51, 130):
        stats.add(n, plan_spans(n, 50, "truncate", 0, f"doc {n}"))
    d = stats.as_dict()
    assert (d["documents"], d["truncated"], d["tokens_lost"]) == (4, 2, 1 + 80)
    assert d["long_documents"] == 2 and d["windows"] == 4


def test_window_policy_counts_windows():
    stats = LongTextStats("dev", "window")
    for n in (10, 130):
        stats.add(n, plan_spans(n, 50, "window", 10, "doc"))
    d = stats.as_dict()
    assert (d["documents"], d["long_documents"], d["truncated"], d["windows"]) == (2, 1, 0, 1 + 3)


def test_error_policy_names_the_document():
    with pytest.raises(DataError, match=r"train.txt line 7: 130 tokens > 50.*Data.long_text"):
        plan_spans(130, 50, "error", 0, "train.txt line 7")
    assert plan_spans(50, 50, "error", 0, "x") == [(0, 50)]


def test_bad_stride_is_a_clear_error():
    with pytest.raises(ValueError, match="Data.stride"):
        plan_spans(100, 20, "window", 20, "doc")


def test_classification_aggregation_one_row_per_document():
    doc_ids = [3, 1, 3, 3]
    logits = np.array([[1.0, 0.0], [0.0, 2.0], [3.0, 0.0], [2.0, 3.0]])
    ids, agg = aggregate_classification(doc_ids, logits)
    assert ids.tolist() == [1, 3]
    np.testing.assert_allclose(agg, [[0.0, 2.0], [2.0, 1.0]])


@settings(max_examples=40, deadline=None, derandomize=True)
@given(lengths=st.lists(st.integers(1, 120), min_size=1, max_size=5), window=st.integers(4, 30),
       data=st.data())
def test_token_aggregation_restores_each_document(lengths, window, data):
    overlap = data.draw(st.integers(0, window - 1))
    doc_ids, offsets, outputs, truth = [], [], [], []
    for doc, n in enumerate(lengths):
        tags = np.arange(n) * 10 + doc  # each token's true output
        truth.append(tags)
        for s, e in window_spans(n, window, overlap):
            doc_ids.append(doc), offsets.append(s), outputs.append(tags[s:e])
    ids, per_doc = aggregate_tokens(doc_ids, offsets, outputs)
    assert ids == list(range(len(lengths)))
    for got, want in zip(per_doc, truth):
        np.testing.assert_array_equal(got, want)


def test_token_aggregation_prefers_the_most_central_window():
    # doc of 6 tokens, windows [0,4) and [2,6): token 2 is central in window 0 (dist 1 vs 0)
    out = aggregate_tokens([0, 0], [0, 2], [np.array([0, 0, 0, 0]), np.array([1, 1, 1, 1])])[1][0]
    assert out.tolist() == [0, 0, 0, 1, 1, 1]
    with pytest.raises(ValueError, match="covered by no window"):
        aggregate_tokens([0, 0], [0, 5], [np.zeros(3), np.zeros(2)])


@settings(max_examples=80, deadline=None, derandomize=True)
@given(tokens=st.lists(st.sampled_from(["字", "词", "，", "。", "!", "a"]), min_size=1, max_size=120),
       max_content=st.integers(1, 20))
def test_clause_spans_cover_every_token_and_cut_after_punctuation(tokens, max_content):
    spans = clause_spans(tokens, max_content)
    assert spans[0][0] == 0 and spans[-1][1] == len(tokens)
    for (s0, e0), (s1, _) in zip(spans, spans[1:]):
        assert e0 == s1  # consecutive: nothing dropped, nothing twice
    for s, e in spans:
        assert 0 < e - s <= max_content
    for s, e in spans[:-1]:
        reach = tokens[s:s + max_content]
        if any(t in CLAUSE_END for t in reach):  # a clause end within reach: the last one
            last = max(i for i, t in enumerate(reach) if t in CLAUSE_END)
            assert e == s + last + 1
        else:  # one clause longer than max_content: cut at the limit
            assert e - s == max_content


def test_clause_spans_pack_whole_clauses():
    tokens = list("今天天气不错，我们去公园散步吧。好的！")
    assert ["".join(tokens[s:e]) for s, e in clause_spans(tokens, 16)] == [
        "今天天气不错，我们去公园散步吧。", "好的！"]
    assert ["".join(tokens[s:e]) for s, e in clause_spans(tokens, 8)] == [
        "今天天气不错，", "我们去公园散步吧", "。好的！"]
    with pytest.raises(ValueError, match="max_content"):
        clause_spans(tokens, 0)
