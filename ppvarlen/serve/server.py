"""HTTP (and gRPC) serving: the app over one ``DataPlane``, run with uvicorn.

``create_app`` assembles one ``DataPlane`` (``dataplane.py``: Deploy settings, model registry,
repository, counters, an inference request's lifecycle) and, over it, the routes of every
protocol in ``protocols.PROTOCOLS`` (``predict``: ``POST /predict``, ``/health``, the metrics;
``oip``: the Open Inference Protocol v2 under ``/v2`` with Triton's extensions; ``openai``: the
OpenAI embeddings API); their inference routes are answered ahead of FastAPI's routing
(``http.direct``); ``serve`` adds the protocols' gRPC services (``grpc.service``,
``Deploy.grpc_port``) on the same plane.  Every answer names the version that produced it
(``X-Model-Version``).  Every input is bounded (``docs/SERVING.md``, the threat model); a
refusal is a ``ServeError`` answered in the form of the protocol whose route it came from.
"""
import asyncio
import concurrent.futures
import contextlib
import functools
import gc
import logging
import signal
import socket
import threading
import time

import uvicorn
from fastapi.middleware.cors import CORSMiddleware

from ppvarlen.config import ConfigError
from ppvarlen.utils.io import atomic_write_text
from ppvarlen.utils.parallel import die_by
from ppvarlen.utils.log import get_logger

from fastapi.openapi.utils import get_openapi

from ppvarlen.runtime import threads_choice
from ppvarlen.runtime.precision_choice import load_admitted
from ppvarlen.runtime.predictor import Predictor
from ppvarlen.serve.dataplane import (DataPlane, deploy_settings, max_text_chars,  # noqa: F401
                                      model_name_of, served_name)
from ppvarlen.serve.errors import ServeError
from ppvarlen.serve.grpc.service import GrpcServer
from ppvarlen.serve.http.connections import uvicorn_config
from ppvarlen.serve.http import fallback
from ppvarlen.serve.http.direct import DirectRoutes, ServingApp, error_response
from ppvarlen.serve.http.edge import AnswerErrors, RequireToken, read_token
from ppvarlen.serve.signals import sigterm_held, sigterm_pending
from ppvarlen.serve.protocols import (PROTOCOLS, edge_render, gathered, render_checks,
                                      route_render)

log = get_logger("serve.server")
# how often start-up looks for a stop asked while the model(s) load
STOP_POLL_S = 0.1


def create_app(predictor=None, deploy=None, repository=None, load_predictor=None,
               auth_token=None, grpc_port=None):
    """The app (a FastAPI ``ServingApp``) over one ``DataPlane``: one export (``predictor``,
    served as version 1 of its manifest's model_name) or a model repository (``repository`` dir,
    ``load_predictor(export_dir)``), with the ``deploy`` settings (a Deploy section;
    ``deploy_settings(**keys)`` makes one; default: the schema's).  ``auth_token``: the bearer
    token of ``Deploy.auth_token_file``.  ``grpc_port``: also serve the OIP over gRPC there
    (0: a free port, in ``app.state.grpc.port``), started and stopped with the app."""
    deploy = deploy if deploy is not None else deploy_settings()
    plane = DataPlane(deploy, predictor, repository, load_predictor, render_checks())

    @contextlib.asynccontextmanager
    async def lifespan(app):
        await plane.start()
        servers = []
        if grpc_port is not None:
            servers = [GrpcServer(p.grpc_service(plane, auth_token, deploy.auth_all_routes),
                                  deploy, deploy.host, grpc_port).start()
                       for p in PROTOCOLS if hasattr(p, "grpc_service")]
            app.state.grpc = servers[0] if servers else None
        yield
        plane.begin_drain()
        for server in servers:
            server.stop(deploy.drain_timeout_s)
        await plane.stop()

    direct = DirectRoutes(plane)
    app = ServingApp(direct, title="ppvarlen", lifespan=lifespan)
    # outermost last: count and answer every error, then the token, then CORS
    if deploy.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(deploy.cors_origins),
                           allow_methods=["GET", "POST"], allow_headers=["*"],
                           expose_headers=["X-Model-Name", "X-Model-Version",
                                           *gathered("EXPOSE_HEADERS")])
    if auth_token is not None:
        app.add_middleware(RequireToken, token=auth_token, render=edge_render,
                           all_routes=deploy.auth_all_routes,
                           guarded=gathered("GUARDED_PREFIXES"), open_paths=gathered("OPEN_PATHS"))
    app.add_middleware(AnswerErrors, observe=plane.metrics.observe_request, render=edge_render,
                       on_error=lambda: plane.metrics.record(500))

    renderers = {}  # route path -> the render_error of the protocol it belongs to
    for protocol in PROTOCOLS:
        router = protocol.router(plane, direct)
        renderers.update((route.path, protocol.render_error) for route in router.routes)
        app.include_router(router)

    @app.exception_handler(ServeError)
    async def _refused(request, exc):
        path = getattr(request.scope.get("route"), "path", None)
        return error_response(plane, renderers.get(path, PROTOCOLS[0].render_error), exc)

    fallback.install(app, route_render)  # no such route, wrong method: the path's protocol's form
    app.openapi = functools.partial(_openapi, app, plane)
    app.state.app_state = plane
    app.state.registry = plane.registry
    app.state.begin_drain = plane.begin_drain
    app.state.grpc = None
    return app


def _openapi(app, plane):
    """The OpenAPI document of what is served now (rebuilt when the versions change): FastAPI's
    document of the routes, each protocol's part filled in for the first model served."""
    registry = plane.registry
    models = registry.models()
    key = tuple(sorted((m.name, m.version) for m in models))
    if plane.openapi is None or plane.openapi[0] != key:
        model = registry.get(models[0].name) if models else None
        if model is None or model.predictor is None:
            return app.openapi_schema or {}
        doc = get_openapi(title=app.title, version=app.version, routes=app.routes,
                          description=app.description)
        for protocol in PROTOCOLS:
            protocol.add_openapi(doc, plane, model)
        plane.openapi = (key, doc)
    return plane.openapi[1]


def app_from_config(export_dir, deploy_cfg, backend=None, repository=None, grpc_port=None):
    """The app for ``export_dir`` (or the model ``repository`` dir) with the ``Deploy``
    settings: predictor(s), limits, batcher (``serve`` runs it with uvicorn; each Ray Serve
    replica runs its own copy).  A single export must pass the admission check first."""
    if deploy_cfg.auth_all_routes and not deploy_cfg.auth_token_file:
        raise ConfigError("Deploy.auth_all_routes: true needs Deploy.auth_token_file (the file "
                          "holding the token)")
    token = read_token(deploy_cfg.auth_token_file) if deploy_cfg.auth_token_file else None
    engine = functools.partial(Predictor, backend=backend or deploy_cfg.backend,
                               device=deploy_cfg.device,
                               threads=threads_choice.resolve(deploy_cfg.threads,
                                                              deploy_cfg.workers),
                               max_batch_tokens=deploy_cfg.max_batch_tokens,
                               max_batch_size=deploy_cfg.max_batch_size,
                               tensorrt=deploy_cfg.tensorrt,
                               split_long_sources=deploy_cfg.split_long_sources,
                               allow_external_symlinks=deploy_cfg.allow_external_symlinks,
                               onednn_cache_bytes=deploy_cfg.onednn_cache_bytes,
                               onednn_shape_grid=deploy_cfg.onednn_shape_grid)
    # admitted, in the precision asked for or (auto) the one this host runs fastest
    load = functools.partial(load_admitted, engine, requested=deploy_cfg.precision,
                             device=deploy_cfg.device, renderers=render_checks(),
                             cache=deploy_cfg.choice_cache, workload="requests")
    if repository is not None:
        if deploy_cfg.model_name is not None:
            raise ConfigError(f"Deploy.model_name {deploy_cfg.model_name!r} names a single "
                              f"export; a repository's models are named by their directories "
                              f"(NAME/VERSION/); leave it out with --model-repository")
        return create_app(repository=repository, load_predictor=load, deploy=deploy_cfg,
                          auth_token=token, grpc_port=grpc_port)
    if deploy_cfg.model_name is not None:
        served_name(deploy_cfg.model_name)  # before the export loads
    # the check a repository runs before a version takes traffic; one export has no fallback
    predictor = load(export_dir)
    log.info("export %s admitted in %s: %s", export_dir, predictor.precision,
             ", ".join(predictor.admission))
    return create_app(predictor, deploy_cfg, auth_token=token, grpc_port=grpc_port)


def stop_before_serving(sig, seconds):
    """Nothing has been served and ppvarlen writes nothing there but atomically (a temp file
    its pid names, reaped later): the process dies by ``sig`` after one log line, without
    unwinding the loads in flight; the precision chooser's child dies with it
    (``die_with_parent``)."""
    log.warning("%s %.1fs into start-up, before serving began: stopped; what was loading is "
                "abandoned", signal.Signals(sig).name, seconds)
    logging.shutdown()  # flushes every handler
    die_by(sig)


def built_unless_stopped(build, takes_sigterm, began):
    """``build()`` (a single export's load and admission) on a thread of its own while this,
    the main thread, waits for it and takes a stop at once: SIGINT, or SIGTERM held
    (``takes_sigterm``) or delivered to a thread started before the hold, ends the process by
    ``stop_before_serving``.  On the main thread itself the load would answer SIGINT with a
    traceback from inside the engine being built, once its native call returned, and SIGTERM
    not at all (held) or without a word (its default action).  Elsewhere than the main thread
    (no signal handlers there) ``build()`` runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        return build()
    built = concurrent.futures.Future()

    def run():
        try:
            built.set_result(build())
        except BaseException as e:  # re-raised on the main thread, as if it had run there
            built.set_exception(e)

    def stop(signum, frame):
        stop_before_serving(signum, time.monotonic() - began)

    # an ignored signal stays ignored; one whose handler Python did not install (None) is left
    # as it is, having no handler to put back
    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)
                if signal.getsignal(sig) not in (signal.SIG_IGN, None)}
    try:
        threading.Thread(target=run, name="ppvarlen-load", daemon=True).start()
        while True:
            try:
                return built.result(timeout=STOP_POLL_S)
            except concurrent.futures.TimeoutError:
                if takes_sigterm and sigterm_pending():
                    stop(signal.SIGTERM, None)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class DrainingServer(uvicorn.Server):
    """uvicorn's server, which drains the app (``begin_drain``) when shutdown begins, takes a
    held SIGTERM (``sigterm_held``) at each tick, and freezes a single export's objects out of
    the collector's sight once started."""

    def __init__(self, config, repository, takes_sigterm):
        super().__init__(config)
        self.repository, self.takes_sigterm = repository, takes_sigterm

    async def startup(self, sockets=None):
        # the app's lifespan loads the model(s): a repository every model, in a thread no
        # signal interrupts, for minutes; a stop asked meanwhile stops the process at once
        began = time.monotonic()
        starting = asyncio.ensure_future(super().startup(sockets))
        while not (await asyncio.wait({starting}, timeout=STOP_POLL_S))[0]:
            stop = self._stop_asked()
            if stop is not None:
                stop_before_serving(stop, time.monotonic() - began)
        starting.result()
        if self.repository is None:
            # The one export lives as long as this process: out of the collector's sight, a
            # collection walks only what requests allocate.  Not for a repository, whose
            # retired versions must stay collectable.
            gc.collect()
            gc.freeze()

    def _stop_asked(self):
        """The signal that asked this server to stop (uvicorn's handler took it, or it is
        held pending) -> None when none did."""
        if self.takes_sigterm and sigterm_pending():
            return signal.SIGTERM
        if self.should_exit:  # uvicorn's handler notes the signals it took (since 0.29)
            taken = getattr(self, "_captured_signals", None)
            return taken[-1] if taken else signal.SIGTERM
        return None

    async def on_tick(self, counter):
        if self.takes_sigterm and sigterm_pending():
            self.should_exit = True  # as uvicorn's SIGTERM handler does
        return await super().on_tick(counter)

    async def shutdown(self, sockets=None):
        self.config.app.state.begin_drain()  # before uvicorn waits for the in-flight requests
        await super().shutdown(sockets)


def serve(export_dir, deploy_cfg, host=None, port=None, backend=None, repository=None,
          port_file=None, grpc_port=None):
    """Serve the export (or the model repository) until SIGINT/SIGTERM, then drain: stop
    accepting, answer every request already taken, unload, return (exit status 0).

    ``port=0`` takes a free port; the bound port is logged and, with ``port_file``, written
    there (atomically) once the socket is listening, so callers never guess a free port.
    ``grpc_port`` (default ``Deploy.grpc_port``; null: none) also serves the Open Inference
    Protocol over gRPC, on the same models, limits and counters."""
    host = host or deploy_cfg.host
    port = deploy_cfg.port if port is None else port
    if host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("binding %s: the server is reachable from other machines", host)
    grpc_port = deploy_cfg.grpc_port if grpc_port is None else grpc_port
    # a repository's versions load while it serves, each on the runtime chosen for it; a
    # single export loads below, before uvicorn installs its handlers (signals.py)
    with sigterm_held(True) as takes_sigterm:  # before any thread starts
        app = built_unless_stopped(functools.partial(
            app_from_config, export_dir, deploy_cfg, backend, repository, grpc_port),
            takes_sigterm, time.monotonic())
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
        config = uvicorn_config(app, deploy_cfg, host, bound)  # the Deploy connection bounds
        # listening before the port file appears: a client that reads it is queued, not
        # refused, until the app has started
        sock.listen(config.backlog)
        if port_file:
            atomic_write_text(port_file, f"{bound}\n")
        server = DrainingServer(config, repository, takes_sigterm)
        # uvicorn re-raises the signal it drained on, to the handler that was there before
        # it: SIGINT -> KeyboardInterrupt (caught below), SIGTERM -> this no-op rather than
        # death by SIGTERM, so a drained shutdown exits 0 either way.
        previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
        try:
            server.run(sockets=[sock])
        except KeyboardInterrupt:  # as uvicorn.run does
            pass
        finally:
            signal.signal(signal.SIGTERM, previous)
    if not server.started:
        raise SystemExit(3)  # uvicorn's STARTUP_FAILURE, as uvicorn.run exits
