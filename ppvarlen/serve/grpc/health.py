"""gRPC's standard health service, ``grpc.health.v1.Health``, on the gRPC port: what a
Kubernetes ``grpc`` probe and ``grpc_health_probe`` call.  ``Check`` of the empty service name
(the server) or of ``inference.GRPCInferenceService`` answers SERVING when the server is ready
(``ServerReady``: not shutting down, every model ready), of a served model's name when that
model is ready (``ModelReady``), and NOT_FOUND for any other name, as the health protocol says.
``Watch`` (a stream) is not served: UNIMPLEMENTED, which probes do not call."""
from grpc_health.v1 import health_pb2

from ppvarlen.serve.errors import ModelNotFound, shown

HEALTH_SERVICE = "grpc.health.v1.Health"
Status = health_pb2.HealthCheckResponse.ServingStatus


def check(service, server_ready, model_ready, names):
    """The ``HealthCheckResponse`` for the service name ``service``: ``server_ready()`` and
    ``model_ready(name)`` say readiness, ``names`` are the models served."""
    if service in ("", "inference.GRPCInferenceService"):
        ready = server_ready()
    elif service in names:
        ready = model_ready(service)
    else:
        raise ModelNotFound(f"health of {shown(service)}: no such service; ask for \"\" (the "
                       f"server), inference.GRPCInferenceService or a served model's name "
                       f"({shown(sorted(names), 200)})")
    return health_pb2.HealthCheckResponse(status=Status.SERVING if ready else Status.NOT_SERVING)
