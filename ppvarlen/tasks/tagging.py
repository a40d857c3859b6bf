"""Tagging: one tag per token (CRF taggers decode in the graph; ONNX exports in numpy)."""
import functools
from typing import Literal, Optional

import numpy as np
import pydantic

from .. import metrics
from ..config import ConfigError
from ..data.errors import DataError
from ..data import tagschemes
from ..data.collate import IGNORE_INDEX
from ..data.longtext import aggregate_tokens
from ..utils.viterbi import crf_decode
from ..data.store import StoreField
from .base import Task, output_width_problems, unpad


@functools.lru_cache(maxsize=8)
def _scheme_of(label_names):
    return tagschemes.detect(label_names)


def entities(tags, spans, text, scheme):
    """``(entity dicts, repaired)``: the chunks of ``tags`` in ``scheme`` with character offsets
    (end exclusive) and how many of them the repair rule read from an ill-formed sequence
    (``tagschemes.read_chunks``); an untyped chunk (a BMES word) has ``"type": None``; none for
    plain tags."""
    if not tagschemes.SCHEME[scheme].has_chunks:
        return [], 0
    found, repaired = tagschemes.read_chunks(tags, scheme)
    out = []
    for kind, first, end in found:
        start, stop = spans[first][0], spans[end - 1][1]
        out.append({"type": kind or None, "text": text[start:stop], "start": start, "end": stop})
    return out, repaired


class TaggingTask(Task):
    name = "tagging"
    main_metric = "f1"
    token_spans = True  # the response gives entities as character offsets
    output_specs = [{"name": "emissions", "dtype": "float32", "dims": [-1, -1, -1], "per": "token"},
                    {"name": "tags", "dtype": "int64", "dims": [-1, -1]}]

    def example_ids(self, encoder, ex, where, tag_ids):
        if len(ex["tags"]) != len(ex["tokens"]):
            raise DataError(f"{where}: {len(ex['tokens'])} tokens but {len(ex['tags'])} tags; "
                            f"every token needs exactly one tag")
        try:
            labels = [tag_ids[t] for t in ex["tags"]]
        except KeyError as e:
            raise DataError(f"{where}: tag {e.args[0]!r} is not one of the labels "
                            f"{list(tag_ids)}") from None
        return encoder.encode(ex["tokens"]), labels

    def window_item(self, ex, labels, start, end, specials, doc_id):
        window = labels[start:end]
        if specials:  # special tokens carry no tag
            window = [IGNORE_INDEX] + window + [IGNORE_INDEX]
        return {"labels": window, "doc_id": doc_id, "offset": start}

    def store_fields(self):
        return super().store_fields() + [StoreField("labels", "int32", ragged=True,
                                                                pad=IGNORE_INDEX),
                                         StoreField("offset", "int64")]

    def check_train_config(self, cfg):
        if cfg.Train.label_smoothing:
            raise ConfigError("Train.label_smoothing: the CRF tagger's loss is a sequence "
                              "likelihood, smoothing does not apply; set it to 0")

    def predict_batch(self, model, batch, decoding, padding_side):
        """Predicted tag ids [len] per example (its real tokens only)."""
        out = model(*self.model_inputs(batch))
        return unpad(out[1].numpy(), batch["seq_len"], padding_side)

    def report(self, dataset, outputs, label_names, encoder=None):
        """Entity P/R/F1 per document (windows stitched back by their token offsets)."""
        doc_ids, offsets, pred_rows, gold_rows = [], [], [], []
        for i, tags in enumerate(outputs):
            item = dataset[i]
            labels = np.asarray(item["labels"])
            content = labels != -100  # special tokens carry -100
            doc_ids.append(item["doc_id"])
            offsets.append(item.get("offset", 0))
            pred_rows.append(np.asarray(tags)[content])
            gold_rows.append(labels[content])
        _, pred_docs = aggregate_tokens(doc_ids, offsets, pred_rows)
        _, gold_docs = aggregate_tokens(doc_ids, offsets, gold_rows)
        names = lambda ids: [label_names[int(t)] for t in ids]  # noqa: E731
        out = metrics.tagging_metrics([names(p) for p in pred_docs], [names(g) for g in gold_docs],
                                      label_names)
        out["num_examples"] = len(gold_docs)
        return out

    def output_problems(self, predictor, out, seq_len):
        n = len(predictor.label_names)
        if "emissions" in out:
            return output_width_problems(out, "emissions", seq_len, n, "tag names",
                                         per_token=True)
        tags = out.get("tags")
        if tags is None:
            return [f"the graph has neither 'emissions' nor 'tags' (it gives {sorted(out)})"]
        top = max(int(np.max(tags[r, :int(k)], initial=0)) for r, k in enumerate(seq_len))
        if top >= n:
            return [f"the graph answers tag id {top} or more but the manifest lists {n} tag "
                    f"names; the manifest comes from another model — re-export"]
        return []

    def engine_rows(self, predictor, out, seq_len):
        """Tag ids per row: from the graph, or Viterbi in numpy over ONNX emissions."""
        if predictor.crf_matrix is not None:
            tags = crf_decode(out["emissions"], predictor.crf_matrix, seq_len)
        else:
            tags = out["tags"]
        return [tags[r, :n].astype(np.int64) for r, n in enumerate(seq_len)]

    def response(self, predictor, item, outputs):
        specials = 1 if predictor.add_special_tokens else 0
        content = [t[specials:len(t) - specials] for t in outputs]
        _, merged = aggregate_tokens([0] * len(content), item.offsets, content)
        tags = [predictor.label_names[int(t)] for t in merged[0]]  # every kept token
        scheme = _scheme_of(tuple(predictor.label_names))  # once per label set, not per text
        found, repaired = entities(tags, item.spans[:len(tags)], item.text, scheme)
        return {"entities": found, "tags": tags, "repaired_chunks": repaired,
                "num_tokens": item.num_tokens, "truncated": item.truncated}

    def answer_counts(self, results):
        return {"tag_sequences_repaired": sum(r["repaired_chunks"] > 0 for r in results),
                "tag_chunks_repaired": sum(r["repaired_chunks"] for r in results)}

    def manifest_extras(self, meta):
        # the label names tell the scheme (data.readers completes them so that they do)
        return {"tag_scheme": _scheme_of(tuple(meta["label_names"]))}

    def health_extras(self, manifest):
        return {"tag_scheme": manifest.get("tag_scheme") or _scheme_of(tuple(manifest["label_names"]))}

    examples = ["江泽民在北京会见了客人"]

    def prediction_model(self, label_names):
        Tag = Literal[tuple(label_names)]

        class Entity(pydantic.BaseModel):
            type: Optional[str] = pydantic.Field(
                description="the chunk's type (PER, LOC ...); null for an untyped chunk (a BMES "
                            "word)")
            text: str = pydantic.Field(description="text[start:end]")
            start: int = pydantic.Field(ge=0, description="character offset in the request text")
            end: int = pydantic.Field(ge=0, description="character offset, exclusive")

        class TaggingPrediction(pydantic.BaseModel):
            entities: list[Entity] = pydantic.Field(
                description="chunks of the tag scheme, in text order")
            tags: list[Tag] = pydantic.Field(description="one tag per token")
            repaired_chunks: int = pydantic.Field(
                ge=0, description="entities read from an ill-formed tag sequence by conlleval's "
                                  "rule (docs/TAGGING.md)")
            num_tokens: int = pydantic.Field(ge=1)
            truncated: bool

        return TaggingPrediction
