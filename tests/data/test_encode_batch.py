"""``Task.encode_examples``: a slice encoded by array operations gives the items, counts and
long-text stats of encoding its examples one at a time, and raises the same first error."""
import numpy as np
import pytest

from ppvarlen.tasks.base import EncodeContext
from ppvarlen.data.errors import DataError
from ppvarlen.data.vocab import TextEncoder
from ppvarlen.tasks import get_task

TEXTS = ["好评", "物流很快，包装完好，非常满意这次购物体验！", "差", "质量太差了 退货",
         "🙂 emoji 与 \ud800 落单代理", "一二三四五六七八九十一二三四五六七八九十一二三四五六七八九十",
         "ab", "还行吧，一般般，没什么特别的，价格也还可以，下次再看看"]


def _where(doc_id):
    return f"train example {doc_id}"


def _encoder(kind, lowercase=False):
    texts = TEXTS[:-2] if kind == "char" else [" ".join(t) for t in TEXTS[:-2]]
    return TextEncoder.build(texts, kind, lowercase)  # the last texts hold unknown tokens


def _examples(task):
    if task == "tagging":
        return [{"tokens": list(t), "tags": ["O" if i % 3 else "B-X" for i in range(len(t))]}
                for t in TEXTS]
    return [{"text": t, "label": k % 2} for k, t in enumerate(TEXTS)]


def _same(a, b):
    assert sorted(a.columns) == sorted(b.columns)
    for name, col in a.columns.items():
        other = b.columns[name]
        if isinstance(col, tuple):  # ragged: (flat, row lengths)
            for x, y in zip(col, other):
                assert x.dtype == y.dtype and np.array_equal(x, y), name
        else:
            assert col.dtype == other.dtype and np.array_equal(col, other), name
    assert (a.unk, a.real) == (b.unk, b.real)
    assert a.doc_lengths.dtype == b.doc_lengths.dtype and np.array_equal(a.doc_lengths,
                                                                         b.doc_lengths)
    assert {k: v.as_dict() for k, v in a.long_text.items()} == \
        {k: v.as_dict() for k, v in b.long_text.items()}


@pytest.mark.parametrize("task", ["classification", "masked_lm", "tagging"])
@pytest.mark.parametrize("kind,lowercase", [("char", False), ("char", True), ("word", False)])
@pytest.mark.parametrize("policy,max_len,stride", [("truncate", 9, 0), ("window", 9, 2),
                                                   ("window", 4, 0), ("error", 64, 0)])
@pytest.mark.parametrize("specials", [True, False])
def test_a_slice_at_once_is_its_examples_one_at_a_time(task, kind, lowercase, policy, max_len,
                                                       stride, specials):
    t = get_task(task)
    enc = _encoder(kind, lowercase)
    examples = _examples(task)
    if kind == "word" and task != "tagging":
        examples = [dict(ex, text=" ".join(ex["text"])) for ex in examples]
    ctx = EncodeContext(enc, max_len, policy, stride, specials, {"O": 0, "B-X": 1})
    assert t._encode_windowed(ctx, examples, 40, _where) is not None  # the array path, not the loop
    batch = t.encode_examples(ctx, examples, 40, _where)
    _same(batch, t._encode_each(ctx, examples, 40, _where))
    assert len(batch.doc_lengths) == len(examples)


def test_encode_batch_is_encode_array_of_each_text():
    for enc in (_encoder("char"), _encoder("char", True), _encoder("word")):
        ids, lengths = enc.encode_batch(TEXTS)
        want = [enc.encode_array(t) for t in TEXTS]
        assert [w.tolist() for w in want] == [enc.encode(enc.tokenize(t)) for t in TEXTS]
        assert ids.dtype == np.int32 and lengths.dtype == np.int64
        assert lengths.tolist() == [len(w) for w in want]
        assert ids.tolist() == np.concatenate(want).tolist()
        empty_ids, empty_lengths = enc.encode_batch([])
        assert len(empty_ids) == 0 and len(empty_lengths) == 0


@pytest.mark.parametrize("policy", ["error", "truncate"])
def test_a_slice_raises_its_first_bad_example(policy):
    """An empty text (no tokens) and, under ``error``, one too long: the first in order is the
    one named, with the message of encoding it alone."""
    t = get_task("classification")
    enc = _encoder("word")
    long = " ".join("好" * 30)
    examples = [{"text": "好 评", "label": 0}, {"text": long, "label": 1},
                {"text": "   ", "label": 0}, {"text": long, "label": 1}]
    ctx = EncodeContext(enc, 12, policy, 0, True, {})
    with pytest.raises(DataError) as alone:
        for k, ex in enumerate(examples):
            t.encode_example(ctx, ex, 7 + k, _where(7 + k))
    with pytest.raises(DataError) as batch:
        t.encode_examples(ctx, examples, 7, _where)
    assert str(batch.value) == str(alone.value)
    assert ("train example 8" if policy == "error" else "train example 9") in str(batch.value)
