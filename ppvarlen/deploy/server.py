"""HTTP serving: FastAPI app over a ``DynamicBatcher``; run with uvicorn.

``POST /predict {"texts": [...]}`` -> ``{"predictions": [...]}`` (input order);
``GET /health``; ``GET /metrics``.  Every input is bounded: body size, number of
texts, characters per text, and the queue (503 + Retry-After when full).  A bad
request is refused before it reaches the queue, so it never touches the batch
its neighbours run in; errors are JSON ``{"error": message, "field": name}``.
"""
import asyncio
import collections
import json
import threading
import time

import numpy as np

from ppvarlen.data.errors import DataError
from ppvarlen.utils.log import get_logger

from . import api
from .batcher import BatcherClosed, DynamicBatcher, QueueFull

log = get_logger("deploy.server")


class ApiError(Exception):
    def __init__(self, status, message, field=None, headers=None):
        super().__init__(message)
        self.status, self.message, self.field, self.headers = status, message, field, headers


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
        self._latencies = collections.deque(maxlen=window)

    def count_request(self):
        with self._lock:
            self.requests += 1

    def record(self, status, latency_s=None, texts=0, truncated=0, split=0):
        with self._lock:
            self.responses[str(status)] += 1
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
                   "split_texts": self.split}
        pct = {f"p{q}": float(np.percentile(lat, q)) if lat.size else None for q in (50, 95, 99)}
        out["latency_ms"] = {**pct, "mean": float(lat.mean()) if lat.size else None,
                             "window": int(lat.size)}
        return out


def validate_payload(payload, limits):
    """``{"texts": [str, ...]}`` within limits -> the list; ApiError naming the field otherwise."""
    if not isinstance(payload, dict):
        raise ApiError(422, f"body must be a JSON object like {{\"texts\": [\"...\"]}}, got "
                       f"{type(payload).__name__}", "body")
    unknown = sorted(set(payload) - {"texts"})
    if unknown:
        raise ApiError(422, f"unknown field(s) {unknown}; the body takes only \"texts\"",
                       unknown[0])
    if "texts" not in payload:
        raise ApiError(422, "field \"texts\" is required: a list of strings", "texts")
    texts = payload["texts"]
    if not isinstance(texts, list):
        raise ApiError(422, f"\"texts\" must be a list of strings, got {type(texts).__name__}",
                       "texts")
    if not texts:
        raise ApiError(422, "\"texts\" is empty; send at least one text", "texts")
    if len(texts) > limits.max_texts_per_request:
        raise ApiError(422, f"{len(texts)} texts in one request; at most "
                       f"{limits.max_texts_per_request} (Deploy.max_texts_per_request) — split "
                       f"the request", "texts")
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise ApiError(422, f"texts[{i}] must be a string, got {type(t).__name__}",
                           f"texts[{i}]")
        if len(t) > limits.max_text_chars:
            raise ApiError(422, f"texts[{i}] has {len(t)} characters; at most "
                           f"{limits.max_text_chars} (Deploy.max_text_chars)", f"texts[{i}]")
    return texts


async def _read_body(request, limit):
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise ApiError(400, f"bad Content-Length header {declared!r}", "Content-Length")
        if int(declared) > limit:
            raise ApiError(413, f"body is {declared} bytes; at most {limit} "
                           f"(Deploy.max_body_bytes)", "body")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:  # chunked uploads announce no length: count while reading
            raise ApiError(413, f"body exceeds {limit} bytes (Deploy.max_body_bytes)", "body")
        chunks.append(chunk)
    return b"".join(chunks)


def create_app(predictor, workers=1, max_wait_ms=5.0, max_batch_tokens=8192, max_batch_size=64,
               queue_size=1024, limits=None, drain_timeout_s=30.0, overhead_tokens=None):
    """The FastAPI app; the batcher (one predictor clone per worker) lives in its lifespan."""
    import contextlib

    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse

    limits = limits or Limits()
    metrics = ServerMetrics()
    state = {"batcher": None, "draining": False, "overhead_tokens": overhead_tokens,
             "example": None, "openapi": None}

    @contextlib.asynccontextmanager
    async def lifespan(app):
        predictors = [predictor] + [predictor.clone() for _ in range(workers - 1)]
        for p in predictors:
            await asyncio.to_thread(p.warmup)
        if state["overhead_tokens"] is None:
            state["overhead_tokens"] = await asyncio.to_thread(predictor.measure_overhead_tokens)
        state["example"] = await asyncio.to_thread(_example, predictor)
        state["batcher"] = DynamicBatcher(predictors, max_wait_ms, max_batch_tokens,
                                          max_batch_size, queue_size, state["overhead_tokens"])
        log.info("serving %s (%s backend) with %d worker(s); a forward pass costs as much as "
                 "%d tokens", predictor.task.name, predictor.backend, workers, state["overhead_tokens"])
        yield
        state["draining"] = True
        drained = await asyncio.to_thread(state["batcher"].close, True, drain_timeout_s)
        log.info("shutdown: queue %s", "drained" if drained else "NOT drained before timeout")

    app = FastAPI(title="ppvarlen", lifespan=lifespan)

    @app.exception_handler(ApiError)
    async def _api_error(request, exc):
        metrics.record(exc.status)
        return JSONResponse({"error": exc.message, "field": exc.field}, status_code=exc.status,
                            headers=exc.headers)

    @app.post("/predict")
    async def predict(request: Request):
        start = time.perf_counter()
        metrics.count_request()
        if state["draining"]:
            raise ApiError(503, "server is shutting down", None, {"Retry-After": "1"})
        body = await _read_body(request, limits.max_body_bytes)
        try:
            payload = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ApiError(400, f"body is not valid JSON: {e}", "body") from None
        texts = validate_payload(payload, limits)
        items = []
        for i, t in enumerate(texts):
            try:
                items.append(predictor.encode(t))
            except DataError as e:
                raise ApiError(422, f"texts[{i}]: {e}", f"texts[{i}]") from None
        try:
            futures = state["batcher"].submit(items)
        except QueueFull as e:
            raise ApiError(503, f"overloaded: {e}; retry later", None,
                           {"Retry-After": "1"}) from None
        except BatcherClosed:
            raise ApiError(503, "server is shutting down", None, {"Retry-After": "1"}) from None
        results = await asyncio.gather(*(asyncio.wrap_future(f) for f in futures),
                                       return_exceptions=True)
        for i, r in enumerate(results):
            if isinstance(r, BaseException):
                log.error("texts[%d] failed: %r", i, r)
                raise ApiError(500, f"prediction failed for texts[{i}]: {type(r).__name__}",
                               f"texts[{i}]")
        metrics.record(200, time.perf_counter() - start, len(texts),
                       sum(bool(r.get("truncated")) for r in results),
                       sum(r.get("pieces", 1) > 1 for r in results))
        return {"predictions": results}

    @app.get("/health")
    async def health():
        batcher = state["batcher"]
        body = {"status": "draining" if state["draining"] else "ok", "task": predictor.task.name,
                "backend": predictor.backend, "model_name": predictor.manifest.get("model_name"),
                "labels": predictor.label_names, "workers": workers,
                "queue_depth": batcher.queue_depth() if batcher else 0}
        return JSONResponse(body, status_code=503 if state["draining"] else 200)

    @app.get("/metrics")
    async def get_metrics():
        out = metrics.snapshot()
        out.update(state["batcher"].metrics())
        out["settings"] = {"max_wait_ms": max_wait_ms, "max_batch_tokens": max_batch_tokens,
                           "max_batch_size": max_batch_size, "queue_size": queue_size,
                           "workers": workers, "overhead_tokens": state["overhead_tokens"]}
        return out

    def openapi():
        if state["openapi"] is None:
            request = api.request_model(limits, _max_text_chars(predictor, limits))
            prediction = predictor.task.prediction_model(predictor.label_names)
            state["openapi"] = api.openapi_document(app, request, api.response_model(prediction),
                                                    state["example"])
        return state["openapi"]

    app.openapi = openapi
    return app


def _max_text_chars(predictor, limits):
    """Characters a text may have: under the 'error' long-text policy also the export's limit
    (a token is at least one character, so this many characters never exceed it)."""
    if predictor.long_text != "error" or predictor.split_long_sources:
        return limits.max_text_chars
    specials = 2 if predictor.add_special_tokens else 0
    return min(limits.max_text_chars, predictor.max_len - specials)


def _example(predictor):
    """A request and the answer this model really gives it, for /docs."""
    texts = predictor.task.examples
    try:
        return {"request": {"texts": texts}, "response": {"predictions": predictor.predict(texts)}}
    except DataError as e:  # e.g. an export whose max_len is shorter than the example
        log.warning("no /docs example: the example texts do not fit this export (%s)", e)
        return None


def app_from_config(export_dir, deploy_cfg, backend=None):
    """The app for ``export_dir`` with the ``Deploy`` settings: predictor, limits, batcher
    (``serve`` runs it with uvicorn; each Ray Serve replica runs its own copy)."""
    from .predictor import Predictor

    predictor = Predictor(export_dir, backend or deploy_cfg.backend, device=deploy_cfg.device,
                          precision=deploy_cfg.precision, threads=deploy_cfg.threads,
                          max_batch_tokens=deploy_cfg.max_batch_tokens,
                          max_batch_size=deploy_cfg.max_batch_size, tensorrt=deploy_cfg.tensorrt,
                          split_long_sources=deploy_cfg.split_long_sources)
    limits = Limits(deploy_cfg.max_texts_per_request, deploy_cfg.max_body_bytes,
                    deploy_cfg.max_text_chars)
    return create_app(predictor, deploy_cfg.workers, deploy_cfg.max_wait_ms,
                      deploy_cfg.max_batch_tokens, deploy_cfg.max_batch_size,
                      deploy_cfg.queue_size, limits, deploy_cfg.drain_timeout_s,
                      deploy_cfg.batch_overhead_tokens)


def serve(export_dir, deploy_cfg, host=None, port=None, backend=None, port_file=None):
    """Load the export and serve it until SIGINT/SIGTERM (then drain the queue and exit).

    ``port=0`` takes a free port; the bound port is logged and, with ``port_file``, written
    there (atomically) once the socket is listening, so callers never guess a free port."""
    import socket

    import uvicorn

    from ..config import ConfigError
    from ..utils.io import atomic_write_text

    host = host or deploy_cfg.host
    port = deploy_cfg.port if port is None else port
    if host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("binding %s: the server is reachable from other machines", host)
    app = app_from_config(export_dir, deploy_cfg, backend)
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
    log.info("serving %s on http://%s:%d", export_dir, host, bound)
    if port_file:
        atomic_write_text(port_file, f"{bound}\n")
    config = uvicorn.Config(app, host=host, port=bound, log_level="warning",
                            timeout_graceful_shutdown=int(deploy_cfg.drain_timeout_s))
    server = uvicorn.Server(config)
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:  # uvicorn re-raises the SIGINT it drained on; as uvicorn.run does
        pass
    if not server.started:
        raise SystemExit(3)  # uvicorn's STARTUP_FAILURE, as uvicorn.run exits
