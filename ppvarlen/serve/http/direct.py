"""The inference routes, answered ahead of FastAPI's routing.

The protocols' inference routes carry the load, one text a request at its heaviest; on them
FastAPI's middleware layers, routing, dependency solving and request objects cost the event
loop about as much as the route's own work.
``ServingApp`` (the app ``create_app`` returns) hands a request for a route of its
``DirectRoutes`` straight to the handler, through the same edge middlewares as every other
route (the app's ``user_middleware``: ``AnswerErrors``, ``RequireToken``, CORS, built a second
time around the direct routes); every other request goes through FastAPI as usual.  A direct
route is declared once (``DirectRoutes.post``): the same declaration puts it in FastAPI's
routes (so the OpenAPI document, and 405 for another method, stay FastAPI's own), with an
endpoint that calls the same handler.

A handler is ``async handler(scope, receive, **path_params) -> (body bytes, headers)``: a 200
answer, ``headers`` a list of lowercase (name, value) byte pairs besides its length; a
``ServeError`` it raises is answered in its protocol's form (the route's ``render``, counted
by ``error_response``).  Paths match as Starlette matches them (``compile_path``, under the
scope's ``root_path``).
"""
import inspect

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.routing import compile_path

from ppvarlen.serve.errors import ServeError


class DirectRoute:
    """One path template answered directly; ``path`` is what ``AnswerErrors`` counts it as,
    ``render(error)`` -> (status, headers, body) the refusals of its protocol."""

    __slots__ = ("path", "regex", "params", "handler", "render")

    def __init__(self, path, handler, render):
        self.path, self.handler, self.render = path, handler, render
        self.regex, _, params = compile_path(path)
        self.params = list(params)


def route_path(scope):
    """The path the app's routes see: ``scope["path"]`` without the ``root_path`` it is
    mounted under (as Starlette's routing strips it)."""
    path, root = scope["path"], scope.get("root_path", "")
    if root and path.startswith(root) and path[len(root):len(root) + 1] == "/":
        return path[len(root):]
    return path


def version_headers(model):
    """The headers naming the version that answered (every protocol's answers carry them)."""
    return {"X-Model-Name": model.name, "X-Model-Version": model.version}


def version_header_pairs(model):
    """``version_headers`` as a direct route answers them (lowercase bytes)."""
    return [(b"x-model-name", model.name.encode("latin-1")),
            (b"x-model-version", model.version.encode("latin-1"))]


def error_response(plane, render, error):
    """The answer to a ``ServeError`` in the form ``render`` gives, counted on ``plane``."""
    status, headers, body = render(error)
    plane.failed(error, status)
    return JSONResponse(body, status_code=status, headers=headers)


def _endpoint(route):
    """The FastAPI endpoint of a direct route: the route's handler, on FastAPI's request (its
    signature names the path parameters, which is what the OpenAPI document lists)."""
    async def endpoint(request, **path_params):
        body, headers = await route.handler(request.scope, request.receive, **path_params)
        response = Response(body)
        response.raw_headers = [(b"content-length", b"%d" % len(body)), *headers]
        return response

    endpoint.__name__ = route.handler.__name__
    endpoint.__signature__ = inspect.Signature(
        [inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                           annotation=Request)] +
        [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=str)
         for name in route.params])
    return endpoint


class DirectRoutes:
    """The routes ``ServingApp`` answers ahead of FastAPI (an ASGI app for one of them)."""

    def __init__(self, plane):
        self.plane = plane
        self.routes = []

    def post(self, router, path, handler, render):
        """Answer ``POST path`` with ``handler``, its refusals rendered by ``render``; declared
        on ``router`` too (FastAPI's routing and OpenAPI), under the handler's name."""
        route = DirectRoute(path, handler, render)
        router.add_api_route(path, _endpoint(route), methods=["POST"], name=handler.__name__)
        self.routes.append(route)
    def match(self, scope):
        """(route, path parameters) for an HTTP POST to a direct route, else None."""
        if scope["type"] != "http" or scope["method"] != "POST":
            return None
        path = route_path(scope)
        for route in self.routes:
            found = route.regex.match(path)
            if found is not None:
                return route, found.groupdict()
        return None

    async def __call__(self, scope, receive, send):
        route = scope["route"]
        try:
            body, headers = await route.handler(scope, receive, **scope["path_params"])
        except ServeError as e:
            await error_response(self.plane, route.render, e)(scope, receive, send)
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"%d" % len(body)), *headers]})
        await send({"type": "http.response.body", "body": body})


class ServingApp(FastAPI):
    """FastAPI with ``direct`` (a ``DirectRoutes``) answered ahead of its own routing."""

    def __init__(self, direct, **kwargs):
        super().__init__(**kwargs)
        self.direct = direct
        self._direct_stack = None

    async def __call__(self, scope, receive, send):
        found = self.direct.match(scope)
        if found is None:
            return await super().__call__(scope, receive, send)
        scope["app"] = self
        scope["route"], scope["path_params"] = found
        if self._direct_stack is None:  # as Starlette builds its stack: on the first request
            stack = self.direct
            for cls, args, kwargs in reversed(self.user_middleware):
                stack = cls(stack, *args, **kwargs)
            self._direct_stack = stack
        await self._direct_stack(scope, receive, send)
