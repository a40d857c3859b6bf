"""ppvarlen's own REST protocol over the ``DataPlane``: ``POST /predict``, ``GET /health``,
``GET /metrics`` (Prometheus) and ``GET /metrics.json``; its refusals are ``{"error": message,
"field": name}`` with the REST statuses (``http.status``)."""
import weakref

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response

from ppvarlen.tasks.base import Task

from ppvarlen.serve.protocols.predict import openapi as api
from ppvarlen.serve.dataplane import Call
from ppvarlen.serve.errors import SHOWN_CHARS, InvalidInput, shown
from ppvarlen.serve.http.direct import version_header_pairs
from ppvarlen.serve.http.edge import parse_json, read_body
from ppvarlen.serve.http.status import http_status

_health_extras = weakref.WeakKeyDictionary()  # served model -> what /health adds of its task


def render_error(error):
    """(status, headers, body) of a refusal on this protocol's routes (and the default form
    of every answer the edge gives outside a protocol's paths)."""
    status, headers = http_status(error)
    return status, headers, {"error": error.message, "field": error.field}


def validate_payload(payload, limits, key="texts", check_item=None, item_words="strings"):
    """``{key: [item, ...]}`` within ``limits`` (the Deploy keys) -> the list; InvalidInput naming
    the field otherwise.  ``key`` and ``check_item(item, max_chars)`` -> (problem or None, over
    the character limit) are the task's (``Task.request_key`` / ``Task.check_request_item``)."""
    check_item = check_item or Task().check_request_item
    if not isinstance(payload, dict):
        raise InvalidInput(f"body must be a JSON object like {{\"{key}\": [...]}}, got "
                           f"{type(payload).__name__}", "body")
    unknown = sorted(set(payload) - {key})
    if unknown:
        raise InvalidInput(f"unknown field(s) {shown(unknown)}; the body takes only "
                           f"\"{key}\"", unknown[0][:SHOWN_CHARS])
    if key not in payload:
        raise InvalidInput(f"field \"{key}\" is required: a list of {item_words}", key)
    texts = payload[key]
    if not isinstance(texts, list):
        raise InvalidInput(f"\"{key}\" must be a list of {item_words}, got "
                           f"{type(texts).__name__}", key)
    if not texts:
        raise InvalidInput(f"\"{key}\" is empty; send at least one", key)
    if len(texts) > limits.max_texts_per_request:
        raise InvalidInput(f"{len(texts)} {key} in one request; at most "
                           f"{limits.max_texts_per_request} (Deploy.max_texts_per_request) — "
                           f"split the request", key)
    for i, t in enumerate(texts):
        problem, too_long = check_item(t, limits.max_text_chars)
        if problem:
            raise InvalidInput(f"{key}[{i}] {problem}", f"{key}[{i}]",
                               refused_texts=int(too_long))
    return texts


def health_extras(model):
    """What /health adds of the served version's task (e.g. the tag scheme), read once."""
    extras = _health_extras.get(model)
    if extras is None:
        extras = _health_extras[model] = model.task.health_extras(model.manifest)
    return extras


def router(plane, direct):
    """The routes over ``plane``; ``POST /predict`` answered by ``direct`` (a DirectRoutes)."""
    routes = APIRouter()
    deploy = plane.deploy

    async def read(scope, receive):
        payload = parse_json(await read_body(scope, receive, deploy.max_body_bytes))
        task = plane.model().task
        items = validate_payload(payload, deploy, task.request_key, task.check_request_item,
                                 task.request_item_words)
        return Call(items, where=task.request_key)

    def render(outcome, call):
        return api.predict_body(outcome.results, outcome.model.version), [
            (b"content-type", b"application/json"), *version_header_pairs(outcome.model)]

    async def predict(scope, receive):
        return await plane.infer(lambda: read(scope, receive), render)

    direct.post(routes, "/predict", predict, render_error)

    @routes.get("/health")
    async def health():
        names = plane.registry.names()  # a repository of several models: the first one's
        model = plane.model(names[0] if names else None)
        status = "draining" if plane.draining else "unhealthy" if model.unhealthy else "ok"
        body = {"status": status, "task": model.task_name, "backend": model.backend,
                "model_name": model.name, "model_version": model.version,
                "labels": model.label_names, "workers": deploy.workers,
                "queue_depth": plane.registry.queue_depth(),
                "precision": model.precision_choice["precision"],
                "precision_reason": model.precision_choice["reason"],
                "threads": model.threads, "threads_reason": model.threads_reason,
                "threads_under_load": model.under_load,
                **health_extras(model)}
        if model.unhealthy:
            body["unhealthy_reason"] = model.unhealthy
        if model.files_changed:  # answering from memory; its directory says otherwise
            body["files_changed"] = model.files_changed
        return JSONResponse(body, status_code=200 if status == "ok" else 503)

    @routes.get("/metrics")
    async def get_metrics():
        body, content_type = plane.metrics.exposition()
        return Response(body, media_type=content_type)

    @routes.get("/metrics.json")
    async def get_metrics_json():
        out = plane.metrics.snapshot()
        models = plane.registry.models()
        batchers = [m.batch_metrics() for m in models if m.batcher is not None]
        out.update(batchers[0] if len(batchers) == 1 else {"models": batchers})
        out["settings"] = {"max_wait_ms": deploy.max_wait_ms,
                           "max_batch_tokens": deploy.max_batch_tokens,
                           "max_batch_size": deploy.max_batch_size,
                           "queue_size": deploy.queue_size, "workers": deploy.workers,
                           "overhead_tokens": models[0].overhead_tokens if models else None}
        return out

    return routes
