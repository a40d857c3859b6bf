"""``Task``: everything that differs between classification, tagging, seq2seq and masked-LM.

The trainer, evaluator, exporter, parity checker, predictor and server hold a Task object
(``ppvarlen.tasks.get_task``) and ask it; none of them compares task names.  A Task:

* data: which corpora it reads, how an example becomes encoded items (``example_ids``,
  ``window_item``; source/target ``pairs`` for seq2seq), its special-token default;
* training: the config combinations it refuses, the model inputs of a batch, the loss,
  predictions (argmax, in-graph tags, greedy/beam decoding), the metrics report and the main
  metric that picks the best checkpoint, the checkpoint-meta extras;
* export: input/output specs and the export views (``export_view``, exporter.VIEWS);
* deploy: what a manifest of this task must hold, how engine outputs become per-row outputs,
  and the per-text response of the predictor.

Layering: this package imports data, utils and ``ppvarlen.metrics`` only (never engine, export
or deploy); ``paddle`` is imported inside the methods that need it, so a serving host imports no
model or training code.  Model objects are received and their methods called, never imported.
"""
from dataclasses import dataclass

import numpy as np

from ..config import ConfigError
from ..data.errors import DataError
from ..data.longtext import POLICIES, LongTextStats, batch_spans, span_rows, text_windows
from ..data.store import EncodedSlice, StoreField, pack_columns

INPUTS = [{"name": "input_ids", "dtype": "int64", "dims": [-1, -1]},
          {"name": "seq_len", "dtype": "int64", "dims": [-1]}]


@dataclass
class EncodeContext:
    """What a task's ``encode_example`` reads besides the example (picklable, plain values)."""
    encoder: object
    max_len: int
    long_text: str
    stride: int
    specials: bool
    tag_ids: dict
    max_source_len: int = None
    max_target_len: int = None


@dataclass(frozen=True)
class EncodeRecord:
    """What ``encode_example`` reports of one example besides its items: its tokens before the
    long-text policy (``doc_length``, special tokens counted), its [UNK] and real token counts,
    and ``long_text`` {name: (tokens, kept spans)} for the split's long-text stats."""
    doc_length: int
    unk: int
    real: int
    long_text: dict


class Task:
    name = ""
    main_metric = ""
    reads = ()                     # corpus tasks whose examples it can encode (default: its own)
    default_special_tokens = False  # Data.add_special_tokens: null means this
    pairs = False                  # source/target pairs (seq2seq) instead of windowed token rows
    example_weighting = False      # Train.loss_weighting=example applies (one label per example)
    text_field = "text"            # field of a corpus example the load test sends (bench)
    servable = True                # an export of it can be served (deploy)
    generates = False              # outputs are decoded step by step (many runs per batch)
    token_spans = False            # the response needs each token's character offsets
    export_view = "forward"        # exporter.VIEWS key: which programs an export writes
    input_specs = INPUTS
    output_specs = []

    def __repr__(self):
        return f"<task {self.name}>"

    # ------------------------------------------------------------ data
    def corpus_tasks(self):
        return self.reads or (self.name,)

    def check_data_config(self, data_cfg, builds_encoder):
        """Refuse Data settings this task cannot follow (ConfigError naming the key)."""

    def check_encoder(self, encoder):
        """Refuse an encoder that lacks ids the task needs."""

    def example_ids(self, encoder, ex, where, tag_ids):
        """-> (token ids (a list or int32 array), per-token label ids or None) of one example."""
        return encoder.encode_array(ex["text"]), None

    def window_item(self, ex, labels, start, end, specials, doc_id):
        """The fields of one window's item besides ``input_ids``."""
        return {"doc_id": doc_id}

    def store_fields(self):
        """The fields of this task's items, as the store keeps them (``data.store.StoreField``)."""
        return [StoreField("input_ids", "int32", ragged=True, length=True, lengths="seq_len"),
                StoreField("doc_id", "int64")]

    def encode_example(self, ctx, ex, doc_id, where):
        """One corpus example -> (items, record) for the store builder (``ppvarlen.store_build``).

        Items: dicts with every ``store_fields`` field (token rows under the long-text policy,
        ``[CLS] .. [SEP]`` with ``ctx.specials``; ``window_item`` adds the label fields).
        Record: an ``EncodeRecord``."""
        enc = ctx.encoder
        ids, labels = self.example_ids(enc, ex, where, ctx.tag_ids)
        ids = np.asarray(ids, np.int32)
        if not len(ids):
            raise DataError(f"{where}: no tokens after tokenisation (empty or only spaces); "
                            f"remove it from the data")
        rows, spans = text_windows(ids, ctx.max_len, ctx.long_text, ctx.stride, where,
                                   (enc.cls_id, enc.sep_id) if ctx.specials else None)
        items = [{"input_ids": row, **self.window_item(ex, labels, start, end, ctx.specials,
                                                       doc_id)}
                 for row, (start, end) in zip(rows, spans)]
        return items, EncodeRecord(len(ids) + (2 if ctx.specials else 0),
                                   int(np.count_nonzero(ids == enc.unk_id)), len(ids),
                                   {"": (len(ids), spans)})

    def encode_examples(self, ctx, examples, first_doc_id, where):
        """Examples (doc ids ``first_doc_id``, ``first_doc_id + 1``, ...) -> ``EncodedSlice``:
        the items ``encode_example`` makes of each, in order, their columns packed, and the
        records summed; ``where(doc_id)`` names an example in an error.  A task whose
        ``encode_example`` is this class's gets the same bytes from array operations over the
        whole slice; any other encodes one example at a time."""
        if type(self).encode_example is Task.encode_example:
            try:
                encoded = self._encode_windowed(ctx, examples, first_doc_id, where)
            except (DataError, ValueError):
                encoded = None
            if encoded is not None:
                return encoded
        # one at a time: also how a slice with a bad example raises the first one's error
        return self._encode_each(ctx, examples, first_doc_id, where)

    def _encode_each(self, ctx, examples, first_doc_id, where):
        fields = self.store_fields()
        columns = {f.name: [] for f in fields}
        unk = real = 0
        doc_lengths, long_text = [], {}
        for k, ex in enumerate(examples):
            items, record = self.encode_example(ctx, ex, first_doc_id + k,
                                                where(first_doc_id + k))
            for item in items:
                for f in fields:
                    columns[f.name].append(item[f.name])
            unk += record.unk
            real += record.real
            doc_lengths.append(record.doc_length)
            for name, (n, spans) in record.long_text.items():
                lt = long_text.setdefault(name, LongTextStats("", ctx.long_text))
                lt.add(n, spans)
        return EncodedSlice(pack_columns(fields, columns), unk, real,
                            np.asarray(doc_lengths, np.int64), long_text)

    def _encode_windowed(self, ctx, examples, first_doc_id, where):
        """``encode_example``'s rule over a slice at once, or None when an example breaks it
        (the one-at-a-time path then raises its error).  DataError / ValueError from
        ``example_ids`` or the planning: the same."""
        enc = ctx.encoder
        specials = (enc.cls_id, enc.sep_id) if ctx.specials else None
        content = ctx.max_len - (2 if specials else 0)
        if type(self).example_ids is Task.example_ids:
            ids, lengths = enc.encode_batch([ex["text"] for ex in examples])
            labels = [None] * len(examples)
        else:
            pairs = [self.example_ids(enc, ex, where(first_doc_id + k), ctx.tag_ids)
                     for k, ex in enumerate(examples)]
            arrays = [np.asarray(a, np.int32) for a, _ in pairs]
            labels = [lab for _, lab in pairs]
            lengths = np.fromiter(map(len, arrays), np.int64, len(arrays))
            ids = np.concatenate(arrays) if arrays else np.zeros(0, np.int32)
        if ctx.long_text not in POLICIES or content < 1 or not lengths.all() or \
                (ctx.long_text == "error" and (lengths > content).any()):
            return None
        ids = ids.astype(np.int32, copy=False)
        docs, starts, ends = batch_spans(lengths, content, ctx.long_text, ctx.stride)
        offsets = np.cumsum(lengths) - lengths
        rows, row_lengths = span_rows(ids, offsets, docs, starts, ends, specials)
        others = [f for f in self.store_fields() if f.name != "input_ids"]
        items = [self.window_item(examples[d], labels[d], s, e, ctx.specials, first_doc_id + d)
                 for d, s, e in zip(docs.tolist(), starts.tolist(), ends.tolist())]
        columns = pack_columns(others, {f.name: [it[f.name] for it in items] for f in others})
        columns["input_ids"] = (rows, row_lengths)
        windows = np.bincount(docs, minlength=len(lengths))
        first = np.searchsorted(docs, np.arange(len(lengths)))  # each document's first span
        kept = ends[first + windows - 1] - starts[first]
        lt = LongTextStats("", ctx.long_text)
        lt.add_batch(lengths, kept, windows)
        return EncodedSlice(columns, int(np.count_nonzero(ids == enc.unk_id)), len(ids),
                            lengths + (2 if specials else 0), {"": lt})

    def extra_train_items(self, corpora, data_cfg, encoder, first_doc_id):
        """Train items from other corpora (``Pretrain.extra_corpora``) -> (items, {source: n}),
        the counts None for a task that reads no extra text."""
        if corpora:
            raise ConfigError(f"Pretrain.extra_corpora {list(corpora)}: only the masked_lm task "
                              f"reads extra text, this run trains {self.name}; remove it or set "
                              f"Train.task: masked_lm")
        return [], None

    # ------------------------------------------------------------ training
    def check_train_config(self, cfg):
        """Refuse Train/Model combinations the task's loss cannot honour."""

    length_key = "max_len"  # the Data key that bounds an item's tokens

    def check_lengths(self, cfg):
        """An item of ``Data.<length_key>`` tokens must fit the model's position table (else an
        index error deep inside a kernel at the first long batch, PITFALLS 17)."""
        table, longest = cfg.Model.get("max_position"), cfg.Data.get(self.length_key)
        if table is not None and longest is not None and longest > table:
            raise ConfigError(f"Data.{self.length_key}={longest} is longer than "
                              f"Model.max_position={table} ({cfg.Model.name} reads at most "
                              f"{table} positions); lower Data.{self.length_key} or raise "
                              f"Model.max_position")

    def num_labels(self, encoder, label_names):
        return len(label_names)

    def configure_model(self, model, cfg, encoder):
        """Settings the model applies itself (e.g. seq2seq's smoothed loss)."""

    def model_inputs(self, batch):
        """The model's inputs of a batch: its declared ``input_specs``, in order (what the
        export feeds the program too)."""
        import paddle

        return tuple(paddle.to_tensor(batch[s["name"]]) for s in self.input_specs)

    def loss(self, model, batch, label_smoothing=0.0):
        """Mean float32 loss of one batch (pads ignored by the models' losses)."""
        import paddle

        loss, _ = model(*self.model_inputs(batch), labels=paddle.to_tensor(batch["labels"]))
        return loss.astype("float32")

    def synthetic_inputs(self, input_ids, seq_len, rng):
        """The inputs after ids and lengths (``input_specs[2:]``) of a random-id batch (export
        parity's shape grid); a task that declares more inputs makes plausible ones here."""
        return ()

    def batch_size(self, batch):
        return len(batch["seq_len"])

    def token_counts(self, batch):
        """(real tokens, padded tokens) of a batch."""
        return int(batch["seq_len"].sum()), int(batch["input_ids"].size)

    def predict_batch(self, model, batch, decoding, padding_side):
        """Per-example outputs of one collated batch (eval mode, no grad)."""
        raise NotImplementedError

    def report(self, dataset, outputs, label_names, encoder=None):
        raise NotImplementedError

    def class_report(self, dataset, outputs, label_names):
        """The eval's per-class report of a single-label task (``metrics.class_report``: per
        class precision/recall/F1/support and the confusion matrix); None for other tasks."""
        return None

    def meta_extras(self, cfg):
        """Checkpoint-meta fields besides the common ones."""
        return {}

    def model_meta(self, model):
        """Checkpoint-meta fields the built model decides (what a pretrained directory chose
        rather than the config, e.g. an embedding's width and pooling), over ``meta_extras``."""
        return {}

    def write_artifacts(self, model, data, out_dir):
        """Files the run leaves in ``out_dir`` besides checkpoints -> result entries."""
        return {}

    # ------------------------------------------------------------ deploy
    def manifest_problems(self, manifest):
        """What a manifest of this task lacks (messages; empty when servable)."""
        return []

    def output_problems(self, predictor, out, seq_len):
        """What the engine's outputs of one batch (rows of ``seq_len`` tokens) say against the
        manifest (messages; empty when they agree), e.g. one logit per label name."""
        return []

    def too_long_fix(self):
        return "shorten the text or re-export with Data.long_text: window"

    def engine_rows(self, predictor, out, seq_len):
        """Engine outputs of one batch -> one output per row."""
        raise NotImplementedError

    def target_counts(self, rows):
        """(real, run) decoder steps of a batch's rows; None when the task does not decode."""
        return None

    def response(self, predictor, item, outputs):
        """The predictor's result for one text from its windows' (or pieces') outputs."""
        raise NotImplementedError

    def answer_counts(self, results):
        """Counters of a list of ``response`` results that the server's /metrics and the infer
        summary add up (e.g. tagging: sequences whose chunks were repaired); {} by default."""
        return {}

    def manifest_extras(self, meta):
        """manifest.json fields of this task besides the common ones (from checkpoint meta)."""
        return {}

    def health_extras(self, manifest):
        """What the server's /health says about this export besides the common fields."""
        return {}

    def embedding_spec(self, manifest):
        """What the OpenAI-style embeddings route (``POST /v1/embeddings``) and
        ``ppvarlen-infer``'s array outputs need of an export of this task: ``{"field": the
        ``response`` field holding the D floats, "dim": D, "normalize": bool, "truncatable":
        bool}`` (the results carry ``num_tokens`` too); None: the task answers no
        embeddings."""
        return None

    def output_shapes(self, manifest):
        """{prediction field: shape after the batch dim} of the fields holding a list of
        floats whose width the prediction model's annotation cannot say (the manifest holds
        it, e.g. an embedding's D); a protocol that answers tensors reads them."""
        return {}

    def bench_overrides(self, manifest):
        """Config overrides naming the corpus whose test texts the load test sends."""
        return ["Data.corpus=sentiment"]

    examples = []  # request items of the /docs example (deploy/api.py)
    request_key = "texts"  # the /predict body's list: {"texts": [...]}
    request_item_words = "strings"  # what the list holds, in an error message
    # the Open Inference Protocol's BYTES input tensors of a request item, in order (one text:
    # "text"; a task whose item holds several texts names one tensor per text)
    oip_inputs = ("text",)

    def oip_item(self, texts):
        """The request item of one row of the OIP input tensors (``texts``: one string per
        ``oip_inputs`` name, in that order)."""
        return texts[0]

    def line_fields(self):
        """The fields of a JSONL line holding a request item's texts (``ppvarlen-infer``): per
        ``oip_inputs`` name, in that order, the field names it is read under (the first one
        present wins); the item is ``oip_item`` of the texts.  Other fields are ignored."""
        return tuple((name,) for name in self.oip_inputs)

    def request_item(self, text_type):
        """The pydantic type of one request item, given the server's bounded text type."""
        return text_type

    def check_request_item(self, item, max_chars):
        """(problem or None, whether it is over the character limit) of one request item."""
        if not isinstance(item, str):
            return f"must be a string, got {type(item).__name__}", False
        if len(item) > max_chars:
            return f"has {len(item)} characters; at most {max_chars} (Deploy.max_text_chars)", True
        return None, False

    def encode_request(self, predictor, item, long_text):
        """One request item -> the predictor's ``EncodedText`` (DataError when unusable)."""
        return predictor.encode(item, long_text)

    def prediction_model(self, label_names):
        """The pydantic model of one ``response`` (the HTTP API's prediction object)."""
        raise NotImplementedError


def output_width_problems(out, name, seq_len, width, what, per_token=False):
    """Problems of output ``name``: rows [B] (and positions [L] when ``per_token``) by
    ``width`` values, one per ``what``."""
    if name not in out:
        return [f"the graph has no output {name!r} (it gives {sorted(out)}); re-export"]
    shape = tuple(np.shape(out[name]))
    rank = 3 if per_token else 2
    want = (len(seq_len),) + ((int(max(seq_len)),) if per_token else ()) + (width,)
    if len(shape) != rank or shape[0] != want[0] or shape[-1] != width:
        return [f"the graph's {name!r} has shape {list(shape)} for {len(seq_len)} texts but the "
                f"manifest lists {width} {what}, so it should be {list(want)}; the manifest "
                f"comes from another model — re-export"]
    return []


def unpad(rows, seq_len, padding_side):
    """Per-example rows of a [B, L] array without their padding."""
    width = rows.shape[1]
    if padding_side == "left":
        return [rows[j, width - n:] for j, n in enumerate(seq_len)]
    return [rows[j, :n] for j, n in enumerate(seq_len)]
