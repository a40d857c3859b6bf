"""benchmarks/busy_start.py reads the grid times a server started planning with from its ready
line, in this checkout's wording and in the wording of checkouts before it (a variant may be
an older checkout).  No server runs here."""
import pytest
from script_loader import load_script


@pytest.fixture(scope="module")
def bench():
    return load_script("benchmarks/busy_start.py")


@pytest.mark.parametrize("line", [
    "[21:13:17] INFO ppvarlen.serve.repository: model m version 1 ready (classification, paddle "
    "backend, 1 worker(s)); batches run on a grid of 4 held shapes (rows [1, 4], widths [64, 256]),"
    " planned with each shape's fastest run so far (/metrics.json shape_grid_ms follows them; now,"
    " ms, rows x width: 1x64 37.5, 1x256 132.7, 4x64 151.9, 4x256 545.3)",
    "[21:13:17] INFO ppvarlen.serve.repository: model m version 1 ready (classification, paddle "
    "backend, 1 worker(s)); batches run on a grid of 4 held shapes (rows [1, 4], widths [64, 256]),"
    " planned with their measured times (ms, rows x width: 1x64 37.5, 1x256 132.7, 4x64 151.9, "
    "4x256 545.3)"])
def test_the_ready_line_gives_the_grid_times(bench, tmp_path, line):
    log = tmp_path / "serve.log"
    log.write_text("[21:13:00] INFO ppvarlen.serve.server: serving ...\n" + line + "\n")
    assert bench.ready_times(str(log)) == {"1x64": 37.5, "1x256": 132.7, "4x64": 151.9,
                                           "4x256": 545.3}
    log.write_text("a model without a grid: a forward pass costs as much as 16 tokens\n")
    assert bench.ready_times(str(log)) is None
