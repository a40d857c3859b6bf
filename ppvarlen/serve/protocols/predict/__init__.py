"""ppvarlen's own REST protocol: ``POST /predict``, ``/health`` and the metrics routes."""
from ppvarlen.serve.protocols.predict.routes import render_error, router  # noqa: F401
from ppvarlen.serve.protocols.predict.openapi import add_openapi, render_checks  # noqa: F401
