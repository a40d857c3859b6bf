"""The OpenAI embeddings API: ``POST /v1/embeddings``, in the OpenAI error object."""
from ppvarlen.serve.protocols.openai.routes import (EDGE_PREFIXES, add_openapi,  # noqa: F401
                                                    render_error, router)

PATH_PREFIXES = EDGE_PREFIXES


def render_checks():
    """Nothing to check at admission: an embedding answer is the /predict one's vectors."""
    return []
