"""The HTTP status of each refusal (``errors``) as the REST protocols answer it; a protocol
overrides the ones its specification words differently (the OpenAI API's 400 for 422)."""
from ppvarlen.serve import errors

HTTP_STATUS = {errors.MalformedRequest: 400, errors.Unauthenticated: 401,
               errors.ModelNotFound: 404, errors.NoRepository: 404,
               errors.NoSuchRoute: 404, errors.MethodNotAllowed: 405,
               errors.AmbiguousModel: 409, errors.LoadRefused: 409,
               errors.BodyTooLarge: 413, errors.UnsupportedEncoding: 415,
               errors.InvalidInput: 422,
               errors.PredictionFailed: 500, errors.InternalError: 500,
               errors.Draining: 503, errors.Overloaded: 503, errors.ModelNotReady: 503,
               errors.NonFiniteAnswer: 503, errors.DeadlineExceeded: 503}
RETRY_AFTER = {"Retry-After": "1"}


def http_status(error, overrides=None):
    """(status, headers or None) of ``error`` (a ``ServeError``)."""
    table = {**HTTP_STATUS, **(overrides or {})}
    status = next(table[k] for k in type(error).__mro__ if k in table)
    return status, (RETRY_AFTER if error.retry else None)
