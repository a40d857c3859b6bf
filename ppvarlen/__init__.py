"""ppvarlen: variable-length text through PaddlePaddle without padding waste."""
from . import _quiet  # noqa: F401  (must run before paddle / paddlenlp are imported)
from . import _mkl  # noqa: F401  (before Paddle's first MKL call: MKL reads its CPU type then)

__version__ = "0.1.0"
