"""ppvarlen's own REST routes over the ``AppState``: ``POST /predict``, ``GET /health``,
``GET /metrics`` (Prometheus) and ``GET /metrics.json``."""
import time

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from ppvarlen.tasks.base import Task

from ppvarlen.serve import openapi as api
from ppvarlen.serve.http.edge import SHOWN_CHARS, parse_json, read_body, shown
from ppvarlen.serve.errors import ApiError


def validate_payload(payload, limits, key="texts", check_item=None, item_words="strings"):
    """``{key: [item, ...]}`` within ``limits`` (the Deploy keys) -> the list; ApiError naming
    the field otherwise.  ``key`` and ``check_item(item, max_chars)`` -> (problem or None, over
    the character limit) are the task's (``Task.request_key`` / ``Task.check_request_item``)."""
    check_item = check_item or Task().check_request_item
    if not isinstance(payload, dict):
        raise ApiError(422, f"body must be a JSON object like {{\"{key}\": [...]}}, got "
                       f"{type(payload).__name__}", "body")
    unknown = sorted(set(payload) - {key})
    if unknown:
        raise ApiError(422, f"unknown field(s) {shown(unknown)}; the body takes only "
                       f"\"{key}\"", unknown[0][:SHOWN_CHARS])
    if key not in payload:
        raise ApiError(422, f"field \"{key}\" is required: a list of {item_words}", key)
    texts = payload[key]
    if not isinstance(texts, list):
        raise ApiError(422, f"\"{key}\" must be a list of {item_words}, got "
                       f"{type(texts).__name__}", key)
    if not texts:
        raise ApiError(422, f"\"{key}\" is empty; send at least one", key)
    if len(texts) > limits.max_texts_per_request:
        raise ApiError(422, f"{len(texts)} {key} in one request; at most "
                       f"{limits.max_texts_per_request} (Deploy.max_texts_per_request) — split "
                       f"the request", key)
    for i, t in enumerate(texts):
        problem, too_long = check_item(t, limits.max_text_chars)
        if problem:
            raise ApiError(422, f"{key}[{i}] {problem}", f"{key}[{i}]",
                           refused_texts=int(too_long))
    return texts


def version_headers(model):
    return {"X-Model-Name": model.name, "X-Model-Version": model.version}


def version_header_pairs(model):
    """``version_headers`` as a direct route answers them (``direct``: lowercase bytes)."""
    return [(b"x-model-name", model.name.encode("latin-1")),
            (b"x-model-version", model.version.encode("latin-1"))]


def router(state, direct):
    """The routes over ``state``; ``POST /predict`` answered by ``direct`` (a DirectRoutes)."""
    routes = APIRouter()
    deploy = state.deploy

    async def predict(scope, receive):
        started = time.perf_counter()
        state.metrics.count_request()
        state.check_open()
        payload = parse_json(await read_body(scope, receive, deploy.max_body_bytes))
        task = state.model().task
        items = validate_payload(payload, deploy, task.request_key, task.check_request_item,
                                 task.request_item_words)
        outcome = await state.infer(items, where=task.request_key, started=started)
        rendering = time.perf_counter()
        content = api.predict_body(outcome.results, outcome.model.version)
        state.answered(outcome, started, time.perf_counter() - rendering)
        return content, [(b"content-type", b"application/json"),
                         *version_header_pairs(outcome.model)]

    async def declared_predict(request: Request):
        pass  # never called: the direct route answers (the body's schema is api.py's)

    direct.post(routes, "/predict", predict, declared_predict)

    @routes.get("/health")
    async def health():
        names = state.registry.names()  # a repository of several models: the first one's
        model = state.model(names[0] if names else None)
        status = "draining" if state.draining else "unhealthy" if model.unhealthy else "ok"
        body = {"status": status, "task": model.task_name, "backend": model.backend,
                "model_name": model.name, "model_version": model.version,
                "labels": model.label_names, "workers": deploy.workers,
                "queue_depth": state.registry.queue_depth(),
                "precision": model.precision_choice["precision"],
                "precision_reason": model.precision_choice["reason"], **model.health_extras}
        if model.unhealthy:
            body["unhealthy_reason"] = model.unhealthy
        if model.files_changed:  # answering from memory; its directory says otherwise
            body["files_changed"] = model.files_changed
        return JSONResponse(body, status_code=200 if status == "ok" else 503)

    @routes.get("/metrics")
    async def get_metrics():
        body, content_type = state.metrics.exposition()
        return Response(body, media_type=content_type)

    @routes.get("/metrics.json")
    async def get_metrics_json():
        out = state.metrics.snapshot()
        models = state.registry.models()
        batchers = [m.batcher.metrics() for m in models if m.batcher is not None]
        out.update(batchers[0] if len(batchers) == 1 else {"models": batchers})
        out["settings"] = {"max_wait_ms": deploy.max_wait_ms,
                           "max_batch_tokens": deploy.max_batch_tokens,
                           "max_batch_size": deploy.max_batch_size,
                           "queue_size": deploy.queue_size, "workers": deploy.workers,
                           "overhead_tokens": models[0].overhead_tokens if models else None}
        return out

    return routes
