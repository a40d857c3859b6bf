"""Transformer encoder classifier whose output does not depend on padding.

Pad keys get an additive mask of the dtype's most negative finite value; pad
queries are computed but never pooled (``cls`` reads position 0, ``mean``/``max``
are masked).  The embeddings of pad positions are also multiplied by 0: Paddle
3.3.1's CPU softmax returns ~1e-28, not 0, for a key at the fill value (its exp
saturates), so without this a pad token would still leak a 1e-28 weight and
its embedding row a 1e-28 gradient.  With it, pad ids never enter the model and
the gradient reaching pad-only embedding rows is exactly zero.

``ngram_buckets > 0`` adds hashed char n-gram embeddings (``ngram.py``) to the
token embedding; they read only preceding positions and are masked the same way.
``pooling: mean_max`` concatenates the masked mean and max.

``wide_buckets > 0`` adds a linear "wide" head over hashed char n-grams
(``ngram.WideNgramHead``, fastText / TF-IDF-LR style) whose logits are added
to the encoder's: the linear n-gram model and the deep model are trained jointly.
``encode`` (embeddings + encoder, ``TransformerEncoderBase``) is shared with MLM pretraining
(models/masked_lm.py) and the sentence embedder (models/embedder.py).
Regularisers (training only, identity in eval/export): ``token_dropout`` drops
whole character embeddings; ``rdrop_alpha > 0`` adds R-Drop to the model's own
loss (a second dropout pass + symmetric KL between the two).
"""
import paddle
import paddle.nn as nn
import paddle.nn.functional as F

from ..config import ConfigError
from .masks import key_padding_mask, masked_cross_entropy, pool, sequence_mask
from .ngram import build_ngram_embedding, build_wide_head

POOLINGS = ("cls", "mean", "max", "last", "mean_max")


def pool_states(x, seq_len, method):
    """``masks.pool`` plus ``mean_max`` (mean and max concatenated: [B, 2H])."""
    if method == "mean_max":
        return paddle.concat([pool(x, seq_len, "mean"), pool(x, seq_len, "max")], axis=-1)
    return pool(x, seq_len, method)


def check_max_position(input_ids, max_position, key="Model.max_position"):
    """Clear error for a batch longer than the position table (eager only: traced dims are unknown)."""
    if not paddle.in_dynamic_mode():
        return
    length = input_ids.shape[1]
    if length > max_position:
        raise ValueError(f"input length {length} exceeds {key}={max_position}; raise {key} "
                         f"or lower Data.max_len (long texts are truncated/windowed at build time)")


class TransformerEncoderBase(nn.Layer):
    """Embeddings (token, position, optional segment and hashed n-gram) + a pre-norm Transformer
    encoder, padding-free as the module docstring says; ``encode`` is what every head reads
    (the classifier here, the embedder of models/embedder.py, MLM pretraining)."""

    def __init__(self, vocab_size, hidden_size=128, num_layers=2, num_heads=4, ffn_size=512,
                 dropout=0.1, max_position=512, ngram_buckets=0, ngram_orders=(2, 3),
                 ngram_dropout=0.0, token_dropout=0.0, type_vocab_size=0):
        super().__init__()
        if hidden_size % num_heads:
            raise ConfigError(f"Model.hidden_size={hidden_size} must be divisible by "
                             f"Model.num_heads={num_heads}")
        self.max_position = max_position
        self.token_embedding = nn.Embedding(vocab_size, hidden_size)
        self.position_embedding = nn.Embedding(max_position, hidden_size)
        # segment ids (a text pair's token_type_ids): only a model built with segments has them
        self.segment_embedding = nn.Embedding(type_vocab_size, hidden_size) \
            if type_vocab_size else None
        self.ngram_embedding = build_ngram_embedding(vocab_size, ngram_buckets, ngram_orders, hidden_size,
                                                     ngram_dropout)
        if not 0.0 <= token_dropout < 1.0:
            raise ConfigError(f"Model.token_dropout={token_dropout}: use a probability in [0, 1)")
        self.token_dropout = token_dropout
        self.embedding_dropout = nn.Dropout(dropout)
        layer = nn.TransformerEncoderLayer(hidden_size, num_heads, ffn_size, dropout=dropout,
                                           activation="gelu", normalize_before=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers, norm=nn.LayerNorm(hidden_size))

    def encode(self, input_ids, seq_len, token_type_ids=None):
        """Encoder states [B, L, H] (pad rows are computed but meaningless) and the [B, L] float mask."""
        check_max_position(input_ids, self.max_position)
        max_len = paddle.shape(input_ids)[1]
        positions = paddle.arange(max_len, dtype="int64").unsqueeze(0)
        x = self.token_embedding(input_ids)
        # Training only: drop whole characters (all dims of a position), not single features.
        x = F.dropout(x, self.token_dropout, axis=[0, 1], training=self.training)
        x = x + self.position_embedding(positions)
        if token_type_ids is not None:
            if self.segment_embedding is None:
                raise ConfigError("token_type_ids given but transformer_cls was built without "
                                  "segments; set Model.type_vocab_size: 2")
            x = x + self.segment_embedding(token_type_ids)
        mask = sequence_mask(seq_len, max_len, dtype=x.dtype)
        x = x * mask.unsqueeze(-1)  # see module doc
        if self.ngram_embedding is not None:
            x = x + self.ngram_embedding(input_ids, mask)
        x = self.embedding_dropout(x)
        h = self.encoder(x, src_mask=key_padding_mask(seq_len, max_len, dtype=x.dtype))
        return h, mask


class TransformerClassifier(TransformerEncoderBase):
    def __init__(self, vocab_size, num_labels, hidden_size=128, num_layers=2, num_heads=4,
                 ffn_size=512, dropout=0.1, max_position=512, pooling="cls", ngram_buckets=0,
                 ngram_orders=(2, 3), ngram_dropout=0.0, wide_buckets=0, wide_orders=(1, 2, 3),
                 wide_dropout=0.0, wide_scale=1.0, token_dropout=0.0, rdrop_alpha=0.0,
                 type_vocab_size=0):
        if pooling not in POOLINGS:
            raise ConfigError(f"Model.pooling={pooling!r}: transformer_cls supports {', '.join(POOLINGS)}")
        if rdrop_alpha < 0:
            raise ConfigError(f"Model.rdrop_alpha={rdrop_alpha}: use 0 (off) or a positive weight")
        # the parameters are created in the order they always were (same init for a seed)
        super().__init__(vocab_size, hidden_size, num_layers, num_heads, ffn_size, dropout,
                         max_position, ngram_buckets, ngram_orders, ngram_dropout,
                         token_dropout, type_vocab_size)
        self.pooling = pooling
        self.rdrop_alpha = rdrop_alpha
        self.head_dropout = nn.Dropout(dropout)
        pooled_size = 2 * hidden_size if pooling == "mean_max" else hidden_size
        self.classifier = nn.Linear(pooled_size, num_labels)
        self.wide_head = build_wide_head(vocab_size, wide_buckets, wide_orders, num_labels, wide_dropout)
        self.wide_scale = wide_scale

    def _logits(self, input_ids, seq_len, token_type_ids=None):
        h, mask = self.encode(input_ids, seq_len, token_type_ids)
        logits = self.classifier(self.head_dropout(pool_states(h, seq_len, self.pooling))).astype("float32")
        if self.wide_head is not None:
            # The scale acts as a learning-rate multiplier for the wide table under Adam: each
            # sparse row is updated only in batches holding its n-gram, the deep part every step.
            logits = logits + self.wide_scale * self.wide_head(input_ids, mask)
        return logits

    def forward(self, input_ids, seq_len, token_type_ids=None, labels=None):
        logits = self._logits(input_ids, seq_len, token_type_ids)
        if labels is None:
            return logits
        loss = masked_cross_entropy(logits, labels)
        if self.rdrop_alpha > 0 and self.training:
            # R-Drop: a second pass with other dropout masks; both fit the labels and are pulled
            # together by a symmetric KL term (a consistency regulariser against overfitting).
            other = self._logits(input_ids, seq_len, token_type_ids)
            loss = (loss + masked_cross_entropy(other, labels)) / 2 + self.rdrop_alpha * symmetric_kl(logits, other)
        return loss, logits


def symmetric_kl(a, b):
    """Mean over the batch of (KL(p_a || p_b) + KL(p_b || p_a)) / 2 for logits [B, C]."""
    log_a, log_b = F.log_softmax(a, axis=-1), F.log_softmax(b, axis=-1)
    return ((log_a.exp() - log_b.exp()) * (log_a - log_b)).sum(axis=-1).mean() / 2


def build(cfg, vocab_size, num_labels, pad_id, init_weights=True):
    """The registered builder (ppvarlen/model_registry.py): ``cfg`` holds this family's keys."""
    return TransformerClassifier(
        vocab_size, num_labels, hidden_size=cfg["hidden_size"], num_layers=cfg["num_layers"],
        num_heads=cfg["num_heads"], ffn_size=cfg["ffn_size"], dropout=cfg["dropout"],
        max_position=cfg["max_position"], pooling=cfg["pooling"] or "cls",
        ngram_buckets=cfg["ngram_buckets"], ngram_orders=cfg["ngram_orders"],
        ngram_dropout=cfg["ngram_dropout"], wide_buckets=cfg["wide_buckets"],
        wide_orders=cfg["wide_orders"], wide_dropout=cfg["wide_dropout"], wide_scale=cfg["wide_scale"],
        token_dropout=cfg["token_dropout"], rdrop_alpha=cfg["rdrop_alpha"],
        type_vocab_size=cfg["type_vocab_size"])
