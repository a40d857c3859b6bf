"""ppvarlen: variable-length text through PaddlePaddle without padding waste.

Importing the package (or any helper in it) changes nothing in the process: the process-wide
settings of ppvarlen's commands (warning filters, MKL_DEBUG_CPU_TYPE) are made when a command or
a Trainer starts (``ppvarlen.cli.command_settings``, ``ppvarlen._mkl.apply``).
"""

__version__ = "0.1.0"
