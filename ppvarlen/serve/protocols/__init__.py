"""The protocols the server speaks, one folder each: its codec, its routes (and gRPC service,
where it has one), its OpenAPI part and the form of its refusals.

A protocol package offers ``router(plane, direct)`` (its REST routes over the ``DataPlane``;
inference routes declared on ``direct``, the fast path), ``render_error(error)`` -> (HTTP
status, headers, JSON body) of a ``ServeError``, ``add_openapi(doc, plane, model)`` and
``render_checks()`` (admission's checks of its answer forms); optionally ``grpc_service(plane,
auth_token, auth_all_routes)``, ``EDGE_PREFIXES`` (paths whose edge refusals take its form),
``PATH_PREFIXES`` (paths it owns: a request no route takes there is refused in its form),
``OPEN_PATHS`` / ``GUARDED_PREFIXES`` (bearer-token policy), ``EXPOSE_HEADERS`` (CORS).
Adding a protocol is its folder and one line in ``PROTOCOLS``; the first one is the default
form of a refusal outside every protocol's paths.
"""
from ppvarlen.serve.protocols import oip, openai, predict

PROTOCOLS = (predict, oip, openai)


def render_checks():
    """Every protocol's answer forms, as admission render checks (``runtime.admission.admit``):
    a model is admitted only if each form can send the answer to its example."""
    return [check for p in PROTOCOLS for check in p.render_checks()]


def edge_render(path, error):
    """(status, headers, body) of a refusal the edge gives on ``path`` itself (no token, a
    bug), in the form of the protocol whose ``EDGE_PREFIXES`` hold it (else the first's)."""
    for p in PROTOCOLS:
        if path.startswith(getattr(p, "EDGE_PREFIXES", ())):
            return p.render_error(error)
    return PROTOCOLS[0].render_error(error)


def route_render(path, error):
    """(status, headers, body) of a request no route takes (no such path, a wrong method) on
    ``path``: in the form of the protocol whose ``PATH_PREFIXES`` hold it, as its own routes
    answer, else as the edge answers there (``edge_render``)."""
    for p in PROTOCOLS:
        if path.startswith(getattr(p, "PATH_PREFIXES", ())):
            return p.render_error(error)
    return edge_render(path, error)


def gathered(name):
    """Every protocol's tuple attribute ``name`` (e.g. OPEN_PATHS), joined."""
    return tuple(x for p in PROTOCOLS for x in getattr(p, name, ()))
