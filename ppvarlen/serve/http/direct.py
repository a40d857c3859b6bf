"""The inference routes, answered ahead of FastAPI's routing.

``POST /predict``, ``POST /v2/models/{name}[/versions/{version}]/infer`` and ``POST
/v1/embeddings`` carry the load, one text a request at its heaviest; on them FastAPI's middleware layers, routing, dependency
solving and request objects cost the event loop about as much as the route's own work.
``ServingApp`` (the app ``create_app`` returns) hands a request for a route of its
``DirectRoutes`` straight to the handler, through the same edge middlewares as every other
route (the app's ``user_middleware``: ``AnswerErrors``, ``RequireToken``, CORS, built a second
time around the direct routes); every other request goes through FastAPI as usual.  FastAPI
still declares the direct routes (so the OpenAPI document, and 405 for another method, stay
its own); the endpoint it declares is never called.

A handler is ``async handler(scope, receive, **path_params) -> (body bytes, headers)``: a 200
answer, ``headers`` a list of lowercase (name, value) byte pairs besides its length; an
``ApiError`` it raises is answered as on every route (``error_response``).  Paths match as
Starlette matches them (``compile_path``, under the scope's ``root_path``).
"""
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from starlette.routing import compile_path

from ppvarlen.serve.errors import ApiError


class DirectRoute:
    """One path template answered directly; ``path`` is what ``AnswerErrors`` counts it as."""

    __slots__ = ("path", "regex", "handler")

    def __init__(self, path, handler):
        self.path, self.handler = path, handler
        self.regex = compile_path(path)[0]


def route_path(scope):
    """The path the app's routes see: ``scope["path"]`` without the ``root_path`` it is
    mounted under (as Starlette's routing strips it)."""
    path, root = scope["path"], scope.get("root_path", "")
    if root and path.startswith(root) and path[len(root):len(root) + 1] == "/":
        return path[len(root):]
    return path


def error_response(state, error, scope):
    """The answer to an ``ApiError`` on any route, counted, in the body of the route's
    protocol (``errors.error_body``)."""
    state.failed(error)
    return JSONResponse(error.body(route_path(scope)), status_code=error.status,
                        headers=error.headers)


class DirectRoutes:
    """The routes ``ServingApp`` answers ahead of FastAPI (an ASGI app for one of them)."""

    def __init__(self, state):
        self.state = state
        self.routes = []

    def post(self, router, path, handler, declared):
        """Answer ``POST path`` with ``handler``; ``declared`` (an endpoint function never
        called: its parameters are what FastAPI documents) goes on ``router`` under the
        handler's name (the OpenAPI operation's)."""
        router.add_api_route(path, declared, methods=["POST"], name=handler.__name__)
        self.routes.append(DirectRoute(path, handler))

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
        try:
            body, headers = await scope["route"].handler(scope, receive, **scope["path_params"])
        except ApiError as e:
            await error_response(self.state, e, scope)(scope, receive, send)
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
