"""The server's edge: what happens to a request before a route reads it, and to an error after.

* ``read_body``: an ASGI request's body within ``Deploy.max_body_bytes`` (declared or counted),
  a client that goes away mid-body is one log line (``ClientGone``), not a traceback.
  A ``Content-Encoding: gzip`` or ``deflate`` body (tritonclient's request compression) is
  decoded, its decoded size bounded by the same limit (a zip bomb is refused once it passes it).
* ``parse_json``: strict JSON -> ``MalformedRequest`` naming what is wrong: not UTF-8, nested
  too deep, an integer too long to convert, NaN/Infinity, a lone surrogate (it could not be
  encoded back into an answer); so no route ever holds a value it could not echo.
* ``RequireToken``: ASGI middleware for ``Deploy.auth_token_file`` (bearer token).
* ``AnswerErrors``: ASGI middleware, outermost: counts every answer by route and status, and
  an exception no route turned into an answer becomes a JSON 500 (logged once with its
  traceback), never text/plain.
Both answer their refusals in the form of the protocol that owns the path (``render``, given
by the server): this module knows no protocol.
"""
import hmac
import json
import os
import re
import time
import zlib

from ppvarlen.config import ConfigError
from ppvarlen.utils.log import get_logger

from ppvarlen.serve.errors import (BodyTooLarge, InternalError, MalformedRequest,
                                   Unauthenticated, UnsupportedEncoding, shown)

log = get_logger("serve.server")
DECIMAL = re.compile(r"[0-9]{1,19}", re.ASCII)  # str.isdigit() also takes '²', int() does not
SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


class ClientGone(Exception):
    """The client closed the connection before its request was read."""


def header_int(value, name):
    """An ASCII-decimal header value -> int; MalformedRequest naming the header otherwise."""
    if not DECIMAL.fullmatch(value):
        raise MalformedRequest(f"bad {name} header {shown(value)}: a decimal number of bytes",
                               name)
    return int(value)


def header(scope, name):
    """The first value of header ``name`` (lowercase bytes) of an ASGI scope as str, or None."""
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1")
    return None


async def read_body(scope, receive, limit):
    """The body of an ASGI request, within ``limit`` bytes; ClientGone when the client left."""
    declared = header(scope, b"content-length")
    if declared is not None and header_int(declared, "Content-Length") > limit:
        raise BodyTooLarge(f"body is {declared} bytes; at most {limit} (Deploy.max_body_bytes)",
                           "body")
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone(f"{scope['method']} {scope['path']}: the client disconnected after "
                             f"{size} bytes of the body")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:  # chunked uploads announce no length: count while reading
            raise BodyTooLarge(f"body exceeds {limit} bytes (Deploy.max_body_bytes)", "body")
        if not message.get("more_body", False):
            body = b"".join(chunks + [chunk]) if chunks else chunk
            encoding = header(scope, b"content-encoding")
            return body if encoding is None else decoded(body, encoding, limit)
        chunks.append(chunk)


# zlib's window bits for each Content-Encoding: gzip's header, or zlib's (RFC 9110 "deflate")
ENCODINGS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS,
             "deflate": zlib.MAX_WBITS}


def decoded(body, encoding, limit):
    """``body`` sent with ``Content-Encoding: encoding`` -> its bytes, at most ``limit``
    decoded (BodyTooLarge beyond, before more is inflated); UnsupportedEncoding another
    encoding, MalformedRequest a body that is not what its encoding says."""
    name = encoding.strip().lower()
    if name in ("", "identity"):
        return body
    if name not in ENCODINGS:
        raise UnsupportedEncoding(f"Content-Encoding {shown(encoding)}: this server decodes gzip "
                                  f"and deflate; send one of them or none", "Content-Encoding")
    inflater = zlib.decompressobj(ENCODINGS[name])
    try:
        out = inflater.decompress(body, limit + 1)
        if len(out) > limit or inflater.unconsumed_tail:
            raise BodyTooLarge(f"the {name}-decoded body exceeds {limit} bytes "
                               f"(Deploy.max_body_bytes)", "body")
        out += inflater.flush()
    except zlib.error as e:
        raise MalformedRequest(f"the body is not valid {name} data (Content-Encoding: "
                               f"{name}): {e}", "Content-Encoding") from None
    if not inflater.eof:
        raise MalformedRequest(f"the {name} body ends before its compressed stream does",
                               "Content-Encoding")
    if len(out) > limit:
        raise BodyTooLarge(f"the {name}-decoded body exceeds {limit} bytes "
                           f"(Deploy.max_body_bytes)", "body")
    return out


def _not_json(constant):
    raise ValueError(f"{constant} is not a JSON value")


def parse_json(raw, where="body"):
    """Strict JSON of a request body (bytes) -> the value; MalformedRequest naming the
    problem."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise MalformedRequest(f"{where} is not valid JSON: not UTF-8 at byte {e.start}; "
                               f"send UTF-8", where) from None
    try:
        value = json.loads(text, parse_constant=_not_json)
    except RecursionError:
        raise MalformedRequest(f"{where} nests arrays/objects too deeply to parse; the API's "
                               f"bodies are a few levels deep", where) from None
    except ValueError as e:  # JSONDecodeError, NaN/Infinity, integers over Python's digit limit
        raise MalformedRequest(f"{where} is not valid JSON: {shown(str(e), 200)}",
                               where) from None
    if SURROGATE_ESCAPE.search(text):
        path = _surrogate_path(value)
        if path is not None:
            raise MalformedRequest(f"{where}{path} holds a lone UTF-16 surrogate escape "
                                   f"(\\ud800-\\udfff without its pair); JSON strings must be "
                                   f"valid Unicode", f"{where}{path}")
    return value


def _has_surrogate(s):
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _surrogate_path(value):
    """The JSON path (e.g. ``.inputs[0].data[2]``) of the first string or key holding a lone
    surrogate, or None.  Iterative: the value may be as deep as the parser allowed."""
    stack = [(value, "")]
    while stack:
        node, path = stack.pop()
        if isinstance(node, str):
            if _has_surrogate(node):
                return path
        elif isinstance(node, dict):
            for k, v in node.items():
                if _has_surrogate(k):
                    return f"{path} (a key)"
                stack.append((v, f"{path}.{k}"))
        elif isinstance(node, list):
            stack.extend((v, f"{path}[{i}]") for i, v in enumerate(node))
    return None


async def send_error(send, render, path, error, extra_headers=()):
    """Answer ``error`` (a ServeError) on ``path`` in the form ``render(path, error)`` ->
    (status, headers or None, body) gives: the protocol's that owns the path."""
    status, headers, body = render(path, error)
    raw = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), *extra_headers,
                            *((k.lower().encode("latin-1"), v.encode("latin-1"))
                              for k, v in (headers or {}).items()),
                            (b"content-length", str(len(raw)).encode())]})
    await send({"type": "http.response.body", "body": raw})
    return status


# ---------------------------------------------------------------- bearer token

def read_token(path):
    """The bearer token in the first line of ``path``; ConfigError naming the file."""
    try:
        with open(path, encoding="utf-8") as f:
            token = f.readline().strip()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"Deploy.auth_token_file {path}: cannot be read ({e})") from None
    if len(token) < 16 or not token.isascii() or any(c.isspace() for c in token):
        raise ConfigError(f"Deploy.auth_token_file {path}: the first line must be a token of at "
                          f"least 16 printable ASCII characters without spaces, e.g. the output "
                          f"of `python -c \"import secrets; print(secrets.token_urlsafe(32))\"`")
    if os.stat(path).st_mode & 0o077:
        log.warning("Deploy.auth_token_file %s is readable by other users; chmod 600 it", path)
    return token


class RequireToken:
    """ASGI middleware: requests to protected paths need ``Authorization: Bearer TOKEN``
    (401 otherwise, in the form ``render(path, error)`` gives).  Protected: the paths under
    ``guarded`` (prefixes: a repository's endpoints), or with ``all_routes`` every path but
    those in ``open_paths`` (the health probes)."""

    def __init__(self, app, token, render, all_routes=False, guarded=(), open_paths=()):
        self.app, self.render, self.all_routes = app, render, all_routes
        self.guarded, self.open_paths = tuple(guarded), frozenset(open_paths)
        self._expected = f"Bearer {token}".encode("ascii")

    def protects(self, path):
        if self.all_routes:
            return path not in self.open_paths
        return path.startswith(self.guarded) if self.guarded else False

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not self.protects(scope["path"]):
            return await self.app(scope, receive, send)
        given = dict(scope["headers"]).get(b"authorization", b"")
        if hmac.compare_digest(given, self._expected):
            return await self.app(scope, receive, send)
        why = "no Authorization header" if not given else "a wrong token"
        error = Unauthenticated(f"{scope['path']} needs Authorization: Bearer TOKEN (the token "
                                f"of Deploy.auth_token_file); the request had {why}",
                                "Authorization", code="invalid_api_key")
        await send_error(send, self.render, scope["path"], error,
                         [(b"www-authenticate", b'Bearer realm="ppvarlen"')])


# ---------------------------------------------------------------- last resort

class AnswerErrors:
    """ASGI middleware, outermost: every answer's route template, status and time go to
    ``observe(route, status, seconds)``; a bug that escaped every route still gets the
    project's JSON answer (500, logged once with its traceback, ``on_error()`` counts it); a
    client that went away is one line (counted as 499, nginx's "client closed request").
    One layer for both: each middleware layer costs every request an extra coroutine."""

    def __init__(self, app, observe, render, on_error=None):
        self.app, self.observe, self.render, self.on_error = app, observe, render, on_error

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start, status = time.perf_counter(), [None]

        async def tracking_send(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except ClientGone as e:
            log.info("%s", e)
        except Exception:  # noqa: BLE001 - the last place an answer can still be given
            log.exception("%s %s: internal error", scope.get("method"), scope.get("path"))
            if self.on_error is not None:
                self.on_error()
            if status[0] is None:  # else the answer had begun: the connection just closes
                status[0] = await send_error(send, self.render, scope.get("path", ""),
                                             InternalError("internal server error (logged); "
                                                           "retry, or report it with the "
                                                           "server's log"))
        finally:
            route = getattr(scope.get("route"), "path", "unmatched")
            self.observe(route, status[0] or 499, time.perf_counter() - start)
