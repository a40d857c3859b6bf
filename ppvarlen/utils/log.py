"""One logger for the package; every command calls ``setup_logging`` (``ppvarlen.cli``), the
trainer again with ``Global.log_level``: one line format for train, eval, export, serve...

Lines go to stderr through ``tqdm.write``, which clears an active progress bar, writes the line
on its own, and redraws the bar below it: a log line never lands inside the bar's line.
"""
import logging
import sys

from tqdm import tqdm

_FMT = "[%(asctime)s] %(levelname)s %(name)s: %(message)s"


class BarSafeHandler(logging.StreamHandler):
    """A stream handler that writes around tqdm's progress bars (``tqdm.write``)."""

    def emit(self, record):
        try:
            tqdm.write(self.format(record), file=self.stream)
            self.flush()
        except Exception:  # noqa: BLE001 - logging's own contract: report, never raise
            self.handleError(record)


def get_logger(name="ppvarlen"):
    return logging.getLogger(name if name.startswith("ppvarlen") else "ppvarlen." + name)


def setup_logging(level=logging.INFO, log_file=None):
    root = logging.getLogger("ppvarlen")
    root.setLevel(level)
    root.handlers.clear()
    h = BarSafeHandler(sys.stderr)
    h.setFormatter(logging.Formatter(_FMT, "%H:%M:%S"))
    root.addHandler(h)
    if log_file:
        fh = logging.FileHandler(log_file, encoding="utf-8")
        fh.setFormatter(logging.Formatter(_FMT))
        root.addHandler(fh)
    root.propagate = False
    return root
