"""HTTP serving: FastAPI app over a ``DynamicBatcher`` per model version; run with uvicorn.

``POST /predict {"texts": [...]}`` -> ``{"predictions": [...], "model_version": "1"}``
(input order); ``GET /health``; ``GET /metrics`` (Prometheus text format; the JSON
counters at ``GET /metrics.json``); the Open Inference Protocol v2 (``/v2/...``, see
``oip.py``); with a model repository, hot reload (``repository.py``).  Every answer names
the version that produced it (``X-Model-Version`` header).  Every input is bounded: body size, number of
texts, characters per text, and the queue (503 + Retry-After when full).  A bad
request is refused before it reaches the queue, so it never touches the batch
its neighbours run in; errors are JSON ``{"error": message, "field": name}``.
"""
import asyncio
import collections
import contextlib
import functools
import re
import signal
import socket
import threading
import time
from importlib import metadata

import numpy as np
import uvicorn
from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response

from ppvarlen.config import ConfigError
from ppvarlen.data.errors import DataError
from ppvarlen.tasks.base import Task
from ppvarlen.utils.io import atomic_write_text
from ppvarlen.utils.log import get_logger

from . import api, oip
from .admission import admit
from .batcher import BatcherClosed, QueueFull
from .connections import uvicorn_config
from .edge import (SHOWN_CHARS, AnswerErrors, RequireToken, parse_json, read_body, read_token,
                   shown)
from .engines import import_runtime
from .errors import ApiError
from .manifest import UnservableExportError
from .predictor import NonFiniteOutput, Predictor
from .prom import PromMetrics
from .repository import (VERSION_NAME, BatchSettings, ModelRegistry, NotServed, Repository,
                         ServedModel, SeveralModels)

log = get_logger("deploy.server")


class Limits:
    """Request bounds (the Deploy config keys of the same names)."""

    def __init__(self, max_texts_per_request=256, max_body_bytes=1 << 20, max_text_chars=20000):
        self.max_texts_per_request = max_texts_per_request
        self.max_body_bytes = max_body_bytes
        self.max_text_chars = max_text_chars


class ServerMetrics:
    """Request counters and a window of recent latencies (bounded memory)."""

    def __init__(self, window=10000):
        self._lock = threading.Lock()
        self.requests = 0
        self.responses = collections.Counter()
        self.texts = 0
        self.truncated = 0  # texts cut to the export's max_len (long_text: truncate)
        self.split = 0  # seq2seq sources served in pieces (Deploy.split_long_sources)
        self.answers = collections.Counter()  # the task's answer counters (Task.answer_counts)
        self._latencies = collections.deque(maxlen=window)

    def count_request(self):
        with self._lock:
            self.requests += 1

    def record(self, status, latency_s=None, texts=0, truncated=0, split=0, answers=None):
        with self._lock:
            self.responses[str(status)] += 1
            self.answers.update(answers or {})
            self.texts += texts
            self.truncated += truncated
            self.split += split
            if latency_s is not None:
                self._latencies.append(latency_s * 1000.0)

    def snapshot(self):
        with self._lock:
            lat = np.array(self._latencies, dtype=np.float64)
            out = {"requests": self.requests, "responses": dict(self.responses),
                   "texts": self.texts, "truncated_texts": self.truncated,
                   "split_texts": self.split, "answers": dict(self.answers)}
        pct = {f"p{q}": float(np.percentile(lat, q)) if lat.size else None for q in (50, 95, 99)}
        out["latency_ms"] = {**pct, "mean": float(lat.mean()) if lat.size else None,
                             "window": int(lat.size)}
        return out


def validate_payload(payload, limits, key="texts", check_item=None, item_words="strings"):
    """``{key: [item, ...]}`` within limits -> the list; ApiError naming the field otherwise.
    ``key`` and ``check_item(item, max_chars)`` -> (problem or None, over the character limit)
    are the task's (``Task.request_key`` / ``Task.check_request_item``)."""
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



def model_name_of(predictor):
    """The name OIP paths use for a single export: the manifest's model_name if path-safe."""
    name = predictor.manifest.get("model_name") or "model"
    return name if re.fullmatch(r"[A-Za-z0-9_.-]+", name) else "model"


class _CountRequests:
    """ASGI middleware: every answer's route template, status and time (Prometheus)."""

    def __init__(self, app, prom):
        self.app, self.prom = app, prom

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        # no answer at all: the client went away first (nginx's 499)
        start, status = time.perf_counter(), [499]

        async def send_status(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route = getattr(scope.get("route"), "path", "unmatched")
            self.prom.observe_request(route, status[0], time.perf_counter() - start)


def create_app(predictor=None, workers=1, max_wait_ms=5.0, max_batch_tokens=8192,
               max_batch_size=64, queue_size=1024, limits=None, drain_timeout_s=30.0,
               overhead_tokens=None, repository=None, load_predictor=None, poll_s=None,
               auth_token=None, auth_all_routes=False, cors_origins=(),
               allow_external_symlinks=False):
    """The FastAPI app: one export (``predictor``, served as version 1 of its manifest's
    model_name) or a model repository (``repository`` dir, ``load_predictor(export_dir)``);
    batchers (one predictor clone per worker) live in its lifespan.  ``auth_token``: the
    bearer token of the repository's endpoints (every route's with ``auth_all_routes``)."""


    if (predictor is None) == (repository is None):
        raise ValueError("create_app serves either a predictor or a model repository")
    limits = limits or Limits()
    metrics = ServerMetrics()
    prom = PromMetrics()
    registry = ModelRegistry()
    prom.queue_depth.set_function(registry.queue_depth)
    settings = BatchSettings(workers, max_wait_ms, max_batch_tokens, max_batch_size, queue_size,
                             overhead_tokens, drain_timeout_s)
    state = {"draining": False, "openapi": None, "loop": None}

    def after_load():
        """A version's predictor was just created (in a loader thread): whatever signal
        handlers its native libraries installed, the server's win again."""
        loop = state["loop"]
        if loop is not None:
            loop.call_soon_threadsafe(rearm_signal_handlers)

    repo = None
    if repository is not None:
        repo = Repository(repository, load_predictor, registry, settings, prom, poll_s,
                          after_load, allow_external_symlinks)

    def begin_drain():
        """Shutdown has begun: refuse new requests (503), stop polling the repository, and
        let every batcher run what it holds without waiting for company."""
        state["draining"] = True
        if repo is not None:
            repo.stop(wait=False)
        for m in registry.models():
            m.stop_waiting()

    @contextlib.asynccontextmanager
    async def lifespan(app):
        state["loop"] = asyncio.get_running_loop()
        if repo is not None:
            await asyncio.to_thread(repo.load_all)
            repo.start_polling()
        else:
            model = ServedModel(model_name_of(predictor), "1", predictor)
            await asyncio.to_thread(model.start, settings, prom)
            registry.add(model)
            prom.model_loaded.labels(model.name, model.version).set(1)
            prom.model_healthy.labels(model.name, model.version).set(1)
        yield
        begin_drain()
        if repo is not None:
            await asyncio.to_thread(repo.stop)
        drained = True
        for m in registry.models():
            drained &= await asyncio.to_thread(m.close, drain_timeout_s)
        log.info("shutdown: queue %s", "drained" if drained else "NOT drained before timeout")

    app = FastAPI(title="ppvarlen", lifespan=lifespan)
    # outermost last: count every answer, answer every error, then the token, then CORS
    if cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(cors_origins),
                           allow_methods=["GET", "POST"], allow_headers=["*"],
                           expose_headers=["X-Model-Name", "X-Model-Version",
                                           oip.HEADER_LENGTH])
    if auth_token is not None:
        app.add_middleware(RequireToken, token=auth_token, all_routes=auth_all_routes)
    app.add_middleware(AnswerErrors, on_status=metrics.record)
    app.add_middleware(_CountRequests, prom=prom)

    @app.exception_handler(ApiError)
    async def _api_error(request, exc):
        metrics.record(exc.status)
        if exc.refused_texts:
            prom.texts.labels("refused").inc(exc.refused_texts)
        oip_route = request.url.path.startswith("/v2")
        body = {"error": exc.message} if oip_route else {"error": exc.message, "field": exc.field}
        return JSONResponse(body, status_code=exc.status, headers=exc.headers)

    def check_open():
        if state["draining"]:
            raise ApiError(503, "server is shutting down", None, {"Retry-After": "1"})

    def not_served(e):
        """404 no such model/version; 409 a route without a model name, several models."""
        return ApiError(409 if isinstance(e, SeveralModels) else 404, str(e), None)

    def model_or_404(name=None, version=None):
        if version is not None and not VERSION_NAME.fullmatch(version):
            raise ApiError(404, f"version {shown(version)}: versions are positive integers in "
                           f"ASCII digits", None)
        try:
            return registry.get(name, version)
        except NotServed as e:
            raise not_served(e) from None

    def refuse_nonfinite(model, failures, where):
        """NaN/inf from the model is never an answer: 503 naming the version, counted, and
        the version marked unhealthy (the index, /health and its ready endpoint say so)."""
        reason = f"non-finite outputs (NaN/inf) for {len(failures)} text(s), e.g. {where}"
        prom.nonfinite_outputs.labels(model.name, model.version).inc(len(failures))
        prom.model_healthy.labels(model.name, model.version).set(0)
        if registry.mark_unhealthy(model, reason):
            log.error("model %s version %s marked unhealthy: %s", model.name, model.version,
                      reason)
        raise ApiError(503, f"model {model.name!r} version {model.version} answered NaN/inf for "
                       f"{where}; the version is marked unhealthy — the operator must replace "
                       f"it (a newer version in the repository takes over)", where)

    async def run_texts(texts, name=None, version=None, long_text=None, where="texts"):
        """Encode with the chosen version's vocab, batch, wait -> (model, results)."""
        def encode(p):
            items = []
            for i, t in enumerate(texts):
                try:
                    items.append(p.task.encode_request(p, t, long_text))
                except DataError as e:
                    raise ApiError(422, f"{where}[{i}]: {e}", f"{where}[{i}]",
                                   refused_texts=1) from None
            return items

        try:
            model, futures = registry.submit(encode, name, version)
        except NotServed as e:
            raise not_served(e) from None
        except QueueFull as e:
            raise ApiError(503, f"overloaded: {e}; retry later", None,
                           {"Retry-After": "1"}) from None
        except BatcherClosed:
            raise ApiError(503, "server is shutting down or the version was unloaded; retry",
                           None, {"Retry-After": "1"}) from None
        results = await asyncio.gather(*(asyncio.wrap_future(f) for f in futures),
                                       return_exceptions=True)
        nonfinite = [i for i, r in enumerate(results) if isinstance(r, NonFiniteOutput)]
        if nonfinite:
            refuse_nonfinite(model, nonfinite, f"{where}[{nonfinite[0]}]")
        for i, r in enumerate(results):
            if isinstance(r, BaseException):
                log.error("%s[%d] failed: %r", where, i, r)
                raise ApiError(500, f"prediction failed for {where}[{i}]: {type(r).__name__}",
                               f"{where}[{i}]")
        truncated = sum(bool(r.get("truncated")) for r in results)
        split = sum(r.get("pieces", 1) > 1 for r in results)
        prom.texts.labels("served").inc(len(results))
        prom.texts.labels("truncated").inc(truncated)
        prom.texts.labels("split").inc(split)
        answers = model.task.answer_counts(results)
        for counter, n in answers.items():
            prom.answers.labels(counter).inc(n)
        return model, results, truncated, split, answers

    def version_headers(model):
        return {"X-Model-Name": model.name, "X-Model-Version": model.version}

    @app.post("/predict")
    async def predict(request: Request):
        start = time.perf_counter()
        metrics.count_request()
        check_open()
        payload = parse_json(await read_body(request, limits.max_body_bytes))
        task = model_or_404().task
        texts = validate_payload(payload, limits, task.request_key, task.check_request_item,
                                 task.request_item_words)
        model, results, truncated, split, answers = await run_texts(texts,
                                                                    where=task.request_key)
        content = api.predict_body(results, model.version)
        metrics.record(200, time.perf_counter() - start, len(texts), truncated, split,
                       answers)
        return Response(content, media_type="application/json",
                        headers=version_headers(model))

    @app.get("/health")
    async def health():
        names = registry.names()  # a repository of several models: the first one's details
        model = model_or_404(names[0] if names else None)
        status = "draining" if state["draining"] else "unhealthy" if model.unhealthy else "ok"
        body = {"status": status, "task": model.task_name,
                "backend": model.backend, "model_name": model.name,
                "model_version": model.version, "labels": model.label_names,
                "workers": workers, "queue_depth": registry.queue_depth(),
                **model.health_extras}
        if model.unhealthy:
            body["unhealthy_reason"] = model.unhealthy
        return JSONResponse(body, status_code=200 if status == "ok" else 503)

    @app.get("/metrics")
    async def get_metrics():
        body, content_type = prom.exposition()
        return Response(body, media_type=content_type)

    @app.get("/metrics.json")
    async def get_metrics_json():
        out = metrics.snapshot()
        batchers = [m.batcher.metrics() for m in registry.models() if m.batcher is not None]
        out.update(batchers[0] if len(batchers) == 1 else {"models": batchers})
        out["settings"] = {"max_wait_ms": max_wait_ms, "max_batch_tokens": max_batch_tokens,
                           "max_batch_size": max_batch_size, "queue_size": queue_size,
                           "workers": workers, "overhead_tokens": [
                               m.overhead_tokens for m in registry.models()][0]
                           if registry.models() else None}
        return out

    # ------------------------------------------------------------ Open Inference Protocol v2
    @app.get("/v2")
    async def server_metadata():
        return {"name": "ppvarlen", "version": _version(), "extensions": oip.EXTENSIONS}

    @app.get("/v2/health/live")
    async def live():
        return {"live": True}

    @app.get("/v2/health/ready")
    async def ready():
        ok = not state["draining"] and bool(registry.names())
        return JSONResponse({"ready": ok}, status_code=200 if ok else 503)

    async def model_metadata(name: str, version: str = None):
        model = model_or_404(name, version)
        return JSONResponse(oip.model_metadata(name, registry.versions(name), model),
                            headers=version_headers(model))

    async def model_ready(name: str, version: str = None):
        model = model_or_404(name, version)
        if state["draining"] or model.unhealthy:
            why = "the server is shutting down" if state["draining"] else model.unhealthy
            return JSONResponse({"name": name, "ready": False, "reason": why}, status_code=503,
                                headers=version_headers(model))
        return JSONResponse({"name": name, "ready": True}, headers=version_headers(model))

    async def infer(request: Request, name: str, version: str = None):
        start = time.perf_counter()
        metrics.count_request()
        check_open()
        body = await read_body(request, limits.max_body_bytes)
        head, binary = oip.split_body(body, request.headers.get(oip.HEADER_LENGTH))
        payload = parse_json(head)
        model = model_or_404(name, version)
        if not model.task.oip_infer:
            raise ApiError(422, f"model {model.name!r} ({model.task_name}) takes "
                           f"{model.task.request_key} through POST /predict; the Open Inference "
                           f"Protocol's text tensor carries single texts", "inputs")
        texts, request_id, params, wanted = oip.parse_infer(payload, binary, limits, model)
        model, results, truncated, split, answers = await run_texts(
            texts, name, version, params.get("long_text"), where="inputs[0].data")
        metrics.record(200, time.perf_counter() - start, len(texts), truncated, split,
                       answers)
        content, headers = oip.infer_response(model, request_id, params, wanted, results)
        return Response(content, headers={**headers, **version_headers(model)})

    for path, handler, methods in [
            ("/v2/models/{name}", model_metadata, ["GET"]),
            ("/v2/models/{name}/versions/{version}", model_metadata, ["GET"]),
            ("/v2/models/{name}/ready", model_ready, ["GET"]),
            ("/v2/models/{name}/versions/{version}/ready", model_ready, ["GET"]),
            ("/v2/models/{name}/infer", infer, ["POST"]),
            ("/v2/models/{name}/versions/{version}/infer", infer, ["POST"])]:
        app.add_api_route(path, handler, methods=methods)

    if repo is not None:
        @app.post("/v2/repository/index")
        async def repository_index():
            return registry.index()

        @app.post("/v2/repository/models/{name}/load")
        async def repository_load(name: str):
            """Load NAME's newest version now (verified before it takes traffic)."""
            try:
                status = await asyncio.to_thread(repo.refresh, name)
            except UnservableExportError as e:
                raise ApiError(404, str(e), None) from None
            if status["state"] != "READY":
                raise ApiError(409, f"model {name!r} version {status['version']} refused: "
                               f"{status['reason']}; still serving "
                               f"{registry.versions(name) or 'nothing'}", None)
            return status

    def openapi():
        models = registry.models()
        key = tuple(sorted((m.name, m.version) for m in models))
        if state["openapi"] is None or state["openapi"][0] != key:
            model = registry.get(models[0].name) if models else None
            p = model.predictor if model is not None else None
            if p is None:
                return app.openapi_schema or {}
            request = api.request_model(limits, _max_text_chars(p, limits), p.task)
            prediction = p.task.prediction_model(p.label_names)
            doc = api.openapi_document(app, request, api.response_model(prediction),
                                       model.example)
            api.add_oip(doc, {n: registry.versions(n) for n in registry.names()},
                        oip.model_metadata(model.name, registry.versions(model.name), model),
                        limits, _max_text_chars(p, limits), oip.long_text_choices(model),
                        repo is not None)
            if not p.task.oip_infer:  # not offered for this task: not in its contract either
                for path in [k for k in doc["paths"] if k.endswith("/infer")]:
                    del doc["paths"][path]
            state["openapi"] = (key, doc)
        return state["openapi"][1]

    app.openapi = openapi
    app.state.registry = registry
    app.state.begin_drain = begin_drain
    app.state.prom = prom
    app.state.repository = repo
    return app


def rearm_signal_handlers():
    """Re-install Python's SIGINT/SIGTERM handlers at the C level (main thread only; a no-op
    elsewhere): a native library loaded after the server started may have replaced them."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGINT, signal.SIGTERM):
        handler = signal.getsignal(sig)
        if callable(handler):
            signal.signal(sig, handler)


def _version():
    try:
        return metadata.version("ppvarlen")
    except Exception:  # noqa: BLE001 - a source checkout without metadata
        return "unknown"


def _max_text_chars(predictor, limits):
    """Characters a text may have: under the 'error' long-text policy also the export's limit
    (a token is at least one character, so this many characters never exceed it)."""
    if predictor.long_text != "error" or predictor.split_long_sources:
        return limits.max_text_chars
    specials = 2 if predictor.add_special_tokens else 0
    return min(limits.max_text_chars, predictor.max_len - specials)


def app_from_config(export_dir, deploy_cfg, backend=None, repository=None):
    """The app for ``export_dir`` (or the model ``repository`` dir) with the ``Deploy``
    settings: predictor(s), limits, batcher (``serve`` runs it with uvicorn; each Ray Serve
    replica runs its own copy)."""


    load = functools.partial(Predictor, backend=backend or deploy_cfg.backend,
                             device=deploy_cfg.device, precision=deploy_cfg.precision,
                             threads=deploy_cfg.threads,
                             max_batch_tokens=deploy_cfg.max_batch_tokens,
                             max_batch_size=deploy_cfg.max_batch_size,
                             tensorrt=deploy_cfg.tensorrt,
                             split_long_sources=deploy_cfg.split_long_sources,
                             allow_external_symlinks=deploy_cfg.allow_external_symlinks)
    limits = Limits(deploy_cfg.max_texts_per_request, deploy_cfg.max_body_bytes,
                    deploy_cfg.max_text_chars)
    common = dict(workers=deploy_cfg.workers, max_wait_ms=deploy_cfg.max_wait_ms,
                  max_batch_tokens=deploy_cfg.max_batch_tokens,
                  max_batch_size=deploy_cfg.max_batch_size, queue_size=deploy_cfg.queue_size,
                  limits=limits, drain_timeout_s=deploy_cfg.drain_timeout_s,
                  overhead_tokens=deploy_cfg.batch_overhead_tokens,
                  auth_token=(read_token(deploy_cfg.auth_token_file)
                              if deploy_cfg.auth_token_file else None),
                  auth_all_routes=deploy_cfg.auth_all_routes,
                  cors_origins=tuple(deploy_cfg.cors_origins or ()),
                  allow_external_symlinks=deploy_cfg.allow_external_symlinks)
    if deploy_cfg.auth_all_routes and not deploy_cfg.auth_token_file:
        raise ConfigError("Deploy.auth_all_routes: true needs Deploy.auth_token_file (the file "
                          "holding the token)")
    if repository is not None:
        return create_app(repository=repository, load_predictor=load,
                          poll_s=deploy_cfg.repository_poll_s, **common)
    predictor = load(export_dir)
    # the check a repository runs before a version takes traffic; one export has no fallback
    report = admit(predictor)
    log.info("export %s admitted: %s", export_dir, ", ".join(report))
    return create_app(predictor, **common)


def serve(export_dir, deploy_cfg, host=None, port=None, backend=None, repository=None,
          port_file=None):
    """Serve the export (or the model repository) until SIGINT/SIGTERM, then drain: stop
    accepting, answer every request already taken, unload, return (exit status 0).

    ``port=0`` takes a free port; the bound port is logged and, with ``port_file``, written
    there (atomically) once the socket is listening, so callers never guess a free port."""



    class DrainingServer(uvicorn.Server):
        async def shutdown(self, sockets=None):
            app.state.begin_drain()  # before uvicorn waits for the in-flight requests
            await super().shutdown(sockets)

    host = host or deploy_cfg.host
    port = deploy_cfg.port if port is None else port
    if host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("binding %s: the server is reachable from other machines", host)
    app = app_from_config(export_dir, deploy_cfg, backend, repository)
    # A repository loads its predictors after uvicorn has installed its signal handlers;
    # importing the runtime now keeps Paddle's SIGTERM handler from replacing them.
    import_runtime(backend or deploy_cfg.backend)
    # bound here rather than by uvicorn so the port is known before serving (port 0)
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port} ({e.strerror}); choose another "
                          f"--port (or Deploy.port), or 0 for any free port") from None
    bound = sock.getsockname()[1]
    log.info("serving %s on http://%s:%d", repository or export_dir, host, bound)
    config = uvicorn_config(app, deploy_cfg, host, bound)  # with the Deploy connection bounds
    # listening before the port file appears: a client that reads it is queued, not refused,
    # until the app has started
    sock.listen(config.backlog)
    if port_file:
        atomic_write_text(port_file, f"{bound}\n")
    server = DrainingServer(config)
    # uvicorn re-raises the signal it drained on, to the handler that was there before it:
    # SIGINT -> KeyboardInterrupt (caught below), SIGTERM -> this no-op rather than death by
    # SIGTERM, so a drained shutdown exits 0 either way.
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:  # as uvicorn.run does
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
    if not server.started:
        raise SystemExit(3)  # uvicorn's STARTUP_FAILURE, as uvicorn.run exits
