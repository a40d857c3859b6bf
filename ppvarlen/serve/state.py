"""``AppState``: what every route of the server shares, built once from the Deploy section.

The REST predict routes (``routes_predict``), the Open Inference Protocol over REST
(``routes_oip``) and over gRPC (``grpc_service``) are modules over one ``AppState``: the
Deploy settings (limits, batching), the registry of model versions taking traffic, the model
repository, the counters (``prom.ServerMetrics``) and the one path a request's items take to
a batcher and back (``infer``).
"""
import asyncio
import re
import signal
import threading
import time

from ppvarlen.config import ConfigError, load_config
from ppvarlen.data.errors import DataError
from ppvarlen.utils.log import get_logger

from ppvarlen.serve.batcher import BatcherClosed, QueueFull
from ppvarlen.serve.http.edge import shown
from ppvarlen.serve.errors import ApiError
from ppvarlen.runtime.predictor import NonFiniteOutput
from ppvarlen.serve.prom import ServerMetrics
from ppvarlen.serve.repository import (VERSION_NAME, LiveVersions, NotServed, Repository, ServedModel,
                         SeveralModels)

log = get_logger("serve.server")


def deploy_settings(**keys):
    """A Deploy section with ``keys`` over the schema's defaults, validated like
    ``-o Deploy.KEY=V`` (tests and library callers; the commands read the config)."""
    return load_config(data={"Deploy": keys}).Deploy


SERVED_NAME = re.compile(r"[A-Za-z0-9_.-]{1,128}", re.ASCII)


def model_name_of(predictor, deploy=None):
    """The name OIP paths use for a single export: ``Deploy.model_name`` when set, else the
    manifest's model_name if path-safe."""
    chosen = getattr(deploy, "model_name", None)
    if chosen is not None:
        return served_name(chosen)
    name = predictor.manifest.get("model_name") or "model"
    return name if SERVED_NAME.fullmatch(name) else "model"


def served_name(name):
    """``Deploy.model_name`` if it can be a path segment; ConfigError naming the key else."""
    if not SERVED_NAME.fullmatch(name):
        raise ConfigError(f"Deploy.model_name {shown(name)}: 1-128 letters, digits, '_', '.' "
                          f"or '-' (it is a URL path segment: /v2/models/NAME)")
    return name


def max_text_chars(predictor, deploy):
    """Characters a text may have: under the 'error' long-text policy also the export's limit
    (a token is at least one character, so this many characters never exceed it)."""
    if predictor.long_text != "error" or predictor.split_long_sources:
        return deploy.max_text_chars
    specials = 2 if predictor.add_special_tokens else 0
    return min(deploy.max_text_chars, predictor.max_len - specials)


def rearm_signal_handlers():
    """Re-install Python's SIGINT/SIGTERM handlers at the C level (main thread only; a no-op
    elsewhere): a native library loaded after the server started may have replaced them."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGINT, signal.SIGTERM):
        handler = signal.getsignal(sig)
        if callable(handler):
            signal.signal(sig, handler)


class Outcome:
    """What ``AppState.infer`` hands a route: the version that answered and its results."""

    __slots__ = ("model", "results", "truncated", "split", "answers", "input_s", "timings")

    def __init__(self, model, results, truncated, split, answers, input_s, timings):
        self.model, self.results = model, results
        self.truncated, self.split, self.answers = truncated, split, answers
        self.input_s, self.timings = input_s, timings  # encoding; (queue, forward) per text


class AppState:
    """One export (``predictor``, served as version 1 of its manifest's model_name) or a
    model repository (``repository`` dir, ``load_predictor(export_dir)``) with the ``deploy``
    settings; ``start``/``stop`` run in the app's lifespan."""

    def __init__(self, deploy, predictor=None, repository=None, load_predictor=None):
        if (predictor is None) == (repository is None):
            raise ValueError("the server serves either a predictor or a model repository")
        self.deploy = deploy
        self.metrics = ServerMetrics()
        self.registry = LiveVersions()
        self.metrics.queue_depth.set_function(self.registry.queue_depth)
        self.predictor = predictor
        self.draining = False
        self.loop = None
        self.openapi = None  # (served versions, document), rebuilt when they change
        self.repository = None
        if repository is not None:
            self.repository = Repository(repository, load_predictor, self.registry, deploy,
                                         self.metrics, self._after_load)

    # ------------------------------------------------------------ lifecycle
    def _after_load(self):
        """A version's predictor was just created (in a loader thread): whatever signal
        handlers its native libraries installed, the server's win again."""
        if self.loop is not None:
            self.loop.call_soon_threadsafe(rearm_signal_handlers)

    async def start(self):
        self.loop = asyncio.get_running_loop()
        if self.repository is not None:
            await asyncio.to_thread(self.repository.load_all)
            self.repository.start_polling()
            return
        model = ServedModel(model_name_of(self.predictor, self.deploy), "1", self.predictor)
        await asyncio.to_thread(model.start, self.deploy, self.metrics, self.registry.callers)
        self.registry.add(model)
        self.metrics.mark_loaded(model)

    def begin_drain(self):
        """Shutdown has begun: refuse new requests (503), stop polling the repository, and
        let every batcher run what it holds without waiting for company."""
        self.draining = True
        if self.repository is not None:
            self.repository.stop(wait=False)
        for m in self.registry.models():
            m.stop_waiting()

    async def stop(self):
        self.begin_drain()
        if self.repository is not None:
            await asyncio.to_thread(self.repository.stop)
        drained = True
        for m in self.registry.models():
            drained &= await asyncio.to_thread(m.close, self.deploy.drain_timeout_s)
        log.info("shutdown: queue %s", "drained" if drained else "NOT drained before timeout")

    # ------------------------------------------------------------ requests
    def check_open(self):
        if self.draining:
            raise ApiError(503, "server is shutting down", None, {"Retry-After": "1"})

    def model(self, name=None, version=None):
        """The version a request addresses (the newest ready one without ``version``); 404
        no such model or version, 409 a route without a model name on several models."""
        if version is not None and not VERSION_NAME.fullmatch(version):
            raise ApiError(404, f"version {shown(version)}: versions are positive integers in "
                           f"ASCII digits", None)
        try:
            return self.registry.get(name, version)
        except NotServed as e:
            raise _not_served(e) from None

    async def infer(self, items, name=None, version=None, long_text=None, where="texts",
                    started=None):
        """Encode ``items`` with the chosen version's vocabulary, queue them on its batcher,
        wait -> ``Outcome``.  ApiError for what cannot be answered (422 a bad item, 503 full,
        draining, or NaN/inf from the model); a failure once queued is counted in the
        version's statistics (``started``: the request's ``time.perf_counter()``)."""
        started = time.perf_counter() if started is None else started
        encoded = {"queued": False}
        callers = self.registry.callers

        def encode(p):
            start = time.perf_counter()
            out = []
            for i, item in enumerate(items):
                try:
                    out.append(p.task.encode_request(p, item, long_text))
                except DataError as e:
                    raise ApiError(422, f"{where}[{i}]: {e}", f"{where}[{i}]",
                                   refused_texts=1) from None
            encoded["seconds"] = time.perf_counter() - start
            if not encoded["queued"]:  # counted before the submit wakes a worker
                encoded["queued"] = True
                callers.queued()
            return out

        callers.arrive()
        try:
            try:
                model, futures = self.registry.submit(encode, name, version,
                                                      loop=asyncio.get_running_loop())
            except NotServed as e:
                raise _not_served(e) from None
            except QueueFull as e:
                raise ApiError(503, f"overloaded: {e}; retry later", None,
                               {"Retry-After": "1"}) from None
            except BatcherClosed:
                raise ApiError(503, "server is shutting down or the version was unloaded; "
                               "retry", None, {"Retry-After": "1"}) from None
            answered = await _all_of(futures)
        finally:
            callers.leave(encoded["queued"])
        results = [a if isinstance(a, BaseException) else a.result for a in answered]
        failures = [i for i, r in enumerate(results) if isinstance(r, BaseException)]
        if failures:
            model.stats.observe_failure(time.perf_counter() - started)
            nonfinite = [i for i in failures if isinstance(results[i], NonFiniteOutput)]
            if nonfinite:
                self._refuse_nonfinite(model, nonfinite, f"{where}[{nonfinite[0]}]")
            i = failures[0]
            log.error("%s[%d] failed: %r", where, i, results[i])
            raise ApiError(500, f"prediction failed for {where}[{i}]: "
                           f"{type(results[i]).__name__}", f"{where}[{i}]")
        truncated = sum(bool(r.get("truncated")) for r in results)
        split = sum(r.get("pieces", 1) > 1 for r in results)
        return Outcome(model, results, truncated, split, model.task.answer_counts(results),
                       encoded["seconds"], [(a.queue_s, a.compute_s) for a in answered])

    def answered(self, outcome, started, output_s):
        """Count a successful inference request (``started``: its ``time.perf_counter()``;
        ``output_s``: the time its answer took to render)."""
        seconds = time.perf_counter() - started
        self.metrics.record(200, seconds, len(outcome.results), outcome.truncated,
                            outcome.split, outcome.answers)
        outcome.model.stats.observe_success(seconds, outcome.input_s, outcome.timings,
                                            output_s)

    def failed(self, error):
        """Count a refused request (an ApiError)."""
        self.metrics.record(error.status)
        if error.refused_texts:
            self.metrics.refused(error.refused_texts)

    def _refuse_nonfinite(self, model, failures, where):
        """NaN/inf from the model is never an answer: 503 naming the version, counted, and
        the version marked unhealthy (the index, /health and its ready endpoint say so)."""
        reason = f"non-finite outputs (NaN/inf) for {len(failures)} text(s), e.g. {where}"
        self.metrics.nonfinite_outputs.labels(model.name, model.version).inc(len(failures))
        self.metrics.model_healthy.labels(model.name, model.version).set(0)
        if self.registry.mark_unhealthy(model, reason):
            log.error("model %s version %s marked unhealthy: %s", model.name, model.version,
                      reason)
        raise ApiError(503, f"model {model.name!r} version {model.version} answered NaN/inf for "
                       f"{where}; the version is marked unhealthy — the operator must replace "
                       f"it (a newer version in the repository takes over)", where)


async def _all_of(futures):
    """Every future's result or exception, in order (``gather(return_exceptions=True)``,
    which for the one-text request costs more than the awaiting itself)."""
    if len(futures) == 1:
        try:
            return [await futures[0]]
        except Exception as e:  # noqa: BLE001 - the caller refuses the text with it
            return [e]
    return await asyncio.gather(*futures, return_exceptions=True)


def _not_served(e):
    """404 no such model/version; 409 a route without a model name, several models."""
    return ApiError(409 if isinstance(e, SeveralModels) else 404, str(e), None)
