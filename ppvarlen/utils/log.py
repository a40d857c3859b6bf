"""One logger for the package; entry points call ``setup_logging`` once."""
import logging
import sys

_FMT = "[%(asctime)s] %(levelname)s %(name)s: %(message)s"


def get_logger(name="ppvarlen"):
    return logging.getLogger(name if name.startswith("ppvarlen") else "ppvarlen." + name)


def setup_logging(level=logging.INFO, log_file=None):
    root = logging.getLogger("ppvarlen")
    root.setLevel(level)
    root.handlers.clear()
    h = logging.StreamHandler(sys.stderr)
    h.setFormatter(logging.Formatter(_FMT, "%H:%M:%S"))
    root.addHandler(h)
    if log_file:
        fh = logging.FileHandler(log_file, encoding="utf-8")
        fh.setFormatter(logging.Formatter(_FMT))
        root.addHandler(fh)
    root.propagate = False
    return root
