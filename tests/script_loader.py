"""Load a repository script that is not a package module (benchmarks/*.py, tools/*.py) by path."""
import importlib.util
import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_script(relative_path, name=None):
    """The module of ``REPO/relative_path``, executed fresh (its ``__main__`` block not run)."""
    name = name or os.path.splitext(os.path.basename(relative_path))[0]
    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, relative_path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
