"""Dygraph -> static -> Paddle Inference / ONNX export, precisions, manifest and parity.

Entry point: ``ppvarlen.export.exporter.export_checkpoint``.
"""
from .errors import ExportFailedError  # noqa: F401
