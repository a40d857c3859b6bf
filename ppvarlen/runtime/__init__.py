"""An export directory -> predictions, with no server: manifest, backends, precision
choice, predictor, admission and its row checks, file inference, embedding files.

Imports ``ppvarlen.data``, ``ppvarlen.tasks`` and ``ppvarlen.utils`` only; ``export``, ``doctor``,
``serve``, ``ppvarlen-infer`` and Ray batch inference build on it.
"""
