"""Serving an export directory: predictor (paddle | onnx), dynamic batcher, HTTP server.

Needs only the export directory: imports ``ppvarlen.data`` and ``ppvarlen.utils``, never
``models``, ``engine`` or ``export``.  Public entry points:
``predictor.Predictor``, ``batcher.DynamicBatcher``, ``server.create_app`` / ``server.serve``,
``infer.run_file``, ``bench.run_benchmark``.
"""
