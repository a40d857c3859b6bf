"""data/collate.py at its edges: exact messages, boundaries, left padding, seq2seq fields.

Written against the mutants benchmarks/mutation.py found alive (docs/mutation/collate.md);
the expected arrays are written out by hand.
"""
import numpy as np
import pytest

from ppvarlen.data.collate import IGNORE_INDEX, Collator, pad_sequences
from ppvarlen.data.errors import DataError
from ppvarlen.data.store import StoreField
from ppvarlen.tasks import get_task


def test_pad_sequences_defaults_to_the_right_and_names_the_long_item():
    np.testing.assert_array_equal(pad_sequences([[1, 2], [3]], 0, 3), [[1, 2, 0], [3, 0, 0]])
    np.testing.assert_array_equal(pad_sequences([[1, 2], [3]], 0, 3, "left"),
                                  [[0, 1, 2], [0, 0, 3]])
    with pytest.raises(ValueError, match=r"^pad_sequences: item 1 has 4 tokens > target length "
                                         r"3$"):
        pad_sequences([[1], [1, 2, 3, 4]], 0, 3)


def test_target_length_of_one_token_and_an_exact_bucket():
    assert Collator(0).target_length(1) == 1
    assert Collator(0).target_length(0) == 1  # an empty batch row still gets one column
    assert Collator(0, bucket_boundaries=[8, 4]).target_length(4) == 4  # fits exactly
    assert Collator(0, bucket_boundaries=[4, 8]).target_length(5) == 8
    assert Collator(0, bucket_boundaries=[4, 8]).target_length(9) == 9  # longer than all


SEQ2SEQ = get_task("seq2seq").store_fields()
CLASSIFICATION = get_task("classification").store_fields()
TAGGING = get_task("tagging").store_fields()


def test_messages_name_the_problem():
    with pytest.raises(ValueError, match=r"^Collator got an empty batch$"):
        Collator(0)([])
    with pytest.raises(DataError, match=r"^Collator: unexpected fields \['extra'\], missing \[\] "
                                        r"\(the task declares \['doc_id', 'input_ids'\]\)$"):
        Collator(0)([{"input_ids": [1], "extra": 1}])
    with pytest.raises(DataError, match=r"^batch item 1 has fields \['input_ids'\] but item 0 "
                                        r"has \['doc_id', 'input_ids'\]"):
        Collator(0)([{"input_ids": [1], "doc_id": 0}, {"input_ids": [1]}])
    with pytest.raises(DataError, match=r"^batch item 0 \(doc_id \?\): field 'label' holds one "
                                        r"number per item \(declared scalar\), got \[1, 0\]$"):
        Collator(0, fields=CLASSIFICATION)([{"input_ids": [1, 2], "label": [1, 0]}])
    with pytest.raises(DataError, match=r"^batch item 0 \(doc_id \?\): labels has 1 entries but "
                                        r"input_ids has 2"):
        Collator(0, fields=TAGGING)([{"input_ids": [1, 2], "labels": [1]}])
    with pytest.raises(DataError, match=r"^batch item 1 \(doc_id 9\): tgt_ids must hold at "
                                        r"least BOS and EOS, got \[4\]$"):
        Collator(0, fields=SEQ2SEQ)([{"src_ids": [1], "tgt_ids": [4, 5], "doc_id": 8},
                                     {"src_ids": [1], "tgt_ids": [4], "doc_id": 9}])
    with pytest.raises(ValueError, match=r"^Collator: the fields declare no length field "
                                         r"\(ragged, length=True\)$"):
        Collator(0, fields=[f for f in SEQ2SEQ if not f.length])
    with pytest.raises(DataError, match=r"^batch item 0 \(doc_id \?\): tgt_ids must hold at "
                                        r"least BOS and EOS, got \[4\]$"):
        Collator(0, fields=SEQ2SEQ)([{"src_ids": [1], "tgt_ids": [4]}])


def test_seq2seq_shortest_target_left_padding_and_doc_ids():
    items = [{"src_ids": [7, 8, 9], "tgt_ids": [4, 5], "doc_id": 3},  # BOS EOS: 1 step
             {"src_ids": [7], "tgt_ids": [4, 6, 6, 5], "doc_id": 1}]
    batch = Collator(0, padding_side="left", fields=SEQ2SEQ)(items)
    assert sorted(batch) == ["doc_id", "src_ids", "src_len", "tgt_in", "tgt_len", "tgt_out"]
    np.testing.assert_array_equal(batch["src_ids"], [[7, 8, 9], [0, 0, 7]])
    np.testing.assert_array_equal(batch["tgt_in"], [[0, 0, 4], [4, 6, 6]])
    np.testing.assert_array_equal(batch["tgt_out"], [[IGNORE_INDEX, IGNORE_INDEX, 5], [6, 6, 5]])
    for key in ("src_len", "tgt_len", "doc_id"):
        assert batch[key].dtype == np.int64, key
    assert batch["src_len"].tolist() == [3, 1] and batch["tgt_len"].tolist() == [1, 3]
    assert batch["doc_id"].tolist() == [3, 1]
    # a declared non-length field may be absent from a whole batch
    assert "doc_id" not in Collator(0, fields=SEQ2SEQ)([{"src_ids": [1], "tgt_ids": [4, 5]}])


def test_classification_and_tagging_fields_are_int64():
    batch = Collator(0, fields=CLASSIFICATION)([{"input_ids": [5, 6], "label": 1, "doc_id": 4},
                                                {"input_ids": [5], "label": 0, "doc_id": 2}])
    for key in ("input_ids", "seq_len", "labels", "doc_id"):
        assert batch[key].dtype == np.int64, key
    assert batch["labels"].tolist() == [1, 0] and batch["seq_len"].tolist() == [2, 1]
    tag = Collator(0, fields=TAGGING)([{"input_ids": [5, 6], "labels": [1, 2], "offset": 3}])
    assert tag["labels"].dtype == np.int64 and tag["offset"].tolist() == [3]
    np.testing.assert_array_equal(tag["labels"], [[1, 2]])


def test_a_declared_scalar_given_as_a_one_element_list_is_refused():
    # numpy would flatten [[1], [0]] into the labels [1, 0]: a list is not a number
    collate = Collator(0, fields=CLASSIFICATION)
    good = {"input_ids": [1], "label": 1, "doc_id": 6}
    for bad in ([0], np.array([0]), [[0]], None, "x"):
        with pytest.raises(DataError, match=r"^batch item 1 \(doc_id 7\): field 'label' holds "
                                            r"one number per item \(declared scalar\), got "):
            collate([good, {"input_ids": [1], "label": bad, "doc_id": 7}])
    with pytest.raises(DataError, match=r"^batch item 0 \(doc_id 6\): .*got \[1\]$"):
        collate([{"input_ids": [1], "label": [1], "doc_id": 6}])
    # a 0-d numpy value is one number
    batch = collate([good, {"input_ids": [1], "label": np.int32(3), "doc_id": np.int64(2)}])
    assert batch["labels"].tolist() == [1, 3] and batch["doc_id"].tolist() == [6, 2]
    assert batch["labels"].dtype == np.int64 and batch["labels"].shape == (2,)


def test_pad_sequences_gives_int64_whatever_the_pad_value_type():
    out = pad_sequences([[1, 2], [3]], np.int32(-1), 3)
    assert out.dtype == np.int64
    np.testing.assert_array_equal(out, [[1, 2, -1], [3, -1, -1]])


def test_with_two_length_fields_a_plain_ragged_field_aligns_with_neither():
    # the one-to-one check applies only with a single length field (Collator's docstring):
    # here "tgt_tags" follows tgt_ids, so checking it against src_ids would refuse good data
    fields = [StoreField("src_ids", "int32", ragged=True, length=True, lengths="src_len"),
              StoreField("tgt_ids", "int32", ragged=True, length=True),
              StoreField("tgt_tags", "int32", ragged=True, pad=-1)]
    batch = Collator(0, fields=fields)([{"src_ids": [5], "tgt_ids": [6, 7, 8],
                                         "tgt_tags": [1, 2, 3]},
                                        {"src_ids": [5, 5], "tgt_ids": [6],
                                         "tgt_tags": [4]}])
    np.testing.assert_array_equal(batch["tgt_tags"], [[1, 2, 3], [4, -1, -1]])
    np.testing.assert_array_equal(batch["src_ids"], [[5, 0], [5, 5]])
    assert batch["src_len"].tolist() == [1, 2] and sorted(batch) == [
        "src_ids", "src_len", "tgt_ids", "tgt_tags"]
