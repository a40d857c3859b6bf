"""BiLSTM / BiGRU classifier that never reads padding.

``sequence_length=seq_len`` makes the backward direction start at each
sequence's real last token and freezes the forward state after it, so the
final states (``pooling: last``) and the per-position outputs of real tokens
are the same as for the sequence run alone.  ``mean``/``max`` pool only real
positions; ``cls`` reads position 0 (whose backward state has seen the whole
sequence).
"""
import paddle
import paddle.nn as nn

from ..config import ConfigError
from .masks import masked_cross_entropy, sequence_mask
from .ngram import build_ngram_embedding
from .transformer_cls import POOLINGS, pool_states

RNN_CELLS = {"lstm": nn.LSTM, "gru": nn.GRU}


def build_birnn(cell, input_size, hidden_size, num_layers, dropout):
    if cell not in RNN_CELLS:
        raise ConfigError(f"Model.cell={cell!r}: use one of {sorted(RNN_CELLS)}")
    return RNN_CELLS[cell](input_size, hidden_size, num_layers=num_layers, direction="bidirect",
                           dropout=dropout if num_layers > 1 else 0.0)


class RNNClassifier(nn.Layer):
    def __init__(self, vocab_size, num_labels, emb_size=128, hidden_size=128, num_layers=2,
                 cell="lstm", dropout=0.1, pooling="last", ngram_buckets=0, ngram_orders=(2, 3),
                 ngram_dropout=0.0):
        super().__init__()
        if pooling not in POOLINGS:
            raise ConfigError(f"Model.pooling={pooling!r}: rnn_cls supports {', '.join(POOLINGS)}")
        self.cell = cell
        self.pooling = pooling
        self.embedding = nn.Embedding(vocab_size, emb_size)
        self.ngram_embedding = build_ngram_embedding(vocab_size, ngram_buckets, ngram_orders, emb_size,
                                                     ngram_dropout)
        self.embedding_dropout = nn.Dropout(dropout)
        self.rnn = build_birnn(cell, emb_size, hidden_size, num_layers, dropout)
        self.head_dropout = nn.Dropout(dropout)
        pooled_size = 4 * hidden_size if pooling == "mean_max" else 2 * hidden_size
        self.classifier = nn.Linear(pooled_size, num_labels)

    def forward(self, input_ids, seq_len, labels=None):
        x = self.embedding(input_ids)
        if self.ngram_embedding is not None:
            # The RNN never reads pads (sequence_length), but masking keeps pad-only rows' grad 0.
            mask = sequence_mask(seq_len, paddle.shape(input_ids)[1], dtype=x.dtype)
            x = x + self.ngram_embedding(input_ids, mask)
        x = self.embedding_dropout(x)
        outputs, final_states = self.rnn(x, sequence_length=seq_len.astype("int64"))
        if self.pooling == "last":
            h = final_states[0] if self.cell == "lstm" else final_states  # LSTM: (h, c)
            # h: [num_layers * 2, B, H], layer-major, forward then backward.
            pooled = paddle.concat([h[-2], h[-1]], axis=-1)
        else:
            pooled = pool_states(outputs, seq_len, self.pooling)
        logits = self.classifier(self.head_dropout(pooled)).astype("float32")
        if labels is None:
            return logits
        return masked_cross_entropy(logits, labels), logits


def build(cfg, vocab_size, num_labels, pad_id, init_weights=True):
    """The registered builder (ppvarlen/model_registry.py): ``cfg`` holds this family's keys."""
    return RNNClassifier(
        vocab_size, num_labels, emb_size=cfg["emb_size"], hidden_size=cfg["hidden_size"],
        num_layers=cfg["num_layers"], cell=cfg["cell"], dropout=cfg["dropout"],
        pooling=cfg["pooling"] or "last", ngram_buckets=cfg["ngram_buckets"],
        ngram_orders=cfg["ngram_orders"], ngram_dropout=cfg["ngram_dropout"])
