"""The OpenAI embeddings API over the ``DataPlane``: ``POST /v1/embeddings``, and the models
API's ``GET /v1/models`` and ``GET /v1/models/{model}`` (model discovery: every served model,
``owned_by`` ppvarlen, ``created`` the time its export was written).

Request (the OpenAI API's, as the official ``openai`` client sends it)::

    {"input": "text" | ["text", ...], "model": NAME,
     "encoding_format": "float" | "base64", "dimensions": D', "user": "..."}

``model`` names a served model (a single export serves its manifest's model_name, as the OIP
paths name it; a repository each of its models; the newest ready version answers).
``encoding_format`` (default ``float``; the ``openai`` client sends ``base64`` unless told
otherwise and decodes it itself): ``base64`` is each embedding's little-endian float32 bytes.
``dimensions``: the model's width D always; fewer only where the manifest says the model may
be cut (``embedding.truncatable``, ``Task.embedding_spec``): the first D' values, divided by
their L2 norm again when the model normalises.  ``user`` is accepted and ignored.  Token-id
inputs (lists of integers) are refused (400, code ``unsupported_input``): the OpenAI API's ids
are tiktoken's, another tokenizer's, and read as this model's ids they would embed other
words.  Up to ``MAX_INPUTS`` (2,048, the OpenAI API's bound) texts a request; the data plane
queues a long list in parts (``DataPlane.infer``).

Answer::

    {"object": "list", "model": NAME,
     "data": [{"object": "embedding", "embedding": [floats] | "base64", "index": i}, ...],
     "usage": {"prompt_tokens": n, "total_tokens": n}}

``n``: the tokens the model read, summed over the texts, special tokens excluded (each text's
``num_tokens`` in ``/predict``).  The texts take the path every route's texts take
(``DataPlane.infer``): the version's vocabulary, long-text policy and length-aware batcher,
the same counters.

Errors: the OpenAI error object ``{"error": {"message", "type", "param", "code"}}``
(``render_error``; ``type`` invalid_request_error for a 4xx, server_error for a 5xx).
Bad input is 400 (where ``/predict`` says 422), a body over ``Deploy.max_body_bytes`` 413, a
model not served 404 (code ``model_not_found``), a served model that is no embedding model 400
(code ``model_not_embedding``), a full queue or a shutdown 503 with Retry-After.
"""
import base64
import json
import os
import weakref

import numpy as np
from fastapi import APIRouter

from ppvarlen.utils.inputs import NON_BLANK_PATTERN
from ppvarlen.serve.dataplane import Call, max_text_chars
from ppvarlen.serve.errors import InvalidInput, ModelNotFound, shown
from ppvarlen.serve.http.direct import version_header_pairs
from ppvarlen.serve.http.edge import parse_json, read_body
from ppvarlen.serve.http.status import http_status

ENDPOINT = "/v1/embeddings"
MODELS = "/v1/models"
MAX_INPUTS = 2048  # the OpenAI API's inputs per request (CreateEmbeddingRequest.input maxItems)
FIELDS = ("input", "model", "encoding_format", "dimensions", "user")
ENCODINGS = ("float", "base64")
MAX_USER_CHARS = 256
EDGE_PREFIXES = ("/v1/",)  # what the edge answers under these paths, it answers in this form
_NO_SPEC = object()
_specs = weakref.WeakKeyDictionary()  # served model -> its embedding spec (_NO_SPEC: none)


def _bad(message, param=None, code=None, refused_texts=0):
    return InvalidInput(message, param, refused_texts=refused_texts, code=code)


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def render_error(error):
    """(status, headers, body) of a refusal as the OpenAI API answers it: a request the other
    routes refuse with 422 (a body that does not fit, a text the export cannot take) is 400."""
    status, headers = http_status(error, {InvalidInput: 400})
    kind = "invalid_request_error" if status < 500 else "server_error"
    return status, headers, {"error": {"message": error.message, "type": kind,
                                       "param": error.field, "code": error.code}}


def parse_request(payload, limits):
    """The body -> (texts, model name, encoding_format, dimensions or None); InvalidInput
    naming the field otherwise.  ``limits``: the Deploy section (texts per request, chars)."""
    if not isinstance(payload, dict):
        raise _bad(f"the body must be a JSON object like {{\"input\": [\"text\"], \"model\": "
                   f"NAME}}, got {type(payload).__name__}")
    unknown = sorted(set(payload) - set(FIELDS))
    if unknown:
        raise _bad(f"unrecognized request argument(s) {shown(unknown)}; {ENDPOINT} takes "
                   f"{', '.join(FIELDS)}", str(unknown[0])[:64])
    model = payload.get("model")
    if not isinstance(model, str):
        raise _bad("you must provide a model parameter: the name of a served embedding model "
                   "(GET /v1/models lists them)" if model is None else
                   f"model must be a model name (a string), got {shown(model)}", "model")
    texts = _texts(payload.get("input"), limits)
    encoding = payload.get("encoding_format")
    if encoding is None:
        encoding = "float"
    elif encoding not in ENCODINGS:
        raise _bad(f"encoding_format {shown(encoding)}: one of {list(ENCODINGS)}",
                   "encoding_format")
    dimensions = payload.get("dimensions")
    if dimensions is not None and (not _is_int(dimensions) or dimensions < 1):
        raise _bad(f"dimensions {shown(dimensions)}: a positive integer (the embedding width "
                   f"wanted), or leave it out for the model's own", "dimensions")
    user = payload.get("user")
    if user is not None and (not isinstance(user, str) or len(user) > MAX_USER_CHARS):
        raise _bad(f"user must be a string of at most {MAX_USER_CHARS} characters", "user")
    return texts, model, encoding, dimensions


def _texts(value, limits):
    """``input`` -> the list of texts, within the server's bounds."""
    if value is None:
        raise _bad("input is required: a string or a list of strings to embed", "input")
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        raise _bad(f"input must be a string or a list of strings, got "
                   f"{type(value).__name__}", "input")
    if not value:
        raise _bad("input is an empty list; send at least one string", "input")
    if all(_is_int(t) for t in value) or any(isinstance(t, list) for t in value):
        raise _bad("token-id inputs (lists of integers) are not supported: this server "
                   "tokenizes each text with the model's own vocabulary; send the texts as "
                   "strings (LangChain's OpenAIEmbeddings: check_embedding_ctx_length=False)",
                   "input", "unsupported_input")
    if len(value) > MAX_INPUTS:
        raise _bad(f"{len(value)} inputs in one request; at most {MAX_INPUTS} (the OpenAI "
                   f"API's bound) — split the request", "input")
    for i, t in enumerate(value):
        if not isinstance(t, str):
            raise _bad(f"input[{i}] must be a string, got {type(t).__name__}", f"input[{i}]")
        if len(t) > limits.max_text_chars:
            raise _bad(f"input[{i}] has {len(t)} characters; at most {limits.max_text_chars} "
                       f"(Deploy.max_text_chars)", f"input[{i}]", refused_texts=1)
    return value


def spec_of(model):
    """The served version's ``Task.embedding_spec`` (None: no embedding model), read once."""
    spec = _specs.get(model)
    if spec is None:
        spec = _specs[model] = model.task.embedding_spec(model.manifest) or _NO_SPEC
    return None if spec is _NO_SPEC else spec


def embedding_spec(model, name):
    """The served version's ``Task.embedding_spec``; 400 when it is no embedding model."""
    spec = spec_of(model)
    if spec is None:
        raise _bad(f"model {shown(name)} is a {model.task_name} model, not an embedding model: "
                   f"{ENDPOINT} serves exports of the embedding task (ask this one on "
                   f"/predict or /v2/models/{model.name}/infer)", "model", "model_not_embedding")
    return spec


def check_dimensions(spec, dimensions, name):
    """400 unless ``dimensions`` (None: the model's own) is one the model may answer."""
    if dimensions is None or dimensions == spec["dim"]:
        return
    if dimensions > spec["dim"]:
        raise _bad(f"dimensions {dimensions}: model {shown(name)} answers "
                   f"{spec['dim']}-dimensional embeddings; ask for at most {spec['dim']}",
                   "dimensions")
    if not spec["truncatable"]:
        raise _bad(f"dimensions {dimensions}: model {shown(name)} answers {spec['dim']}-"
                   f"dimensional embeddings and was not trained to be truncated (its manifest's "
                   f"embedding.truncatable is not true); leave dimensions out or send "
                   f"{spec['dim']}", "dimensions")


def vectors(results, spec, dimensions=None):
    """float32 [N, D'] of the texts' results: the first ``dimensions`` values (all: None),
    re-normalised to unit L2 norm when cut and the model normalises."""
    rows = np.asarray([r[spec["field"]] for r in results], np.float32)
    if dimensions is None or dimensions == rows.shape[1]:
        return rows
    rows = rows[:, :dimensions].astype(np.float64)
    if spec["normalize"]:
        rows /= np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)
    return rows.astype(np.float32)


def response_body(rows, encoding, name, prompt_tokens):
    """The bytes of the answer (strict JSON: a NaN raises ValueError, never sent)."""
    if encoding == "base64":
        values = [base64.b64encode(r.astype("<f4").tobytes()).decode("ascii") for r in rows]
    else:
        values = rows.tolist()
    data = [{"object": "embedding", "embedding": v, "index": i} for i, v in enumerate(values)]
    return json.dumps({"object": "list", "data": data, "model": name,
                       "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}},
                      ensure_ascii=False, allow_nan=False).encode("utf-8")


def served_model(plane, name):
    """The newest ready version of ``name``; ModelNotFound (``model_not_found``) naming what
    is served."""
    try:
        return plane.model(name)
    except ModelNotFound:
        raise ModelNotFound(f"the model {shown(name)} does not exist on this server; served: "
                            f"{shown(plane.registry.names(), 200)}", "model",
                            code="model_not_found") from None


def model_object(model):
    """The OpenAI API's model object of a served version."""
    created = 0
    if model.predictor is not None:
        try:
            created = int(os.stat(os.path.join(model.predictor.export_dir,
                                               "manifest.json")).st_mtime)
        except OSError:  # removed since it loaded: it still answers from memory
            pass
    return {"id": model.name, "object": "model", "created": created, "owned_by": "ppvarlen"}


def router(plane, direct):
    """``POST /v1/embeddings`` over ``plane``, answered by ``direct`` (a DirectRoutes), and
    the models API."""
    routes = APIRouter()
    limit = plane.deploy.max_body_bytes

    @routes.get(MODELS)
    async def list_models():
        return {"object": "list",
                "data": [model_object(plane.registry.get(n)) for n in plane.registry.names()]}

    @routes.get(MODELS + "/{model:path}")
    async def retrieve_model(model: str):
        return model_object(served_model(plane, model))

    async def read(scope, receive):
        texts, name, encoding, dimensions = parse_request(
            parse_json(await read_body(scope, receive, limit)), plane.deploy)
        check_dimensions(embedding_spec(served_model(plane, name), name), dimensions, name)
        return Call(texts, name, where="input", context=(encoding, dimensions))

    def render(outcome, call):
        encoding, dimensions = call.context
        # the version that answered may be newer than the one checked
        spec = embedding_spec(outcome.model, call.name)
        check_dimensions(spec, dimensions, call.name)
        content = response_body(vectors(outcome.results, spec, dimensions), encoding,
                                call.name, sum(r["num_tokens"] for r in outcome.results))
        return content, [(b"content-type", b"application/json"),
                         *version_header_pairs(outcome.model)]

    async def embeddings(scope, receive):
        return await plane.infer(lambda: read(scope, receive), render)

    direct.post(routes, ENDPOINT, embeddings, render_error)
    return routes


# ---------------------------------------------------------------- OpenAPI

def request_schema(name, spec, limits, max_text_chars):
    """The JSON Schema of a request to model ``name`` (its ``embedding_spec``)."""
    text = {"type": "string", "minLength": 1, "maxLength": max_text_chars,
            "pattern": NON_BLANK_PATTERN}
    return {"type": "object", "additionalProperties": False, "required": ["input", "model"],
            "properties": {
                "input": {"description": "a text, or a list of texts (answered in order)",
                          "oneOf": [text, {"type": "array", "items": text, "minItems": 1,
                                           "maxItems": MAX_INPUTS}]},
                "model": {"type": "string", "enum": [name],
                          "description": "a served embedding model's name"},
                "encoding_format": {"type": ["string", "null"], "enum": [*ENCODINGS, None],
                                    "description": "float (default) or base64: little-endian "
                                    "float32 bytes"},
                "dimensions": {"type": ["integer", "null"],
                               "minimum": 1 if spec["truncatable"] else spec["dim"],
                               "maximum": spec["dim"],
                               "description": "fewer dimensions only where the model's "
                               "manifest says embedding.truncatable"},
                "user": {"type": ["string", "null"], "maxLength": MAX_USER_CHARS,
                         "description": "accepted and ignored"}}}


RESPONSE_SCHEMA = {
    "title": "EmbeddingsResponse", "type": "object",
    "required": ["object", "data", "model", "usage"],
    "properties": {
        "object": {"type": "string", "const": "list"},
        "data": {"type": "array", "description": "one per input, in order: {object: "
                 "embedding, embedding: D floats or a base64 string, index}", "items": {
            "type": "object", "required": ["object", "embedding", "index"],
            "properties": {"object": {"const": "embedding"},
                           "embedding": {"oneOf": [{"type": "array",
                                                    "items": {"type": "number"}},
                                                   {"type": "string",
                                                    "contentEncoding": "base64"}]},
                           "index": {"type": "integer", "minimum": 0}}}},
        "model": {"type": "string", "description": "the model asked for"},
        "usage": {"type": "object", "description": "{prompt_tokens, total_tokens}: the tokens "
                  "the model read, special tokens excluded", "required": ["prompt_tokens",
                                                                     "total_tokens"],
                  "properties": {"prompt_tokens": {"type": "integer", "minimum": 0},
                                 "total_tokens": {"type": "integer", "minimum": 0}}}}}

ERROR_SCHEMA = {
    "title": "OpenAIErrorBody", "type": "object", "required": ["error"],
    "properties": {"error": {
        "type": "object", "required": ["message", "type", "param", "code"],
        "description": "{message, type: invalid_request_error | server_error, param: the "
                       "field at fault or null, code: e.g. model_not_found or null}",
        "properties": {"message": {"type": "string"},
                       "type": {"enum": ["invalid_request_error", "server_error"]},
                       "param": {"type": ["string", "null"]},
                       "code": {"type": ["string", "null"]}}}}}


MODEL_SCHEMA = {
    "title": "OpenAIModel", "type": "object", "required": ["id", "object", "created", "owned_by"],
    "properties": {"id": {"type": "string"}, "object": {"const": "model"},
                   "created": {"type": "integer", "description": "when the export's manifest "
                               "was written (unix seconds)"},
                   "owned_by": {"const": "ppvarlen"}}}


def add_models_openapi(doc):
    """Declare ``GET /v1/models`` and ``GET /v1/models/{model}``."""
    schemas = doc["components"]["schemas"]
    schemas["OpenAIModel"], schemas["OpenAIErrorBody"] = MODEL_SCHEMA, ERROR_SCHEMA
    model = {"$ref": "#/components/schemas/OpenAIModel"}

    def answer(description, schema):
        return {"description": description, "content": {"application/json": {
            "schema": schema}}}

    listing = {"type": "object", "required": ["object", "data"],
               "properties": {"object": {"const": "list"},
                              "data": {"type": "array", "items": model}}}
    doc["paths"][MODELS]["get"].update(summary="List models (the OpenAI models API)",
                                       responses={"200": answer("every served model", listing)})
    one = doc["paths"][MODELS + "/{model}"]["get"]
    one.update(summary="Retrieve a model (the OpenAI models API)", responses={
        "200": answer("the model", model),
        "404": answer("no such model (code model_not_found)",
                      {"$ref": "#/components/schemas/OpenAIErrorBody"})})
    one["parameters"] = [{"name": "model", "in": "path", "required": True,
                          "schema": {"type": "string"}}]


def add_openapi(doc, plane, model=None):
    """Declare ``POST /v1/embeddings`` in ``doc`` for the embedding models ``plane`` serves
    now (the request schema of each: its name, width, text bounds; none: the path is left
    out), and the models API."""
    add_models_openapi(doc)
    limits, options = plane.deploy, []
    for name in sorted(plane.registry.names()):
        served = plane.registry.get(name)
        spec = spec_of(served)
        if spec is not None and served.predictor is not None:
            chars = max_text_chars(served.predictor, limits)
            options.append(request_schema(name, spec, limits, chars))
    if not options:
        doc["paths"].pop(ENDPOINT, None)
        return
    schemas = doc["components"]["schemas"]
    schemas["EmbeddingsRequest"] = (dict(options[0], title="EmbeddingsRequest")
                                    if len(options) == 1 else
                                    {"title": "EmbeddingsRequest", "anyOf": options})
    schemas["EmbeddingsResponse"] = RESPONSE_SCHEMA
    schemas["OpenAIErrorBody"] = ERROR_SCHEMA
    error = {"$ref": "#/components/schemas/OpenAIErrorBody"}

    def answer(description, schema=error, headers=None):
        out = {"description": description, "content": {"application/json": {
            "schema": schema}}}
        if headers:
            out["headers"] = headers
        return out

    retry = {"Retry-After": {"description": "seconds to wait before retrying",
                             "schema": {"type": "string"}}}
    post = doc["paths"][ENDPOINT]["post"]
    post.update(summary="Create embeddings (the OpenAI embeddings API)", requestBody={
        "required": True, "content": {"application/json": {"schema": {
            "$ref": "#/components/schemas/EmbeddingsRequest"}}}}, responses={
        "200": answer("one embedding per input, in order",
                      {"$ref": "#/components/schemas/EmbeddingsResponse"}),
        "400": answer("not JSON, a field that does not fit, a text the export cannot take, "
                      "token-id input, or a model that is no embedding model"),
        "404": answer("no such model (code model_not_found)"),
        "413": answer("the body is larger than Deploy.max_body_bytes"),
        "500": answer("the model failed on a text (a bug: the server log has details)"),
        "503": answer("the queue is full or the server is shutting down; retry",
                      headers=retry)})
