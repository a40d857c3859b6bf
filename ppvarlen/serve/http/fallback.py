"""Answers for requests no route takes: a path that does not exist (``NoSuchRoute``, 404), a
method the path does not have (``MethodNotAllowed``, 405 with ``Allow``), a request FastAPI's own
parameter validation refuses (``InvalidInput``).  FastAPI answers them ``{"detail": ...}``; here
each is refused in the form of the protocol that owns the path (``render``: the server's
``protocols.route_render``), so a client reads the error as it reads every other one (tritonclient
reported "while decoding the response: 'error'" for ``{"detail": ...}``)."""
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from ppvarlen.serve import errors
from ppvarlen.serve.errors import shown
from ppvarlen.serve.http.direct import route_path


def refusal(method, path, exc):
    """The ``ServeError`` of Starlette's ``HTTPException`` ``exc`` for ``method path``."""
    where = f"{method} {shown(path, 200)}"
    if exc.status_code == 405:
        allowed = (exc.headers or {}).get("Allow", "another method")
        return errors.MethodNotAllowed(f"{where}: the method is not allowed on this path; "
                                       f"allowed: {allowed}")
    if exc.status_code == 404:
        return errors.NoSuchRoute(f"{where}: no such route (the routes are in /openapi.json)",
                                  code="unknown_url")
    return errors.MalformedRequest(f"{where}: {exc.detail}")


def install(app, render):
    """Answer ``app``'s routing errors as ``render(path, error)`` -> (status, headers, body)
    gives them."""
    def answer(request, error, extra_headers=None):
        status, headers, body = render(route_path(request.scope), error)
        return JSONResponse(body, status_code=status, headers={**(headers or {}),
                                                               **(extra_headers or {})})

    async def http_error(request, exc):
        return answer(request, refusal(request.method, route_path(request.scope), exc),
                      exc.headers)

    async def validation_error(request, exc):
        first = (exc.errors() or [{}])[0]
        field = ".".join(str(p) for p in first.get("loc", ()) if p not in ("path", "query"))
        return answer(request, errors.InvalidInput(f"{field or 'request'}: "
                                                   f"{first.get('msg', 'invalid')}", field or None))

    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(RequestValidationError, validation_error)
