"""Silence two known-harmless import-time warnings from Paddle's dependency chain.

* ``paddle.utils.cpp_extension`` warns "No ccache found" on import; it only
  matters when compiling custom C++ ops, which ppvarlen never does.
* setuptools' ``_distutils_hack`` warns "Setuptools is replacing distutils"
  when PaddleNLP imports ``distutils``.

Both filters match the exact message, so any other warning still shows.
Imported first by ``ppvarlen/__init__.py``.
"""
import os
import warnings

warnings.filterwarnings("ignore", message=r"No ccache found", category=UserWarning)
warnings.filterwarnings("ignore", message=r"Setuptools is replacing distutils", category=UserWarning)
# PaddleNLP probes for an optional Hugging Face login at import; keep it offline.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
