"""The OpenAPI part of the Open Inference Protocol's routes (``/v2``)."""
from typing import Optional

from pydantic import BaseModel, Field

from ppvarlen.utils.inputs import NON_BLANK_PATTERN

from ppvarlen.serve.dataplane import max_text_chars
from ppvarlen.serve.openapi import RETRY_AFTER
from ppvarlen.serve.openapi import json_answer as _json
from ppvarlen.serve.openapi import schema_ref as _schema
from ppvarlen.serve.protocols.oip import codec


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


def add_openapi(doc, plane, model):
    """Declare the /v2 routes in ``doc`` (FastAPI's document of the app): every served model
    by name, the infer schema of ``model`` (its inputs, outputs, text bounds)."""
    registry, limits = plane.registry, plane.deploy
    served = {n: registry.versions(n) for n in registry.names()}
    metadata = codec.model_metadata(model.name, registry.versions(model.name), model)
    chars = max_text_chars(model.predictor, limits)
    long_text_choices = codec.long_text_choices(model)
    repository = plane.repository is not None
    components = doc["components"]["schemas"]
    error = _schema(OipError, components)
    components["InferRequest"] = infer_request_schema(
        limits, chars, [o["name"] for o in metadata["outputs"]], long_text_choices,
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
    return doc
