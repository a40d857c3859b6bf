"""The HTTP error every server route raises: status, message, the field at fault, headers."""


class ApiError(Exception):
    def __init__(self, status, message, field=None, headers=None, refused_texts=0):
        super().__init__(message)
        self.status, self.message, self.field, self.headers = status, message, field, headers
        self.refused_texts = refused_texts  # texts refused for what they hold (metrics)
