"""The tokenizer beside a model, seen the way the doctor needs it.

``Tokenizer`` holds the vocabulary size, the special ids, whether texts are expected wrapped
in [CLS] ... [SEP] and whether the serving path wraps them, the inputs the tokenizer returns
(``model_input_names``: PaddleNLP tokenizers return no attention mask by default), and
``ids(text)``: a text as the serving path encodes it.  Three sources: a ppvarlen vocabulary
(an export's ``TextEncoder``), a PaddleNLP tokenizer directory (``tokenizer_config.json``:
``AutoTokenizer``, local files only) and a bare BERT/ERNIE ``vocab.txt``.

``read_model_config`` reads a directory's ``config.json`` as plain JSON: the position table
(``max_position_embeddings``), ``vocab_size`` and ``pad_token_id`` the model was built with.
"""
import json
import os

from ppvarlen.config import ConfigError
from ppvarlen.data.errors import DataError
from ppvarlen.data.vocab import TextEncoder

from .errors import ModelLoadError

PADDLENLP_INPUTS = ["input_ids", "token_type_ids"]  # a PaddleNLP tokenizer's default keys


class Tokenizer:
    def __init__(self, source, kind, vocab_size, special_ids, encode, wraps, expects_wrap,
                 input_names=None):
        self.source, self.kind, self.vocab_size = source, kind, int(vocab_size)
        self.special_ids = {k: v for k, v in special_ids.items() if v is not None}
        self.pad_id = self.special_ids.get("pad", 0)
        self._encode = encode  # text -> ids without special tokens
        self.wraps = wraps  # the serving path puts [CLS] ... [SEP] around every text
        self.expects_wrap = expects_wrap  # the model was trained on wrapped texts (None: unknown)
        self.input_names = input_names

    def content_ids(self, text):
        return list(self._encode(text))

    def wrap(self, body):
        """``body`` with [CLS] ... [SEP] around it when the serving path adds them."""
        if not self.wraps:
            return list(body)
        return [self.special_ids["cls"]] + list(body) + [self.special_ids["sep"]]

    def ids(self, text):
        return self.wrap(self.content_ids(text))

    def first_regular_id(self):
        """The first id after the special ones (random rows draw from here up)."""
        return max(self.special_ids.values(), default=0) + 1

    def as_dict(self):
        return {"source": self.source, "kind": self.kind, "vocab_size": self.vocab_size,
                "special_ids": self.special_ids, "adds_cls_sep": self.wraps,
                "expects_cls_sep": self.expects_wrap, "returns": self.input_names}


def from_encoder(encoder, wraps, source):
    """A ppvarlen ``TextEncoder`` (an export's): texts wrapped exactly when the export adds
    special tokens, which is also how it was trained."""
    return Tokenizer(source, f"ppvarlen {encoder.kind} vocabulary", encoder.vocab_size,
                     encoder.special_ids, encoder.encode_text, bool(wraps), bool(wraps))


def _paddlenlp_tokenizer(directory):
    from paddlenlp.transformers import AutoTokenizer  # seconds to import: only for this source

    where = os.path.join(directory, "tokenizer_config.json")
    try:
        tok = AutoTokenizer.from_pretrained(directory, from_hf_hub=False, from_aistudio=False)
    except (OSError, ValueError, KeyError, AssertionError, TypeError) as e:
        raise ModelLoadError(f"{where}: PaddleNLP's AutoTokenizer cannot load this directory "
                             f"({e})") from None
    special = {"pad": tok.pad_token_id, "unk": tok.unk_token_id, "cls": tok.cls_token_id,
               "sep": tok.sep_token_id}
    probe = tok.convert_tokens_to_ids(tok.tokenize("a")) or [special["unk"]]
    built = tok.build_inputs_with_special_tokens(probe)  # what training with it fed the model
    encoded = tok("a")["input_ids"]  # what tokenizer(text) returns, the usual serving call
    expects = built[:1] == [special["cls"]] and built[-1:] == [special["sep"]]
    wraps = encoded[:1] == [special["cls"]] and encoded[-1:] == [special["sep"]]
    return Tokenizer(directory, f"PaddleNLP {type(tok).__name__}", len(tok), special,
                     lambda text: tok.convert_tokens_to_ids(tok.tokenize(text)),
                     wraps and expects, expects, list(tok.model_input_names))


def load_tokenizer(directory, key="--tokenizer"):
    """The tokenizer of ``directory``; ModelLoadError when it holds none the doctor reads."""
    if not os.path.isdir(directory):
        raise ModelLoadError(f"{key} {directory}: not a directory; give the directory holding "
                             f"vocab.txt (and tokenizer_config.json for a PaddleNLP tokenizer)")
    if os.path.isfile(os.path.join(directory, "tokenizer_config.json")):
        return _paddlenlp_tokenizer(directory)
    if not os.path.isfile(os.path.join(directory, "vocab.txt")):
        raise ModelLoadError(f"{key} {directory}: no vocab.txt and no tokenizer_config.json; "
                             f"the doctor reads PaddleNLP tokenizer directories, ppvarlen "
                             f"vocabularies and BERT/ERNIE vocab.txt files")
    try:
        if os.path.isfile(os.path.join(directory, "encoder.json")):
            encoder = TextEncoder.load(directory)
            return Tokenizer(directory, f"ppvarlen {encoder.kind} vocabulary",
                             encoder.vocab_size, encoder.special_ids, encoder.encode_text,
                             False, None)
        encoder = TextEncoder.load(directory, "pretrained")
    except (DataError, ConfigError) as e:
        raise ModelLoadError(f"{key} {directory}: {e}") from None
    # a bare BERT/ERNIE vocab.txt: such models are trained on [CLS] text [SEP]
    return Tokenizer(directory, "BERT/ERNIE vocab.txt (ErnieTokenizer)", encoder.vocab_size,
                     encoder.special_ids, encoder.encode_text, True, True, PADDLENLP_INPUTS)


def read_model_config(directory):
    """config.json of ``directory`` as a dict ({} when there is none); ModelLoadError when it
    is not a JSON object."""
    path = os.path.join(directory, "config.json")
    if not os.path.isfile(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelLoadError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(config, dict):
        raise ModelLoadError(f"{path}: must be a JSON object, got {type(config).__name__}")
    return config
