"""The HTTP error every server route raises (status, message, the field at fault, headers) and
the JSON body it is answered with, which depends on the route's protocol."""

OPENAI_PREFIX = "/v1/"  # routes_openai: the OpenAI API's error object
OIP_PREFIX = "/v2"  # the Open Inference Protocol's {"error": message}


class ApiError(Exception):
    def __init__(self, status, message, field=None, headers=None, refused_texts=0, code=None):
        super().__init__(message)
        self.status, self.message, self.field, self.headers = status, message, field, headers
        self.refused_texts = refused_texts  # texts refused for what they hold (metrics)
        self.code = code  # a machine-readable reason, where the protocol has one (OpenAI's)

    def body(self, path):
        """The JSON body answering this error on ``path`` (``error_body``)."""
        return error_body(path, self.status, self.message, self.field, self.code)


def error_body(path, status, message, field=None, code=None):
    """The JSON body of an error answer on ``path``: under /v1/ the OpenAI API's
    ``{"error": {"message", "type", "param", "code"}}``, under /v2 the protocol's ``{"error":
    message}``, elsewhere ``{"error": message, "field": name}``."""
    if path.startswith(OPENAI_PREFIX):
        kind = "invalid_request_error" if status < 500 else "server_error"
        return {"error": {"message": message, "type": kind, "param": field, "code": code}}
    if path.startswith(OIP_PREFIX):
        return {"error": message}
    return {"error": message, "field": field}
