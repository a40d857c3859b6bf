"""The servers the conformance tests talk to: the tiny classification export and the tiny
embedding export, each behind a real uvicorn socket (the clients speak HTTP and gRPC to it),
with gRPC on a free port.  One server per test module (module-scoped fixtures call these).

The published documents the tests check facts of (read, not copied into the repo):

* OIP: kserve/open-inference-protocol, ``specification/protocol/open_inference_rest.yaml``
  (info.version 2.0), ``inference_rest.md``, ``open_inference_grpc.proto``, ``inference_grpc.md``
  at commit d49cc23f89d709d87b210ef9449e273ae243984e (2025-05-11).
* OpenAI: openai/openai-openapi ``openapi.yaml`` (info.version 2.3.0) at commit
  f85dbe223d40e1a31cba812ab2d755c7e98a92a3 (2026-08-21): ``/embeddings``, ``/models``,
  ``/models/{model}``, the ``Model``, ``ListModelsResponse``, ``CreateEmbeddingRequest``,
  ``CreateEmbeddingResponse`` and ``ErrorResponse`` schemas.
* gRPC health: grpc/grpc ``doc/health-checking.md`` (``grpc.health.v1.Health``), the messages
  as the ``grpcio-health-checking`` package compiles them.
"""
import contextlib

import httpx
from test_server import RunningServer

from ppvarlen.runtime.predictor import Predictor
from ppvarlen.serve.server import create_app, deploy_settings

# small parts, so a request of many inputs is split into several (openai routes.infer_in_parts)
LIMITS = dict(max_texts_per_request=64, max_text_chars=200, max_body_bytes=1 << 20,
              batch_overhead_tokens=8, max_wait_ms=2)

# the platform names inference_rest.md's "Platforms" section allows
OIP_PLATFORMS = {"tensorrt_plan", "tensorflow_graphdef", "tensorflow_savedmodel", "onnx_onnxv1",
                 "pytorch_torchscript", "mxnet_mxnet", "caffe2_netdef"}


class Served:
    """A running server: ``url`` (REST), ``grpc_url`` (host:port), ``name`` (its model)."""

    def __init__(self, srv, app):
        self.url, self.app = srv.url, app
        self.grpc_url = f"127.0.0.1:{app.state.grpc.port}"
        self.name = httpx.get(srv.url + "/health").json()["model_name"]


@contextlib.contextmanager
def serving(export_dir, **deploy_keys):
    """One export on ONNX Runtime behind a real socket, with gRPC -> ``Served``."""
    keys = dict(LIMITS, **deploy_keys)
    app = create_app(Predictor(export_dir, "onnx"), deploy=deploy_settings(**keys), grpc_port=0)
    with RunningServer(app) as srv:
        yield Served(srv, app)
