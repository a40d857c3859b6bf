"""ppvarlen: variable-length text through PaddlePaddle without padding waste."""
from . import _quiet  # noqa: F401  (must run before paddle / paddlenlp are imported)

__version__ = "0.1.0"
