"""Load a repository script that is not a package module (benchmarks/*.py, tools/*.py) by path."""
import importlib.util
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_script(relative_path, name=None):
    """The module of ``REPO/relative_path``, executed fresh (its ``__main__`` block not run).
    Its directory is on ``sys.path`` while it loads, as when Python runs the script, so it
    imports its siblings (benchmarks/machine.py) the same way."""
    name = name or os.path.splitext(os.path.basename(relative_path))[0]
    path = os.path.join(REPO, relative_path)
    directory = os.path.dirname(path)
    added = directory not in sys.path
    if added:
        sys.path.insert(0, directory)
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        if added:
            sys.path.remove(directory)
    return module
