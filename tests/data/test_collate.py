"""Collator: the task's field declarations drive pad values, keys, lengths and shifts."""
import numpy as np
import pytest

from ppvarlen.data.collate import Collator
from ppvarlen.data.errors import DataError
from ppvarlen.data.store import StoreField
from ppvarlen.tasks import get_task

PAD = 7  # deliberately not 0: pad id must come from the tokenizer


def fields(task):
    return get_task(task).store_fields()


def test_classification_batch():
    items = [{"input_ids": [2, 10, 11, 3], "label": 1, "doc_id": 0},
             {"input_ids": [2, 12, 3], "label": 0, "doc_id": 1}]
    b = Collator(PAD, fields=fields("classification"))(items)
    assert set(b) == {"input_ids", "seq_len", "labels", "doc_id"}
    np.testing.assert_array_equal(b["input_ids"], [[2, 10, 11, 3], [2, 12, 3, PAD]])
    np.testing.assert_array_equal(b["seq_len"], [4, 3])
    np.testing.assert_array_equal(b["labels"], [1, 0])
    assert all(v.dtype == np.int64 for v in b.values())


def test_tagging_labels_padded_with_ignore_index_and_masks_with_zero():
    decl = list(fields("tagging")) + [StoreField("attention_mask", "int8", ragged=True, pad=0)]
    items = [{"input_ids": [5, 6], "labels": [1, 2], "attention_mask": [1, 1], "doc_id": 0,
              "offset": 0},
             {"input_ids": [5], "labels": [3], "attention_mask": [1], "doc_id": 0, "offset": 1}]
    b = Collator(PAD, pad_to_multiple_of=4, fields=decl)(items)
    np.testing.assert_array_equal(b["input_ids"], [[5, 6, PAD, PAD], [5, PAD, PAD, PAD]])
    np.testing.assert_array_equal(b["labels"], [[1, 2, -100, -100], [3, -100, -100, -100]])
    np.testing.assert_array_equal(b["attention_mask"], [[1, 1, 0, 0], [1, 0, 0, 0]])
    np.testing.assert_array_equal(b["offset"], [0, 1])


def test_a_new_field_needs_only_its_declaration():
    """A field no task had before (segment ids, padded 0) is collated from its StoreField alone."""
    decl = list(fields("classification")) + [StoreField("segments", "int8", ragged=True, pad=0)]
    items = [{"input_ids": [5, 6, 7], "segments": [0, 0, 1], "label": 1, "doc_id": 0},
             {"input_ids": [5], "segments": [0], "label": 0, "doc_id": 1}]
    b = Collator(PAD, fields=decl)(items)
    np.testing.assert_array_equal(b["segments"], [[0, 0, 1], [0, 0, 0]])
    with pytest.raises(DataError, match="segments has 2 entries but input_ids has 3"):
        Collator(PAD, fields=decl)([dict(items[0], segments=[0, 1])])


def test_left_padding():
    b = Collator(0, padding_side="left")([{"input_ids": [4, 5, 6]}, {"input_ids": [8]}])
    np.testing.assert_array_equal(b["input_ids"], [[4, 5, 6], [0, 0, 8]])
    np.testing.assert_array_equal(b["seq_len"], [3, 1])


def test_bucket_boundary_padding():
    c = Collator(0, bucket_boundaries=[8, 16, 32])
    assert c([{"input_ids": [1] * 9}, {"input_ids": [1] * 3}])["input_ids"].shape == (2, 16)
    assert c([{"input_ids": [1] * 3}])["input_ids"].shape == (1, 8)
    assert c([{"input_ids": [1] * 40}])["input_ids"].shape == (1, 40)  # beyond: batch max


def test_misaligned_labels_are_refused_with_doc_id():
    items = [{"input_ids": [1, 2, 3], "labels": [0, 1], "doc_id": 42, "offset": 0}]
    with pytest.raises(DataError, match=r"doc_id 42.*labels has 2 entries but input_ids has 3"):
        Collator(0, fields=fields("tagging"))(items)


def test_unknown_field_and_mixed_fields_refused():
    with pytest.raises(DataError, match="unexpected fields"):
        Collator(0)([{"input_ids": [1], "weird": 3}])
    with pytest.raises(DataError, match="same fields"):
        Collator(0, fields=fields("classification"))([{"input_ids": [1], "label": 0},
                                                      {"input_ids": [1]}])
    with pytest.raises(DataError, match="declared scalar"):
        Collator(0, fields=fields("classification"))([{"input_ids": [1], "label": [0, 1]}])
    with pytest.raises(ValueError, match="empty batch"):
        Collator(0)([])


def test_seq2seq_shift_and_pad_values():
    BOS, EOS = 4, 5
    items = [{"src_ids": [10, 11, 12], "tgt_ids": [BOS, 20, 21, EOS], "doc_id": 0},
             {"src_ids": [13], "tgt_ids": [BOS, 22, EOS], "doc_id": 1}]
    b = Collator(PAD, fields=fields("seq2seq"))(items)
    np.testing.assert_array_equal(b["src_ids"], [[10, 11, 12], [13, PAD, PAD]])
    np.testing.assert_array_equal(b["src_len"], [3, 1])
    np.testing.assert_array_equal(b["tgt_in"], [[BOS, 20, 21], [BOS, 22, PAD]])
    np.testing.assert_array_equal(b["tgt_out"], [[20, 21, EOS], [22, EOS, -100]])
    np.testing.assert_array_equal(b["tgt_len"], [3, 2])
    with pytest.raises(DataError, match="BOS and EOS"):
        Collator(PAD, fields=fields("seq2seq"))([{"src_ids": [1], "tgt_ids": [BOS], "doc_id": 3}])


def test_bad_options():
    with pytest.raises(ValueError, match="padding_side"):
        Collator(0, padding_side="middle")
    with pytest.raises(ValueError, match="pad_to_multiple_of"):
        Collator(0, pad_to_multiple_of=0)
    with pytest.raises(ValueError, match="no length field"):
        Collator(0, fields=[StoreField("doc_id", "int64")])
    with pytest.raises(ValueError, match="pad must be"):
        StoreField("x", "int32", ragged=True, pad="zero")
