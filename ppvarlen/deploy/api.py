"""The HTTP API as data: request, response and error models, and the OpenAPI document.

The server reads ``/predict`` bodies itself (to bound their size before parsing), so
FastAPI cannot infer the request schema from a handler argument: this module builds it
from pydantic models and the server's limits, declares every status the server answers
with its JSON error body, and fills ``/docs`` with a request and the answer the loaded
model really gives to it.  The prediction object is the task's
(``task.prediction_model(label_names)``).
"""
from typing import Annotated, Optional

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from ..utils.inputs import NON_BLANK_PATTERN


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


def request_model(limits, max_text_chars):
    """The ``/predict`` body the server accepts, with the server's own bounds."""
    Text = Annotated[str, StringConstraints(min_length=1, max_length=max_text_chars,
                                            pattern=NON_BLANK_PATTERN)]

    class PredictRequest(BaseModel):
        model_config = ConfigDict(extra="forbid")
        texts: list[Text] = Field(min_length=1, max_length=limits.max_texts_per_request,
                                  description="texts to predict; answers come back in this order")

    return PredictRequest


def response_model(prediction):
    class PredictResponse(BaseModel):
        predictions: list[prediction] = Field(description="one per text, in request order")

    return PredictResponse


def _schema(model, components):
    """The model's JSON schema with its nested definitions moved into ``components``."""
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    for name, definition in schema.pop("$defs", {}).items():
        components[name] = definition
    components[schema.get("title", model.__name__)] = schema
    return {"$ref": f"#/components/schemas/{schema.get('title', model.__name__)}"}


def _json(schema_ref, description, example=None, headers=None):
    content = {"schema": schema_ref}
    if example is not None:
        content["example"] = example
    out = {"description": description, "content": {"application/json": content}}
    if headers:
        out["headers"] = headers
    return out


RETRY_AFTER = {"Retry-After": {"description": "seconds to wait before retrying",
                               "schema": {"type": "string"}}}


def openapi_document(app, request, response, example=None):
    """The OpenAPI document of ``app``: FastAPI's, with /predict, /health and /metrics filled in.

    ``example``: ``{"request": body, "response": body}`` shown in /docs, or None.
    """
    from fastapi.openapi.utils import get_openapi

    doc = get_openapi(title=app.title, version=app.version, routes=app.routes,
                      description=app.description)
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
        "200": _json(_schema(Metrics, components), "counters, latency and batcher statistics"),
    }
    return doc
