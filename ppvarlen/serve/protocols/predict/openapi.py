"""The OpenAPI part of ppvarlen's own protocol (``/predict``, ``/health``, ``/metrics``) and the
admission check of its answer form."""
import json
from typing import Annotated, Optional

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, create_model

from ppvarlen.runtime.admission import strict_json
from ppvarlen.utils.inputs import NON_BLANK_PATTERN

from ppvarlen.serve.dataplane import max_text_chars
from ppvarlen.serve.openapi import RETRY_AFTER
from ppvarlen.serve.openapi import json_answer as _json
from ppvarlen.serve.openapi import schema_ref as _schema


class ErrorBody(BaseModel):
    """Every 4xx/5xx answer of /predict."""

    error: str = Field(description="what is wrong and how to fix it")
    field: Optional[str] = Field(description="the request field at fault, e.g. texts[3]; "
                                             "null when no single field is")


class Health(BaseModel):
    status: str = Field(description="ok, or draining while the server shuts down")
    task: str
    backend: str
    model_name: Optional[str]
    model_version: str = Field(description="the version /predict answers with now")
    labels: list[str]
    workers: int
    queue_depth: int
    tag_scheme: Optional[str] = Field(None, description="tagging exports: the tag scheme "
                                      "(bio, bioes, bmes, plain) the answers are read with")


class LatencyMs(BaseModel):
    p50: Optional[float]
    p95: Optional[float]
    p99: Optional[float]
    mean: Optional[float]
    window: int


class Metrics(BaseModel):
    """Counters since start; the batcher adds its own keys (batches, padding efficiency...)."""

    model_config = ConfigDict(extra="allow")
    requests: int
    responses: dict[str, int] = Field(description="answers per HTTP status")
    texts: int
    truncated_texts: int
    split_texts: int
    answers: dict[str, int] = Field(description="the task's answer counters, e.g. tagging: "
                                    "tag_sequences_repaired, tag_chunks_repaired")
    latency_ms: LatencyMs
    settings: dict


def predict_body(predictions, model_version):
    """The bytes of a ``/predict`` answer: strict JSON (a NaN raises ValueError, never sent)."""
    return json.dumps({"predictions": predictions, "model_version": model_version},
                      ensure_ascii=False, allow_nan=False).encode("utf-8")


def request_model(limits, max_text_chars, task=None):
    """The ``/predict`` body the server accepts, with the server's own bounds: a list under the
    task's ``request_key`` of its ``request_item`` (default: ``texts``, one text each)."""
    Text = Annotated[str, StringConstraints(min_length=1, max_length=max_text_chars,
                                            pattern=NON_BLANK_PATTERN)]
    key = task.request_key if task is not None else "texts"
    item = task.request_item(Text) if task is not None else Text
    return create_model(
        "PredictRequest", __config__=ConfigDict(extra="forbid"),
        **{key: (list[item], Field(min_length=1, max_length=limits.max_texts_per_request,
                                   description=f"{key} to predict; answers come back in this "
                                   f"order"))})


def response_model(prediction):
    class PredictResponse(BaseModel):
        predictions: list[prediction] = Field(description="one per text, in request order")
        model_version: str = Field(description="the model version that produced every "
                                               "prediction (also the X-Model-Version header)")

    return PredictResponse


def add_openapi(doc, plane, model):
    """Fill in /predict, /health and /metrics in ``doc`` (FastAPI's document of the app) for
    the served ``model`` (its request bounds, its prediction, its example answer)."""
    chars = max_text_chars(model.predictor, plane.deploy)
    request = request_model(plane.deploy, chars, model.task)
    response = response_model(model.task.prediction_model(model.label_names))
    example = model.example and {
        "request": {model.task.request_key: model.example[0]},
        "response": {"predictions": model.example[1], "model_version": model.version}}
    components = doc.setdefault("components", {}).setdefault("schemas", {})
    error = _schema(ErrorBody, components)
    req, resp = _schema(request, components), _schema(response, components)
    body = {"required": True, "content": {"application/json": {"schema": req}}}
    if example:
        body["content"]["application/json"]["example"] = example["request"]
    post = doc["paths"]["/predict"]["post"]
    post["requestBody"] = body
    post["responses"] = {
        "200": _json(resp, "one prediction per text, in request order",
                     example["response"] if example else None),
        "400": _json(error, "the body is not JSON (or a bad Content-Length header)"),
        "413": _json(error, "the body is larger than Deploy.max_body_bytes"),
        "422": _json(error, "the JSON does not fit the request schema, or a text cannot be "
                            "taken by this export (blank, or longer than max_len under the "
                            "'error' long-text policy)"),
        "500": _json(error, "the model failed on a text (a bug: the server log has details)"),
        "503": _json(error, "the queue is full or the server is shutting down; retry",
                     headers=RETRY_AFTER),
    }
    health = _schema(Health, components)
    doc["paths"]["/health"]["get"]["responses"] = {
        "200": _json(health, "serving"),
        "503": _json(health, "draining: the server is shutting down"),
    }
    doc["paths"]["/metrics"]["get"]["responses"] = {
        "200": {"description": "Prometheus text exposition format (names: docs/SERVING.md)",
                "content": {"text/plain": {"schema": {"type": "string"}}}},
    }
    doc["paths"]["/metrics.json"]["get"]["responses"] = {
        "200": _json(_schema(Metrics, components), "counters, latency and batcher statistics"),
    }
    if plane.repository is not None:  # one that comes to hold several models refuses it
        post["responses"]["409"] = _json(
            error, "the model repository holds several models: /predict takes none of them; "
            "address one as POST /v2/models/NAME/infer")


def render_checks():
    """Admission's render check of this protocol: the answer to the example, strict JSON."""
    def check(predictor, results):
        strict_json(predict_body(results, "0"), "the /predict answer")

    return [("/predict", check)]
