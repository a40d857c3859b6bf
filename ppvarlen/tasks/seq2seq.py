"""Seq2seq: source text -> generated target ids (g2p); greedy or beam decoding."""
import pydantic

from ..config import ConfigError
from ..data.errors import DataError
from ..data.longtext import plan_spans
from ..data.store import StoreField
from ..utils.search import strip_eos
from .base import EncodeRecord, Task
from .seq2seq_metrics import seq2seq_metrics

DECODING_KEYS = ("max_len_a", "max_len_b", "max_position", "bos_id", "eos_id", "pad_id")
PAIR_FIELDS = ("src_ids", "src_len", "tgt_in", "tgt_len", "tgt_out")


def seq2seq_report(dataset, hyp_ids, encoder):
    """Sequence accuracy and token (syllable) error rate of decoded outputs vs references."""
    refs = [encoder.decode_target(dataset[i]["tgt_ids"][1:-1]) for i in range(len(dataset))]
    return seq2seq_metrics([encoder.decode_target(h) for h in hyp_ids], refs)


class Seq2SeqTask(Task):
    name = "seq2seq"
    main_metric = "seq_acc"
    pairs = True
    text_field = "source"
    generates = True
    export_view = "greedy"
    input_specs = [{"name": "src_ids", "dtype": "int64", "dims": [-1, -1]},
                   {"name": "src_len", "dtype": "int64", "dims": [-1]}]
    # generated ids after BOS, EOS-terminated, pad after (Paddle graph)
    output_specs = [{"name": "tokens", "dtype": "int64", "dims": [-1, -1]}]

    def line_fields(self):
        return (("source", "text"),)  # the seq2seq data format's field, or the OIP input's

    # ------------------------------------------------------------ data
    def check_data_config(self, data_cfg, builds_encoder):
        if builds_encoder and data_cfg.tokenizer == "pretrained":
            raise ConfigError("Data.tokenizer: seq2seq builds its own char/word vocabulary; "
                              "set tokenizer: char")
        if data_cfg.long_text == "window":
            raise ConfigError("Data.long_text: window cannot split a source/target pair (the "
                              "target has no alignment to source windows); use truncate or error")

    def store_fields(self):
        return [StoreField("src_ids", "int32", ragged=True, length=True, lengths="src_len"),
                StoreField("tgt_ids", "int32", ragged=True, length=True, key="tgt",
                           lengths="tgt_len", shift=True),
                StoreField("doc_id", "int64")]

    def encode_example(self, ctx, ex, doc_id, where):
        """A source/target pair -> one ``{src_ids, tgt_ids (BOS .. EOS), doc_id}`` item."""
        enc = ctx.encoder
        src = enc.encode(enc.tokenize(ex["source"]))
        tgt = enc.encode_target(ex["target"])
        if not src or not tgt:
            raise DataError(f"{where}: empty source or target after tokenisation; remove the "
                            f"example")
        src_spans = plan_spans(len(src), ctx.max_source_len, ctx.long_text, 0, where + " source")
        tgt_spans = plan_spans(len(tgt), ctx.max_target_len, ctx.long_text, 0, where + " target")
        item = {"src_ids": src[:src_spans[0][1]],
                "tgt_ids": [enc.bos_id] + tgt[:tgt_spans[0][1]] + [enc.eos_id], "doc_id": doc_id}
        return [item], EncodeRecord(len(src) + len(tgt) + 2,
                                    src.count(enc.unk_id) + tgt.count(enc.unk_id),
                                    len(src) + len(tgt),
                                    {"source": (len(src), src_spans),
                                     "target": (len(tgt), tgt_spans)})

    def check_encoder(self, encoder):
        if encoder.bos_id is None or encoder.eos_id is None:
            raise ConfigError("Data.tokenizer: seq2seq targets need [BOS]/[EOS]; a pretrained "
                              "BERT/ERNIE vocabulary has none: use tokenizer: char")

    # ------------------------------------------------------------ training
    length_key = "max_source_len"  # what a deployed model receives

    def check_train_config(self, cfg):
        if cfg.Data.padding_side != "right":
            raise ConfigError("Data.padding_side: the seq2seq model builds its masks for right "
                              "padding; set it to right")

    def num_labels(self, encoder, label_names):
        # the output vocabulary: the ids a decoder may generate
        return encoder.output_size or encoder.vocab_size

    def configure_model(self, model, cfg, encoder):
        model.label_smoothing = cfg.Train.label_smoothing  # the model's own (masked) loss

    def model_inputs(self, batch):
        import paddle

        return [paddle.to_tensor(batch[k]) for k in PAIR_FIELDS]

    def loss(self, model, batch, label_smoothing=0.0):
        loss, _ = model(*self.model_inputs(batch))
        return loss.astype("float32")

    def batch_size(self, batch):
        return len(batch["src_len"])

    def token_counts(self, batch):
        """Both sides count: sources and decoder inputs."""
        real = int(batch["src_len"].sum()) + int(batch["tgt_len"].sum())
        return real, int(batch["src_ids"].size) + int(batch["tgt_in"].size)

    def predict_batch(self, model, batch, decoding, padding_side):
        """Generated ids per source (no BOS/EOS): greedy, or beam search when beam_size > 1."""
        import paddle

        src_ids, src_len = paddle.to_tensor(batch["src_ids"]), paddle.to_tensor(batch["src_len"])
        if decoding.get("beam_size", 1) > 1:
            return model.beam_search(src_ids, src_len, beam_size=decoding["beam_size"],
                                     length_penalty=decoding.get("length_penalty", 1.0))
        return model.greedy_decode(src_ids, src_len)

    def report(self, dataset, outputs, label_names, encoder=None):
        return seq2seq_report(dataset, outputs, encoder)

    def meta_extras(self, cfg):
        d, m = cfg.Data, cfg.Model  # the source side is what a deployed model receives
        return {"max_len": d.max_source_len, "max_source_len": d.max_source_len,
                "max_target_len": d.max_target_len,
                "decoding": {"max_len_a": m.max_len_a, "max_len_b": m.max_len_b,
                             "beam_size": m.beam_size, "length_penalty": m.length_penalty}}

    # ------------------------------------------------------------ deploy
    def manifest_problems(self, manifest):
        """A seq2seq manifest needs its decoding rule, and a long-text policy a pair can follow."""
        decoding = manifest.get("decoding")
        if not isinstance(decoding, dict):
            return [f"a seq2seq export needs a 'decoding' object (strategy, "
                    f"{', '.join(DECODING_KEYS)}); re-export with tools/export.py"]
        missing = [k for k in DECODING_KEYS if k not in decoding]
        if missing:
            return [f"decoding.{missing[0]} is missing (needs {list(DECODING_KEYS)}); re-export "
                    f"with tools/export.py"]
        if decoding.get("strategy", "greedy") != "greedy":
            return [f"decoding.strategy {decoding['strategy']!r} cannot be served; the exported "
                    f"programs decode greedily"]
        policy = manifest["long_text"]
        policy = policy if isinstance(policy, str) else policy.get("policy")
        if policy not in ("error", "truncate"):
            return [f"long_text policy {policy!r} cannot be served for seq2seq (windows of a "
                    f"source have no target to join); use error or truncate"]
        return []

    def too_long_fix(self):
        return ("split it at punctuation, or serve with -o Deploy.split_long_sources=true "
                "(deploy/python/infer.py: --split-long-sources)")

    def engine_rows(self, predictor, out, seq_len):
        if "output_ids" in out:  # ONNX: the loop ran in numpy
            return out["output_ids"]
        # Paddle: [B, T] tokens after BOS, EOS, padding
        return strip_eos(out["tokens"], predictor.decoding["eos_id"])

    def output_problems(self, predictor, out, seq_len):
        rows = self.engine_rows(predictor, out, seq_len)
        limit = predictor.encoder.output_size or predictor.encoder.vocab_size
        top = max((int(i) for r in rows for i in r), default=0)
        if top >= limit:
            return [f"the graph generated id {top} but the vocabulary has {limit} output "
                    f"tokens; the vocabulary comes from another model — re-export"]
        return []

    def target_counts(self, rows):
        steps = max(len(g) for g in rows) + 1  # the loop stops at the last EOS
        return sum(len(g) + 1 for g in rows), len(rows) * steps

    def response(self, predictor, item, outputs):
        ids = [int(i) for out in outputs for i in out]  # pieces in source order
        return {"output": predictor.encoder.decode_target(ids), "output_ids": ids,
                "num_tokens": item.num_tokens, "truncated": item.truncated,
                "pieces": len(outputs)}

    examples = ["中国人民"]

    def prediction_model(self, label_names):
        class Seq2SeqPrediction(pydantic.BaseModel):
            output: str = pydantic.Field(description="the generated text")
            output_ids: list[int] = pydantic.Field(description="generated ids, without BOS/EOS")
            num_tokens: int = pydantic.Field(ge=1, description="source tokens")
            truncated: bool
            pieces: int = pydantic.Field(ge=1, description="source pieces decoded "
                                                           "(Deploy.split_long_sources)")

        return Seq2SeqPrediction

    def bench_overrides(self, manifest):
        # the g2p clauses packed to the export's source length
        return ["Data.corpus=g2p", f"Data.max_source_len={int(manifest['max_len'])}"]
