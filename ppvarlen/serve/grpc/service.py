"""The Open Inference Protocol v2 over gRPC (``inference.GRPCInferenceService``) on the
``AppState`` the REST routes use: the same batcher, repository, limits, counters and errors.

gRPC itself is spoken by the front end, a process of its own (``grpc_front``), which relays
each call's bytes here over a socket pair (``relay_frames``); this module parses them, answers
on the state and serialises the answer.  The messages and the service are the protocol's own
``.proto`` files as Triton compiles them into the ``tritonclient[grpc]`` package
(``service_pb2``, ``model_config_pb2``): nothing here defines a message.  A request becomes the
REST handler's payload (``oip.parse_infer`` checks it), so both transports refuse and answer
alike; BYTES tensors arrive as ``raw_input_contents`` (the binary extension's length-prefixed
elements) or ``bytes_contents``, and every output leaves as ``raw_output_contents``.  The relay
runs on an event loop in a thread of its own; requests reach the batcher through thread-safe
futures.  Bounds: messages of at most ``Deploy.max_body_bytes`` (RESOURCE_EXHAUSTED naming the
key; past twice that, grpc core's own refusal in the front end), at most
``Deploy.max_connections`` calls at once (RESOURCE_EXHAUSTED beyond, by the front end), and
every limit ``parse_infer`` enforces.  The front end exiting on its own is logged and it is
started again on the same port.
"""
import asyncio
import hmac
import os
import socket
import subprocess
import sys
import threading
import time

import grpc
from google.protobuf import json_format

from grpc_health.v1 import health_pb2
from tritonclient.grpc import model_config_pb2, service_pb2

from ppvarlen.utils.log import get_logger

from ppvarlen.serve.protocols.oip import codec as oip
from ppvarlen.serve.http.edge import HEALTH_PROBES
from ppvarlen.serve.errors import ApiError
from ppvarlen.serve.grpc import health
from ppvarlen.serve.grpc.frames import CALL, HELLO, FramedProtocol, answer_frame, stop_frame
from ppvarlen.serve.protocols.oip.routes import load_newest, server_version, statistics

try:  # uvicorn[standard]'s event loop where it installs (not on Windows), as uvicorn picks it
    import uvloop
except ImportError:  # pragma: no cover - platforms without uvloop
    uvloop = None

log = get_logger("serve.grpc")
SERVICE = "inference.GRPCInferenceService"
STATUS_CODES = {400: grpc.StatusCode.INVALID_ARGUMENT, 401: grpc.StatusCode.UNAUTHENTICATED,
                404: grpc.StatusCode.NOT_FOUND, 409: grpc.StatusCode.FAILED_PRECONDITION,
                413: grpc.StatusCode.RESOURCE_EXHAUSTED, 422: grpc.StatusCode.INVALID_ARGUMENT,
                503: grpc.StatusCode.UNAVAILABLE}
# the REST paths whose protection (Deploy.auth_all_routes) the health methods share
PROBES = {"ServerLive": HEALTH_PROBES[0], "ServerReady": HEALTH_PROBES[1],
          "Check": HEALTH_PROBES[1]}
# the methods served, with their request messages; the front end answers UNIMPLEMENTED to others
METHODS = {"ServerLive": service_pb2.ServerLiveRequest,
           "ServerReady": service_pb2.ServerReadyRequest,
           "ModelReady": service_pb2.ModelReadyRequest,
           "ServerMetadata": service_pb2.ServerMetadataRequest,
           "ModelMetadata": service_pb2.ModelMetadataRequest,
           "ModelConfig": service_pb2.ModelConfigRequest,
           "ModelStatistics": service_pb2.ModelStatisticsRequest,
           "ModelInfer": service_pb2.ModelInferRequest,
           "RepositoryIndex": service_pb2.RepositoryIndexRequest,
           "RepositoryModelLoad": service_pb2.RepositoryModelLoadRequest,
           "Check": health_pb2.HealthCheckRequest}
METHOD_NAMES = list(METHODS)
# the service each method belongs to: the protocol's, or gRPC's health service
METHOD_PATHS = [f"{health.HEALTH_SERVICE if m == 'Check' else SERVICE}/{m}"
                for m in METHOD_NAMES]
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _parameter(p):
    kind = p.WhichOneof("parameter_choice")
    return getattr(p, kind) if kind else None


def _payload(request):
    """(the REST infer payload, binary bytes) of a ``ModelInferRequest``."""
    raw = list(request.raw_input_contents)
    if raw and len(raw) != len(request.inputs):
        raise ApiError(400, f"raw_input_contents holds {len(raw)} tensors for "
                       f"{len(request.inputs)} inputs; send one per input, in order", None)
    if raw and any(t.HasField("contents") for t in request.inputs):
        typed = next(k for k, t in enumerate(request.inputs) if t.HasField("contents"))
        raise ApiError(400, f"inputs[{typed}] has contents while the request has "
                       f"raw_input_contents; the protocol allows one form per request: all "
                       f"tensors raw, or all in contents", None)
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


class InferenceService:
    """Each method of the protocol's service over the ``AppState``: a request message in, the
    response message out, an ApiError for a refusal."""

    def __init__(self, state, auth_token=None, auth_all_routes=False):
        self.state = state
        self._expected = f"Bearer {auth_token}" if auth_token else None
        self.auth_all_routes = auth_all_routes

    async def call(self, method, request_bytes, authorization):
        """-> (status code, body) for one relayed call: the serialised response with OK, the
        error text with any other code; every call is counted like a REST route."""
        started, code = time.perf_counter(), grpc.StatusCode.OK
        try:
            self._authorize(method, authorization)
            try:
                request = METHODS[method].FromString(request_bytes)
            except Exception:  # noqa: BLE001 - protobuf's DecodeError and kin
                raise ApiError(400, f"{method}: the request is not a valid "
                               f"{METHODS[method].__name__} message", None) from None
            response = await getattr(self, method)(request)
            return code, response.SerializeToString()
        except ApiError as e:
            code = STATUS_CODES.get(e.status, grpc.StatusCode.INTERNAL)
            if method == "ModelInfer":
                self.state.failed(e)
            return code, e.message.encode("utf-8")
        except Exception:  # noqa: BLE001 - the protocol's INTERNAL, logged once, never a crash
            code = grpc.StatusCode.INTERNAL
            log.exception("gRPC %s: internal error", method)
            return code, b"internal server error (logged)"
        finally:
            self.state.metrics.observe_request(f"grpc:{method}", code.name,
                                               time.perf_counter() - started)

    def _authorize(self, method, given):
        if self._expected is None:
            return
        protected = method.startswith("Repository") or (self.auth_all_routes
                                                        and method not in PROBES)
        if protected and not hmac.compare_digest(given.encode(), self._expected.encode()):
            raise ApiError(401, f"{method} needs the metadata authorization: Bearer TOKEN (the "
                           f"token of Deploy.auth_token_file)", "authorization")

    # ------------------------------------------------------------ health and metadata
    async def ServerLive(self, request):
        return service_pb2.ServerLiveResponse(live=True)

    async def ServerReady(self, request):
        return service_pb2.ServerReadyResponse(ready=self._server_ready())

    def _server_ready(self):
        return not self.state.draining and bool(self.state.registry.names())

    def _model_ready(self, name):
        return not self.state.draining and not self.state.model(name).unhealthy

    async def Check(self, request):
        """grpc.health.v1.Health/Check (``health.check``)."""
        return health.check(request.service, self._server_ready, self._model_ready,
                            self.state.registry.names())

    async def ModelReady(self, request):
        model = self.state.model(request.name, request.version or None)
        return service_pb2.ModelReadyResponse(ready=not self.state.draining
                                              and not model.unhealthy)

    async def ServerMetadata(self, request):
        return service_pb2.ServerMetadataResponse(name="ppvarlen", version=server_version(),
                                                  extensions=oip.EXTENSIONS)

    async def ModelMetadata(self, request):
        model = self.state.model(request.name, request.version or None)
        doc = oip.model_metadata(request.name, self.state.registry.versions(request.name), model)
        return json_format.ParseDict(doc, service_pb2.ModelMetadataResponse())

    async def ModelConfig(self, request):
        model = self.state.model(request.name, request.version or None)
        config = json_format.ParseDict(oip.model_config(model), model_config_pb2.ModelConfig())
        return service_pb2.ModelConfigResponse(config=config)

    async def ModelStatistics(self, request):
        doc = statistics(self.state, request.name or None, request.version or None)
        return json_format.ParseDict(doc, service_pb2.ModelStatisticsResponse())

    # ------------------------------------------------------------ inference
    async def ModelInfer(self, request):
        state = self.state
        started = time.perf_counter()
        state.metrics.count_request()
        state.check_open()
        size, limit = request.ByteSize(), state.deploy.max_body_bytes
        if size > limit:
            raise ApiError(413, f"message is {size} bytes; at most {limit} "
                           f"(Deploy.max_body_bytes)", None)
        version = request.model_version or None
        model = state.model(request.model_name, version)
        payload, binary = _payload(request)
        items, request_id, params, wanted = oip.parse_infer(payload, binary, state.deploy, model)
        where = "inputs[0].data" if len(model.task.oip_inputs) == 1 else "rows"
        outcome = await state.infer(items, request.model_name, version, params.get("long_text"),
                                    where, started)
        rendering = time.perf_counter()
        tensors = oip.output_tensors(outcome.model, [n for n, _ in wanted], outcome.results)
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

    # ------------------------------------------------------------ repository
    async def RepositoryIndex(self, request):
        self._repository()
        return service_pb2.RepositoryIndexResponse(
            models=[service_pb2.RepositoryIndexResponse.ModelIndex(**e)
                    for e in self.state.registry.index()])

    async def RepositoryModelLoad(self, request):
        self._repository()
        await load_newest(self.state, request.model_name)
        return service_pb2.RepositoryModelLoadResponse()

    def _repository(self):
        if self.state.repository is None:
            raise ApiError(404, "this server serves one export (--model-dir), not a model "
                           "repository", None)


class _ServerEnd(FramedProtocol):
    """The server's end of the socket pair: each relayed call answered in a task of its own."""

    def __init__(self, service, hello, lost):
        super().__init__()
        self.service, self.hello, self.lost = service, hello, lost
        self.tasks = set()

    def connection_lost(self, exc):
        if not self.hello.done():
            self.hello.set_result((0, "the gRPC front end exited before it listened"))
        self.lost.set()

    def on_frame(self, kind, call_id, code, authorization, body):
        if kind == HELLO:
            if not self.hello.done():
                self.hello.set_result((call_id, body.decode("utf-8", "replace")))
        elif kind == CALL:
            task = asyncio.ensure_future(self._answer(call_id, METHOD_NAMES[code],
                                                      authorization.decode("utf-8", "replace"),
                                                      body))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _answer(self, call_id, method, authorization, body):
        code, out = await self.service.call(method, body, authorization)
        if not self.transport.is_closing():
            self.transport.write(answer_frame(call_id, code.value[0], out))


def front_end_command(fd, host, port, max_receive, max_send, max_calls):
    """The command that starts the front end on its end ``fd`` of the socket pair."""
    return [sys.executable, "-m", "ppvarlen.serve.grpc.front", "--fd", str(fd), "--host", host,
            "--port", str(port), "--methods", ",".join(METHOD_PATHS),
            "--max-receive", str(max_receive), "--max-send", str(max_send),
            "--max-calls", str(max_calls)]


def _front_end_env():
    """This process's environment, with the directory this ppvarlen was imported from first on
    the child's path: the front end runs the same ppvarlen whether it is installed or not."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
    return env


class GrpcServer:
    """The gRPC front end process (``grpc_front``) on ``host:port`` (0: a free port) relaying to
    ``InferenceService`` on an event loop in a thread of its own; ``port`` is the bound one once
    ``start`` returns.  A front end that exits on its own (killed, crashed) is logged and
    started again on the same port, at most once a second."""

    def __init__(self, state, host, port, auth_token=None, auth_all_routes=False):
        self.state, self.host, self.port = state, host, port
        self.service = InferenceService(state, auth_token, auth_all_routes)
        self._loop = uvloop.new_event_loop() if uvloop is not None else asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="grpc",
                                        daemon=True)
        self._proc = self._end = self._watch = None
        self._stopping = False

    @property
    def front_end_pid(self):
        return self._proc.pid if self._proc is not None else None

    def start(self):
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._launch(), self._loop).result(90)
        self._watch = asyncio.run_coroutine_threadsafe(self._restart_when_lost(), self._loop)
        log.info("serving the Open Inference Protocol over gRPC on %s:%d (front end: process "
                 "%d)", self.host, self.port, self._proc.pid)
        return self

    async def _launch(self):
        loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair()
        deploy = self.state.deploy
        limit = deploy.max_body_bytes
        # grpc core refuses past its limit in its own words; up to twice the body limit the
        # message reaches ModelInfer, whose 413 names Deploy.max_body_bytes
        command = front_end_command(theirs.fileno(), self.host, self.port, 2 * limit,
                                    max(limit, 64 << 20), deploy.max_connections)
        try:
            self._proc = subprocess.Popen(command, pass_fds=(theirs.fileno(),),
                                          stdin=subprocess.DEVNULL, env=_front_end_env())
        finally:
            theirs.close()
        hello, self._lost = loop.create_future(), asyncio.Event()
        _, self._end = await loop.connect_accepted_socket(
            lambda: _ServerEnd(self.service, hello, self._lost), ours)
        try:
            port, why = await asyncio.wait_for(hello, 60)
        except asyncio.TimeoutError:
            port, why = 0, "the gRPC front end did not answer within 60 s"
        if not port:
            self._end.transport.close()
            self._reap(5)
            raise OSError(why)
        self.port = port

    async def _restart_when_lost(self):
        while True:
            await self._lost.wait()
            if self._stopping:
                return
            code = await asyncio.get_running_loop().run_in_executor(None, self._reap, 5)
            log.error("the gRPC front end (process %d) exited with %s; starting it again on "
                      "port %d", self._proc.pid, code, self.port)
            await asyncio.sleep(1.0)
            try:
                await self._launch()
            except OSError as e:
                log.error("gRPC is not served: %s", e)
                return

    def _reap(self, timeout):
        try:
            return self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            return self._proc.wait()

    def _send_stop(self, grace_s):
        if not self._end.transport.is_closing():
            self._end.transport.write(stop_frame(grace_s))

    def stop(self, grace_s=5.0):
        """Stop taking calls; the calls in flight get ``grace_s`` to finish."""
        self._stopping = True
        if self._proc is not None:
            self._loop.call_soon_threadsafe(self._send_stop, grace_s)
            self._reap(grace_s + 30)
        if self._watch is not None:
            self._loop.call_soon_threadsafe(self._watch.cancel)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)

