"""Character tagger: embedding -> BiGRU (with sequence_length) -> emissions -> linear-chain CRF.

Eval/export: ``(emissions [B, L, T] float32, tags [B, L] int64)`` with tags
Viterbi-decoded in the graph (pads get 0).  Training: ``(loss, emissions)``
with the exact CRF negative log-likelihood (see crf.py).
"""
import paddle.nn as nn

from .crf import LinearChainCRF
from .rnn_cls import build_birnn


class BiGRUCRF(nn.Layer):
    def __init__(self, vocab_size, num_labels, emb_size=128, hidden_size=128, num_layers=2,
                 dropout=0.1):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, emb_size)
        self.embedding_dropout = nn.Dropout(dropout)
        self.rnn = build_birnn("gru", emb_size, hidden_size, num_layers, dropout)
        self.emission_dropout = nn.Dropout(dropout)
        self.emission = nn.Linear(2 * hidden_size, num_labels)
        self.crf = LinearChainCRF(num_labels)

    def forward(self, input_ids, seq_len, labels=None):
        x = self.embedding_dropout(self.embedding(input_ids))
        outputs, _ = self.rnn(x, sequence_length=seq_len.astype("int64"))
        emissions = self.emission(self.emission_dropout(outputs)).astype("float32")
        if labels is None:
            return emissions, self.crf.decode(emissions, seq_len)
        return self.crf.nll(emissions, labels, seq_len), emissions


def build(cfg, vocab_size, num_labels, pad_id, init_weights=True):
    """The registered builder (ppvarlen/model_registry.py): ``cfg`` holds this family's keys."""
    return BiGRUCRF(vocab_size, num_labels, emb_size=cfg["emb_size"], hidden_size=cfg["hidden_size"],
                    num_layers=cfg["num_layers"], dropout=cfg["dropout"])
