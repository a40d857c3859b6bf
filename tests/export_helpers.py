"""Tiny export directories for the deploy/server tests (built in seconds, once per session).

The export goes through the exporter itself (``ppvarlen.export.exporter.export_model``:
to_static save, ONNX conversion in a subprocess, crf matrix, manifest with sha256),
so the deploy side reads exactly what the exporter writes.  The models are tiny but real: masked
mean pooling (classification) and emissions + ``paddle.text.ViterbiDecoder``
(tagging), both ``forward(self, input_ids, seq_len, labels=None)``.
"""
import pytest

TEXTS = ["这部电影真好看", "服务很差，再也不来了", "江泽民主席在北京会见了客人", "今天天气不错",
         "质量一般般", "上海和广州都是大城市", "房间干净，早餐丰富，推荐！"]
NER_TAGS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG"]


def _models():
    import paddle

    class TinyClassifier(paddle.nn.Layer):
        def __init__(self, vocab_size, num_labels, hidden=16):
            super().__init__()
            self.emb = paddle.nn.Embedding(vocab_size, hidden)
            self.out = paddle.nn.Linear(hidden, num_labels)

        def forward(self, input_ids, seq_len, labels=None):
            positions = paddle.arange(paddle.shape(input_ids)[1]).unsqueeze(0)
            mask = (positions < seq_len.unsqueeze(1)).astype("float32").unsqueeze(-1)
            pooled = (paddle.tanh(self.emb(input_ids)) * mask).sum(1)
            return self.out(pooled / seq_len.astype("float32").unsqueeze(1))

    class TinyTagger(paddle.nn.Layer):
        def __init__(self, vocab_size, num_tags, hidden=16):
            super().__init__()
            self.emb = paddle.nn.Embedding(vocab_size, hidden)
            self.out = paddle.nn.Linear(hidden, num_tags)
            self.transitions = self.create_parameter([num_tags, num_tags])
            self.decoder = paddle.text.ViterbiDecoder(self.transitions, include_bos_eos_tag=False)

        def forward(self, input_ids, seq_len, labels=None):
            positions = paddle.arange(paddle.shape(input_ids)[1]).unsqueeze(0)
            mask = (positions < seq_len.unsqueeze(1)).astype("float32").unsqueeze(-1)
            emissions = self.out(paddle.tanh(self.emb(input_ids))) * mask
            _, tags = self.decoder(emissions, seq_len)
            return emissions, tags

    return TinyClassifier, TinyTagger


def make_tiny_export(out_dir, task="classification", max_len=16, long_text="truncate", stride=4,
                     seed=0, precisions=("fp32",), verify=False):
    """Export a tiny random model with the exporter itself; returns (out_dir, model, encoder)."""
    import paddle

    from ppvarlen.config import load_config
    from ppvarlen.data.vocab import TextEncoder
    from ppvarlen.export.exporter import export_model

    paddle.seed(seed)
    encoder = TextEncoder.build(TEXTS, kind="char")
    TinyClassifier, TinyTagger = _models()
    labels = ["negative", "positive"] if task == "classification" else NER_TAGS
    if task == "classification":
        model = TinyClassifier(encoder.vocab_size, len(labels))
    else:
        model = TinyTagger(encoder.vocab_size, len(labels))
        with paddle.no_grad():  # a non-trivial CRF so Viterbi differs from argmax
            model.transitions.set_value(paddle.randn([len(labels)] * 2) * 2)
    model.eval()
    meta = {"task": task, "model_name": "tiny", "label_names": labels,
            "special_ids": encoder.special_ids, "max_len": max_len, "max_position": max_len,
            "long_text": long_text, "length_profile": {"p50": 8, "p95": 12, "p99": 14, "max": 16}}
    corpus = "sentiment" if task == "classification" else "people_daily_ner"
    cfg = load_config(overrides=[f"Data.corpus={corpus}", f"Data.max_len={max_len}",
                                 f"Data.long_text={long_text}", f"Data.stride={stride}"])
    export_model(model, meta, encoder, cfg, out_dir, ("paddle", "onnx"), precisions, verify)
    return out_dir, model, encoder


def reference_ids(model, id_lists, task):
    """Dygraph outputs one id list at a time (no batching, no padding): the ground truth."""
    import paddle

    out = []
    for ids in id_lists:
        x = paddle.to_tensor([ids], dtype="int64")
        n = paddle.to_tensor([len(ids)], dtype="int64")
        with paddle.no_grad():
            y = model(x, n)
        out.append(y.numpy()[0] if task == "classification" else y[1].numpy()[0])
    return out


def reference(model, encoder, task, texts, max_len):
    """``reference_ids`` for texts encoded as the export does (truncated to ``max_len``)."""
    add_special = task == "classification"
    id_lists = []
    for t in texts:
        ids = encoder.encode(encoder.tokenize(t))[:max_len - (2 if add_special else 0)]
        id_lists.append([encoder.cls_id] + ids + [encoder.sep_id] if add_special else ids)
    return reference_ids(model, id_lists, task)


@pytest.fixture(scope="session")
def cls_export(tmp_path_factory):
    return make_tiny_export(str(tmp_path_factory.mktemp("cls") / "export"), "classification",
                            precisions=("fp32", "bf16", "fp16"))


@pytest.fixture(scope="session")
def tag_export(tmp_path_factory):
    return make_tiny_export(str(tmp_path_factory.mktemp("tag") / "export"), "tagging")
