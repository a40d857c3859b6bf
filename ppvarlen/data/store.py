"""Encoded-corpus store: one directory per split, token ids memory-mapped from disk.

API (what the dataset builder, the Ray job and benchmarks use)::

    fields = [StoreField("input_ids", "int32", ragged=True, length=True),
              StoreField("score", "int64"), StoreField("doc_id", "int64")]
    with StoreWriter(path, fields) as w:            # path appears only when complete
        w.add_columns({"input_ids": [np.array([2, 7, 3])], "score": [1], "doc_id": [0]})
        w.set_extra("doc_lengths", np.array([3]))   # split-level arrays besides the fields
        w.set_meta({"stats": {...}})                # JSON, merged into manifest.json
    split = StoreSplit(path)                        # opens the manifest, memory-maps the arrays
    len(split); split.lengths; split[i] -> {"input_ids": array, "score": np.int64, ...}
    split.row_lengths("input_ids"); split.extra("doc_lengths"); split.meta["stats"]

A ``StoreField`` is declared by the task (``ppvarlen.tasks``), never by the store: ``ragged``
fields hold a variable-length row per item (token ids, per-token tags), the others one scalar
per item; ``length=True`` ragged fields sum to the item's ``lengths`` entry (the samplers'
input; seq2seq declares two, source and target).  ``pad``/``key``/``lengths``/``shift`` say how a batch holds
the field (``data.collate`` reads them).  A new task adds fields without changing this module.

Files of a split directory: ``manifest.json`` (format, fields, count, the builder's meta),
``<ragged>.bin`` (the rows concatenated, raw little-endian, read with ``np.memmap``) with
``<ragged>.offsets.npy`` (int64, count + 1), ``<scalar>.npy``, ``lengths.npy`` and
``<extra>.npy``.  Format: raw ``.bin`` + ``.npy`` offsets, because it needs only numpy (the
paddle-free deploy host can read it), is written streaming at disk speed with no copy, and opens
as a memmap (pyarrow's IPC files also memmap but add a dependency and ListArray offsets; the
PaddleNLP indexed format ties one dtype and one ragged field per file pair and imports paddlenlp);
``IndexedTokens`` reads a user's PaddleNLP/Megatron ``.bin``/``.idx`` corpus as token ids.

Arrays are loaded with ``allow_pickle=False`` and the manifest is JSON: nothing is unpickled.
A writer builds in a temp directory next to ``path`` (named by ``owned_prefix``: a later writer
removes a dead one's), fsyncs every file and renames it into place, so a build killed at any
point leaves no directory a reader takes as complete (``StoreSplit`` refuses a directory without
a manifest of this ``FORMAT``).  A full disk raises ``DiskFullError`` naming the store, after
the temp directory is removed.

What a reader can vouch for: the manifest records every file's size and xxh3-64 checksum
(``files``; a ``.bin``'s computed as its bytes are written).  Every open checks each file's size
(and that the offsets, row counts and ``.bin`` sizes agree), so a cut-short or missing file is
refused before the first item is read; ``verify`` says when the content is hashed against the
checksums too: ``"always"``, or ``"once"``: unless the ``stamp`` file (written after a
verification that passed) records each file with the same size, mtime, ctime and inode (a
rewrite changes the ctime, which no user can set back), i.e. the first open after the store was
written or changed.  A file whose ctime is not older than the stamp's own is left out of the
stamp (a change within the same timestamp tick would not show) and hashed again next time.
A mismatch raises ``StoreDamagedError`` (a ``DataError``) naming the file and what is wrong.
"""
import contextlib
import json
import os
import shutil
import struct
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import NamedTuple

import numpy as np
import xxhash

from ..utils.io import (DirectAppender, DiskFullError, atomic_write_json, is_disk_full,
                        owned_prefix, reap_dead_owners)
from ..utils.log import get_logger
from .errors import DataError

log = get_logger("data.store")

# 2: the manifest records each file's size and checksum ("files")
FORMAT = "ppvarlen-store/2"
MANIFEST = "manifest.json"
HASH_BLOCK = 8 << 20  # bytes read per step when hashing a file
VERIFY = ("once", "always")


class StoreDamagedError(DataError):
    """A store file is missing, cut short or changed since it was written; ``file`` names it."""

    def __init__(self, file, problem, store):
        super().__init__(f"{file}: {problem}; the store {store} is damaged: rebuild it "
                         f"(Data.rebuild_cache: true) or delete the directory")
        self.file, self.problem, self.store = file, problem, store


def file_xxh3(path):
    """The xxh3-64 hex digest of a file's bytes (read in ``HASH_BLOCK`` steps)."""
    digest = xxhash.xxh3_64()
    buffer = bytearray(HASH_BLOCK)
    with open(path, "rb", buffering=0) as f, memoryview(buffer) as view:
        while n := f.readinto(buffer):
            digest.update(view[:n])
    return digest.hexdigest()


@dataclass(frozen=True)
class StoreField:
    """One per-item field a task stores: name, numpy dtype, a row per item or a scalar."""
    name: str
    dtype: str
    ragged: bool = False  # a variable-length row per item (ids, tags) instead of one value
    length: bool = False  # its row lengths add up to the item's length (ragged only)
    # how a batch holds it (data.collate): the collator reads these, it knows no field names
    pad: object = "pad_id"  # ragged: the pad value, an int or "pad_id" (the tokenizer's)
    key: str = ""           # the batch key (default: the name)
    lengths: str = ""       # ragged: the batch key of its row lengths (e.g. "seq_len")
    shift: bool = False     # ragged: teacher forcing, row -> <key>_in (pad) / <key>_out (-100)
    # False: stored and returned by ``dataset[i]`` (e.g. what a task's report reads: a
    # document's characters) but left out of collated batches; such a ragged row need not
    # align with the length field
    batch: bool = True

    def __post_init__(self):
        if self.length and not self.ragged:
            raise ValueError(f"StoreField {self.name!r}: only a ragged field can count as length")
        if (self.lengths or self.shift) and not self.ragged:
            raise ValueError(f"StoreField {self.name!r}: lengths/shift apply to a ragged field "
                             f"only")
        if not self.batch and (self.length or self.lengths or self.shift or self.key):
            raise ValueError(f"StoreField {self.name!r}: a field left out of batches has no "
                             f"length/lengths/shift/key")
        if not (self.pad == "pad_id" or isinstance(self.pad, int)):
            raise ValueError(f"StoreField {self.name!r}: pad must be an int or 'pad_id', "
                             f"got {self.pad!r}")
        np.dtype(self.dtype)  # an unknown dtype fails at declaration


def _fsync_dir(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class StoreWriter:
    """Streams items column-wise into a new split directory (see the module docstring)."""

    def __init__(self, path, fields):
        if not any(f.length for f in fields):
            raise ValueError("a store needs at least one length field (ragged, length=True)")
        self.path = os.path.abspath(path)
        self.fields = list(fields)
        parent = os.path.dirname(self.path)
        os.makedirs(parent, exist_ok=True)
        reap_dead_owners(parent)  # a killed writer's temp directory
        self.tmp = tempfile.mkdtemp(prefix=owned_prefix(".tmp-" + os.path.basename(self.path)),
                                    dir=parent)
        self.count = 0
        self._files = {}  # file name -> {"size", "xxh3"}, recorded in the manifest
        # the rows are read back through a memory map: written past the page cache; hashed as
        # they go (the bytes are in memory then: no second read)
        self._bins = {f.name: DirectAppender(os.path.join(self.tmp, f.name + ".bin"),
                                             digest=xxhash.xxh3_64())
                      for f in self.fields if f.ragged}
        # per-item columns (row lengths, scalars) go to temp files as they arrive, so the
        # writer's memory does not grow with the corpus; read back once on ``close``
        self._columns = {f.name: open(self._column_path(f.name), "wb") for f in self.fields}
        self._extras, self._meta = {}, {}

    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        if kind is None:
            self.close()
        else:
            self.abort()
        return False

    def add_columns(self, columns):
        """Append items given column-wise: ``{field: [row or value per item]}``."""
        self.add_packed(pack_columns(self.fields, columns))

    def add_packed(self, packed):
        """Append items packed by ``pack_columns`` (what encoding workers send back)."""
        with self._disk_full_aborts():
            self._add_packed(packed)

    @contextlib.contextmanager
    def _disk_full_aborts(self):
        """A full disk: the temp directory removed, then one ``DiskFullError`` naming the
        store and the bytes written to it so far."""
        try:
            yield
        except OSError as e:
            if not is_disk_full(e) or isinstance(e, DiskFullError):
                raise
            written = sum(f.size for f in self._bins.values()) + sum(
                f.tell() for f in self._columns.values() if not f.closed)
            self.abort()
            raise DiskFullError(self.path, None, f"encoding it ({written:,} bytes encoded "
                                                 f"when the disk filled)") from None

    def _add_packed(self, packed):
        n = None
        for f in self.fields:
            if f.ragged:
                flat, rows = packed[f.name]
                self._bins[f.name].write(_little_endian(flat, f.dtype))
                self._columns[f.name].write(_little_endian(rows, np.int64))
            else:
                rows = packed[f.name]
                self._columns[f.name].write(_little_endian(rows, f.dtype))
            if n is not None and len(rows) != n:
                raise ValueError(f"StoreWriter: field {f.name!r} has {len(rows)} items, "
                                 f"expected {n}")
            n = len(rows)
        self.count += n  # a store has at least one field (its length field)

    def set_extra(self, name, array):
        """A split-level array saved as ``<name>.npy`` (e.g. per-document lengths)."""
        self._extras[name] = np.asarray(array)

    def set_meta(self, meta):
        self._meta.update(meta)

    def _column_path(self, name):
        return os.path.join(self.tmp, f".{name}.column")  # removed before the rename

    def _column(self, name, dtype=np.int64):
        """A field's column written so far (a ragged field's: its row lengths)."""
        self._columns[name].flush()
        return np.fromfile(self._column_path(name), np.dtype(dtype).newbyteorder("<"))

    def lengths(self):
        """Item lengths so far: the sum of the length fields' rows."""
        return sum(self._column(f.name) for f in self.fields if f.length)

    def close(self):
        with self._disk_full_aborts():
            self._close()

    def _close(self):
        for name, f in self._bins.items():
            f.close()
            self._files[name + ".bin"] = {"size": f.size, "xxh3": f.digest.hexdigest()}
        for f in self.fields:
            if f.ragged:
                offsets = np.zeros(self.count + 1, np.int64)
                np.cumsum(self._column(f.name), out=offsets[1:])
                self._save(f.name + ".offsets", offsets)
                del offsets
            else:
                self._save(f.name, self._column(f.name, f.dtype).astype(f.dtype, copy=False))
        self._save("lengths", np.asarray(self.lengths(), np.int64).reshape(self.count))
        for name, f in self._columns.items():
            f.close()
            os.remove(self._column_path(name))
        for name, arr in self._extras.items():
            self._save(name, arr)
        manifest = {"format": FORMAT, "count": self.count,
                    "fields": [asdict(f) for f in self.fields],
                    "extras": sorted(self._extras), **self._meta,
                    "files": dict(sorted(self._files.items()))}
        with open(os.path.join(self.tmp, MANIFEST), "w", encoding="utf-8") as fh:
            json.dump(manifest, fh, indent=1, ensure_ascii=False)
            fh.flush()
            os.fsync(fh.fileno())
        _fsync_dir(self.tmp)
        os.chmod(self.tmp, 0o755)
        if os.path.exists(self.path):  # a stale split: replaced whole
            old = tempfile.mkdtemp(prefix=owned_prefix(".old-" + os.path.basename(self.path)),
                                   dir=os.path.dirname(self.path))
            os.rmdir(old)
            os.replace(self.path, old)
            shutil.rmtree(old, ignore_errors=True)
        os.replace(self.tmp, self.path)
        _fsync_dir(os.path.dirname(self.path))

    def _save(self, name, arr):
        path = os.path.join(self.tmp, name + ".npy")
        np.save(path, arr, allow_pickle=False)
        with open(path, "rb") as f:
            os.fsync(f.fileno())
        self._files[name + ".npy"] = {"size": os.path.getsize(path), "xxh3": file_xxh3(path)}

    def abort(self):
        """Remove the temp directory (again: a no-op)."""
        for f in self._bins.values():
            f.discard()
        for f in self._columns.values():
            f.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


def _little_endian(array, dtype):
    """The bytes of ``array`` as little-endian ``dtype``, not copied when they are already."""
    return memoryview(np.ascontiguousarray(array, np.dtype(dtype).newbyteorder("<"))).cast("B")


def pack_columns(fields, columns):
    """``{field: [row or value per item]}`` -> ``{ragged: (concatenated rows, row lengths),
    scalar: array}`` in the fields' dtypes (compact to send between processes)."""
    packed = {}
    for f in fields:
        if f.name not in columns:
            raise ValueError(f"StoreWriter: field {f.name!r} missing from the columns")
        col = columns[f.name]
        if f.ragged:
            rows = [np.asarray(r, dtype=f.dtype) for r in col]
            flat = np.concatenate(rows) if rows else np.zeros(0, f.dtype)
            packed[f.name] = (flat, np.fromiter((len(r) for r in rows), np.int64, len(rows)))
        else:
            packed[f.name] = np.asarray(col, dtype=f.dtype).reshape(len(col))
    return packed


class EncodedSlice(NamedTuple):
    """A slice of a split's examples encoded into items, as an encoding worker sends it back
    (``Task.encode_examples``): ``columns`` as ``pack_columns`` packs them, the [UNK] and real
    token counts, ``doc_lengths`` (int64: each document's tokens before the long-text policy)
    and ``long_text`` ({name: ``data.longtext.LongTextStats``} of the slice)."""

    columns: dict
    unk: int
    real: int
    doc_lengths: np.ndarray
    long_text: dict


def is_complete(path):
    try:
        with open(os.path.join(path, MANIFEST), encoding="utf-8") as fh:
            return json.load(fh).get("format") == FORMAT
    except (OSError, ValueError):
        return False


class StoreSplit:
    """Read side of one split directory: every array memory-mapped (``.npy`` and ragged rows).

    Opening checks every file's size, and hashes the content as ``verify`` says (the module
    docstring): a damaged store raises ``StoreDamagedError`` here, before any item is read.
    ``stamp``: the file recording a passed verification (None: none is kept, ``"once"`` hashes
    on every open).  Memmaps are opened lazily and dropped when pickled, so DataLoader worker
    processes (fork or spawn) reopen them instead of copying token ids.
    """

    def __init__(self, path, verify="once", stamp=None):
        if verify not in VERIFY:
            raise ValueError(f"StoreSplit: verify must be one of {VERIFY}, got {verify!r}")
        self.path = os.path.abspath(path)
        manifest_path = os.path.join(self.path, MANIFEST)
        try:
            with open(manifest_path, encoding="utf-8") as fh:
                self.meta = json.load(fh)
        except (OSError, ValueError) as e:
            raise DataError(f"{self.path}: not a complete ppvarlen store ({e}); delete the "
                            f"directory or rebuild with Data.rebuild_cache: true") from None
        if self.meta.get("format") != FORMAT:
            raise DataError(f"{manifest_path}: store format {self.meta.get('format')!r}, this "
                            f"ppvarlen reads {FORMAT!r}; rebuild with Data.rebuild_cache: true")
        self.fields = [StoreField(**f) for f in self.meta["fields"]]
        self.count = int(self.meta["count"])
        stats = self._check_sizes()
        self.lengths = self._load("lengths", self.count)
        self._offsets = {f.name: self._load(f.name + ".offsets", self.count + 1)
                         for f in self.fields if f.ragged}
        self._scalars = {f.name: self._load(f.name, self.count)
                         for f in self.fields if not f.ragged}
        self._check_offsets()
        self._maps = {}
        self.lease = None  # what keeps the directory from removal while read (data.cache)
        self._verify_content(stats, verify == "always", stamp)

    def _damaged(self, name, problem):
        return StoreDamagedError(os.path.join(self.path, name), problem, self.path)

    def _check_sizes(self):
        """Each file the manifest lists has the size it records -> {name: os.stat_result}."""
        files = self.meta.get("files")
        if not isinstance(files, dict):
            raise self._damaged(MANIFEST, "it lists no files with their sizes and checksums")
        stats = {}
        for name, want in files.items():
            if not (isinstance(want, dict) and type(want.get("size")) is int
                    and isinstance(want.get("xxh3"), str)) or os.path.basename(name) != name \
                    or name in ("", ".", ".."):
                raise self._damaged(MANIFEST, f"its entry for {name!r} is not a file of the store "
                                              f"with its size and xxh3 checksum")
            try:
                st = os.stat(os.path.join(self.path, name))
            except FileNotFoundError:
                raise self._damaged(name, "the file is missing") from None
            if st.st_size != want["size"]:
                raise self._damaged(name, f"{st.st_size:,} bytes where {want['size']:,} were "
                                          f"written: cut short or overwritten")
            stats[name] = st
        return stats

    def _load(self, name, count=None):
        # memory-mapped: a 10M-item split's per-item arrays are page cache the OS can drop,
        # not anonymous memory of every process that opens the store
        file = name + ".npy"
        try:
            arr = np.load(os.path.join(self.path, file), mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError) as e:
            raise self._damaged(file, f"not a readable .npy array ({e})") from None
        if count is not None and arr.shape[:1] != (count,):
            raise self._damaged(file, f"{arr.shape} values where the manifest counts {count} "
                                      f"items")
        return arr

    def _check_offsets(self):
        """Each ragged field's offsets start at 0 and end at its ``.bin``'s last row."""
        for f in self.fields:
            if not f.ragged:
                continue
            off = self._offsets[f.name]
            size = os.path.getsize(os.path.join(self.path, f.name + ".bin"))
            end = int(off[-1]) * np.dtype(f.dtype).itemsize
            if off[0] != 0 or end != size:
                raise self._damaged(f.name + ".offsets.npy",
                                    f"its rows end at byte {end:,} of {f.name}.bin, which has "
                                    f"{size:,}")

    def _verify_content(self, stats, always, stamp):
        """Hash the files a passed verification has not vouched for (all when ``always``)."""
        files = self.meta["files"]
        known = {} if always or stamp is None else _read_stamp(stamp)
        vouched = {}
        started, hashed = time.perf_counter(), 0
        for name, want in files.items():
            stat = _stat_key(stats[name]) + [want["xxh3"]]
            if known.get(name) != stat:
                got = file_xxh3(os.path.join(self.path, name))
                hashed += want["size"]
                if got != want["xxh3"]:
                    raise self._damaged(name, f"its content differs from what was written "
                                              f"(xxh3 {got}, the manifest records "
                                              f"{want['xxh3']})")
                if _stat_key(os.stat(os.path.join(self.path, name))) != stat[:-1]:
                    continue  # changed while hashed: not vouched for
            vouched[name] = stat
        if hashed:
            seconds = time.perf_counter() - started
            log.info("store: verified %s (%s bytes hashed in %.2f s)", self.path,
                     f"{hashed:,}", seconds)
        if stamp is not None and vouched != known:
            _write_stamp(stamp, vouched)

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_maps"] = {}
        state["lease"] = None  # held by the parent (a forked worker inherits its descriptor)
        return state

    def _rows(self, name):
        m = self._maps.get(name)
        if m is None:
            dtype = np.dtype(next(f.dtype for f in self.fields if f.name == name))
            path = os.path.join(self.path, name + ".bin")
            if os.path.getsize(path) == 0:  # np.memmap refuses an empty file
                m = np.zeros(0, dtype)
            else:
                m = np.memmap(path, dtype=dtype.newbyteorder("<"), mode="r")
            self._maps[name] = m
        return m

    def __len__(self):
        return self.count

    def __getitem__(self, i):
        if not -self.count <= i < self.count:
            raise IndexError(f"item {i} of a {self.count}-item store split")
        i = int(i) % self.count  # an empty split has no index in range
        out = {}
        for f in self.fields:
            if f.ragged:
                off = self._offsets[f.name]
                out[f.name] = np.asarray(self._rows(f.name)[off[i]:off[i + 1]])
            else:
                out[f.name] = self._scalars[f.name][i]
        return out

    def row_lengths(self, name):
        return np.diff(self._offsets[name])

    def column(self, name):
        """A scalar field's values (numpy, one per item)."""
        return self._scalars[name]

    def extra(self, name):
        return self._load(name) if name in self.meta.get("extras", ()) else None


def _stat_key(st):
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def _read_stamp(stamp):
    try:
        with open(stamp, encoding="utf-8") as f:
            known = json.load(f)
    except (OSError, ValueError):
        return {}
    return known if isinstance(known, dict) else {}


def _write_stamp(stamp, vouched):
    """Record ``vouched`` in ``stamp``, less the files changed in the stamp's own timestamp tick
    (their ctime would not show a change made right after)."""
    try:
        atomic_write_json(stamp, vouched)
        tick = os.stat(stamp).st_ctime_ns
        racy = {name for name, stat in vouched.items() if stat[2] >= tick}
        if racy:
            atomic_write_json(stamp, {k: v for k, v in vouched.items() if k not in racy})
    except OSError as e:  # e.g. a read-only cache: verified again next time
        log.debug("store: cannot record the verification in %s (%s)", stamp, e)


# ---------------------------------------------------------------- PaddleNLP / Megatron corpora

_IDX_MAGIC = b"MMIDIDX\x00\x00"
# the dtype codes of the indexed format (PaddleNLP's and Megatron's shared table)
_IDX_DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64,
               7: np.float32, 8: np.uint16, 9: np.uint32, 10: np.uint64}


class IndexedTokens:
    """A PaddleNLP/Megatron memory-mapped indexed corpus (``prefix.bin`` + ``prefix.idx``) as
    token-id rows: ``len``, ``lengths``, ``[i]`` -> numpy row.  Read with numpy here (the format
    is a small header + sizes + byte pointers) so reading needs no paddlenlp import."""

    def __init__(self, prefix):
        idx, bin_path = prefix + ".idx", prefix + ".bin"
        try:
            with open(idx, "rb") as fh:
                magic = fh.read(9)
                if magic != _IDX_MAGIC:
                    raise DataError(f"{idx}: not a memory-mapped indexed corpus (magic "
                                    f"{magic!r}); write it with paddlenlp.data.indexed_dataset "
                                    f"(impl mmap)")
                version, code, count, doc_count = struct.unpack("<QBQQ", fh.read(25))
                header = fh.tell()
            buf = np.memmap(idx, mode="r", dtype=np.uint8)
            self._bin = np.memmap(bin_path, mode="r", dtype=np.uint8)
        except (OSError, ValueError, struct.error) as e:  # missing, empty or cut-short files
            raise DataError(f"{prefix}: cannot read the indexed corpus ({e}); it needs "
                            f"{idx} and {bin_path} as paddlenlp writes them") from None
        if version != 1 or code not in _IDX_DTYPES:
            raise DataError(f"{idx}: index version {version} / dtype code {code} is not one "
                            f"this reader knows (version 1, codes {sorted(_IDX_DTYPES)})")
        self.dtype = np.dtype(_IDX_DTYPES[code])
        if len(buf) < header + 12 * count + 8 * doc_count:
            raise DataError(f"{idx}: {len(buf)} bytes, too few for the {count} items and "
                            f"{doc_count} documents its header lists; the file is cut short")
        self.lengths = np.frombuffer(buf, np.int32, count, header).astype(np.int64)
        self._pointers = np.frombuffer(buf, np.int64, count, header + 4 * count)
        self.doc_idx = np.frombuffer(buf, np.int64, doc_count, header + 12 * count)
        ends = self._pointers + self.lengths * self.dtype.itemsize
        if count and (min(self.lengths.min(), self._pointers.min()) < 0
                      or ends.max() > len(self._bin)):
            raise DataError(f"{bin_path}: the index places items outside its {len(self._bin)} "
                            f"bytes; {idx} was written for another .bin, or one is cut short")

    def __len__(self):
        return len(self.lengths)

    def __getitem__(self, i):
        start = int(self._pointers[i])
        return np.frombuffer(self._bin, self.dtype, int(self.lengths[i]), start)
