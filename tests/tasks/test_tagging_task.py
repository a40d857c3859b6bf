"""tasks/tagging.py without a model: entities from chunks, item building, the per-document
report (checked against seqeval), engine rows.  Expected values are worked out by hand or
come from seqeval, never from ppvarlen's own chunker."""
import numpy as np
import pytest
from seqeval.metrics import f1_score, precision_score, recall_score
from seqeval.scheme import IOB2

from ppvarlen.data.errors import DataError
from ppvarlen.data.vocab import SPECIAL_TOKENS, TextEncoder
from ppvarlen.tasks import get_task
from ppvarlen.tasks.tagging import entities

BIO = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]


def test_entities_are_character_offsets_of_the_chunks():
    text = "江泽民在北京"
    spans = [(k, k + 1) for k in range(len(text))]
    tags = ["B-PER", "I-PER", "I-PER", "O", "B-LOC", "I-LOC"]
    assert entities(tags, spans, text, "bio") == ([
        {"type": "PER", "text": "江泽民", "start": 0, "end": 3},
        {"type": "LOC", "text": "北京", "start": 4, "end": 6}], 0)
    # word tokens: spans with gaps between them
    words = "Li  met  Wang"
    word_spans = [(0, 2), (4, 7), (9, 13)]
    assert entities(["B-PER", "O", "B-PER"], word_spans, words, "bio") == ([
        {"type": "PER", "text": "Li", "start": 0, "end": 2},
        {"type": "PER", "text": "Wang", "start": 9, "end": 13}], 0)
    assert entities(["N", "V"], [(0, 1), (1, 2)], "ab", "plain") == ([], 0)
    # an I- that continues no chunk starts one (conlleval's rule), counted as repaired
    assert entities(["I-PER", "I-PER"], [(0, 1), (1, 2)], "ab", "bio") == (
        [{"type": "PER", "text": "ab", "start": 0, "end": 2}], 1)


def test_example_ids_check_lengths_and_labels():
    task = get_task("tagging")
    encoder = TextEncoder(list(SPECIAL_TOKENS) + ["江", "北"])
    tag_ids = {t: k for k, t in enumerate(BIO)}
    ids, labels = task.example_ids(encoder, {"tokens": ["江", "北"], "tags": ["B-PER", "O"]},
                                   "f:1", tag_ids)
    assert ids == [len(SPECIAL_TOKENS), len(SPECIAL_TOKENS) + 1] and labels == [1, 0]
    with pytest.raises(DataError, match=r"^f:2: 2 tokens but 1 tags; every token needs exactly "
                                        r"one tag$"):
        task.example_ids(encoder, {"tokens": ["江", "北"], "tags": ["O"]}, "f:2", tag_ids)
    with pytest.raises(DataError, match=r"^f:3: tag 'B-ORG' is not one of the labels \['O', "):
        task.example_ids(encoder, {"tokens": ["江"], "tags": ["B-ORG"]}, "f:3", tag_ids)


def test_window_items_carry_offsets_and_ignore_specials():
    task = get_task("tagging")
    assert task.window_item({}, [1, 2, 3, 4], 1, 3, True, 7) == {
        "labels": [-100, 2, 3, -100], "doc_id": 7, "offset": 1}
    assert task.window_item({}, [1, 2, 3, 4], 2, 4, False, 0) == {
        "labels": [3, 4], "doc_id": 0, "offset": 2}


def test_report_stitches_windows_and_matches_seqeval():
    # doc 0: 6 tokens in two windows (offsets 0 and 2, 4 tokens each); doc 1: one window
    gold0 = [1, 2, 0, 3, 4, 0]
    gold1 = [3, 0, 1]
    dataset = [{"labels": [-100] + gold0[0:4] + [-100], "doc_id": 0, "offset": 0},
               {"labels": [-100] + gold0[2:6] + [-100], "doc_id": 0, "offset": 2},
               {"labels": [-100] + gold1 + [-100], "doc_id": 1, "offset": 0}]
    pred0 = [1, 2, 0, 3, 0, 0]  # LOC cut short: wrong chunk
    pred1 = [3, 0, 3]  # PER read as LOC
    # window rows (specials included, as predict_batch returns them); doc 0 positions 2..3 are
    # most central in window 0 (positions 2,3 -> centralities 1,0 vs 0,1 in window 1)
    outputs = [[0] + pred0[0:4] + [0], [0] + pred0[2:6] + [0], [0] + pred1 + [0]]
    report = get_task("tagging").report(dataset, outputs, BIO)
    names = lambda ids: [BIO[k] for k in ids]  # noqa: E731
    gold, pred = [names(gold0), names(gold1)], [names(pred0), names(pred1)]
    assert report["num_examples"] == 2
    assert report["f1"] == pytest.approx(f1_score(gold, pred, mode="strict", scheme=IOB2))
    assert report["precision"] == pytest.approx(precision_score(gold, pred, mode="strict",
                                                                scheme=IOB2))
    assert report["recall"] == pytest.approx(recall_score(gold, pred, mode="strict", scheme=IOB2))
    assert report["token_accuracy"] == pytest.approx(7 / 9)  # 2 of 9 tokens wrong


def test_engine_rows_cut_each_row_to_its_length():
    class NoCrf:
        crf_matrix = None

    tags = np.array([[1, 2, 3], [4, 0, 0]], dtype=np.int32)
    rows = get_task("tagging").engine_rows(NoCrf(), {"tags": tags}, [3, 1])
    assert [r.tolist() for r in rows] == [[1, 2, 3], [4]]
    assert all(r.dtype == np.int64 for r in rows)
