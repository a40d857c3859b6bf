"""ppvarlen's own ``/predict`` protocol."""
