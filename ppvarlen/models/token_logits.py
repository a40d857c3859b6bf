"""Transformer encoder with a per-token K-logit head, returned as K [B, L] outputs.

The encoder (embeddings, optional segment embeddings, masked self-attention) is
``transformer_cls``'s, so padding invariance holds for the same reasons (its module doc);
the head is one ``Linear(hidden, K)`` applied at every position and split into K float32
[B, L] tensors (an extractive span reader uses K = 2: start and end scores).  The model knows
no task: what the K scores mean, which positions may win and the loss over them are the
caller's (``forward`` without labels returns the K outputs; with ``labels`` [B, K] positions
it adds the mean cross-entropy of each output over the row's real tokens).
"""
from .masks import position_cross_entropy
from .transformer_cls import TransformerClassifier


class TransformerTokenLogits(TransformerClassifier):
    """``forward(input_ids, seq_len, token_type_ids=None) -> K tensors [B, L]`` (see module)."""

    def __init__(self, vocab_size, num_outputs, **encoder):
        super().__init__(vocab_size, num_outputs, pooling="cls", **encoder)  # classifier: Linear(H, K)
        self.num_outputs = num_outputs

    def forward(self, input_ids, seq_len, token_type_ids=None, labels=None):
        h, _ = self.encode(input_ids, seq_len, token_type_ids)
        logits = self.classifier(self.head_dropout(h)).astype("float32")  # [B, L, K]
        outputs = [logits[:, :, k] for k in range(self.num_outputs)]
        if labels is None:
            return tuple(outputs)
        return position_cross_entropy(outputs, labels, seq_len), tuple(outputs)


def build(cfg, vocab_size, num_labels, pad_id, init_weights=True):
    """The registered builder (ppvarlen/model_registry.py): ``num_labels`` = K outputs."""
    return TransformerTokenLogits(
        vocab_size, num_labels, hidden_size=cfg["hidden_size"], num_layers=cfg["num_layers"],
        num_heads=cfg["num_heads"], ffn_size=cfg["ffn_size"], dropout=cfg["dropout"],
        max_position=cfg["max_position"], type_vocab_size=cfg["type_vocab_size"])
