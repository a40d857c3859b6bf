"""The Open Inference Protocol v2 over gRPC (``inference.GRPCInferenceService``) on the
``DataPlane`` the REST routes use: the same batcher, repository, limits, counters and refusals.

The gRPC transport (``serve.grpc``: a front end process and the relay to it) hands each call's
method name and bytes to ``InferenceService.call``, which parses them, answers on the plane and
serialises the answer.  The messages and the service are the protocol's own ``.proto`` files as
Triton compiles them into the ``tritonclient[grpc]`` package (``service_pb2``,
``model_config_pb2``): nothing here defines a message.  A request becomes the REST handler's
payload (``codec.parse_infer`` checks it), so both transports refuse and answer alike; BYTES
tensors arrive as ``raw_input_contents`` (the binary extension's length-prefixed elements) or
``bytes_contents``, and every output leaves as ``raw_output_contents``.  Bounds: messages of at
most ``Deploy.max_body_bytes`` (RESOURCE_EXHAUSTED naming the key), and every limit
``parse_infer`` enforces.
"""
import hmac
import time

import grpc
from google.protobuf import json_format
from grpc_health.v1 import health_pb2
from tritonclient.grpc import model_config_pb2, service_pb2

from ppvarlen.utils.log import get_logger

from ppvarlen.serve import errors
from ppvarlen.serve.grpc import health
from ppvarlen.runtime.manifest import VERSION_NAME
from ppvarlen.serve.errors import (BodyTooLarge, InvalidInput, MalformedRequest, NoRepository,
                                   ServeError, Unauthenticated, shown)
from ppvarlen.serve.http.status import http_status
from ppvarlen.serve.protocols.oip import codec as oip
from ppvarlen.serve.protocols.oip.routes import (HEALTH_PROBES, read_infer,
                                                 repository_index_of, server_version,
                                                 statistics)

log = get_logger("serve.grpc")
SERVICE = "inference.GRPCInferenceService"
STATUS_CODES = {errors.MalformedRequest: grpc.StatusCode.INVALID_ARGUMENT,
                errors.InvalidInput: grpc.StatusCode.INVALID_ARGUMENT,
                errors.Unauthenticated: grpc.StatusCode.UNAUTHENTICATED,
                errors.ModelNotFound: grpc.StatusCode.NOT_FOUND,
                errors.NoRepository: grpc.StatusCode.NOT_FOUND,
                errors.AmbiguousModel: grpc.StatusCode.FAILED_PRECONDITION,
                errors.LoadRefused: grpc.StatusCode.FAILED_PRECONDITION,
                errors.BodyTooLarge: grpc.StatusCode.RESOURCE_EXHAUSTED,
                errors.Draining: grpc.StatusCode.UNAVAILABLE,
                errors.Overloaded: grpc.StatusCode.UNAVAILABLE,
                errors.ModelNotReady: grpc.StatusCode.UNAVAILABLE,
                errors.NonFiniteAnswer: grpc.StatusCode.UNAVAILABLE,
                errors.DeadlineExceeded: grpc.StatusCode.UNAVAILABLE}
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
           "RepositoryModelUnload": service_pb2.RepositoryModelUnloadRequest,
           "Check": health_pb2.HealthCheckRequest}
METHOD_NAMES = list(METHODS)
# "service/method" of each, in code order: the protocol's, or gRPC's health service
METHOD_PATHS = [f"{health.HEALTH_SERVICE if m == 'Check' else SERVICE}/{m}"
                for m in METHOD_NAMES]


def status_code(error):
    """The gRPC status code of a refusal (INTERNAL for a failure of the model)."""
    return STATUS_CODES.get(type(error), grpc.StatusCode.INTERNAL)


def _infer_response(outcome, call):
    """The ``ModelInferResponse`` of an answered ``Call``."""
    request_id, params, wanted = call.context
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
    return response


def _parameter(p):
    kind = p.WhichOneof("parameter_choice")
    return getattr(p, kind) if kind else None


def _payload(request):
    """(the REST infer payload, binary bytes) of a ``ModelInferRequest``."""
    raw = list(request.raw_input_contents)
    if raw and len(raw) != len(request.inputs):
        raise MalformedRequest(f"raw_input_contents holds {len(raw)} tensors for "
                               f"{len(request.inputs)} inputs; send one per input, in order")
    if raw and any(t.HasField("contents") for t in request.inputs):
        typed = next(k for k, t in enumerate(request.inputs) if t.HasField("contents"))
        raise MalformedRequest(f"inputs[{typed}] has contents while the request has "
                               f"raw_input_contents; the protocol allows one form per request: "
                               f"all tensors raw, or all in contents")
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
                raise MalformedRequest(f"inputs[{k}].contents.bytes_contents holds bytes that "
                                       f"are not UTF-8") from None
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
    """Each method of the protocol's service over the ``DataPlane``: a request message in, the
    response message out, a ServeError for a refusal (answered with its status code)."""

    # what the gRPC front end serves
    name, method_names, method_paths = SERVICE, METHOD_NAMES, METHOD_PATHS

    def __init__(self, plane, auth_token=None, auth_all_routes=False):
        self.plane = plane
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
                raise MalformedRequest(f"{method}: the request is not a valid "
                                       f"{METHODS[method].__name__} message") from None
            response = await getattr(self, method)(request)
            return code, response.SerializeToString()
        except ServeError as e:
            code = status_code(e)
            if method == "ModelInfer":  # counted as the REST route counts it
                self.plane.failed(e, http_status(e)[0])
            return code, e.message.encode("utf-8")
        except Exception:  # noqa: BLE001 - the protocol's INTERNAL, logged once, never a crash
            code = grpc.StatusCode.INTERNAL
            log.exception("gRPC %s: internal error", method)
            return code, b"internal server error (logged)"
        finally:
            self.plane.metrics.observe_request(f"grpc:{method}", code.name,
                                               time.perf_counter() - started)

    def _authorize(self, method, given):
        if self._expected is None:
            return
        protected = method.startswith("Repository") or (self.auth_all_routes
                                                        and method not in PROBES)
        if protected and not hmac.compare_digest(given.encode(), self._expected.encode()):
            raise Unauthenticated(f"{method} needs the metadata authorization: Bearer TOKEN "
                                  f"(the token of Deploy.auth_token_file)", "authorization")

    # ------------------------------------------------------------ health and metadata
    async def ServerLive(self, request):
        return service_pb2.ServerLiveResponse(live=True)

    async def ServerReady(self, request):
        return service_pb2.ServerReadyResponse(ready=self.plane.ready())

    async def Check(self, request):
        """grpc.health.v1.Health/Check (``grpc.health.check``)."""
        plane = self.plane
        return health.check(request.service, plane.ready,
                            lambda name: not plane.not_ready_reason(plane.model(name)),
                            plane.registry.names())

    def _model(self, name, version):
        """The version a request names; an empty name or a version that is no number is
        INVALID_ARGUMENT, as Triton answers it (the REST paths cannot carry either)."""
        if not name:
            raise InvalidInput("the model name is empty; name a served model "
                               f"({shown(self.plane.registry.names(), 200)})", "name")
        if version and not VERSION_NAME.fullmatch(version):
            raise InvalidInput(f"version {shown(version)}: versions are positive integers in "
                               f"ASCII digits (empty: the newest ready one)", "version")
        return self.plane.model(name, version or None)

    async def ModelReady(self, request):
        model = self._model(request.name, request.version)
        return service_pb2.ModelReadyResponse(ready=not self.plane.not_ready_reason(model))

    async def ServerMetadata(self, request):
        return service_pb2.ServerMetadataResponse(name="ppvarlen", version=server_version(),
                                                  extensions=oip.extensions(
                                                      self.plane.repository is not None))

    async def ModelMetadata(self, request):
        model = self._model(request.name, request.version)
        doc = oip.model_metadata(request.name, self.plane.registry.versions(request.name), model)
        return json_format.ParseDict(doc, service_pb2.ModelMetadataResponse())

    async def ModelConfig(self, request):
        model = self._model(request.name, request.version)
        config = json_format.ParseDict(oip.model_config(model), model_config_pb2.ModelConfig())
        return service_pb2.ModelConfigResponse(config=config)

    async def ModelStatistics(self, request):
        doc = statistics(self.plane, request.name or None, request.version or None)
        return json_format.ParseDict(doc, service_pb2.ModelStatisticsResponse())

    # ------------------------------------------------------------ inference
    async def ModelInfer(self, request):
        plane = self.plane

        async def read():
            size, limit = request.ByteSize(), plane.deploy.max_body_bytes
            if size > limit:
                raise BodyTooLarge(f"message is {size} bytes; at most {limit} "
                                   f"(Deploy.max_body_bytes)")
            self._model(request.model_name, request.model_version)
            payload, binary = _payload(request)
            return read_infer(plane, payload, binary, request.model_name,
                              request.model_version or None)

        return await plane.infer(read, _infer_response)

    # ------------------------------------------------------------ repository
    async def RepositoryIndex(self, request):
        if self.plane.repository is None:
            raise NoRepository("this server serves one export (--model-dir), not a model "
                               "repository")
        return service_pb2.RepositoryIndexResponse(
            models=[service_pb2.RepositoryIndexResponse.ModelIndex(**e)
                    for e in repository_index_of(self.plane, request.ready)])

    async def RepositoryModelLoad(self, request):
        await self.plane.load_newest(request.model_name)
        return service_pb2.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(self, request):
        await self.plane.unload(request.model_name)
        return service_pb2.RepositoryModelUnloadResponse()
