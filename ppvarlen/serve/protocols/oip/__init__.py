"""The Open Inference Protocol v2 (KServe / Triton): REST under ``/v2`` and the gRPC service."""
from ppvarlen.serve.protocols.oip.codec import HEADER_LENGTH, render_checks  # noqa: F401
from ppvarlen.serve.protocols.oip.grpc import InferenceService as grpc_service  # noqa: F401
from ppvarlen.serve.protocols.oip.openapi import add_openapi  # noqa: F401
from ppvarlen.serve.protocols.oip.routes import (HEALTH_PROBES, REPOSITORY_PREFIX,  # noqa: F401
                                                 render_error, router)

PATH_PREFIXES = ("/v2",)  # no such route / wrong method under /v2: the protocol's {"error"}
EXPOSE_HEADERS = (HEADER_LENGTH,)  # what a browser client must be let read (CORS)
OPEN_PATHS = HEALTH_PROBES  # answered without the token even under Deploy.auth_all_routes
GUARDED_PREFIXES = (REPOSITORY_PREFIX,)  # always behind the token when there is one
