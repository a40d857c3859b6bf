"""Silence two known-harmless import-time warnings from Paddle's dependency chain, and keep
PaddleNLP's Hugging Face probes offline -- in ppvarlen's own commands only.

* ``paddle.utils.cpp_extension`` warns "No ccache found" on import; it only
  matters when compiling custom C++ ops, which ppvarlen never does.
* setuptools' ``_distutils_hack`` warns "Setuptools is replacing distutils"
  when PaddleNLP imports ``distutils``.
* PaddleNLP probes for an optional Hugging Face login at import: ``HF_HUB_OFFLINE`` /
  ``HF_DATASETS_OFFLINE`` = 1 unless the user set them.

Both filters match the exact message, so any other warning still shows; the Python processes a
command starts inherit them (``PYTHONWARNINGS``).  ``apply()`` is called by ``ppvarlen.cli``
when a command starts (before it imports paddle); ``import ppvarlen`` changes nothing, so a
user's script that imports a ppvarlen helper keeps its own warning filters and environment
(tests/test_hygiene.py checks both).
"""
import os
import warnings

QUIET_MESSAGES = (r"No ccache found", r"Setuptools is replacing distutils")
OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")


def apply(environ=None):
    """Install the filters and the offline defaults in this process; returns the log line."""
    environ = os.environ if environ is None else environ
    for message in QUIET_MESSAGES:
        warnings.filterwarnings("ignore", message=message, category=UserWarning)
    # and in the Python processes the command starts (the precision chooser, the ONNX export
    # worker): PYTHONWARNINGS matches the start of a message, as these filters do
    inherited = [f"ignore:{message}:UserWarning" for message in QUIET_MESSAGES]
    given = [f for f in environ.get("PYTHONWARNINGS", "").split(",") if f]
    environ["PYTHONWARNINGS"] = ",".join(given + [f for f in inherited if f not in given])
    set_here = [name for name in OFFLINE_VARIABLES if name not in environ]
    for name in set_here:
        environ[name] = "1"
    return (f"warnings silenced: {', '.join(QUIET_MESSAGES)}; "
            f"{', '.join(f'{n}=1' for n in set_here) or 'HF offline variables kept as set'}")
