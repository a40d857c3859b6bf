"""``MaskedLM``: a classifier's encoder (``backbone.encode``) + an MLM head tied to its embedding.

Built by ``build_model(..., task="masked_lm")`` around a ``transformer_cls`` model; the
masked-LM task (``ppvarlen.tasks.masked_lm``) masks the batches and sets ``mask_id`` /
``mask_prob`` (``configure_model``).  ``save_encoder`` writes the backbone without its task
heads: the file ``Model.init_from`` warm-starts a classifier from.
"""
import paddle
import paddle.nn as nn
import paddle.nn.functional as F

from .weights import save_weights

HEAD_PREFIXES = ("classifier.", "wide_head.")  # task heads: trained by fine-tuning, not here


class MaskedLM(nn.Layer):
    """``backbone.encode`` + transform + output layer tied to the token embedding."""

    def __init__(self, backbone):
        super().__init__()
        hidden = backbone.token_embedding.weight.shape[1]
        self.backbone = backbone
        for name, param in backbone.named_parameters():
            if name.startswith(HEAD_PREFIXES):
                # no gradient reaches them: frozen, so the optimizer state (and a resumed run's
                # check of it) covers exactly the parameters that are trained
                param.stop_gradient = True
        self.vocab_size = backbone.token_embedding.weight.shape[0]
        self.transform = nn.Linear(hidden, hidden)
        self.norm = nn.LayerNorm(hidden)
        self.output_bias = self.create_parameter([self.vocab_size], is_bias=True)
        self.mask_id, self.mask_prob = None, None  # set by the task (configure_model)

    def forward(self, input_ids, seq_len, positions, targets=None):
        """Logits [N, V] at the flat ``positions``; with ``targets``: (mean loss, accuracy)."""
        h, _ = self.backbone.encode(input_ids, seq_len)
        picked = paddle.gather(h.reshape([-1, h.shape[-1]]), positions)
        picked = self.norm(F.gelu(self.transform(picked)))
        logits = paddle.matmul(picked, self.backbone.token_embedding.weight, transpose_y=True)
        logits = (logits + self.output_bias).astype("float32")
        if targets is None:
            return logits
        loss = F.cross_entropy(logits, targets.unsqueeze(-1))
        correct = (logits.argmax(axis=-1) == targets).astype("float32").mean()
        return loss, correct

    def save_encoder(self, path, metadata):
        """The backbone's weights except the classification heads -> ``path`` (.safetensors)."""
        save_weights(self.backbone, path, skip_prefixes=HEAD_PREFIXES, metadata=metadata)
