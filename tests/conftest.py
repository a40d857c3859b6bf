"""Suite-wide test settings: the ``gpu`` marker (docs/TESTING.md).

Tests marked ``@pytest.mark.gpu`` need a CUDA build of Paddle (or onnxruntime-gpu) and a
visible GPU; elsewhere they are skipped with the reason.  Paddle is imported only when a
collected test carries the marker (most files never import it).
"""
import pytest


def gpu_status():
    """(usable, why) -- the same check tools/check_gpu.py makes before checking anything."""
    from ppvarlen.export.gpu_check import gpu_status as status

    return status()


def pytest_collection_modifyitems(config, items):
    marked = [item for item in items if item.get_closest_marker("gpu")]
    if not marked:
        return
    usable, why = gpu_status()
    if usable:
        return
    skip = pytest.mark.skip(reason=f"needs a GPU: {why}")
    for item in marked:
        item.add_marker(skip)
