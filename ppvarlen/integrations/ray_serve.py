"""Online serving on Ray Serve: ppvarlen's own HTTP app, one copy per replica.

Each replica loads one ``Predictor`` and serves the app ``deploy/python/serve.py``
serves (``ppvarlen.serve.server.create_app``): the same token-budget
``DynamicBatcher``, ``POST /predict``, ``/health``, ``/metrics`` (Prometheus),
``/metrics.json``, the Open Inference Protocol v2 routes under ``/v2``, error JSON and
statuses, so every existing client works unchanged.  Serve's proxy spreads requests
over the replicas; ``/health`` and the metrics describe the replica that answered.

Replicas, CPUs per replica and autoscaling bounds come from a config in Ray Serve's
own format (``deploy/ray/serve.yaml``), usable as is with ``serve run`` / ``serve
deploy``, or with ``deploy/ray/serve.py`` (``run_config`` below: the same through
Serve's public Python API, plus ``--model-dir``).  ``args`` of the application:
``model_dir`` or ``model_repository`` (one of them: an export directory, or a
``NAME/VERSION/`` repository each replica polls and hot-reloads, docs/SERVING.md),
``backend``, ``deploy`` (Deploy config keys, as serve.py's ``-o Deploy.KEY=V``; host/port
belong to ``http_options``).

A replica that cannot load the export raises the predictor's own error (e.g. the
manifest's sha256 mismatch); Serve retries the constructor a few times, then marks
the deployment failed with that message, and ``serve.run`` raises it.
"""
import argparse
import signal
import sys
import threading

import yaml
from pydantic import ValidationError

try:
    from ray import serve
    from ray.serve.schema import ServeDeploySchema
except ImportError as e:  # the core package never needs Ray
    raise ImportError("ppvarlen.integrations.ray_serve needs Ray: install the ray extra, "
                      "ppvarlen[ray]") from e

from ppvarlen.cli import run_command
from ppvarlen.config import ConfigError
from ppvarlen.runtime.manifest import UnservableExportError
from ppvarlen.serve.server import app_from_config, deploy_settings

from .ray_cluster import add_cluster_args, ray_cluster

IMPORT_PATH = "ppvarlen.integrations.ray_serve:build_app"
DEPLOYMENT = "ppvarlen"
ARGS = ("model_dir", "model_repository", "backend", "deploy")


# Serve's proxy holds the sockets: the server's own listening and connection keys do not apply
PROXY_KEYS = ("host", "port", "grpc_port", "max_header_bytes", "max_headers", "header_timeout_s",
              "body_timeout_s", "idle_timeout_s", "max_connections", "keep_alive_timeout_s")


def replica_deploy_settings(deploy):
    """The Deploy section from a dict of Deploy keys, validated like ``-o Deploy.KEY=V``; a
    key the proxy owns is refused rather than silently ignored."""
    deploy = dict(deploy or {})
    for key in PROXY_KEYS:
        if key in deploy:
            where = f"http_options.{key}" if key in ("host", "port") else "http_options"
            raise ConfigError(f"args.deploy.{key} has no effect under Ray Serve (its proxy holds "
                              f"the connections); set {where} in the Serve config")
    return deploy_settings(**deploy)


@serve.deployment(name=DEPLOYMENT, ray_actor_options={"num_cpus": 1},
                  max_constructor_retry_count=3)
@serve.ingress()
class PpvarlenReplica:
    """One replica: a predictor and ``create_app`` around it (built after the constructor)."""

    def __init__(self, model_dir, backend=None, deploy=None, model_repository=None):
        # create_app's lifespan (warm-up, overhead measurement, batcher) runs when Serve
        # starts the replica's ASGI app, and drains the batcher when Serve stops it.
        self._app = app_from_config(model_dir, replica_deploy_settings(deploy), backend,
                                    model_repository)

    def __serve_build_asgi_app__(self):
        return self._app


def build_app(args, deployment_options=None):
    """Serve application builder (``import_path: ppvarlen.integrations.ray_serve:build_app``)."""
    args = dict(args or {})
    unknown = sorted(set(args) - set(ARGS))
    where = [k for k in ("model_dir", "model_repository") if args.get(k)]
    if unknown or len(where) != 1:
        what = f"unknown {unknown}" if unknown else (
            "model_dir is missing" if not where else "both model_dir and model_repository")
        raise ConfigError(f"Serve config args: {what}; ppvarlen takes {list(ARGS)} (model_dir "
                          f"or model_repository required)")
    replica_deploy_settings(args.get("deploy"))  # a bad Deploy key fails here, not in every replica
    deployment = PpvarlenReplica.options(**(deployment_options or {}))
    return deployment.bind(args.get("model_dir"), args.get("backend"), args.get("deploy") or {},
                           args.get("model_repository"))


class ReplicaStartError(UnservableExportError):
    """The deployment failed: its replicas could not serve the export with these settings; the
    message is the replica's own error (e.g. the predictor's)."""


def replica_error(app_name):
    """The exception line a failed replica raised, from Serve's deployment status.

    ``serve.run`` only says "Failed to update the deployments"; the status message
    holds the replica's traceback, whose last line is the error itself, e.g.
    ``ppvarlen.runtime.manifest.UnservableExportError: export directory not found: ...``.
    """
    status = serve.status().applications.get(app_name)
    deployment = status.deployments.get(DEPLOYMENT) if status else None
    lines = [ln for ln in (deployment.message if deployment else "").splitlines() if ln.strip()]
    return lines[-1].strip() if lines else None


def load_serve_config(path, model_dir=None):
    """Read a Serve config file and validate it with Serve's own schema (``ServeDeploySchema``);
    ``model_dir`` replaces every application's ``args.model_dir``."""
    try:
        with open(path, encoding="utf-8") as f:
            raw = yaml.safe_load(f)
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"{path}: cannot read the Serve config ({e})") from None
    if not isinstance(raw, dict) or not raw.get("applications"):
        raise ConfigError(f"{path}: a Serve config needs an 'applications' list (see "
                          f"deploy/ray/serve.yaml)")
    if model_dir:
        for app in raw["applications"]:
            app.setdefault("args", {})["model_dir"] = model_dir
    try:
        return ServeDeploySchema.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(f"{path}: not a valid Ray Serve config:\n{e}") from None


def run_config(config):
    """Deploy a validated Serve config on the connected Ray cluster; returns the base URL.

    Serve's public API only: ``serve.start`` with the config's proxy and HTTP options,
    then ``serve.run`` per application with its ``deployments`` entries applied.
    """
    http = config.http_options.model_dump(exclude_unset=True)
    serve.start(proxy_location=config.proxy_location, http_options=http)
    for app in config.applications:
        if app.import_path != IMPORT_PATH:
            raise ConfigError(f"application {app.name!r}: import_path must be {IMPORT_PATH}")
        options = {}
        for d in app.deployments:
            if d.name != DEPLOYMENT:
                raise ConfigError(f"application {app.name!r}: deployment {d.name!r} does not "
                                  f"exist; the deployment is named {DEPLOYMENT!r}")
            options = d.model_dump(exclude_unset=True, exclude={"name"})
        try:
            serve.run(build_app(app.args, options), name=app.name, route_prefix=app.route_prefix)
        except RuntimeError as e:
            raise ReplicaStartError(f"application {app.name!r} failed to deploy: "
                                    f"{replica_error(app.name) or e}") from None
    host = config.http_options.host
    return f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{config.http_options.port}"


def main(argv=None):
    """``deploy/ray/serve.py``: deploy, then serve until SIGINT / SIGTERM; 2 on a bad setup
    (ppvarlen.cli's error policy)."""
    parser = argparse.ArgumentParser(description="Serve an export on Ray Serve")
    parser.add_argument("--config", default="deploy/ray/serve.yaml", help="Serve config file")
    parser.add_argument("--model-dir", default=None, help="replaces args.model_dir of the config")
    add_cluster_args(parser)
    return run_command(parser, argv, _serve)


def _serve(args):
    config = load_serve_config(args.config, args.model_dir)
    stop = threading.Event()
    with ray_cluster(args):
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        try:
            url = run_config(config)
            print(f"serving on {url} (POST /predict, /v2/..., GET /health, GET /metrics); "
                  f"Ctrl-C stops", file=sys.stderr)
            stop.wait()
        finally:
            serve.shutdown()
    return 0
