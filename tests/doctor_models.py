"""Models with one planted variable-length bug each, for tests/doctor/test_doctor.py (random init).

Paddle layers saved as Paddle inference programs (``paddle.jit.save``: PIR ``.json``, or a
legacy ``.pdmodel`` when ``FLAGS_enable_pir_api=0`` is set before paddle is imported, which
``save_legacy`` does in a child process) and converted to ONNX with paddle2onnx (in a child
process, as the exporter does: paddle2onnx can abort its process).  Every graph has VOCAB
embedding rows and ids inputs named as users name them.
"""
import json
import os
import subprocess
import sys

import paddle
import paddle.nn as nn
from paddle.static import InputSpec

HIDDEN, LABELS = 16, 2
HERE = os.path.dirname(os.path.abspath(__file__))


SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
CHARS = list("的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过")
VOCAB = len(SPECIALS) + len(CHARS)  # every model's embedding rows: the test vocabulary fits


def _real(input_ids, lengths_or_mask, is_mask):
    """[B, L, 1] float mask of real positions, from an attention mask or from lengths."""
    if is_mask:
        return lengths_or_mask.astype("float32").unsqueeze(-1)
    positions = paddle.arange(paddle.shape(input_ids)[1]).unsqueeze(0)
    return (positions < lengths_or_mask.unsqueeze(1)).astype("float32").unsqueeze(-1)


class MeanOverPadding(nn.Layer):
    """Mean pooling that divides by the padded length: padding shrinks every vector."""

    def __init__(self):
        super().__init__()
        self.emb, self.out = nn.Embedding(VOCAB, HIDDEN), nn.Linear(HIDDEN, LABELS)

    def forward(self, input_ids, seq_len):
        # no tanh here: the legacy program translator of Paddle 3.3.1 cannot trace it
        hidden = self.emb(input_ids) * _real(input_ids, seq_len, False)
        return self.out(hidden.mean(axis=1))  # the bug: / L, not / seq_len


class MaskedMean(nn.Layer):
    """A correct masked mean (an empty row pools to zeros)."""

    def __init__(self):
        super().__init__()
        self.emb, self.out = nn.Embedding(VOCAB, HIDDEN), nn.Linear(HIDDEN, LABELS)

    def forward(self, input_ids, attention_mask):
        real = _real(input_ids, attention_mask, True)
        summed = (paddle.tanh(self.emb(input_ids)) * real).sum(1)
        return self.out(summed / paddle.clip(real.sum(1), min=1.0))


class MinusBillionAttention(nn.Layer):
    """Self-attention with the additive mask (1 - mask) * -1e9, then a masked mean: exact in
    float32, -inf (and 0 * -inf = NaN) in float16."""

    def __init__(self):
        super().__init__()
        self.emb, self.out = nn.Embedding(VOCAB, HIDDEN), nn.Linear(HIDDEN, LABELS)

    def forward(self, input_ids, attention_mask):
        x = paddle.tanh(self.emb(input_ids))
        keep = attention_mask.astype("float32")
        scores = paddle.matmul(x, x, transpose_y=True) / 4.0
        scores = scores + (1.0 - keep.unsqueeze(1)) * -1e9
        mixed = paddle.matmul(nn.functional.softmax(scores, axis=-1), x)
        real = keep.unsqueeze(-1)
        return self.out((mixed * real).sum(1) / paddle.clip(real.sum(1), min=1.0))


class NanOnEmpty(nn.Layer):
    """A masked mean divided by seq_len itself: 0 / 0 on a row without tokens."""

    def __init__(self):
        super().__init__()
        self.emb, self.out = nn.Embedding(VOCAB, HIDDEN), nn.Linear(HIDDEN, LABELS)

    def forward(self, input_ids, seq_len):
        summed = (paddle.tanh(self.emb(input_ids)) * _real(input_ids, seq_len, False)).sum(1)
        return self.out(summed / seq_len.astype("float32").unsqueeze(1))


class OddlyNamed(nn.Layer):
    """A correct model whose inputs no naming rule recognises."""

    def __init__(self):
        super().__init__()
        self.emb, self.out = nn.Embedding(VOCAB, HIDDEN), nn.Linear(HIDDEN, LABELS)

    def forward(self, foo, bar):
        return self.out((self.emb(foo) * bar.astype("float32").unsqueeze(-1)).sum(1))


def _spec(name, shape, dtype="int64"):
    return InputSpec(shape, dtype, name)


PROGRAMS = {  # name -> (layer class, input specs)
    "mean_over_padding": (MeanOverPadding, [_spec("input_ids", [None, None]),
                                            _spec("seq_len", [None])]),
    "fixed_32": (MaskedMean, [_spec("input_ids", [None, 32]), _spec("attention_mask", [None, 32])]),
    "fixed_1x32": (MaskedMean, [_spec("input_ids", [1, 32]), _spec("attention_mask", [1, 32])]),
    "minus_1e9": (MinusBillionAttention, [_spec("input_ids", [None, None]),
                                          _spec("attention_mask", [None, None])]),
    "nan_on_empty": (NanOnEmpty, [_spec("input_ids", [None, None]), _spec("seq_len", [None])]),
    "oddly_named": (OddlyNamed, [_spec("foo", [None, None]), _spec("bar", [None, None])]),
}


def save_program(name, directory, seed=0):
    """``directory/name/model.json`` + ``model.pdiparams`` (``.pdmodel`` in legacy mode)."""
    layer_class, specs = PROGRAMS[name]
    paddle.seed(seed)
    layer = layer_class()
    layer.eval()
    prefix = os.path.join(directory, name, "model")
    paddle.jit.save(layer, prefix, input_spec=specs)
    return prefix


def save_legacy(name, directory):
    """The program in the legacy ProgramDesc format, written by a child process (the PIR switch
    is read when paddle is imported)."""
    code = (f"import doctor_models\n"
            f"doctor_models.save_program({name!r}, {directory!r})\n")
    env = dict(os.environ, FLAGS_enable_pir_api="0", GLOG_minloglevel="2")
    done = subprocess.run([sys.executable, "-c", code], cwd=HERE, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return os.path.join(directory, name, "model.pdmodel")


CONVERT = """
import json, sys
import paddle2onnx
for program, params, out in json.loads(sys.argv[1]):
    onnx_bytes = paddle2onnx.export(program, params, save_file=None, opset_version=13,
                                    auto_upgrade_opset=True, enable_onnx_checker=True,
                                    optimize_tool=None)
    with open(out, "wb") as f:
        f.write(onnx_bytes)
"""


def to_onnx(prefixes):
    """Convert PIR programs (path prefixes) to ``PREFIX.onnx``, all in one child process."""
    jobs = [(p + ".json", p + ".pdiparams", p + ".onnx") for p in prefixes]
    done = subprocess.run([sys.executable, "-c", CONVERT, json.dumps(jobs)], capture_output=True,
                          text=True, timeout=900, env=dict(os.environ, GLOG_minloglevel="2"))
    assert done.returncode == 0, done.stderr[-3000:]
    return [out for _, _, out in jobs]


# ---------------------------------------------------------------- PaddleNLP directories

def write_vocab(path, extra=0):
    tokens = SPECIALS + CHARS + [f"[unused{i}]" for i in range(extra)]
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(tokens) + "\n")
    return VOCAB


def save_paddlenlp_dir(directory, arch="ernie", pad_token_id=0, extra_tokens=0, seed=0,
                       max_position=64):
    """A random-init *ForSequenceClassification directory (safetensors) and its tokenizer;
    ``pad_token_id`` is config.json's, ``extra_tokens`` tokens more in vocab.txt than the
    embedding has rows."""
    import paddlenlp.transformers as pt

    os.makedirs(directory, exist_ok=True)
    vocab_file = os.path.join(directory, "source_vocab.txt")
    rows = write_vocab(vocab_file, extra_tokens)
    config_class, model_class, tokenizer_class = {
        "ernie": (pt.ErnieConfig, pt.ErnieForSequenceClassification, pt.ErnieTokenizer),
        "bert": (pt.BertConfig, pt.BertForSequenceClassification, pt.BertTokenizer)}[arch]
    config = config_class(vocab_size=rows, hidden_size=32, num_hidden_layers=2,
                          num_attention_heads=2, intermediate_size=64,
                          max_position_embeddings=max_position, num_labels=LABELS,
                          pad_token_id=pad_token_id)
    paddle.seed(seed)
    model_class(config).save_pretrained(directory, safe_serialization=True)
    tokenizer_class(vocab_file=vocab_file, do_lower_case=True).save_pretrained(directory)
    os.remove(vocab_file)
    return str(directory)
