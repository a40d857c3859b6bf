"""The Open Inference Protocol v2 over REST (``/v2/...``) on the ``AppState``, with Triton's
``model_configuration`` and ``statistics`` extensions and, for a model repository, its
``model_repository`` extension (index and load)."""
import asyncio
import time
from importlib import metadata

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from ppvarlen.serve.protocols.oip import codec as oip
from ppvarlen.serve.http.edge import header, parse_json, read_body, shown
from ppvarlen.serve.errors import ApiError
from ppvarlen.runtime.manifest import UnservableExportError
from ppvarlen.serve.protocols.predict.routes import version_header_pairs, version_headers


def server_version():
    try:
        return metadata.version("ppvarlen")
    except Exception:  # noqa: BLE001 - a source checkout without metadata
        return "unknown"


def statistics(state, name=None, version=None):
    """The statistics extension's document: every ready version, or those of ``name``."""
    models = [state.model(name, version)] if version is not None else [
        m for m in state.registry.models() if name is None or m.name == name]
    if name is not None and not models:
        state.model(name)  # 404 naming what is served
    return {"model_stats": [m.stats.document(m.name, m.version)
                            for m in sorted(models, key=lambda m: (m.name, int(m.version)))]}


def router(state, direct):
    """The /v2 routes over ``state``; the infer routes answered by ``direct``."""
    routes = APIRouter()
    deploy = state.deploy

    @routes.get("/v2")
    async def server_metadata():
        return {"name": "ppvarlen", "version": server_version(), "extensions": oip.EXTENSIONS}

    @routes.get("/v2/health/live")
    async def live():
        return {"live": True}

    @routes.get("/v2/health/ready")
    async def ready():
        ok = not state.draining and bool(state.registry.names())
        return JSONResponse({"ready": ok}, status_code=200 if ok else 503)

    async def model_metadata(name: str, version: str = None):
        model = state.model(name, version)
        return JSONResponse(oip.model_metadata(name, state.registry.versions(name), model),
                            headers=version_headers(model))

    async def model_ready(name: str, version: str = None):
        model = state.model(name, version)
        if state.draining or model.unhealthy:
            why = "the server is shutting down" if state.draining else model.unhealthy
            return JSONResponse({"name": name, "ready": False, "reason": why}, status_code=503,
                                headers=version_headers(model))
        return JSONResponse({"name": name, "ready": True}, headers=version_headers(model))

    async def model_config(name: str, version: str = None):
        model = state.model(name, version)
        return JSONResponse(oip.model_config(model), headers=version_headers(model))

    async def model_stats(name: str, version: str = None):
        return statistics(state, name, version)

    async def all_stats():
        return statistics(state)

    async def infer(scope, receive, name, version=None):
        started = time.perf_counter()
        state.metrics.count_request()
        state.check_open()
        body = await read_body(scope, receive, deploy.max_body_bytes)
        head, binary = oip.split_body(body, header(scope, oip.HEADER_LENGTH_KEY))
        payload = parse_json(head)
        model = state.model(name, version)
        items, request_id, params, wanted = oip.parse_infer(payload, binary, deploy, model)
        where = "inputs[0].data" if len(model.task.oip_inputs) == 1 else "rows"
        outcome = await state.infer(items, name, version, params.get("long_text"), where,
                                    started)
        rendering = time.perf_counter()
        content, headers = oip.infer_response(outcome.model, request_id, params, wanted,
                                              outcome.results)
        state.answered(outcome, started, time.perf_counter() - rendering)
        return content, headers + version_header_pairs(outcome.model)

    async def declared_infer(request: Request, name: str, version: str = None):
        pass  # never called: the direct route answers (the body's schema is api.py's)

    for path in ("/v2/models/{name}/infer", "/v2/models/{name}/versions/{version}/infer"):
        direct.post(routes, path, infer, declared_infer)
    for path, handler in [
            ("/v2/models/stats", all_stats),
            ("/v2/models/{name}", model_metadata),
            ("/v2/models/{name}/versions/{version}", model_metadata),
            ("/v2/models/{name}/ready", model_ready),
            ("/v2/models/{name}/versions/{version}/ready", model_ready),
            ("/v2/models/{name}/config", model_config),
            ("/v2/models/{name}/versions/{version}/config", model_config),
            ("/v2/models/{name}/stats", model_stats),
            ("/v2/models/{name}/versions/{version}/stats", model_stats)]:
        routes.add_api_route(path, handler, methods=["GET"])

    if state.repository is not None:
        @routes.post("/v2/repository/index")
        async def repository_index():
            return state.registry.index()

        @routes.post("/v2/repository/models/{name}/load")
        async def repository_load(name: str):
            """Load NAME's newest version now (verified before it takes traffic)."""
            status = await load_newest(state, name)
            return status

    return routes


async def load_newest(state, name):
    """The repository's newest version of ``name`` loaded now -> its READY status; ApiError
    404 (no such model) or 409 (refused, with the reason) otherwise (REST and gRPC)."""
    try:
        status = await asyncio.to_thread(state.repository.refresh, name)
    except UnservableExportError as e:
        raise ApiError(404, str(e), None) from None
    if status["state"] != "READY":
        raise ApiError(409, f"model {shown(name)} version {status['version']} refused: "
                       f"{status['reason']}; still serving "
                       f"{state.registry.versions(name) or 'nothing'}", None)
    return status
