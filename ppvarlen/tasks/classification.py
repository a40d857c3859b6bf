"""Classification: one label per text (windows of a long text: mean of their logits)."""
from typing import Literal

import numpy as np
import pydantic

from .. import metrics
from ..data.longtext import aggregate_classification
from ..data.store import StoreField
from .base import Task, output_width_problems


def softmax(logits):
    z = logits - logits.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


class ClassificationTask(Task):
    name = "classification"
    main_metric = "accuracy"
    default_special_tokens = True
    example_weighting = True
    output_specs = [{"name": "logits", "dtype": "float32", "dims": [-1, -1], "per": "row"}]

    def window_item(self, ex, labels, start, end, specials, doc_id):
        return {"label": int(ex["label"]), "doc_id": doc_id}

    def store_fields(self):
        return super().store_fields() + [StoreField("label", "int64", key="labels")]

    def loss(self, model, batch, label_smoothing=0.0):
        if not label_smoothing:
            return super().loss(model, batch)
        import paddle
        import paddle.nn.functional as F

        logits = model(*self.model_inputs(batch))
        return F.cross_entropy(logits.astype("float32"), paddle.to_tensor(batch["labels"]),
                               label_smoothing=label_smoothing)

    def predict_batch(self, model, batch, decoding, padding_side):
        """float32 logits [C] per example."""
        return list(model(*self.model_inputs(batch)).astype("float32").numpy())

    def report(self, dataset, outputs, label_names, encoder=None):
        """Accuracy/macro-F1 per document (windows of one long text: mean of their logits)."""
        preds, gold = self.document_labels(dataset, outputs)
        out = metrics.classification_metrics(preds, gold, len(label_names))
        out["num_examples"] = int(len(gold))
        return out

    def class_report(self, dataset, outputs, label_names):
        return metrics.class_report(*self.document_labels(dataset, outputs), label_names)

    def document_labels(self, dataset, outputs):
        """(predicted, gold) label ids per document, in document order."""
        doc_ids = [dataset[i]["doc_id"] for i in range(len(dataset))]
        gold = {}
        for i, d in enumerate(doc_ids):
            gold.setdefault(d, dataset[i]["label"])
        docs, doc_logits = aggregate_classification(doc_ids, np.stack(outputs))
        return doc_logits.argmax(axis=-1), [int(gold[int(d)]) for d in docs]

    def output_problems(self, predictor, out, seq_len):
        return output_width_problems(out, "logits", seq_len, len(predictor.label_names),
                                     "label_names")

    def engine_rows(self, predictor, out, seq_len):
        return list(out["logits"].astype(np.float32))

    def response(self, predictor, item, outputs):
        if len(outputs) == 1:  # one window: its logits are the mean (and cost no grouping)
            logits = outputs[0]
        else:
            logits = aggregate_classification([0] * len(outputs), np.stack(outputs))[1][0]
        probs = softmax(np.asarray(logits, np.float64))
        k = int(probs.argmax())
        names = predictor.label_names
        return {"label": names[k], "label_id": k,
                "probs": {n: round(float(p), 6) for n, p in zip(names, probs)},
                "num_tokens": item.num_tokens, "truncated": item.truncated}

    examples = ["物流很快，包装完好", "质量太差了"]

    def prediction_model(self, label_names):
        Label = Literal[tuple(label_names)]

        class ClassificationPrediction(pydantic.BaseModel):
            label: Label = pydantic.Field(description="the most probable label")
            label_id: int = pydantic.Field(ge=0, lt=len(label_names),
                                           description="its index in the labels")
            probs: dict[Label, float] = pydantic.Field(description="probability of every label")
            num_tokens: int = pydantic.Field(
                ge=1, description="tokens the model read, over all windows, special tokens "
                "included")
            truncated: bool = pydantic.Field(description="the text was cut to the export's max_len")

        return ClassificationPrediction
