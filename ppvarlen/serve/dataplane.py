"""The data plane: what every protocol's requests share, written once.

``DataPlane`` holds the Deploy settings, the model versions taking traffic (``LiveVersions``),
the model repository and the counters (``prom.ServerMetrics``), and owns an inference
request's lifecycle (``infer``): count it, refuse it while draining, look the model up by name
and version, let the protocol's codec read it, encode its items with that version's
vocabulary and queue them on its batcher, refuse NaN/inf answers (the version is marked
unhealthy), time it, let the codec render the answer, count it answered.  It raises
``errors.ServeError`` types, never a protocol's status: each protocol (``protocols/*``) reads
and renders its own form around it, each transport (``http/``, ``grpc/``) carries the bytes.
"""
import asyncio
import re
import time

from ppvarlen.config import ConfigError, load_config
from ppvarlen.data.errors import DataError
from ppvarlen.utils.log import get_logger

from ppvarlen.runtime.manifest import UnservableExportError
from ppvarlen.runtime.predictor import NonFiniteOutput
from ppvarlen.serve import errors
from ppvarlen.serve.errors import shown
from ppvarlen.serve.batcher import BatcherClosed, DeadlineExpired, QueueFull
from ppvarlen.serve.prom import ServerMetrics
from ppvarlen.serve.signals import rearm_signal_handlers
from ppvarlen.serve.repository import (VERSION_NAME, LiveVersions, NotServed, Repository,
                                       ServedModel, SeveralModels)

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


class Call:
    """What a protocol's codec read of one inference request: the ``items`` (the task's request
    items), the model ``name`` and ``version`` asked for (None: the only model, the newest
    version), the ``long_text`` policy asked for (None: the export's), ``where`` (how an error
    names the items: ``texts``, ``inputs[0].data``), ``context``, the codec's own (what it
    needs again to render the answer: an id, the outputs wanted) and ``timeout_s``, how long
    its texts may wait in the queue (None: as long as it takes; the OIP's ``timeout``)."""

    __slots__ = ("items", "name", "version", "long_text", "where", "context", "timeout_s")

    def __init__(self, items, name=None, version=None, long_text=None, where="texts",
                 context=None, timeout_s=None):
        self.items, self.name, self.version = items, name, version
        self.long_text, self.where, self.context = long_text, where, context
        self.timeout_s = timeout_s


class Outcome:
    """What ``DataPlane.infer`` hands a codec to render: the version that answered, its
    results, and what the counters take of them."""

    __slots__ = ("model", "results", "truncated", "split", "answers", "input_s", "timings")

    def __init__(self, model, results, truncated, split, answers, input_s, timings):
        self.model, self.results = model, results
        self.truncated, self.split, self.answers = truncated, split, answers
        self.input_s, self.timings = input_s, timings  # encoding; (queue, forward) per text


class DataPlane:
    """One export (``predictor``, served as version 1 of its manifest's model_name) or a
    model repository (``repository`` dir, ``load_predictor(export_dir)``, admitted with the
    ``renderers`` checks) with the ``deploy`` settings; ``start``/``stop`` run in the app's
    lifespan."""

    def __init__(self, deploy, predictor=None, repository=None, load_predictor=None,
                 renderers=()):
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
                                         self.metrics, self._after_load, renderers)

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
        """Shutdown has begun: refuse new requests (``Draining``), stop polling the
        repository, and let every batcher run what it holds without waiting for company."""
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

    # ------------------------------------------------------------ models
    def check_open(self):
        if self.draining:
            raise errors.Draining("server is shutting down")

    def model(self, name=None, version=None):
        """The version a request addresses (the newest ready one without ``version``);
        ModelNotFound, or AmbiguousModel for no name on several models."""
        if version is not None and not VERSION_NAME.fullmatch(version):
            raise errors.ModelNotFound(f"version {shown(version)}: versions are positive "
                                       f"integers in ASCII digits")
        try:
            return self.registry.get(name, version)
        except NotServed as e:
            raise _not_served(e) from None

    def ready(self):
        """Whether the server is ready as the Open Inference Protocol defines it: "all the
        models are ready" -- not draining, a model loaded, every served model's newest version
        healthy, and no repository model left without a version (refused; unloaded on request
        does not count)."""
        names = self.registry.names()
        if self.draining or not names:
            return False
        if any(self.registry.get(n).unhealthy for n in names):
            return False
        return self.repository is None or not self.repository.unserved()

    def not_ready_reason(self, model):
        """Why ``model`` takes no requests now, or None when it does."""
        return "the server is shutting down" if self.draining else model.unhealthy

    async def unload(self, name):
        """The repository's model ``name`` out of routing now, its queue drained (requests
        already queued are answered); it stays unloaded until ``load_newest``.  NoRepository,
        ModelNotFound when nothing of ``name`` is served."""
        if self.repository is None:
            raise errors.NoRepository("this server serves one export (--model-dir), not a "
                                      "model repository")
        if not self.registry.versions(name):
            raise errors.ModelNotFound(f"model {shown(name)} is not loaded; loaded: "
                                       f"{shown(self.registry.names(), 200)}")
        await asyncio.to_thread(self.repository.unload, name)

    async def load_newest(self, name):
        """The repository's newest version of ``name`` loaded now -> its READY status;
        NoRepository, ModelNotFound or LoadRefused (with the reason) otherwise."""
        if self.repository is None:
            raise errors.NoRepository("this server serves one export (--model-dir), not a "
                                      "model repository")
        try:
            status = await asyncio.to_thread(self.repository.refresh, name)
        except UnservableExportError as e:
            raise errors.ModelNotFound(str(e)) from None
        if status["state"] != "READY":
            raise errors.LoadRefused(
                f"model {shown(name)} version {status['version']} refused: {status['reason']}; "
                f"still serving {self.registry.versions(name) or 'nothing'}")
        return status

    # ------------------------------------------------------------ requests
    async def infer(self, read, render):
        """One inference request from arrival to answer: ``read()`` (the protocol's codec, a
        coroutine -> ``Call``) parses it, its items go to the model's batcher, ``render(outcome,
        call)`` -> the answer, which is returned.  A ServeError for what cannot be answered;
        the transport counts it (``failed``) with the status its protocol gives it."""
        started = time.perf_counter()
        self.metrics.count_request()
        self.check_open()
        call = await read()
        outcome = await self._run(call, started)
        rendering = time.perf_counter()
        answer = render(outcome, call)
        self.answered(outcome, started, time.perf_counter() - rendering)
        return answer

    async def _run(self, call, started):
        """``call``'s items -> ``Outcome``.  A request of more items than
        ``Deploy.max_texts_per_request`` (the OpenAI API allows 2,048) is queued that many at a
        time, shortest first, one part after the other on the version that answered the first:
        it holds no more of the queue than any other request, the batcher groups each part
        within its token budget, and no answer mixes versions."""
        part_size = self.deploy.max_texts_per_request
        if len(call.items) <= part_size:
            return await self._run_part(call, call.items, call.version, started)
        # by length (an item's text, or the texts of a pair): each part's texts alike in length
        order = sorted(range(len(call.items)), key=lambda i: len(str(call.items[i])))
        version, parts = call.version, []
        for start in range(0, len(order), part_size):
            positions = order[start:start + part_size]
            part = await self._run_part(call, [call.items[i] for i in positions], version,
                                        started, positions)
            version = part.model.version
            parts.append(part)
        results = [None] * len(call.items)
        for i, result in zip(order, (r for p in parts for r in p.results)):
            results[i] = result
        model = parts[0].model
        return Outcome(model, results, sum(p.truncated for p in parts),
                       sum(p.split for p in parts), model.task.answer_counts(results),
                       sum(p.input_s for p in parts), [t for p in parts for t in p.timings])

    async def _run_part(self, call, items, version, started, positions=None):
        """Encode ``items`` (``call``'s, at ``positions`` in it; None: all, in order) with the
        chosen version's vocabulary, queue them on its batcher, wait -> ``Outcome``; a failure
        once queued is counted in the version's statistics."""
        where, long_text = call.where, call.long_text
        place = (lambda i: i) if positions is None else positions.__getitem__
        deadline = None
        if call.timeout_s is not None:  # from the request's arrival, on the batcher's clock
            deadline = time.monotonic() - (time.perf_counter() - started) + call.timeout_s
        encoded = {"queued": False}
        callers = self.registry.callers

        def encode(p):
            start = time.perf_counter()
            out = []
            for i, item in enumerate(items):
                try:
                    out.append(p.task.encode_request(p, item, long_text))
                except DataError as e:
                    at = f"{where}[{place(i)}]"
                    raise errors.InvalidInput(f"{at}: {e}", at, refused_texts=1) from None
            encoded["seconds"] = time.perf_counter() - start
            if not encoded["queued"]:  # counted before the submit wakes a worker
                encoded["queued"] = True
                callers.queued()
            return out

        callers.arrive()
        try:
            try:
                model, futures = self.registry.submit(encode, call.name, version,
                                                      loop=asyncio.get_running_loop(),
                                                      deadline=deadline)
            except NotServed as e:
                raise _not_served(e) from None
            except QueueFull as e:
                raise errors.Overloaded(f"overloaded: {e}; retry later") from None
            except BatcherClosed:
                raise errors.ModelNotReady("server is shutting down or the version was "
                                           "unloaded; retry") from None
            answered = await _all_of(futures)
        finally:
            callers.leave(encoded["queued"])
        results = [a if isinstance(a, BaseException) else a.result for a in answered]
        failures = [i for i, r in enumerate(results) if isinstance(r, BaseException)]
        if failures:
            model.stats.observe_failure(time.perf_counter() - started)
            expired = [i for i in failures if isinstance(results[i], DeadlineExpired)]
            if expired:
                raise errors.DeadlineExceeded(
                    f"request timeout expired: {len(expired)} of its {len(items)} text(s) were "
                    f"still queued after the {call.timeout_s * 1e6:.0f} microseconds it allowed "
                    f"(parameters.timeout); retry with a longer timeout or later",
                    f"{where}[{place(expired[0])}]")
            nonfinite = [i for i in failures if isinstance(results[i], NonFiniteOutput)]
            if nonfinite:
                self._refuse_nonfinite(model, nonfinite, f"{where}[{place(nonfinite[0])}]")
            i = failures[0]
            log.error("%s[%d] failed: %r", where, place(i), results[i])
            raise errors.PredictionFailed(f"prediction failed for {where}[{place(i)}]: "
                                          f"{type(results[i]).__name__}", f"{where}[{place(i)}]")
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

    def failed(self, error, status):
        """Count a refused request (a ServeError, answered with the HTTP ``status``)."""
        self.metrics.record(status)
        if error.refused_texts:
            self.metrics.refused(error.refused_texts)

    def _refuse_nonfinite(self, model, failures, where):
        """NaN/inf from the model is never an answer: refused naming the version, counted,
        and the version marked unhealthy (the index, /health and its ready endpoint say so)."""
        reason = f"non-finite outputs (NaN/inf) for {len(failures)} text(s), e.g. {where}"
        self.metrics.nonfinite_outputs.labels(model.name, model.version).inc(len(failures))
        self.metrics.model_healthy.labels(model.name, model.version).set(0)
        if self.registry.mark_unhealthy(model, reason):
            log.error("model %s version %s marked unhealthy: %s", model.name, model.version,
                      reason)
        raise errors.NonFiniteAnswer(
            f"model {model.name!r} version {model.version} answered NaN/inf for {where}; the "
            f"version is marked unhealthy — the operator must replace it (a newer version in "
            f"the repository takes over)", where)


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
    """ModelNotFound; AmbiguousModel for a request naming no model, on several models."""
    kind = errors.AmbiguousModel if isinstance(e, SeveralModels) else errors.ModelNotFound
    return kind(str(e))
