"""ppvarlen: variable-length text through PaddlePaddle without padding waste.

Importing the package (or any helper in it) changes nothing in the process: the process-wide
settings of ppvarlen's commands (warning filters, MKL_DEBUG_CPU_TYPE) are made when a command or
a Trainer starts (``ppvarlen.cli.command_settings``, ``ppvarlen._mkl.apply``).
"""

import os as _os
import sys as _sys

__version__ = "0.1.0"
# OMP_NUM_THREADS as found before Paddle's import, which writes "1" into the environment when
# the variable is unset (ppvarlen.utils.parallel tells that "1" from a limit someone set):
# None when unset, UNKNOWN when Paddle was imported first
UNKNOWN = "unknown: Paddle was imported before ppvarlen"
OMP_BEFORE_PADDLE = UNKNOWN if "paddle.base" in _sys.modules else \
    _os.environ.get("OMP_NUM_THREADS")
