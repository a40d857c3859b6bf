class ExportFailedError(ValueError):
    """An export that cannot be produced or fails its parity check; the message says why."""
