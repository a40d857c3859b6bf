"""The host's ``auto`` choices, remembered between starts (``Deploy.choice_cache``).

``precision: auto``, ``backend: auto`` and ``threads: auto`` time candidates when an export
loads (``precision_choice``): seconds to a minute of a server's or ``ppvarlen-infer``'s
start-up.  Timed again with the same export, settings, host and code, the candidates and
batches are the same, so the choice is kept in ``$XDG_CACHE_HOME/ppvarlen/choices/KEY.json``
and the next start loads what it names (and admits it) without timing
(``$PPVARLEN_CHOICE_CACHE_DIR`` names another directory).

``KEY`` is a digest of everything the timing depended on (``key_parts``): the export's
``manifest.json`` (it lists every file's sha256), the loader's settings (backend, threads,
batch limits, oneDNN settings; not the export's path), the precision asked for, this CPU
(model name, flags, usable cores), the versions of ppvarlen, Paddle and ONNX Runtime, and the
source of the modules that choose, admit and time (a changed rule times again).  An entry is
JSON (never a pickle), written atomically; one that cannot be read, whose parts differ from the
key's, or whose choice names what cannot load here, is ignored and replaced; the newest
``MAX_ENTRIES`` are kept.  The log line of a cached choice names its file: deleting
it times again.  A directory that cannot be written costs the next start its timing, with a
warning, never the start itself.
"""
import datetime
import hashlib
import importlib.metadata
import json
import os

from ppvarlen.utils.io import atomic_write_json, sha256_file, user_cache_dir
from ppvarlen.utils.log import get_logger

from ppvarlen.runtime import threads_choice
from ppvarlen.runtime.backends import PRECISIONS

log = get_logger("runtime.precision")
DIR_VARIABLE = "PPVARLEN_CHOICE_CACHE_DIR"  # another directory (a test's, a benchmark's)
FORMAT = 1  # of an entry; bumped when its fields change
MAX_ENTRIES = 256  # the newest are kept
# whose source decides what is chosen: a change to any of them times again
DECIDING_MODULES = ("precision_choice", "threads_choice", "timing", "admission")
VERSIONED = ("ppvarlen", "paddlepaddle", "onnxruntime")


def cache_dir():
    """``$PPVARLEN_CHOICE_CACHE_DIR``, else ``$XDG_CACHE_HOME/ppvarlen/choices``."""
    return os.environ.get(DIR_VARIABLE) or user_cache_dir("choices")


def _cpu():
    """(model name, flags, usable cores) of this host: what ranks the candidates."""
    model, flags = "", ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and not model:
                    model = line.partition(":")[2].strip()
                elif line.startswith("flags") and not flags:
                    flags = " ".join(sorted(line.partition(":")[2].split()))
    except OSError:
        pass
    return {"model": model, "flags": flags, "cores": threads_choice.math_cores()}


def _version(dist):
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _code_digest():
    here = os.path.dirname(os.path.abspath(__file__))
    digest = hashlib.sha256()
    for name in DECIDING_MODULES:
        digest.update(sha256_file(os.path.join(here, name + ".py")).encode())
    return digest.hexdigest()


def key_parts(loader, export_dir, requested):
    """What a choice for ``loader`` (``precision_choice.describe_loader``'s JSON) on
    ``export_dir`` asked for ``requested`` depends on -> a dict, or None when the manifest
    cannot be read (the load then says why)."""
    try:
        manifest = sha256_file(os.path.join(export_dir, "manifest.json"))
    except OSError:
        return None
    parts = {"format": FORMAT, "manifest_sha256": manifest, "loader": loader,
             "requested": requested, "cpu": _cpu(),
             "versions": {d: _version(d) for d in VERSIONED}, "code": _code_digest()}
    return json.loads(json.dumps(parts))  # as an entry reads back (tuples become lists)


def path_of(parts):
    key = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]
    return os.path.join(cache_dir(), key + ".json")


def lookup(parts):
    """The cached entry for ``parts`` -> {"choice", "chosen_at", "path"}, or None."""
    if parts is None:
        return None
    path = path_of(parts)
    try:
        with open(path, encoding="utf-8") as f:
            entry = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        log.warning("choice cache: %s cannot be read (%s); timing again", path, e)
        return None
    if not isinstance(entry, dict) or entry.get("parts") != parts \
            or not _usable(entry.get("choice")):
        log.warning("choice cache: %s is not the entry of its key; timing again", path)
        return None
    return {"choice": entry["choice"], "chosen_at": entry.get("chosen_at"), "path": path}


def _usable(choice):
    """Whether a read choice names what a load can take: a precision and backend by name, a
    thread count within this host's cores."""
    if not isinstance(choice, dict) or not ("precision" in choice or "threads" in choice):
        return False
    if "backend" in choice and choice["backend"] not in PRECISIONS:
        return False
    held = PRECISIONS.get(choice.get("backend"), set().union(*PRECISIONS.values()))
    if "precision" in choice and choice["precision"] not in held:
        return False
    threads = choice.get("threads", 1)
    return type(threads) is int and 1 <= threads <= threads_choice.math_cores()


def _prune(folder):
    """Drop the oldest entries past ``MAX_ENTRIES`` (each export and setting adds one)."""
    try:
        names = [os.path.join(folder, n) for n in os.listdir(folder) if n.endswith(".json")]
        if len(names) <= MAX_ENTRIES:
            return
        names.sort(key=os.path.getmtime)
        for path in names[:len(names) - MAX_ENTRIES]:
            os.remove(path)
    except OSError:
        pass  # another process pruned first, or the folder went away: nothing to keep bounded


def store(parts, choice):
    """Keep ``choice`` for ``parts`` -> its path, or None when it could not be written."""
    if parts is None:
        return None
    path = path_of(parts)
    at = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        atomic_write_json(path, {"parts": parts, "choice": choice, "chosen_at": at})
    except OSError as e:
        log.warning("choice cache: could not write %s (%s); the next start times again "
                    "(Deploy.choice_cache: false stops trying)", path, e)
        return None
    _prune(os.path.dirname(path))
    return path


def forget(entry):
    """Remove a cached entry whose choice no longer loads or passes admission here."""
    try:
        os.remove(entry["path"])
    except OSError:
        pass
