"""Sentence embedder: ``transformer_cls``'s encoder, pooled over real tokens, optionally
projected and L2-normalised: ``forward(input_ids, seq_len) -> embeddings [B, D]`` float32.

* The encoder is ``transformer_cls.TransformerEncoderBase`` (same parameter names, so a
  ``Model.init_from`` file of a classifier or of MLM pretraining warm-starts it), padding-free
  for the reasons that module gives.
* Pooling (``Model.pooling``: cls | mean | max | last | mean_max, default mean) goes through
  ``transformer_cls.pool_states`` / ``masks.pool``, which read real positions only (mean divides
  by the real length, last reads position ``seq_len - 1``, cls position 0).
* ``projection_dim > 0``: a ``Linear(pooled, projection_dim)`` head after pooling.
* ``normalize``: the pooled (projected) row divided by its L2 norm, AFTER pooling, so pads
  can never enter the norm.  The reductions run in float32.
* ``temperature``: InfoNCE's temperature, read by the embedding task's loss (training only;
  the forward never uses it, so it does not reach the export).

``embedding_dim`` is D, what the export's manifest records.
"""
import paddle.nn as nn
import paddle.nn.functional as F

from ..config import ConfigError
from .transformer_cls import POOLINGS, TransformerEncoderBase, pool_states

DEFAULT_POOLING = "mean"
NORM_EPS = 1e-12  # an all-zero row stays zero instead of 0 / 0


class TransformerEmbedder(TransformerEncoderBase):
    def __init__(self, vocab_size, hidden_size=128, num_layers=2, num_heads=4, ffn_size=512,
                 dropout=0.1, max_position=512, pooling=DEFAULT_POOLING, normalize=True,
                 projection_dim=0, temperature=0.05):
        if pooling not in POOLINGS:
            raise ConfigError(f"Model.pooling={pooling!r}: transformer_embed supports "
                              f"{', '.join(POOLINGS)}")
        if projection_dim < 0:
            raise ConfigError(f"Model.projection_dim={projection_dim}: use 0 (no projection) "
                              f"or the embedding width (>= 1)")
        if not temperature > 0:
            raise ConfigError(f"Model.temperature={temperature}: InfoNCE divides the "
                              f"similarities by it; use a positive value (e.g. 0.05)")
        super().__init__(vocab_size, hidden_size, num_layers, num_heads, ffn_size, dropout,
                         max_position)
        self.pooling = pooling
        self.normalize = bool(normalize)
        self.temperature = float(temperature)
        pooled = 2 * hidden_size if pooling == "mean_max" else hidden_size
        self.projection = nn.Linear(pooled, projection_dim) if projection_dim else None
        self.embedding_dim = projection_dim or pooled

    def forward(self, input_ids, seq_len):
        h, _ = self.encode(input_ids, seq_len)
        x = pool_states(h, seq_len, self.pooling)
        if self.projection is not None:
            x = self.projection(x)
        x = x.astype("float32")
        if self.normalize:
            x = F.normalize(x, p=2, axis=-1, epsilon=NORM_EPS)
        return x


def build(cfg, vocab_size, num_labels, pad_id, init_weights=True):
    """The registered builder (ppvarlen/model_registry.py); ``num_labels`` is unused (an
    embedding has no labels)."""
    return TransformerEmbedder(
        vocab_size, hidden_size=cfg["hidden_size"], num_layers=cfg["num_layers"],
        num_heads=cfg["num_heads"], ffn_size=cfg["ffn_size"], dropout=cfg["dropout"],
        max_position=cfg["max_position"], pooling=cfg["pooling"] or DEFAULT_POOLING,
        normalize=True if cfg["normalize"] is None else cfg["normalize"], projection_dim=cfg["projection_dim"],
        temperature=cfg["temperature"])
