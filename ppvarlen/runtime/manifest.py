"""Read an export directory's manifest.json and refuse a tampered or incomplete export.

The manifest (written by ``ppvarlen.export.manifest``) is the only description of
the model a serving host has: task, labels, tokenizer, length policy, backends and
the sha256 of every file.  Every file the predictor will read must be listed and
must match its hash, so a swapped weight file or a vocab from another run is
refused at load instead of giving quietly wrong predictions.
"""
import json
import os
import re

from ppvarlen.tasks import TASKS, get_task
from ppvarlen.utils.io import read_bounded, sha256_file

MANIFEST = "manifest.json"
# read whole into memory: a manifest lists files and parity numbers (kilobytes); a larger one
# is refused before it is parsed
MAX_MANIFEST_BYTES = 64 << 20
# a model repository's version directory: a positive integer in ASCII digits (str.isdigit()
# also takes '²', int() does not); the repository reads it, the exporter refuses to rewrite one
VERSION_NAME = re.compile(r"[0-9]+", re.ASCII)


def is_version_name(name):
    """Whether ``name`` names a version directory of a model repository (a positive integer)."""
    return bool(VERSION_NAME.fullmatch(name)) and int(name) > 0
SUPPORTED_FORMATS = (1,)
SERVED_TASKS = [name for name, task in TASKS.items() if task.servable]


class UnservableExportError(ValueError):
    """The export directory cannot be served as it is; the message says why and what to do."""


def _where(export_dir):
    return os.path.join(export_dir, MANIFEST)


def load_manifest(export_dir, verify=True, allow_external_symlinks=False):
    """Return the manifest dict of ``export_dir``; with ``verify`` check every file's sha256
    and that no file is a symbolic link out of the directory (unless allowed)."""
    path = _where(export_dir)
    if not os.path.isdir(export_dir):
        raise UnservableExportError(f"export directory not found: {export_dir}; pass the --output directory "
                                    f"of tools/export.py")
    if not os.path.exists(path):
        raise UnservableExportError(f"{path} is missing: {export_dir} is not an export directory "
                                    f"(re-run tools/export.py to write one)")
    try:
        manifest = json.loads(read_bounded(path, MAX_MANIFEST_BYTES, "a manifest").decode("utf-8"))
    except OSError as e:
        raise UnservableExportError(f"{path}: cannot be read ({e.strerror}); re-run "
                                    f"tools/export.py to write the export again") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UnservableExportError(f"{path}: not valid JSON ({e}); re-run tools/export.py") from None
    if not isinstance(manifest, dict):
        raise UnservableExportError(f"{path}: top level must be an object")
    for key in ("format_version", "task", "label_names", "tokenizer", "max_len", "long_text",
                "backends", "files"):
        if key not in manifest:
            raise UnservableExportError(f"{path}: key {key!r} is missing; the export is incomplete or from "
                                        f"an older ppvarlen — re-export it")
    if manifest["format_version"] not in SUPPORTED_FORMATS:
        raise UnservableExportError(f"{path}: format_version {manifest['format_version']!r} is not supported "
                                    f"(this ppvarlen reads {list(SUPPORTED_FORMATS)}); re-export or upgrade")
    if manifest["task"] not in SERVED_TASKS:
        raise UnservableExportError(f"{path}: task {manifest['task']!r} cannot be served; served tasks: "
                                    f"{SERVED_TASKS}")
    shape = _shape_problem(manifest)
    if shape:
        raise UnservableExportError(f"{path}: {shape}; re-run tools/export.py")
    problems = get_task(manifest["task"]).manifest_problems(manifest)
    if problems:
        raise UnservableExportError(f"{path}: {problems[0]}")
    if verify:
        verify_files(export_dir, manifest, allow_external_symlinks)
    return manifest


def _shape_problem(manifest):
    """What is wrong with the shape of the keys the loaders read as maps (a hand-edited or
    hostile manifest.json: it is not in its own hash list), or None."""
    if not isinstance(manifest["backends"], dict):
        return "key 'backends' must be an object of backend -> entry"
    precisions = manifest.get("precisions")
    if precisions is not None and not (isinstance(precisions, dict) and all(
            isinstance(v, list) and all(isinstance(p, str) for p in v)
            for v in precisions.values())):
        return ("key 'precisions' must map each backend to a list of precision names, e.g. "
                '{"onnx": ["fp32", "int8"]}')
    measured = manifest.get("precision_measured")
    if measured is not None and not (isinstance(measured, dict) and all(
            isinstance(v, dict) for k, v in measured.items() if k in manifest["backends"])):
        return "key 'precision_measured' must map each backend to an object of precision -> entry"
    return None


def outside(path, root):
    """True when the resolved ``path`` is not ``root`` (resolved) or below it."""
    return os.path.commonpath([os.path.realpath(path), os.path.realpath(root)]) != \
        os.path.realpath(root)


def refuse_external_link(export_dir, full):
    if outside(full, export_dir):
        raise UnservableExportError(f"{full}: a symbolic link to {os.path.realpath(full)}, "
                                    f"outside the export directory {export_dir}; copy the file "
                                    f"into the export, or set Deploy.allow_external_symlinks: "
                                    f"true to serve it as it is")


def verify_files(export_dir, manifest, allow_external_symlinks=False):
    """Every file in ``manifest['files']`` exists, has the recorded sha256 and (unless allowed)
    stays inside the export directory once symbolic links are followed."""
    files = manifest["files"]
    if not isinstance(files, dict) or not files:
        raise UnservableExportError(f"{_where(export_dir)}: 'files' must map relative paths to sha256")
    if not allow_external_symlinks:
        refuse_external_link(export_dir, _where(export_dir))
    for rel, expected in files.items():
        full = resolve(export_dir, rel)
        if not allow_external_symlinks:
            refuse_external_link(export_dir, full)
        if not os.path.exists(full):
            raise UnservableExportError(f"{full}: listed in the manifest but missing; copy the whole export "
                                        f"directory")
        try:
            actual = file_sha256(full)
        except OSError as e:  # a FIFO, a directory, no read permission, an I/O error
            raise UnservableExportError(f"{full}: listed in the manifest but cannot be read "
                                        f"({e.strerror}); copy the export's files themselves, "
                                        f"readable by the user that serves") from None
        if actual != expected:
            raise UnservableExportError(f"{full}: sha256 {actual[:12]}… does not match the manifest's "
                                        f"{str(expected)[:12]}…; the file was modified or comes from "
                                        f"another export — re-export instead of mixing files")


# sha256 of the files this process hashed, by what the file system says of each: a file written
# since (content, size, mode, a replacement under the same name) has another mtime or ctime, and
# ctime cannot be set back.  Loading one export again (auto's candidates, clones, reloads) then
# reads nothing twice.
_DIGESTS = {}
_DIGESTS_MAX = 4096


def _identity(st):
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def file_sha256(path):
    """sha256 of ``path``, hashed once per process while the file is unchanged."""
    key = (os.path.realpath(path), _identity(os.stat(path)))
    digest = _DIGESTS.get(key)
    if digest is None:
        digest = sha256_file(path)
        if _identity(os.stat(path)) == key[1]:  # not written while it was read
            if len(_DIGESTS) >= _DIGESTS_MAX:
                _DIGESTS.pop(next(iter(_DIGESTS)))
            _DIGESTS[key] = digest
    return digest


def resolve(export_dir, rel):
    """Join a manifest path to the export dir; refuse paths that leave it."""
    if os.path.isabs(rel) or ".." in rel.replace("\\", "/").split("/"):
        raise UnservableExportError(f"{_where(export_dir)}: file path {rel!r} must be relative and stay "
                                    f"inside the export directory")
    return os.path.join(export_dir, rel)


def require_listed(export_dir, manifest, rel):
    """A file the predictor reads must be covered by the manifest's hashes."""
    if rel not in manifest["files"]:
        raise UnservableExportError(f"{_where(export_dir)}: {rel!r} is used but has no sha256 in 'files'; "
                                    f"re-export so every file is checked")
    return resolve(export_dir, rel)
