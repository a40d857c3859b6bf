"""ERNIE classifier / token tagger on PaddleNLP's ``ErnieModel``, built fully offline.

Backbone from ``Model.pretrained_dir`` (config.json or model_config.json +
model.safetensors [+ vocab.txt for the data side]) or from ``Model.ernie_config``
(small ErnieConfig kwargs, random init, for tests).  We do not call
``from_pretrained``: it can reach the network for names it does not find
locally and reads ``model_state.pdparams`` with pickle.  Weights are read with
safetensors only; a directory holding only .pdparams gets an error saying how
to convert it.

Masks: ErnieModel turns a 2-D mask into ``(1 - m) * -1e4`` and builds its own
from ``input_ids == pad_token_id`` when none is given (wrong when pad ids are
not the pad token); we pass the [B, 1, 1, L] additive mask from ``seq_len``
(ppvarlen.models.masks), which it adds to the attention scores as is.
``token_type_ids`` are zeros and ``position_ids`` 0..L-1, passed explicitly
(its default position ids use static shapes that break under to_static).  The
word embeddings are looked up here and zeroed on pads (passed as
``inputs_embeds``): Paddle's CPU softmax leaves ~1e-28 weight on masked keys,
so this is what makes pad ids irrelevant and pad-only rows' gradient exactly 0.
"""
import difflib
import json
import os

import paddle
import paddle.nn as nn

from ..config import ConfigError
from ..utils.log import get_logger
from .masks import key_padding_mask, masked_cross_entropy, sequence_mask
from .transformer_cls import check_max_position
from .weights import assign_weights, read_weights

log = get_logger(__name__)

CONFIG_FILES = ("config.json", "model_config.json")
SAFE_WEIGHTS = "model.safetensors"
PICKLE_WEIGHTS = "model_state.pdparams"


def _read_config_file(directory):
    for name in CONFIG_FILES:
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            try:
                with open(path, encoding="utf-8") as f:
                    data = json.load(f)
            except (OSError, ValueError) as e:
                raise ConfigError(f"{path}: cannot read the ERNIE config ({e})") from None
            # Legacy PaddleNLP model_config.json: {"init_args": [{...}], "init_class": ...}
            if isinstance(data, dict) and isinstance(data.get("init_args"), list) and data["init_args"]:
                data = data["init_args"][0]
            if not isinstance(data, dict):
                raise ConfigError(f"{path}: expected a JSON object of ErnieConfig fields")
            return path, data
    raise ConfigError(f"Model.pretrained_dir={directory}: no {' or '.join(CONFIG_FILES)} found; "
                      f"the directory must hold the ERNIE config, {SAFE_WEIGHTS} and vocab.txt")


def _load_pretrained_backbone(directory, vocab_size):
    from paddlenlp.transformers import ErnieConfig, ErnieModel

    if not os.path.isdir(directory):
        raise ConfigError(f"Model.pretrained_dir={directory}: directory not found (nothing is "
                          f"downloaded; put config.json, {SAFE_WEIGHTS} and vocab.txt there)")
    config_path, data = _read_config_file(directory)
    config = ErnieConfig(**data)
    if config.vocab_size != vocab_size:
        raise ConfigError(f"{config_path}: vocab_size={config.vocab_size} but the data vocabulary has "
                          f"{vocab_size} tokens; use Data.tokenizer=pretrained with "
                          f"Data.vocab_file={os.path.join(directory, 'vocab.txt')}")
    weights_path = os.path.join(directory, SAFE_WEIGHTS)
    if not os.path.isfile(weights_path):
        if os.path.isfile(os.path.join(directory, PICKLE_WEIGHTS)):
            raise ConfigError(
                f"{directory}: only {PICKLE_WEIGHTS} found; ppvarlen does not unpickle weights (a crafted "
                f"file runs code). If you trust the file, convert it once: load it with Paddle, and "
                f"write every tensor as float32 numpy with safetensors.numpy.save_file to "
                f"{os.path.join(directory, SAFE_WEIGHTS)} (same tensor names)")
        raise ConfigError(f"{directory}: no {SAFE_WEIGHTS} found (sharded checkpoints are not supported)")
    backbone = ErnieModel(config)
    arrays = read_weights(weights_path)
    # Checkpoints of ErnieFor* models prefix the backbone with "ernie."; task heads are not ours.
    backbone_arrays = {(k[len("ernie."):] if k.startswith("ernie.") else k): v for k, v in arrays.items()}
    ignored = assign_weights(backbone, backbone_arrays, source=weights_path, allow_unexpected=True)
    if ignored:
        log.info("%s: ignored %d non-backbone tensors (e.g. %s)", weights_path, len(ignored), ignored[0])
    return backbone


def build_ernie_backbone(pretrained_dir, ernie_config, vocab_size, pad_id, max_position):
    """ErnieModel from a local directory, or randomly initialised from ``ernie_config``."""
    if pretrained_dir:
        return _load_pretrained_backbone(pretrained_dir, vocab_size)
    if not ernie_config:
        raise ConfigError("ernie models need Model.pretrained_dir (a local ERNIE directory) or "
                          "Model.ernie_config (e.g. {hidden_size: 64, num_hidden_layers: 2, "
                          "num_attention_heads: 2, intermediate_size: 128}) for a random init")
    from paddlenlp.transformers import ErnieConfig, ErnieModel

    # ErnieConfig silently keeps unknown kwargs, so a typo would give the 768-wide default model.
    known = set(ErnieConfig().to_dict())
    for key in ernie_config:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            raise ConfigError(f"Model.ernie_config.{key} is not an ErnieConfig field"
                              + (f"; did you mean {close[0]!r}?" if close else ""))
    kwargs = {"vocab_size": vocab_size, "pad_token_id": pad_id, "max_position_embeddings": max_position}
    kwargs.update(ernie_config)
    if kwargs["vocab_size"] != vocab_size:
        raise ConfigError(f"Model.ernie_config.vocab_size={kwargs['vocab_size']} differs from the data "
                          f"vocabulary size {vocab_size}; drop the key (it is filled in from the data)")
    return ErnieModel(ErnieConfig(**kwargs))


class _ErnieBase(nn.Layer):
    def __init__(self, backbone, num_labels, dropout):
        super().__init__()
        self.ernie = backbone
        self.max_position = backbone.config.max_position_embeddings
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(backbone.config.hidden_size, num_labels)

    def encode(self, input_ids, seq_len):
        check_max_position(input_ids, self.max_position, key="the ERNIE max_position_embeddings")
        max_len = paddle.shape(input_ids)[1]
        # expand(shape) not expand_as: paddle2onnx 2.1.0 turns expand_as into an invalid ONNX Expand.
        position_ids = paddle.arange(max_len, dtype="int64").unsqueeze(0)
        position_ids = position_ids.expand(paddle.shape(input_ids))
        dtype = self.classifier.weight.dtype
        word_embeddings = self.ernie.embeddings.word_embeddings(input_ids)
        keep = sequence_mask(seq_len, max_len, dtype=word_embeddings.dtype).unsqueeze(-1)
        sequence_output, pooled_output = self.ernie(
            inputs_embeds=word_embeddings * keep,
            token_type_ids=paddle.zeros_like(input_ids),
            position_ids=position_ids,
            attention_mask=key_padding_mask(seq_len, max_len, dtype=dtype),
        )
        return sequence_output, pooled_output


class ErnieClassifier(_ErnieBase):
    """ERNIE pooled [CLS] output -> dropout -> linear: logits [B, C] float32."""

    def forward(self, input_ids, seq_len, labels=None):
        _, pooled = self.encode(input_ids, seq_len)
        logits = self.classifier(self.dropout(pooled)).astype("float32")
        if labels is None:
            return logits
        return masked_cross_entropy(logits, labels), logits


class ErnieTagger(_ErnieBase):
    """Token-level softmax head: emissions [B, L, T] float32, tags = argmax (0 on pads)."""

    def forward(self, input_ids, seq_len, labels=None):
        sequence_output, _ = self.encode(input_ids, seq_len)
        emissions = self.classifier(self.dropout(sequence_output)).astype("float32")
        if labels is None:
            mask = sequence_mask(seq_len, paddle.shape(input_ids)[1], dtype="int64")
            return emissions, paddle.argmax(emissions, axis=-1) * mask
        return masked_cross_entropy(emissions, labels), emissions


def build(cfg, vocab_size, num_labels, pad_id, init_weights=True):
    """The registered builder of ernie_cls and ernie_tagger (ppvarlen/model_registry.py)."""
    backbone = build_ernie_backbone(cfg["pretrained_dir"], cfg["ernie_config"], vocab_size, pad_id,
                                    cfg["max_position"])
    model_class = ErnieClassifier if cfg["name"] == "ernie_cls" else ErnieTagger
    return model_class(backbone, num_labels, dropout=cfg["dropout"])
