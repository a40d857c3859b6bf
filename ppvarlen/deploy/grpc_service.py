"""The Open Inference Protocol v2 over gRPC (``inference.GRPCInferenceService``) on the
``AppState`` the REST routes use: the same batcher, repository, limits, counters and errors.

The messages and the service are the protocol's own ``.proto`` files as Triton compiles them
into the ``tritonclient[grpc]`` package (``service_pb2``, ``model_config_pb2``): nothing here
defines a message.  A request becomes the REST handler's payload (``oip.parse_infer`` checks
it), so both transports refuse and answer alike; BYTES tensors arrive as
``raw_input_contents`` (the binary extension's length-prefixed elements) or ``bytes_contents``,
and every output leaves as ``raw_output_contents``.  The server runs ``grpc.aio`` on an event
loop in a thread of its own; requests reach the batcher through thread-safe futures.
Bounds: messages of at most ``Deploy.max_body_bytes`` (RESOURCE_EXHAUSTED naming the key; past
twice that, grpc core's own refusal), at most ``Deploy.max_connections``
calls at once (RESOURCE_EXHAUSTED beyond), and every limit ``parse_infer`` enforces.
"""
import asyncio
import hmac
import threading
import time

import grpc
from google.protobuf import json_format

from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc

from ppvarlen.utils.log import get_logger

from . import oip
from .edge import HEALTH_PROBES
from .errors import ApiError
from .routes_oip import load_newest, server_version, statistics

try:  # uvicorn[standard]'s event loop where it installs (not on Windows), as uvicorn picks it
    import uvloop
except ImportError:  # pragma: no cover - platforms without uvloop
    uvloop = None

log = get_logger("deploy.grpc")
SERVICE = "inference.GRPCInferenceService"
STATUS_CODES = {400: grpc.StatusCode.INVALID_ARGUMENT, 401: grpc.StatusCode.UNAUTHENTICATED,
                404: grpc.StatusCode.NOT_FOUND, 409: grpc.StatusCode.FAILED_PRECONDITION,
                413: grpc.StatusCode.RESOURCE_EXHAUSTED, 422: grpc.StatusCode.INVALID_ARGUMENT,
                503: grpc.StatusCode.UNAVAILABLE}
# the REST paths whose protection (Deploy.auth_all_routes) the health methods share
PROBES = {"ServerLive": HEALTH_PROBES[0], "ServerReady": HEALTH_PROBES[1]}


def _parameter(p):
    kind = p.WhichOneof("parameter_choice")
    return getattr(p, kind) if kind else None


def _payload(request):
    """(the REST infer payload, binary bytes) of a ``ModelInferRequest``."""
    raw = list(request.raw_input_contents)
    if raw and len(raw) != len(request.inputs):
        raise ApiError(400, f"raw_input_contents holds {len(raw)} tensors for "
                       f"{len(request.inputs)} inputs; send one per input, in order", None)
    inputs, binary = [], []
    for k, tensor in enumerate(request.inputs):
        entry = {"name": tensor.name, "datatype": tensor.datatype, "shape": list(tensor.shape)}
        params = {key: _parameter(v) for key, v in tensor.parameters.items()}
        if params:
            entry["parameters"] = params
        if raw:
            entry.setdefault("parameters", {})["binary_data_size"] = len(raw[k])
            binary.append(raw[k])
        else:
            try:
                entry["data"] = [b.decode("utf-8") for b in tensor.contents.bytes_contents]
            except UnicodeDecodeError:
                raise ApiError(400, f"inputs[{k}].contents.bytes_contents holds bytes that are "
                               f"not UTF-8", None) from None
        inputs.append(entry)
    payload = {"inputs": inputs}
    if request.id:
        payload["id"] = request.id
    params = {key: _parameter(v) for key, v in request.parameters.items()}
    if params:
        payload["parameters"] = params
    if request.outputs:
        payload["outputs"] = [{"name": o.name} for o in request.outputs]
    return payload, b"".join(binary)


class InferenceService(service_pb2_grpc.GRPCInferenceServiceServicer):
    """Each method of the protocol's service over the ``AppState``."""

    def __init__(self, state, auth_token=None, auth_all_routes=False):
        self.state = state
        self._expected = f"Bearer {auth_token}" if auth_token else None
        self.auth_all_routes = auth_all_routes

    async def _call(self, method, context, answer):
        """Run ``answer()`` (a coroutine function) for ``method``; an ApiError becomes the
        protocol's status code with its message; every call is counted like a REST route."""
        started, code = time.perf_counter(), grpc.StatusCode.OK
        try:
            self._authorize(method, context)
            return await answer()
        except ApiError as e:
            code = STATUS_CODES.get(e.status, grpc.StatusCode.INTERNAL)
            if method == "ModelInfer":
                self.state.failed(e)
            await context.abort(code, e.message)
        except Exception:  # noqa: BLE001 - the protocol's INTERNAL, logged once, never a crash
            code = grpc.StatusCode.INTERNAL
            log.exception("gRPC %s: internal error", method)
            await context.abort(code, "internal server error (logged)")
        finally:
            self.state.metrics.observe_request(f"grpc:{method}", code.name,
                                               time.perf_counter() - started)

    def _authorize(self, method, context):
        if self._expected is None:
            return
        protected = method.startswith("Repository") or (self.auth_all_routes
                                                        and method not in PROBES)
        if not protected:
            return
        given = dict(context.invocation_metadata()).get("authorization", "")
        if not hmac.compare_digest(given.encode(), self._expected.encode()):
            raise ApiError(401, f"{method} needs the metadata authorization: Bearer TOKEN (the "
                           f"token of Deploy.auth_token_file)", "authorization")

    # ------------------------------------------------------------ health and metadata
    async def ServerLive(self, request, context):
        async def answer():
            return service_pb2.ServerLiveResponse(live=True)
        return await self._call("ServerLive", context, answer)

    async def ServerReady(self, request, context):
        async def answer():
            ready = not self.state.draining and bool(self.state.registry.names())
            return service_pb2.ServerReadyResponse(ready=ready)
        return await self._call("ServerReady", context, answer)

    async def ModelReady(self, request, context):
        async def answer():
            model = self.state.model(request.name, request.version or None)
            ready = not self.state.draining and not model.unhealthy
            return service_pb2.ModelReadyResponse(ready=ready)
        return await self._call("ModelReady", context, answer)

    async def ServerMetadata(self, request, context):
        async def answer():
            return service_pb2.ServerMetadataResponse(name="ppvarlen", version=server_version(),
                                                      extensions=oip.EXTENSIONS)
        return await self._call("ServerMetadata", context, answer)

    async def ModelMetadata(self, request, context):
        async def answer():
            model = self.state.model(request.name, request.version or None)
            doc = oip.model_metadata(request.name, self.state.registry.versions(request.name),
                                     model)
            return json_format.ParseDict(doc, service_pb2.ModelMetadataResponse())
        return await self._call("ModelMetadata", context, answer)

    async def ModelConfig(self, request, context):
        async def answer():
            model = self.state.model(request.name, request.version or None)
            config = json_format.ParseDict(oip.model_config(model), model_config_pb2.ModelConfig())
            return service_pb2.ModelConfigResponse(config=config)
        return await self._call("ModelConfig", context, answer)

    async def ModelStatistics(self, request, context):
        async def answer():
            doc = statistics(self.state, request.name or None, request.version or None)
            return json_format.ParseDict(doc, service_pb2.ModelStatisticsResponse())
        return await self._call("ModelStatistics", context, answer)

    # ------------------------------------------------------------ inference
    async def ModelInfer(self, request, context):
        async def answer():
            state = self.state
            started = time.perf_counter()
            state.metrics.count_request()
            state.check_open()
            size = request.ByteSize()
            if size > state.deploy.max_body_bytes:
                raise ApiError(413, f"message is {size} bytes; at most "
                               f"{state.deploy.max_body_bytes} (Deploy.max_body_bytes)", None)
            version = request.model_version or None
            model = state.model(request.model_name, version)
            payload, binary = _payload(request)
            items, request_id, params, wanted = oip.parse_infer(payload, binary, state.deploy,
                                                                model)
            where = "inputs[0].data" if len(model.task.oip_inputs) == 1 else "rows"
            outcome = await state.infer(items, request.model_name, version,
                                        params.get("long_text"), where, started)
            rendering = time.perf_counter()
            tensors = oip.output_tensors(outcome.model, [n for n, _ in wanted],
                                         outcome.results)
            response = service_pb2.ModelInferResponse(
                model_name=outcome.model.name, model_version=outcome.model.version,
                id=request_id or "",
                outputs=[service_pb2.ModelInferResponse.InferOutputTensor(
                    name=name, datatype=datatype, shape=shape)
                    for name, datatype, shape, _ in tensors],
                raw_output_contents=[oip.raw_contents(datatype, flat)
                                     for _, datatype, _, flat in tensors])
            if params.get("long_text"):  # echoed, as over REST
                response.parameters["long_text"].string_param = params["long_text"]
            state.answered(outcome, started, time.perf_counter() - rendering)
            return response
        return await self._call("ModelInfer", context, answer)

    # ------------------------------------------------------------ repository
    async def RepositoryIndex(self, request, context):
        async def answer():
            if self.state.repository is None:
                raise ApiError(404, "this server serves one export (--model-dir), not a model "
                               "repository", None)
            entries = [service_pb2.RepositoryIndexResponse.ModelIndex(**e)
                       for e in self.state.registry.index()]
            return service_pb2.RepositoryIndexResponse(models=entries)
        return await self._call("RepositoryIndex", context, answer)

    async def RepositoryModelLoad(self, request, context):
        async def answer():
            if self.state.repository is None:
                raise ApiError(404, "this server serves one export (--model-dir), not a model "
                               "repository", None)
            await load_newest(self.state, request.model_name)
            return service_pb2.RepositoryModelLoadResponse()
        return await self._call("RepositoryModelLoad", context, answer)


class GrpcServer:
    """``grpc.aio`` serving ``InferenceService`` on ``host:port`` (0: a free port) from a
    thread of its own; ``port`` is the bound one once ``start`` returns."""

    def __init__(self, state, host, port, auth_token=None, auth_all_routes=False):
        self.state, self.host, self.port = state, host, port
        self.service = InferenceService(state, auth_token, auth_all_routes)
        self._loop = uvloop.new_event_loop() if uvloop is not None else asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="grpc",
                                        daemon=True)
        self._server = None

    def start(self):
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(60)
        log.info("serving the Open Inference Protocol over gRPC on %s:%d", self.host, self.port)
        return self

    async def _start(self):
        deploy = self.state.deploy
        limit = deploy.max_body_bytes
        # grpc core refuses past its limit in its own words; up to twice the body limit the
        # message reaches ModelInfer, whose 413 names Deploy.max_body_bytes
        options = [("grpc.max_receive_message_length", 2 * limit),
                   ("grpc.max_send_message_length", max(limit, 64 << 20)),
                   ("grpc.so_reuseport", 0)]
        self._server = grpc.aio.server(options=options,
                                       maximum_concurrent_rpcs=deploy.max_connections)
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(self.service, self._server)
        address = f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"
        bound = self._server.add_insecure_port(address)
        if not bound:
            raise OSError(f"cannot listen on {address} for gRPC")
        self.port = bound
        await self._server.start()

    def stop(self, grace_s=5.0):
        """Stop taking calls; the calls in flight get ``grace_s`` to finish."""
        if self._server is not None:
            asyncio.run_coroutine_threadsafe(self._server.stop(grace_s),
                                             self._loop).result(grace_s + 30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)
