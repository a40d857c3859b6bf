"""Serving an export directory: the model repository and batcher, the protocols (``protocols/``)
and the transports they are spoken over (``http/``, ``grpc/``).  Loads exports through
``ppvarlen.runtime``; never imports models, engine, export or doctor.
"""
