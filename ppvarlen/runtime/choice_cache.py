"""The host's ``auto`` choices, remembered between starts (``Deploy.choice_cache``).

``precision: auto``, ``backend: auto`` and ``threads: auto`` time candidates when an export
loads (``precision_choice``): seconds to a minute of a server's or ``ppvarlen-infer``'s
start-up.  Timed again with the same export, settings, host and code, the candidates and
batches are the same, so the choice is kept in ``$XDG_CACHE_HOME/ppvarlen/choices/KEY.json``
and the next start loads what it names (and admits it) without timing
(``$PPVARLEN_CHOICE_CACHE_DIR`` names another directory).

``KEY`` is a digest of everything the timing depended on (``key_parts``): the export's
``manifest.json`` (it lists every file's sha256), the loader's settings (backend, threads,
batch limits, oneDNN settings; not the export's path), the precision asked for, the
workload it was timed on (a server's requests or files), this CPU
(model name, flags, usable cores), the versions of ppvarlen, Paddle and ONNX Runtime, and the
source of the modules that choose, admit and time (a changed rule times again).  An entry is
JSON (never a pickle), written atomically (a temporary file named for its writer's pid, renamed
into place; a dead writer's is removed by the next write) and sealed with the sha256 of its
fields; one that cannot be read, does not match its sha256, whose parts differ from the key's,
or whose choice names what cannot load here, is ignored and replaced; the newest
``MAX_ENTRIES`` are kept.  The log line of a cached choice names its file: deleting
it times again.  A directory that cannot be written costs the next start its timing, with a
warning, never the start itself.

Not kept: one math thread chosen by a wall-time comparison with the cores
(``threads_choice.wall_clock_verdict``), which neighbours' work can decide.

A Paddle oneDNN server's shape grid times itself at warm-up (``Predictor.warmup``): its
fastest times are kept too (``keep_grid_times``, after warm-up and when the version stops,
with what traffic lowered), keyed by the engine's settings and the source that sets the
engine up and times the grid (``grid_parts``), and the next start of the same engine seeds its
grid with them and runs one pass, which sets the kernels up (``kept_grid_times``).
"""
import datetime
import functools
import hashlib
import importlib.metadata
import json
import os

from ppvarlen.utils.io import atomic_write_json, reap_dead_owners, sha256_file, user_cache_dir
from ppvarlen.utils.log import get_logger

from ppvarlen.runtime import threads_choice
from ppvarlen.runtime.backends import PRECISIONS

log = get_logger("runtime.precision")
DIR_VARIABLE = "PPVARLEN_CHOICE_CACHE_DIR"  # another directory (a test's, a benchmark's)
FORMAT = 2  # of an entry; bumped when its fields change (2: sealed with its sha256)
MAX_ENTRIES = 256  # the newest are kept
MAX_ENTRY_BYTES = 1 << 20  # an entry is a few kB; a larger file is not read whole
CPU_FLAG_PREFIXES = ("avx", "amx", "fma", "sse4")
# whose source decides what is chosen: a change to any of them times again
DECIDING_MODULES = ("precision_choice", "threads_choice", "timing", "admission")
# whose source decides a oneDNN grid's shape times (the engine's settings, the warm-up)
GRID_MODULES = ("backends", "predictor")
VERSIONED = ("ppvarlen", "paddlepaddle", "onnxruntime")


def cache_dir():
    """``$PPVARLEN_CHOICE_CACHE_DIR``, else ``$XDG_CACHE_HOME/ppvarlen/choices``."""
    return os.environ.get(DIR_VARIABLE) or user_cache_dir("choices")


def _cpuinfo():
    """{field: value} of the first processor in /proc/cpuinfo ({} where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            first = f.read().split("\n\n", 1)[0]
    except OSError:
        return {}
    pairs = (line.partition(":") for line in first.splitlines())
    return {k.strip(): v.strip() for k, _, v in pairs}


def cpu_flags(info=None):
    """The CPU's vector/matrix flags (/proc/cpuinfo, or ``info``: ``_cpuinfo()`` read already)
    that decide which kernels run fast."""
    flags = (_cpuinfo() if info is None else info).get("flags", "").split()
    return sorted(f for f in flags if f.startswith(CPU_FLAG_PREFIXES))


def _cpu():
    """(model name, vector/matrix flags, usable cores) of this host: what ranks the
    candidates."""
    info = _cpuinfo()
    return {"model": info.get("model name", ""), "flags": cpu_flags(info),
            "cores": threads_choice.math_cores()}


def _version(dist):
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.lru_cache(maxsize=None)
def _code_digest(modules=DECIDING_MODULES):
    """sha256 over the source of ``modules`` (in this package), read once per process: the
    code this process runs, not a later edit on disk."""
    here = os.path.dirname(os.path.abspath(__file__))
    digest = hashlib.sha256()
    for name in modules:
        digest.update(sha256_file(os.path.join(here, name + ".py")).encode())
    return digest.hexdigest()


def _manifest_sha256(export_dir):
    try:
        return sha256_file(os.path.join(export_dir, "manifest.json"))
    except OSError:
        return None


def _host_parts(**parts):
    """``parts`` with this CPU and the versions, as an entry reads back (tuples as lists)."""
    parts = {"format": FORMAT, **parts, "cpu": _cpu(),
             "versions": {d: _version(d) for d in VERSIONED}}
    return json.loads(json.dumps(parts))


def key_parts(loader, export_dir, requested, workload):
    """What a choice for ``loader`` (``precision_choice.describe_loader``'s JSON) on
    ``export_dir`` asked for ``requested``, timed on ``workload``'s batches, depends on -> a
    dict, or None when the manifest cannot be read (the load then says why)."""
    manifest = _manifest_sha256(export_dir)
    if manifest is None:
        return None
    return _host_parts(manifest_sha256=manifest, loader=loader, requested=requested,
                       workload=workload, code=_code_digest())


def grid_parts(predictor):
    """What the shape times of ``predictor``'s oneDNN grid (``backends.ShapeGrid``) depend on:
    the export, the engine's settings (precision, math threads, oneDNN cache mode, the grid's
    shapes), the source that sets the engine up and times the grid, this CPU and the versions
    -> a dict, or None (no grid, or no manifest to read)."""
    grid = getattr(predictor.engine, "shape_grid", None)
    manifest = _manifest_sha256(predictor.export_dir) if grid is not None else None
    if manifest is None:
        return None
    return _host_parts(kind="grid_times", manifest_sha256=manifest,
                       engine=predictor.engine.settings, code=_code_digest(GRID_MODULES))


def kept_grid_times(predictor):
    """{(rows, width): seconds} a previous start of this engine kept (``keep_grid_times``),
    logged with its file, or None."""
    parts = grid_parts(predictor)
    entry = lookup(parts, _usable_grid_times(parts))
    if entry is None:
        return None
    log.info("oneDNN shape grid: the fastest time of each shape kept in %s (%s) seeds this "
             "start, which runs one warm-up pass instead of timing the grid (delete the file "
             "to time it)", entry["path"], entry["chosen_at"])
    return {tuple(map(int, k.split("x"))): v for k, v in entry["choice"]["seconds"].items()}


def keep_grid_times(predictor):
    """Keep the fastest time of each shape of ``predictor``'s grid for the next start."""
    grid = getattr(predictor.engine, "shape_grid", None)
    if grid is not None and grid.costs:
        store(grid_parts(predictor),
              {"seconds": {f"{r}x{w}": t for (r, w), t in sorted(grid.costs.items())}})


def path_of(parts):
    key = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]
    return os.path.join(cache_dir(), key + ".json")


def lookup(parts, usable=None):
    """The cached entry for ``parts`` -> {"choice", "chosen_at", "path"}, or None.
    ``usable(choice)``: whether a read choice can be used (default: a load's choice)."""
    if parts is None:
        return None
    path = path_of(parts)
    try:
        with open(path, "rb") as f:
            blob = f.read(MAX_ENTRY_BYTES + 1)
        if len(blob) > MAX_ENTRY_BYTES:
            raise ValueError(f"larger than {MAX_ENTRY_BYTES:,} bytes, no entry is")
        entry = json.loads(blob)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError) as e:
        log.warning("choice cache: %s cannot be read (%s); timing again", path, e)
        return None
    if not isinstance(entry, dict) or entry.get("sha256") != seal(entry)["sha256"]:
        log.warning("choice cache: %s does not match its sha256 (damaged or edited); timing "
                    "again", path)
        return None
    if entry.get("parts") != parts or not (usable or _usable)(entry.get("choice")):
        log.warning("choice cache: %s is not the entry of its key; timing again", path)
        return None
    return {"choice": entry["choice"], "chosen_at": entry.get("chosen_at"), "path": path}


def seal(entry):
    """``entry`` ({"parts", "choice", "chosen_at"}) with the sha256 of those fields, which
    ``lookup`` checks when it reads the entry back."""
    fields = {k: entry.get(k) for k in ("parts", "choice", "chosen_at")}
    blob = json.dumps(fields, sort_keys=True, ensure_ascii=False).encode("utf-8")
    return {**fields, "sha256": hashlib.sha256(blob).hexdigest()}


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


def _usable_grid_times(parts):
    """Whether a read entry holds a positive time for every shape of the grid of ``parts``."""
    def usable(choice):
        seconds = choice.get("seconds") if isinstance(choice, dict) else None
        rows, widths = parts["engine"]["onednn_shape_grid"] if parts else ((), ())
        shapes = {f"{r}x{w}" for r in rows for w in widths}
        return isinstance(seconds, dict) and set(seconds) == set(shapes) and all(
            type(t) is float and 0 < t < 3600 for t in seconds.values())
    return usable


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
        reap_dead_owners(os.path.dirname(path))  # a killed writer's temporary file
        atomic_write_json(path, seal({"parts": parts, "choice": choice, "chosen_at": at}))
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
