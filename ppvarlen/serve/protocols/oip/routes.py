"""The Open Inference Protocol v2 over REST (``/v2/...``) on the ``DataPlane``, with Triton's
``model_configuration`` and ``statistics`` extensions and, for a model repository, its
``model_repository`` extension (index, load and unload).  Refusals are the protocol's ``{"error":
message}`` with the REST statuses (``http.status``)."""
from importlib import metadata

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from ppvarlen.serve.dataplane import Call
from ppvarlen.serve.errors import InvalidInput
from ppvarlen.serve.http.direct import version_header_pairs, version_headers
from ppvarlen.serve.http.edge import header, parse_json, read_body
from ppvarlen.serve.http.status import http_status
from ppvarlen.serve.protocols.oip import codec as oip

HEALTH_PROBES = ("/v2/health/live", "/v2/health/ready")  # open under Deploy.auth_all_routes
REPOSITORY_PREFIX = "/v2/repository"  # the routes a bearer token always guards


def render_error(error):
    """(status, headers, body) of a refusal on the /v2 routes."""
    status, headers = http_status(error)
    return status, headers, {"error": error.message}


def server_version():
    try:
        return metadata.version("ppvarlen")
    except Exception:  # noqa: BLE001 - a source checkout without metadata
        return "unknown"


def repository_index_of(plane, ready_only=False):
    """The repository extension's index: every version seen, with its state (READY,
    UNAVAILABLE with the reason); ``ready_only``: the READY ones (the request's ``ready``)."""
    return [e for e in plane.registry.index() if not ready_only or e["state"] == "READY"]


def statistics(plane, name=None, version=None):
    """The statistics extension's document: every ready version, or those of ``name``."""
    models = [plane.model(name, version)] if version is not None else [
        m for m in plane.registry.models() if name is None or m.name == name]
    if name is not None and not models:
        plane.model(name)  # ModelNotFound naming what is served
    return {"model_stats": [m.stats.document(m.name, m.version)
                            for m in sorted(models, key=lambda m: (m.name, int(m.version)))]}


def read_infer(plane, payload, binary, name, version):
    """The ``Call`` of an infer request's payload (REST and gRPC alike)."""
    model = plane.model(name, version)
    items, request_id, params, wanted = oip.parse_infer(payload, binary, plane.deploy, model)
    where = "inputs[0].data" if len(model.task.oip_inputs) == 1 else "rows"
    timeout_us = int(params.get("timeout", 0))  # Triton's: microseconds, 0 = none
    return Call(items, name, version, params.get("long_text"), where,
                (request_id, params, wanted), timeout_us / 1e6 if timeout_us else None)


def router(plane, direct):
    """The /v2 routes over ``plane``; the infer routes answered by ``direct``."""
    routes = APIRouter()
    deploy = plane.deploy

    @routes.get("/v2")
    async def server_metadata():
        return {"name": "ppvarlen", "version": server_version(),
                "extensions": oip.extensions(plane.repository is not None)}

    @routes.get("/v2/health/live")
    async def live():
        return {"live": True}

    @routes.get("/v2/health/ready")
    async def ready():
        ok = plane.ready()
        return JSONResponse({"ready": ok}, status_code=200 if ok else 503)

    async def model_metadata(name: str, version: str = None):
        model = plane.model(name, version)
        return JSONResponse(oip.model_metadata(name, plane.registry.versions(name), model),
                            headers=version_headers(model))

    async def model_ready(name: str, version: str = None):
        model = plane.model(name, version)
        why = plane.not_ready_reason(model)
        if why:
            return JSONResponse({"name": name, "ready": False, "reason": why}, status_code=503,
                                headers=version_headers(model))
        return JSONResponse({"name": name, "ready": True}, headers=version_headers(model))

    async def model_config(name: str, version: str = None):
        model = plane.model(name, version)
        return JSONResponse(oip.model_config(model), headers=version_headers(model))

    async def model_stats(name: str, version: str = None):
        return statistics(plane, name, version)

    async def all_stats():
        return statistics(plane)

    async def read(scope, receive, name, version):
        body = await read_body(scope, receive, deploy.max_body_bytes)
        head, binary = oip.split_body(body, header(scope, oip.HEADER_LENGTH_KEY))
        return read_infer(plane, parse_json(head), binary, name, version)

    def render(outcome, call):
        content, headers = oip.infer_response(outcome.model, *call.context, outcome.results)
        return content, headers + version_header_pairs(outcome.model)

    async def infer(scope, receive, name, version=None):
        return await plane.infer(lambda: read(scope, receive, name, version), render)

    for path in ("/v2/models/{name}/infer", "/v2/models/{name}/versions/{version}/infer"):
        direct.post(routes, path, infer, render_error)
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

    if plane.repository is not None:
        @routes.post("/v2/repository/index")
        async def repository_index(request: Request):
            """Every version seen with its state; ``{"ready": true}``: the READY ones only."""
            body = await request.body()
            ready = (parse_json(body) or {}) if body.strip() else {}
            if not isinstance(ready, dict) or not isinstance(ready.get("ready", False), bool):
                raise InvalidInput("the index request is {\"ready\": true|false} or empty",
                                   "ready")
            return repository_index_of(plane, ready.get("ready", False))

        @routes.post("/v2/repository/models/{name}/unload")
        async def repository_unload(name: str):
            """Take NAME out of routing now and drain its queue (it stays unloaded until a
            load asks for it)."""
            await plane.unload(name)
            return {}

        @routes.post("/v2/repository/models/{name}/load")
        async def repository_load(name: str):
            """Load NAME's newest version now (verified before it takes traffic)."""
            return await plane.load_newest(name)

    return routes
