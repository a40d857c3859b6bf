"""What the server refuses a request for, in its own terms: one type per meaning, no status code.

The data plane, the repository and the transports raise these; each protocol renders them in
its own form (``protocols/*``: an HTTP status and body, a gRPC status code), and the HTTP
statuses the REST protocols share are ``http.status.HTTP_STATUS``.
"""
SHOWN_CHARS = 64


def shown(value, limit=SHOWN_CHARS):
    """A client's value as an error message quotes it: repr, cut to ``limit`` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"… ({len(text)} characters)"


class ServeError(Exception):
    """A request the server does not answer: ``message`` says why and how to fix it, ``field``
    names the request field at fault (None: no single one), ``refused_texts`` counts texts
    refused for what they hold (metrics), ``code`` is a machine-readable reason where a
    protocol has one (the OpenAI API's)."""

    retry = False  # the client may send the same request again later

    def __init__(self, message, field=None, refused_texts=0, code=None):
        super().__init__(message)
        self.message, self.field = message, field
        self.refused_texts, self.code = refused_texts, code


class MalformedRequest(ServeError):
    """The bytes are not a request: not JSON, not UTF-8, a bad header, a broken message."""


class InvalidInput(ServeError):
    """A well-formed request whose fields (or one of whose items) this model cannot take."""


class UnsupportedEncoding(ServeError):
    """A body in a Content-Encoding the server does not decode (it decodes gzip and deflate)."""


class BodyTooLarge(ServeError):
    """The request is larger than ``Deploy.max_body_bytes``."""


class Unauthenticated(ServeError):
    """A protected call without the bearer token of ``Deploy.auth_token_file``."""


class ModelNotFound(ServeError):
    """No ready model or version answers to the name (the message says what is served)."""


class NoSuchRoute(ServeError):
    """A path no route of the server answers."""


class MethodNotAllowed(ServeError):
    """A route asked with a method it does not have."""


class AmbiguousModel(ServeError):
    """A request that names no model, on a server holding several."""


class NoRepository(ServeError):
    """A model repository call on a server that serves one export."""


class LoadRefused(ServeError):
    """The repository's newest version of a model failed its checks (the reason is named)."""


class Draining(ServeError):
    """The server is shutting down."""

    retry = True


class Overloaded(ServeError):
    """The version's queue is full."""

    retry = True


class DeadlineExceeded(ServeError):
    """The request's own timeout passed while its texts waited in the queue (Triton: "Request
    timeout expired")."""


class ModelNotReady(ServeError):
    """The version picked was unloaded before the request reached its queue."""

    retry = True


class NonFiniteAnswer(ServeError):
    """The model answered NaN/inf; the version is marked unhealthy."""


class PredictionFailed(ServeError):
    """The model raised on an item (a bug: the server log has the details)."""


class InternalError(ServeError):
    """A bug escaped every route (logged with its traceback)."""
