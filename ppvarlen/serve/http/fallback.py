"""Answers for requests no route takes: a path that does not exist (404), a method the path
does not have (405, with ``Allow``), a request FastAPI's own validation refuses (422).  FastAPI
answers them ``{"detail": ...}``; here each is the protocol's error body of its path
(``errors.error_body``: OpenAI's error object under ``/v1/``, the Open Inference Protocol's
``{"error": message}`` under ``/v2``, ``{"error", "field"}`` elsewhere), so a client reads the
error as it reads every other one (tritonclient reported "while decoding the response:
'error'" for ``{"detail": ...}``)."""
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from ppvarlen.serve.errors import error_body
from ppvarlen.serve.http.direct import route_path
from ppvarlen.serve.http.edge import shown


def _message(request, exc):
    where = f"{request.method} {shown(route_path(request.scope), 200)}"
    if exc.status_code == 404:
        return f"{where}: no such route (the routes are in /openapi.json)"
    if exc.status_code == 405:
        allowed = (exc.headers or {}).get("Allow", "another method")
        return f"{where}: the method is not allowed on this path; allowed: {allowed}"
    return f"{where}: {exc.detail}"


def http_error(request, exc):
    """FastAPI/Starlette's HTTPException (404 no route, 405 wrong method) in the protocol's
    error body of the path."""
    path = route_path(request.scope)
    code = "unknown_url" if exc.status_code == 404 and path.startswith("/v1/") else None
    return JSONResponse(error_body(path, exc.status_code, _message(request, exc), None, code),
                        status_code=exc.status_code, headers=exc.headers)


def validation_error(request, exc):
    """FastAPI's parameter validation (a route's path or query parameter), 422 in the protocol's
    error body, naming the first parameter at fault."""
    first = (exc.errors() or [{}])[0]
    field = ".".join(str(p) for p in first.get("loc", ()) if p not in ("path", "query"))
    message = f"{field or 'request'}: {first.get('msg', 'invalid')}"
    return JSONResponse(error_body(route_path(request.scope), 422, message, field or None),
                        status_code=422)


def install(app):
    """Answer ``app``'s routing errors in the protocols' forms."""
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(RequestValidationError, validation_error)
