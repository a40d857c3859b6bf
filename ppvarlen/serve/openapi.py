"""The HTTP API as data: request, response and error models, and the OpenAPI document.

The server reads ``/predict`` bodies itself (to bound their size before parsing), so
FastAPI cannot infer the request schema from a handler argument: this module builds it
from pydantic models and the server's limits, declares every status the server answers
with its JSON error body, and fills ``/docs`` with a request and the answer the loaded
model really gives to it.  The prediction object is the task's
(``task.prediction_model(label_names)``).
"""
import json
from typing import Annotated, Optional

from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, create_model

from ppvarlen.utils.inputs import NON_BLANK_PATTERN


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
        "200": {"description": "Prometheus text exposition format (names: docs/SERVING.md)",
                "content": {"text/plain": {"schema": {"type": "string"}}}},
    }
    doc["paths"]["/metrics.json"]["get"]["responses"] = {
        "200": _json(_schema(Metrics, components), "counters, latency and batcher statistics"),
    }
    return doc


# ---------------------------------------------------------------- Open Inference Protocol v2

class OipError(BaseModel):
    """Every 4xx/5xx answer under /v2 (the protocol's error body)."""

    error: str = Field(description="what is wrong and how to fix it")


class TensorMetadata(BaseModel):
    name: str
    datatype: str
    shape: list[int]


class ServerMetadata(BaseModel):
    name: str
    version: str
    extensions: list[str]


class ModelMetadata(BaseModel):
    name: str
    versions: list[str]
    platform: str
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata]


class ModelReady(BaseModel):
    name: str
    ready: bool


class Live(BaseModel):
    live: bool


class Ready(BaseModel):
    ready: bool


class ResponseTensor(BaseModel):
    name: str
    datatype: str
    shape: list[int]
    parameters: Optional[dict] = Field(None, description="binary_data_size with the binary "
                                                         "extension (then no data)")
    data: Optional[list] = None


class InferResponse(BaseModel):
    model_name: str
    model_version: str = Field(description="the version that produced every output")
    id: Optional[str] = Field(None, description="the request's id, echoed")
    parameters: Optional[dict] = None
    outputs: list[ResponseTensor]


class RepositoryEntry(BaseModel):
    name: str
    version: str
    state: str = Field(description="READY or UNAVAILABLE")
    reason: str = Field(description="why a version is unavailable (e.g. refused: the check "
                                    "that failed)")


# a parameter's value in the Open Inference Protocol: a string, number or boolean
SCALAR = {"type": ["string", "number", "boolean"]}


def infer_request_schema(limits, max_text_chars, output_names, long_text_choices,
                         input_names=("text",), model_names=()):
    """The infer body as JSON Schema: one tensor per name of ``input_names``.  The schema
    cannot say that shape [N] must equal the number of data items, nor that each input comes
    once with the same N; the server checks that (422)."""
    text = {"type": "string", "minLength": 1, "maxLength": max_text_chars,
            "pattern": NON_BLANK_PATTERN}
    count = {"type": "integer", "minimum": 1, "maximum": limits.max_texts_per_request}
    return {
        "title": "InferRequest", "type": "object", "additionalProperties": False,
        "required": ["inputs"],
        "properties": {
            "id": {"type": "string", "description": "echoed in the response"},
            "model_name": {"enum": list(model_names), "description": "the path's model, if "
                           "given"},
            "model_version": {"type": "string", "pattern": "^[0-9]*$", "description": "the "
                              "version that answers, if given (empty: any)"},
            "parameters": {"type": "object", "additionalProperties": SCALAR, "properties": {
                "long_text": {"enum": long_text_choices, "description": "this request's "
                              "long-text policy instead of the export's"},
                "binary_data_output": {"type": "boolean"}},
                "description": "free-form key/values (the protocol's); other keys are "
                               "accepted and ignored"},
            "inputs": {"type": "array", "minItems": len(input_names),
                       "maxItems": len(input_names), "items": {
                "type": "object", "additionalProperties": False,
                "required": ["name", "shape", "datatype", "data"],
                "properties": {
                    "name": {"enum": list(input_names)},
                    "datatype": {"enum": ["BYTES"]},
                    "shape": {"type": "array", "minItems": 1, "maxItems": 2,
                              "prefixItems": [count, {"const": 1}], "items": count,
                              "description": "[N] or [N, 1]: N texts, as many as data holds"},
                    "parameters": {"type": "object", "additionalProperties": SCALAR},
                    "data": {"type": "array", "minItems": 1,
                             "maxItems": limits.max_texts_per_request,
                             "items": {"anyOf": [text, {"type": "array", "items": text,
                                                        "minItems": 1, "maxItems": 1}]}}}}},
            "outputs": {"type": "array", "minItems": 1, "items": {
                "type": "object", "additionalProperties": False, "required": ["name"],
                "properties": {"name": {"enum": output_names},
                               "parameters": {"type": "object",
                                              "additionalProperties": SCALAR,
                                              "properties": {"binary_data": {
                                                  "type": "boolean"}}}}}},
        },
    }


STATS_SCHEMA = {"type": "object", "required": ["model_stats"],
                "properties": {"model_stats": {"type": "array", "items": {"type": "object"}}}}


def _infer_ok(schema_ref):
    out = _json(schema_ref, "one row per text in every output tensor; with binary outputs "
                "(the binary tensor data extension) the JSON header comes first, its length in "
                "the Inference-Header-Content-Length header, then the tensors' bytes")
    out["content"]["application/octet-stream"] = {"schema": {"type": "string",
                                                             "format": "binary"}}
    out["headers"] = {"X-Model-Version": {"description": "the version that answered",
                                          "schema": {"type": "string"}}}
    return out


def add_oip(doc, served, metadata, limits, max_text_chars, long_text_choices, repository):
    """Declare the /v2 routes: ``served`` {name: [versions]}, ``metadata`` of the model whose
    outputs the infer schema lists."""
    components = doc["components"]["schemas"]
    error = _schema(OipError, components)
    components["InferRequest"] = infer_request_schema(
        limits, max_text_chars, [o["name"] for o in metadata["outputs"]], long_text_choices,
        [i["name"] for i in metadata["inputs"]], sorted(served))
    not_found = _json(error, "no such model, or no ready version of that number")
    name = {"name": "name", "in": "path", "required": True,
            "schema": {"type": "string", "enum": sorted(served)}}
    version = {"name": "version", "in": "path", "required": True,
               "schema": {"type": "string", "pattern": "^[0-9]+$"}}
    paths = doc["paths"]
    paths["/v2"]["get"]["responses"] = {"200": _json(_schema(ServerMetadata, components),
                                                     "server metadata")}
    paths["/v2/health/live"]["get"]["responses"] = {"200": _json(_schema(Live, components),
                                                                 "the process answers")}
    paths["/v2/health/ready"]["get"]["responses"] = {
        "200": _json(_schema(Ready, components), "a model version is ready"),
        "503": _json(_schema(Ready, components), "no model ready, or shutting down")}
    for base in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}"):
        params = [name] + ([version] if "{version}" in base else [])
        paths[base]["get"].update(parameters=params, responses={
            "200": _json(_schema(ModelMetadata, components), "model metadata", metadata),
            "404": not_found})
        paths[base + "/ready"]["get"].update(parameters=params, responses={
            "200": _json(_schema(ModelReady, components), "ready"),
            "404": not_found,
            "503": _json(_schema(ModelReady, components), "shutting down")})
        paths[base + "/config"]["get"].update(parameters=params, responses={
            "200": {"description": "the Triton model configuration (model_configuration "
                                   "extension): inputs, outputs, dynamic batching",
                    "content": {"application/json": {"schema": {"type": "object"}}}},
            "404": not_found})
        paths[base + "/stats"]["get"].update(parameters=params, responses={
            "200": {"description": "Triton's statistics extension: counts and durations",
                    "content": {"application/json": {"schema": STATS_SCHEMA}}},
            "404": not_found})
        post = paths[base + "/infer"]["post"]
        post.update(parameters=params, requestBody={"required": True, "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/InferRequest"}}}},
            responses={
                "200": _infer_ok(_schema(InferResponse, components)),
                "400": _json(error, "the body is not JSON, or a bad "
                                    "Inference-Header-Content-Length"),
                "404": not_found,
                "413": _json(error, "the body is larger than Deploy.max_body_bytes"),
                "422": _json(error, "the request does not fit the model: input name, "
                                    "datatype, shape (N texts, as many as data holds), a text "
                                    "the export cannot take, a body's model_name or "
                                    "model_version other than the path's"),
                "500": _json(error, "the model failed on a text (a bug: see the server log)"),
                "503": _json(error, "the queue is full or the server is shutting down; retry",
                             headers=RETRY_AFTER)})
    paths["/v2/models/stats"]["get"]["responses"] = {
        "200": {"description": "Triton's statistics extension, every ready version",
                "content": {"application/json": {"schema": STATS_SCHEMA}}}}
    if repository:
        paths["/v2/repository/index"]["post"]["responses"] = {
            "200": {"description": "every version seen, with its state",
                    "content": {"application/json": {"schema": {
                        "type": "array", "items": _schema(RepositoryEntry, components)}}}}}
        load = paths["/v2/repository/models/{name}/load"]["post"]
        load["parameters"] = [dict(name, schema={"type": "string"})]
        load["responses"] = {
            "200": _json(_schema(RepositoryEntry, components), "the newest version is serving"),
            "404": _json(error, "no such model directory in the repository"),
            "409": _json(error, "the newest version was refused (the reason); the old one "
                                "keeps serving")}
        # /predict takes no model name: a repository that comes to hold several refuses it
        doc["paths"]["/predict"]["post"]["responses"]["409"] = _json(
            _schema(ErrorBody, components), "the model repository holds several models: /predict takes none of them; "
                   "address one as POST /v2/models/NAME/infer")
    return doc
