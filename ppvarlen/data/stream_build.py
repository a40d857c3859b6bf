"""Streaming store build for line files (JSONL / TSV, plain or gzip'd): workers get chunks of
raw lines, never the parsed corpus, and the parent holds nothing that grows with it but numpy
arrays.

Pass 1 (``scan``): each worker reads its chunk (a byte range of a plain file, or raw bytes the
parent decompressed from a ``.gz``), parses and checks every line with ``data.readers``' parsers
and messages (``file:line``), puts each example in its split (its file's, or carved from the
train file by ``data.splits``' stable hash) and returns counts: lines, skipped lines by
reason, raw labels per split, the train split's token counts and 64-bit hashes of the split
keys (the cross-split overlap).  The parent merges them in chunk order into the corpus stats,
the label names and the vocabulary.
Every line is parsed once: pass 1 also returns the chunk's kept examples packed as compact
columns (``pack_examples``: a string field as one UTF-8 blob + offsets, an int field as an
int64 array), which the parent appends to an anonymous temp file in the cache directory
(``ScanResult.spill``, gone when the build ends or dies; about the texts' size on disk).
Pass 2 (``encode``): each worker reads its chunk's columns back (``os.pread`` of the inherited
file; a mapper's workers get the bytes with the job), maps labels and encodes with the task's
function (``dataset._SliceEncoder``); the parent appends the results in chunk order to one
``SplitSink`` per split.  Chunk boundaries do not change a byte: the store, vocabulary
and corpus stats are those of the in-memory path (``corpora.user_files`` +
``dataset._encode_split``; tests compare them file by file).

Not streamed (``plan`` returns None and the in-memory path reads them): Parquet, tag-scheme
checked formats (tagging reads its lines in order over all files), pair vocabularies
(seq2seq), ``Data.limit``, extra corpora, a first line that does not tell the task, and labels
mixing names and ids under ``Data.skip_invalid``.
Hand-written rather than ``datasets``/Arrow: the per-line checks and messages are ppvarlen's,
and the workers are the same fork pool (``data.parallel``) that needs no pickled tokenizer.

Reading is bounded as the in-memory path's is (``readers.ReadLimits``): files are opened with
``readers.open_data_file`` (a ``.gz`` within ``Data.max_decompressed_ratio``), the parent holds
at most ``Data.max_line_bytes`` of an unfinished line (``_line_chunks``), and the workers check
each line of their chunk against that bound; either way the error is raised in input order,
as a bad line's is.
"""
import hashlib
import json
import os
import tempfile
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
from tqdm.auto import tqdm

from .corpora.base import Corpus
from .errors import DataError
from . import parallel
from .corpora.registry import _check_tag_scheme
from .corpora.user_files import logger
from .parallel import ordered_map
from .readers import (_SKIP_HINT, DEFAULT_TASK, FORMATS, BadLine, ReadLimits, _decoded_lines,
                      _is_tsv_header, _label_id, _task_from_first_line, decode_line,
                      expand_inputs, long_line_error, open_data_file, parse_json_bytes)
from .splits import SPLITS, example_key, split_method, stable_split
from .vocab import TextEncoder, split_items

CHUNK_BYTES = 4 << 20  # a chunk of whole lines: a few thousand examples, a few MB per worker
LINE_FORMATS = ("jsonl", "tsv")


class NotStreamable(Exception):
    """Found while scanning: this corpus needs the in-memory path (``plan`` did not know yet)."""


@dataclass(frozen=True)
class Chunk:
    """Whole lines of one file: bytes [offset, offset + size) of a plain file, or ``data``
    (a gzip'd file's decompressed lines); ``first_line`` numbers its first line (1-based).
    ``error``: reading the file stopped here (a line over Data.max_line_bytes, a gzip bomb); the
    chunk carries the message so that it is raised in input order, as a bad line's is."""

    role: str  # the Data key's split: train / dev / test
    path: str
    first_line: int
    offset: int = 0
    size: int = 0
    data: bytes = None
    error: str = None

    def raw_lines(self):
        if self.data is not None:
            data = self.data
        else:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read(self.size)
        lines = data.split(b"\n")
        if lines and not lines[-1]:
            lines.pop()  # the newline ending the last line opens no new one
        return lines


def _chunks_of(role, path, limits=None, ship=False):
    """Chunks of whole lines, in order, at least one per file (an empty file is reported).
    ``ship``: every chunk carries its bytes (workers on other machines cannot read ``path``);
    otherwise only a gzip'd file's do and a worker reads its byte range itself."""
    limits = limits or ReadLimits.of()
    with open_data_file(path, limits) as f:
        yield from _line_chunks(role, path, f, limits.max_line_bytes,
                                carry_data=ship or path.endswith(".gz"))


def _line_chunks(role, path, f, max_line_bytes, carry_data):
    """``_chunks_of`` over the open binary file ``f``.

    Each block is read once and searched once, for its last line end.  A line that runs past
    a block is kept as the list of its pieces and joined once, when its end is found, so the
    work is linear in the file's size however long its lines (joining the pieces block by
    block would copy a long line again for every block it spans).  Once an unfinished line
    holds more than ``max_line_bytes``, the chunks end with one that carries the error."""
    line, offset, sent = 1, 0, False
    open_line, open_bytes = [], 0  # the pieces of the line the last block ended in
    while True:
        try:
            block = f.read(CHUNK_BYTES)
        except DataError as e:  # a .gz file beyond Data.max_decompressed_ratio, or broken
            yield Chunk(role, path, line, offset, error=str(e))
            return
        cut = block.rfind(b"\n") + 1
        if block and not cut:
            open_line.append(block)
            open_bytes += len(block)
            if open_bytes > max_line_bytes:
                yield Chunk(role, path, line, offset,
                            error=str(long_line_error(f"{path}:{line}", max_line_bytes)))
                return
            continue
        end = cut if block else 0  # at the end of the file the open line is the last one
        body = b"".join(open_line + [block[:end]])
        open_line = [block[end:]] if end < len(block) else []
        open_bytes = len(block) - end
        if body or not sent:
            yield Chunk(role, path, line, offset, len(body), body if carry_data else None)
            sent = True
        line += body.count(b"\n")
        offset += len(body)
        if not block:
            return


def _lines(chunk, max_line_bytes, decode=True):
    """(line number, text or BadLine) as ``readers._decoded_lines`` gives them (not
    ``decode``: the raw bytes); DataError for the chunk's read error or a line over
    ``max_line_bytes`` (the message that path gives)."""
    if chunk.error is not None:
        raise DataError(chunk.error)
    for k, raw in enumerate(chunk.raw_lines()):
        n = chunk.first_line + k
        if len(raw) > max_line_bytes:
            raise long_line_error(f"{chunk.path}:{n}", max_line_bytes)
        yield n, decode_line(raw, n) if decode else raw


@dataclass
class Plan:
    """What the scan needs to know before it starts (all picklable plain values)."""

    fmt: str
    task: str
    files: dict  # role -> [paths]
    specs: dict  # role -> the Data key's value
    skip_invalid: bool
    split_seed: int
    label_names: list = None  # given (Data.label_names) or None
    carve: tuple = ()  # splits carved from the train file
    count_vocab: bool = False
    kind: str = "char"
    lowercase: bool = False
    texts_of: object = None
    ship_bytes: bool = False  # chunks carry their lines (a mapper's workers may be elsewhere)
    limits: ReadLimits = field(default_factory=ReadLimits.of)

    def chunks(self):
        for role in SPLITS:
            for path in self.files.get(role, ()):
                yield from _chunks_of(role, path, self.limits, self.ship_bytes)


def plan(cfg, extra_corpora=()):
    """A ``Plan`` for ``Data`` (``cfg``) when the corpus can be streamed, else None."""
    if cfg.corpus not in LINE_FORMATS or cfg.limit is not None or extra_corpora \
            or not cfg.train_file:
        return None
    specs = {s: cfg.get(f"{s}_file") for s in SPLITS}
    files = {s: expand_inputs(spec) for s, spec in specs.items() if spec}
    limits = ReadLimits.of(cfg)
    task = cfg.task
    if cfg.corpus == "tsv":
        task = task or DEFAULT_TASK
    elif task is None:
        task = _first_line_task(files["train"][0], cfg.skip_invalid, limits)
    fmt = FORMATS.get(task)
    if fmt is None or (cfg.corpus == "tsv" and not fmt.tsv) or not fmt.checked_line_by_line:
        return None
    return Plan(cfg.corpus, task, files, {s: v for s, v in specs.items() if v},
                bool(cfg.skip_invalid), cfg.split_seed, cfg.get("label_names"),
                tuple(s for s in ("dev", "test") if s not in files),
                ship_bytes=parallel.has_mapper(), limits=limits)


def _first_line_task(path, skip_invalid, limits):
    """The task the first JSON line's fields tell (as ``readers.read_file``), else None."""
    try:
        for n, line in _decoded_lines(path, limits):
            if isinstance(line, BadLine):
                if not skip_invalid:
                    return None  # the in-memory path reports it
                continue
            if line.strip():
                try:
                    return _task_from_first_line(path, n, line)
                except DataError:
                    return None
    except DataError:
        return None
    return None


# ------------------------------------------------------------------------- pass 1: scan

@dataclass
class ChunkScan:
    role: str
    path: str
    lines: int = 0
    header: bool = False
    examples: int = 0  # valid lines (before label checks)
    error: str = None  # the first bad line's message (not skip_invalid): raised in order
    skipped: Counter = field(default_factory=Counter)
    first_skipped: dict = field(default_factory=dict)  # reason -> (line, message)
    label_skipped: Counter = field(default_factory=Counter)
    label_first: dict = field(default_factory=dict)
    label_error: str = None  # the first unknown label (raised after every line is read)
    kinds: dict = field(default_factory=dict)  # str/int -> (line, label) first seen
    first_label: object = None
    sizes: dict = field(default_factory=dict)  # split -> examples
    labels: dict = field(default_factory=dict)  # split -> Counter of raw labels
    keys: dict = field(default_factory=dict)  # split -> uint64 hashes of the split keys
    counts: Counter = None  # the train split's token counts
    split_codes: np.ndarray = None  # carved train file: SPLITS index of each kept example
    parsed: bytes = None  # the kept examples, ``pack_examples``'d (pass 2 parses no line again)


def _parse(plan, n, line, chunk):
    if isinstance(line, BadLine):
        raise line
    if plan.fmt == "tsv":
        return FORMATS[plan.task].tsv(line)
    return parse_json_bytes(line, n, plan.task)  # a JSONL line comes undecoded


def _examples(plan, chunk, scan):
    """Yield (line, example) of the chunk's valid lines, counting lines and skips in ``scan``."""
    for n, line in _lines(chunk, plan.limits.max_line_bytes, plan.fmt == "tsv"):
        if plan.fmt == "tsv" and n == 1 and isinstance(line, str) and \
                _is_tsv_header(line, FORMATS[plan.task].fields):
            scan.header = True
            continue
        scan.lines += 1
        try:
            ex = _parse(plan, n, line, chunk)
        except BadLine as bad:
            if not plan.skip_invalid:
                scan.error = f"{chunk.path}:{n}: {bad.message} {_SKIP_HINT}"
                return
            scan.skipped[bad.reason] += 1
            scan.first_skipped.setdefault(bad.reason, (n, bad.message))
            continue
        yield n, ex


def _unknown_label(plan, ex, index):
    if index is None or "label" not in ex or _label_id(ex["label"], index) is not None:
        return None
    names = plan.label_names
    return (f"label {ex['label']!r} is not one of the {len(names)} classes {list(names)}; fix "
            f"the label or list it in Data.label_names")


def _split_of_key(plan, key):
    s = stable_split(key, plan.split_seed)
    return s if s in plan.carve else "train"


def _key_view(ex):
    """The example as ``example_key`` sees it in the in-memory path: labels already ids."""
    return {**ex, "label": 0} if isinstance(ex.get("label"), str) else ex


def _key_hash(key):
    return int.from_bytes(hashlib.blake2b(key.encode("utf-8", "surrogatepass"),
                                          digest_size=8).digest(), "little")


def _kept(plan, chunk, scan):
    """Yield (line, example) of the chunk's examples that pass the label check."""
    index = None if plan.label_names is None else \
        {name: i for i, name in enumerate(plan.label_names)}
    for n, ex in _examples(plan, chunk, scan):
        scan.examples += 1
        problem = _unknown_label(plan, ex, index)
        if problem is not None:
            if not plan.skip_invalid:
                scan.label_error = scan.label_error or \
                    f"{chunk.path}:{n}: {problem} {_SKIP_HINT}"
            else:
                scan.label_skipped["unknown_label"] += 1
                scan.label_first.setdefault("unknown_label", (n, problem))
                continue
        yield n, ex


class Scanner:
    def __init__(self, plan):
        self.plan = plan

    def __call__(self, chunk):
        plan = self.plan
        scan = ChunkScan(chunk.role, chunk.path)
        keys, train, codes, kept = {}, [], [], []
        carve = chunk.role == "train" and plan.carve
        try:
            for n, ex in _kept(plan, chunk, scan):
                kept.append(ex)
                key = example_key(_key_view(ex))
                split = chunk.role
                if carve:
                    split = _split_of_key(plan, key)
                    codes.append(SPLITS.index(split))
                label = ex.get("label")
                if label is not None:
                    kind = "str" if isinstance(label, str) else "int"
                    scan.kinds.setdefault(kind, (n, label))
                    if scan.first_label is None:
                        scan.first_label = label
                    per_label = scan.labels.get(split)
                    if per_label is None:  # not setdefault: that makes a Counter per line
                        per_label = scan.labels[split] = Counter()
                    per_label[label] += 1
                scan.sizes[split] = scan.sizes.get(split, 0) + 1
                keys.setdefault(split, []).append(_key_hash(key))
                if plan.count_vocab and split == "train":
                    train.append(ex)
        except DataError as e:  # a line over Data.max_line_bytes, a gzip bomb: in input order
            scan.error = str(e)
            return scan
        scan.keys = {s: np.asarray(v, np.uint64) for s, v in keys.items()}
        scan.parsed = pack_examples(kept)
        if carve:
            scan.split_codes = np.asarray(codes, np.uint8)
        if plan.count_vocab:
            scan.counts = TextEncoder.token_counts(split_items(train, plan.texts_of),
                                                   plan.kind, plan.lowercase)
        return scan


@dataclass
class ScanResult:
    corpus: Corpus  # splits hold example counts, not examples
    counts: Counter  # train token counts (None if not counted)
    bases: list  # per chunk: split -> doc id of its first example
    split_codes: list  # per chunk: its ``ChunkScan.split_codes`` (pass 2 hashes no text again)
    roles: list  # per chunk: the Data key's split it was read for
    parsed: list  # per chunk: (offset, size) of its packed examples in ``spill``
    spill: object  # the temp file of the packed examples (``close`` removes it)

    def close(self):
        self.spill.close()


def scan(plan, cfg, num_proc, spill_dir=None):
    """Pass 1 over every chunk -> ``ScanResult`` (raises the first bad line in input order).
    The packed examples go to an anonymous temp file in ``spill_dir`` (None: the system's)."""
    spill = tempfile.TemporaryFile(dir=spill_dir)
    try:
        return _scan(plan, cfg, num_proc, spill)
    except BaseException:
        spill.close()
        raise


def _scan(plan, cfg, num_proc, spill):
    per_file, counts, bases, codes = {}, Counter() if plan.count_vocab else None, [], []
    roles, parsed, offset = [], [], 0
    sizes = dict.fromkeys(SPLITS, 0)
    labels = {s: Counter() for s in SPLITS}
    keys = {s: [] for s in SPLITS}
    kinds, first_label, label_error = {}, None, None
    size = sum(os.path.getsize(p) for ps in plan.files.values() for p in ps)
    bar = tqdm(desc="read", unit=" lines", unit_scale=True, mininterval=2,
               disable=size < (64 << 20))
    current = None
    for sc in ordered_map(Scanner(plan), plan.chunks(), num_proc):
        if current is not None and sc.path != current.path:
            _check_file(current)
        if sc.error is not None:
            raise DataError(sc.error)
        current = _merge_file(per_file, sc)
        bases.append(dict(sizes))
        codes.append(sc.split_codes)
        roles.append(sc.role)
        spill.write(sc.parsed)
        parsed.append((offset, len(sc.parsed)))
        offset += len(sc.parsed)
        for s, n in sc.sizes.items():
            sizes[s] += n
            keys[s].append(sc.keys[s])
            labels[s].update(sc.labels.get(s, {}))
        for kind, (n, lab) in sc.kinds.items():
            kinds.setdefault(kind, (f"{sc.path}:{n}", lab))
        if first_label is None:
            first_label = sc.first_label
        label_error = label_error or sc.label_error
        if counts is not None:
            counts.update(sc.counts)
        bar.update(sc.lines)
    bar.close()
    if current is not None:
        _check_file(current)
    names = _label_names(plan, kinds, first_label, labels)
    if label_error:
        raise DataError(label_error)
    spill.flush()
    return ScanResult(_corpus(plan, cfg, per_file, sizes, labels, keys, names), counts, bases,
                      codes, roles, parsed, spill)


def _merge_file(per_file, sc):
    fd = per_file.setdefault(sc.path, ChunkScan(sc.role, sc.path))
    fd.lines += sc.lines
    fd.header = fd.header or sc.header
    fd.examples += sc.examples
    fd.skipped.update(sc.skipped)
    for reason, first in sc.first_skipped.items():
        fd.first_skipped.setdefault(reason, first)
    fd.label_skipped.update(sc.label_skipped)
    for reason, first in sc.label_first.items():
        fd.label_first.setdefault(reason, first)
    return fd


def _check_file(fd):
    if not fd.examples:
        raise DataError(f"{fd.path}: no valid examples ({fd.lines} lines read"
                        f"{', all skipped as invalid' if fd.skipped else ''}); check the file")


def _label_names(plan, kinds, first_label, labels):
    """The label names as ``readers._map_class_labels`` finds them (None: no labels)."""
    fmt = FORMATS[plan.task]
    if not fmt.labelled:
        return []
    if plan.label_names is not None:
        return list(plan.label_names)
    kind = "str" if isinstance(first_label, str) else "int"
    other = "int" if kind == "str" else "str"
    if other in kinds:
        if plan.skip_invalid:
            raise NotStreamable("labels mix names and ids under Data.skip_invalid")
        where, lab = kinds[other]
        raise DataError(f"{where}: label {lab!r} is a {'name' if other == 'str' else 'class id'} "
                        f"but the first label ({first_label!r}) is a "
                        f"{'name' if kind == 'str' else 'class id'}; use names or ids throughout "
                        f"{_SKIP_HINT}")
    seen = set().union(*(c.keys() for c in labels.values()))
    return sorted(seen) if kind == "str" else [str(i) for i in range(max(seen) + 1)]


def _file_stats(plan, role, fds):
    """``FileData.stats()`` of a split's file, or of its shards merged (``read_files``)."""
    multi = len(fds) > 1
    out = {"path": plan.specs[role] if multi else fds[0].path,
           "lines": sum(fd.lines for fd in fds),
           "examples": sum(fd.examples - sum(fd.label_skipped.values()) for fd in fds)}
    if fds[0].header:
        out["header_line"] = True
    skipped, first = Counter(), {}
    for fd in fds:
        skipped.update(fd.skipped)
        for reason, (n, msg) in fd.first_skipped.items():
            first.setdefault(reason, f"{fd.path} line {n}: {msg}" if multi
                             else f"line {n}: {msg}")
    for fd in fds:  # labels are checked after every file is read
        skipped.update(fd.label_skipped)
        for reason, (n, msg) in fd.label_first.items():
            first.setdefault(reason, f"{fd.path}:{n}: {msg}" if multi else f"line {n}: {msg}")
    if skipped:
        out["skipped"] = dict(sorted(skipped.items()))
        out["first_skipped"] = dict(sorted(first.items()))
    return out, sum(skipped.values())


def _corpus(plan, cfg, per_file, sizes, labels, keys, names):
    files, skipped_total = {}, 0
    for role, paths in plan.files.items():
        files[role], n = _file_stats(plan, role, [per_file[p] for p in paths])
        skipped_total += n
    stats = {"corpus": plan.fmt, "task": plan.task,
             "task_from": "Data.task" if cfg.task else "fields of the first line",
             "files": files,
             "split": {"sizes": dict(sizes),
                       "from": {s: ("file" if s in plan.files else "train_file, by stable hash")
                                for s in SPLITS}},
             "skipped_total": skipped_total}
    if len(plan.files) < 3:
        stats["split"]["method"] = split_method(plan.split_seed)
    unique = {s: np.unique(np.concatenate(keys[s])) if keys[s] else np.zeros(0, np.uint64)
              for s in SPLITS}
    overlap = {}
    for a, b in (("train", "dev"), ("train", "test"), ("dev", "test")):
        n = len(np.intersect1d(unique[a], unique[b], assume_unique=True))
        if n:
            overlap[f"{a}&{b}"] = n
    if overlap:
        stats["split"]["texts_in_two_splits"] = overlap
        logger.warning("the same text appears in two splits %s: evaluation on it is optimistic; "
                       "remove the duplicates from your files", overlap)
    if FORMATS[plan.task].labelled:
        index = {name: i for i, name in enumerate(names)}
        stats["per_label"] = {}
        for s in SPLITS:
            by_id = Counter()
            for lab, c in labels[s].items():
                by_id[_label_id(lab, index)] += c
            stats["per_label"][s] = {name: by_id.get(i, 0) for i, name in enumerate(names)}
    corpus = Corpus(plan.task, dict(sizes), names, stats)
    _check_tag_scheme(cfg, corpus)
    return corpus


# ----------------------------------------------------------------------- pass 2: encode

class _PackedChunkEncoder:
    """Encodes a chunk's examples of the wanted splits -> {split: ``_SliceEncoder`` result}."""

    def __init__(self, encoders, names, fd):
        self.encoders = encoders  # split -> dataset._SliceEncoder
        self.names, self.fd = names, fd

    def __call__(self, job):
        role, bases, codes, parsed = job
        if isinstance(parsed, tuple):  # (offset, size) in the spill file this process can read
            offset, size = parsed
            parsed = os.pread(self.fd, size, offset)
        index = {name: i for i, name in enumerate(self.names)}
        rows = {}
        for k, ex in enumerate(unpack_examples(parsed)):
            split = role if codes is None else SPLITS[codes[k]]
            if split in self.encoders:
                if "label" in ex:
                    ex["label"] = _label_id(ex["label"], index)
                rows.setdefault(split, []).append(ex)
        return {s: self.encoders[s](_At(r, bases[s]), bases[s], bases[s] + len(r))
                for s, r in rows.items()}


class _At:
    """A chunk's rows answering at the split-wide indices (doc ids) the encoder reads."""

    def __init__(self, rows, start):
        self.rows, self.start = rows, start

    def __getitem__(self, i):
        return self.rows[i - self.start]


def encode(plan, result, encoders, sinks, num_proc):
    """Pass 2: every chunk's packed examples encoded on the workers, appended to ``sinks`` in
    input order.  Forked workers read the spill file themselves; a mapper's (which may run
    elsewhere) get the bytes with their job."""
    fd = result.spill.fileno()
    ship = plan.ship_bytes or parallel.has_mapper()
    parsed = ((lambda ref: os.pread(fd, ref[1], ref[0])) if ship else (lambda ref: ref))
    jobs = ((role, bases, codes, parsed(ref)) for role, bases, codes, ref in
            zip(result.roles, result.bases, result.split_codes, result.parsed))
    for out in ordered_map(_PackedChunkEncoder(encoders, result.corpus.label_names, fd), jobs,
                           num_proc):
        for split, res in out.items():
            sinks[split].add(res)


# ------------------------------------------------------------- packed examples

def pack_examples(examples):
    """Examples (dicts with the same keys) -> bytes: a JSON header, then per field a string
    column as int64 UTF-8 offsets + the UTF-8 blob, an int column as int64 values, any other
    column (e.g. a list of answers) as its values' JSON.  Plain bytes, nothing pickled: the
    spill of pass 1 is read back by ``unpack_examples`` without parsing a line again."""
    names = list(examples[0]) if examples else []
    if any(list(ex) != names for ex in examples):
        names = []
        columns = [("", "json", [json.dumps(ex, ensure_ascii=False).encode("utf-8",
                                                                            "surrogatepass")
                                 for ex in examples])]
    else:
        columns = []
        for name in names:
            values = [ex[name] for ex in examples]
            if all(type(v) is str for v in values):
                columns.append((name, "str", [v.encode("utf-8", "surrogatepass")
                                              for v in values]))
            elif all(type(v) is int for v in values) and \
                    all(-(1 << 63) <= v < (1 << 63) for v in values):
                columns.append((name, "int", np.asarray(values, "<i8").tobytes()))
            else:
                columns.append((name, "json", [json.dumps(v, ensure_ascii=False).encode(
                    "utf-8", "surrogatepass") for v in values]))
    parts, fields = [], []
    for name, kind, data in columns:
        if kind == "int":
            parts.append(data)
            fields.append([name, kind, len(data)])
        else:
            offsets = np.zeros(len(data) + 1, "<i8")
            np.cumsum([len(b) for b in data], out=offsets[1:])
            blob = b"".join(data)
            parts += [offsets.tobytes(), blob]
            fields.append([name, kind, len(blob)])
    header = json.dumps({"count": len(examples), "fields": fields}).encode()
    return len(header).to_bytes(8, "little") + header + b"".join(parts)


def unpack_examples(data):
    """``pack_examples``' bytes -> the examples (dicts in the same key order)."""
    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + size])
    n, pos, columns = header["count"], 8 + size, []
    view = memoryview(data)
    for name, kind, nbytes in header["fields"]:
        if kind == "int":
            columns.append((name, np.frombuffer(data, "<i8", n, pos).tolist()))
            pos += nbytes
            continue
        offsets = np.frombuffer(data, "<i8", n + 1, pos).tolist()
        pos += 8 * (n + 1)
        blob = view[pos:pos + nbytes]
        pos += nbytes
        texts = [str(blob[a:b], "utf-8", "surrogatepass") for a, b in zip(offsets, offsets[1:])]
        columns.append((name, texts if kind == "str" else [json.loads(t) for t in texts]))
    if len(columns) == 1 and columns[0][0] == "" and n:
        return columns[0][1]  # whole examples as JSON (their keys differ)
    return [dict(zip([c[0] for c in columns], row)) for row in zip(*[c[1] for c in columns])] \
        if columns else [{} for _ in range(n)]
