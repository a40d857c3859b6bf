"""data/tagschemes.py and the chunk path of tasks/tagging.py at their edges: exact messages,
tag shapes at the length limits, scheme completion, served answers stitched from windows.

Written against the mutants benchmarks/mutation.py left alive (docs/mutation/tagging.md);
every expected value is written out by hand from the rules in the modules' docstrings.
"""
import types

import pytest

from ppvarlen.data import tagschemes
from ppvarlen.tasks import get_task

BIO = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]


def test_split_tag_refuses_what_is_not_prefix_dash_type():
    assert tagschemes.split_tag("B-") is None      # a dash and no type
    assert tagschemes.split_tag("X-LOC") is None   # no chunk prefix
    assert tagschemes.split_tag("NNP") is None     # long, but no dash
    assert tagschemes.split_tag("B-P") == ("B", "P")
    assert tagschemes.split_tag("S") == ("S", "")


def test_expected_tags_wording():
    assert tagschemes.expected_tags("plain") == ("any tag without spaces (plain per-token labels "
                                                 "such as POS tags)")
    assert tagschemes.expected_tags("bioes") == ("one of O, B-TYPE, I-TYPE, E-TYPE, S-TYPE, or "
                                                 "untyped B, I, E, S")


def test_detect_messages_show_the_first_three_and_two_tags():
    with pytest.raises(ValueError, match=r"^chunk tags \(B-LOC, B-ORG, B-PER\) and plain tags "
                                         r"\(NN, NNP, VB\) are mixed$"):
        tagschemes.detect(["B-PER", "B-LOC", "B-ORG", "B-X", "NN", "VB", "NNP", "VV"])
    with pytest.raises(ValueError, match=r"^BIO/BIOES inside tags \(I-LOC, I-ORG\) and BMES "
                                         r"middle tags \(M-LOC, M-ORG\) are mixed$"):
        tagschemes.detect(["B-PER", "I-PER", "I-LOC", "I-ORG", "M-PER", "M-LOC", "M-ORG"])


def test_detect_reads_e_alone_as_bioes():
    assert tagschemes.detect(["O", "B-X", "I-X", "E-X"]) == "bioes"  # E without S


def test_complete_when_nothing_is_missing_or_only_o_is_there():
    # S-PER already tells BIOES apart: nothing to add although E-PER is absent
    assert tagschemes.complete(["O", "B-PER", "I-PER", "S-PER"], "bioes") == []
    # only O: the scheme's untyped prefixes, in label order
    assert tagschemes.complete(["O"], "bmes") == ["B", "M", "E", "S"]
    assert tagschemes.order(["VB", "NN", "AD"], "plain") == ["AD", "NN", "VB"]


def test_sequence_problem_messages():
    sp = tagschemes.sequence_problem
    assert sp(["E-PER", "O"], "bioes") == (
        "tag 0 'E-PER' does not continue a chunk (after 'the start'); a BIOES chunk is "
        "B I* E or S")
    assert sp(["S-PER", "O", "I-PER"], "bioes") == (
        "tag 2 'I-PER' does not continue a chunk (after 'O'); a BIOES chunk is B I* E or S")
    assert sp(["O", "B-PER", "I-PER", "O"], "bioes") == (
        "the chunk ending at tag 2 ('I-PER') is not closed by E-/S-; a BIOES chunk is "
        "B I* E or S (is this line BIO?)")
    assert sp(["S", "B", "M"], "bmes") == (
        "the last chunk ('M') is not closed by E-/S-; a BMES chunk is B M* E or S "
        "(is this line BIO?)")


def test_plain_tags_have_no_chunks_message():
    with pytest.raises(ValueError, match=r"^plain tags have no chunks; score them by token "
                                         r"accuracy$"):
        tagschemes.read_chunks(["NN"], "plain")


def test_report_of_unwindowed_items_reads_them_from_position_zero():
    # items built without windows carry no "offset": each is its document from token 0
    dataset = [{"labels": [1, 2, 0], "doc_id": 0}, {"labels": [3, 4], "doc_id": 1}]
    report = get_task("tagging").report(dataset, [[1, 2, 0], [3, 0]], BIO)
    # gold chunks: PER(0-2) in doc 0, LOC(0-2) in doc 1; predicted: PER(0-2), LOC(0-1)
    assert report["num_examples"] == 2
    assert report["precision"] == pytest.approx(1 / 2)
    assert report["recall"] == pytest.approx(1 / 2)
    assert report["token_accuracy"] == pytest.approx(4 / 5)


def _predictor(add_special_tokens):
    return types.SimpleNamespace(add_special_tokens=add_special_tokens, label_names=BIO)


def _item(text, offsets, truncated=False):
    return types.SimpleNamespace(text=text, spans=[(k, k + 1) for k in range(len(text))],
                                 offsets=offsets, num_tokens=len(text), truncated=truncated)


def test_response_stitches_windows_and_gives_character_offsets():
    # "江泽民在北京" in two windows of 4 content tokens (offsets 0 and 2), each with its two
    # special tokens.  Position 3 (在) is more central in the second window (1 vs 0), which
    # says O; the first window's B-LOC there must lose.
    text = "江泽民在北京"
    window0 = [0] + [1, 2, 2, 3] + [0]
    window1 = [0] + [1, 0, 3, 4] + [0]  # its position 2 (B-PER) loses to window 0's I-PER
    answer = get_task("tagging").response(_predictor(True), _item(text, [0, 2]),
                                          [window0, window1])
    assert answer == {
        "entities": [{"type": "PER", "text": "江泽民", "start": 0, "end": 3},
                     {"type": "LOC", "text": "北京", "start": 4, "end": 6}],
        "tags": ["B-PER", "I-PER", "I-PER", "O", "B-LOC", "I-LOC"],
        "repaired_chunks": 0, "num_tokens": 6, "truncated": False}


def test_response_without_specials_counts_repairs_and_keeps_kept_tokens_only():
    # a truncated text: 2 of its 3 characters were kept; I-PER I-PER reads as one PER chunk
    # that does not start with B (repaired)
    answer = get_task("tagging").response(_predictor(False), _item("李四x", [0], True),
                                          [[2, 2]])
    assert answer == {"entities": [{"type": "PER", "text": "李四", "start": 0, "end": 2}],
                      "tags": ["I-PER", "I-PER"], "repaired_chunks": 1, "num_tokens": 3,
                      "truncated": True}


def test_answer_counts_count_sequences_and_chunks_repaired():
    results = [{"repaired_chunks": 0}, {"repaired_chunks": 2}, {"repaired_chunks": 1}]
    assert get_task("tagging").answer_counts(results) == {"tag_sequences_repaired": 2,
                                                          "tag_chunks_repaired": 3}
