"""Tiny stand-in models for the export tests (the real ones are tested through them too).

Each has ``forward(self, input_ids, seq_len, labels=None)`` like ppvarlen.models.
"""
import paddle
import paddle.nn as nn

VOCAB = 40


def _mask(input_ids, seq_len):
    positions = paddle.arange(paddle.shape(input_ids)[1], dtype="int64").unsqueeze(0)
    return positions < seq_len.unsqueeze(1)


class TinyRNN(nn.Layer):
    """BiLSTM/BiGRU (2 layers, sequence_length); ``raw`` returns per-step outputs + final states."""

    def __init__(self, cell="lstm", raw=False, num_layers=2):
        super().__init__()
        self.raw = raw
        self.emb = nn.Embedding(VOCAB, 8)
        rnn = nn.LSTM if cell == "lstm" else nn.GRU
        self.rnn = rnn(8, 6, num_layers=num_layers, direction="bidirect")
        self.head = nn.Linear(12, 3)

    def forward(self, input_ids, seq_len, labels=None):
        out, state = self.rnn(self.emb(input_ids), sequence_length=seq_len)
        final_h = state[0] if isinstance(state, (tuple, list)) else state  # LSTM: (h, c)
        if self.raw:  # [B, L, 12] per step, [B, 12] last layer's final fw/bw hidden states
            return out, paddle.concat([final_h[-2], final_h[-1]], axis=-1)
        mask = _mask(input_ids, seq_len).astype("float32").unsqueeze(-1)
        mean = (out * mask).sum(1) / seq_len.astype("float32").unsqueeze(1)
        return self.head(mean)


class TinyTransformer(nn.Layer):
    def __init__(self, max_position=64):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 16)
        self.pos = nn.Embedding(max_position, 16)
        layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0)
        self.encoder = nn.TransformerEncoder(layer, 2)
        self.head = nn.Linear(16, 2)

    def forward(self, input_ids, seq_len, labels=None):
        positions = paddle.arange(paddle.shape(input_ids)[1], dtype="int64").unsqueeze(0)
        x = self.emb(input_ids) + self.pos(positions)
        keep = _mask(input_ids, seq_len)
        additive = (1.0 - keep.astype("float32")) * -3.0e38
        x = self.encoder(x, src_mask=additive.unsqueeze(1).unsqueeze(1))
        return self.head(x[:, 0])


class TinyCRFTagger(nn.Layer):
    """BiGRU emissions + paddle.text.ViterbiDecoder: (emissions, tags) like bigru_crf."""

    def __init__(self, num_tags=5):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 8)
        self.rnn = nn.GRU(8, 6, direction="bidirect")
        self.head = nn.Linear(12, num_tags)
        self.transitions = self.create_parameter([num_tags, num_tags])
        self.decoder = paddle.text.ViterbiDecoder(self.transitions, include_bos_eos_tag=False)

    def forward(self, input_ids, seq_len, labels=None):
        out, _ = self.rnn(self.emb(input_ids), sequence_length=seq_len)
        emissions = self.head(out)
        _, tags = self.decoder(emissions, seq_len)
        # Paddle 3.3.1's static infer-meta gives the path dtype float32 and shape [0]:
        # cast first (a reshape of the mis-typed value hits oneDNN with int64), then reshape.
        batch, length = paddle.shape(input_ids)[0], paddle.shape(input_ids)[1]
        tags = tags.astype("int64").reshape([batch, -1])
        pad = paddle.zeros([batch, length - paddle.shape(tags)[1]], dtype="int64")
        tags = paddle.concat([tags, pad], axis=1)
        return emissions, tags


# ---------------------------------------------------------------- to_static: traced once

def test_static_layer_is_traced_once_for_all_shapes():
    import numpy as np

    from ppvarlen.export.static import to_static, traced_count
    from ppvarlen.tasks.base import INPUTS

    paddle.seed(0)
    for model in (TinyRNN("lstm"), TinyTransformer(), TinyCRFTagger()):
        model.eval()
        eager = [model]  # the wrapper keeps the model's own forward eager
        static = to_static(model, INPUTS)
        rng = np.random.RandomState(0)
        for batch, length in [(1, 1), (3, 7), (2, 16), (5, 3), (4, 33), (1, 50)]:
            ids = rng.randint(1, VOCAB, (batch, length)).astype("int64")
            lens = rng.randint(1, length + 1, batch).astype("int64")
            lens[0] = length
            got = static(paddle.to_tensor(ids), paddle.to_tensor(lens))
            want = eager[0](paddle.to_tensor(ids), paddle.to_tensor(lens))
            got = got if isinstance(got, (list, tuple)) else [got]
            want = want if isinstance(want, (list, tuple)) else [want]
            for g, w in zip(got, want):
                np.testing.assert_allclose(g.numpy(), w.numpy(), atol=1e-5)
        assert traced_count(static) == 1, type(model).__name__
