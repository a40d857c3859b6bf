"""Every corpus as ordered chunks of records, read in two passes: the one ingestion path.

``plan(data_cfg)`` -> a frozen ``Plan`` of the user's files (JSONL / TSV, plain or gzip'd, a
directory or a glob of shards; Parquet, one chunk per row group), or a ``MemoryPlan`` of
a corpus already in memory (the built-in corpora: one chunk per slice of a split).

Pass 1 (``scan``): each worker reads one chunk (``data.chunks``), parses and checks every
record with ``data.readers``' parsers and messages (``file:line``), hashes its split key (the
split of a train file's example comes from ``data.splits``' stable hash), counts the train
split's tokens (``vocab.TokenCounting``) and packs the chunk's kept examples as compact columns
(``chunks.pack_examples``) into an anonymous temp file (gone when the build ends or dies; read
and written past the page cache, ``utils.io.BlockFile``), at room the parent keeps for the
chunk, or sends them back when they do not fit.
The parent merges the chunks in input order: the label, split, overlap, limit and stats rules
are written once, here (``_Merge``); the tag-scheme checks of tagging data run over the merged
tags in chunk order with ``data.readers``' checks.  ``Scanned`` is the result: the ``Corpus``
(splits hold example counts), the token counts and the pass-2 jobs.

Pass 2 (``Scanned.jobs``, read by ``ChunkReader``): a job's examples read back from the temp file
(inherited by the workers; a mapper's workers get the bytes with the job), with label ids, their
split and the doc id of the first.  The code that encodes them with a task sits above the tasks
(``ppvarlen/store_build.py``): control flows down, nothing is handed in here.
Chunk boundaries change no byte of a store.

Reading is bounded (``readers.ReadLimits``): the parent holds at most ``Data.max_line_bytes``
of an unfinished line (``data.chunks``) and the workers check each line (a Parquet text cell)
against that bound; the error is raised in input order, as a bad line's is.  Hand-written
rather than ``datasets``/Arrow: the per-line checks and messages are ppvarlen's, and the workers
are the same fork pool (``utils.parallel``) that needs no pickled tokenizer.
"""
import contextlib
import difflib
import json
import os
import tempfile
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
from tqdm.auto import tqdm

from ..config import ConfigError
from ..utils import parallel
from ..utils.io import BlockFile, block_aligned
from ..utils.log import get_logger
from ..utils.parallel import ordered_map
from .chunks import (_chunks_of, _parquet_chunks, _parquet_file, _parquet_rows, pack_examples,
                     unpack_examples)
from .corpora.base import Corpus, check_limit, check_tag_scheme_key, record_limit
from .corpora.registry import BUILT_IN, USER_FORMATS, data_section, load_built_in
from .errors import DataError
from . import columns, tagschemes
from .readers import (_SKIP_HINT, DEFAULT_TASK, FORMATS, LONG_LINE, NOT_LOADED, TABLE_SEPARATORS,
                      UNPARSED, BadLine, FileData, ReadLimits, bounded_lines, check_tag_scheme,
                      conll_sentences, conll_tagged, csv_records, decode_line, expand_inputs,
                      flat_examples, infer_task, label_id, load_lines, long_line_error, map_tags,
                      open_data_file, parse_json_bytes, parse_object, renamed, sniff_format,
                      table_row, tsv_cells)
from .splits import SPLITS, example_key, key_field, split_codes_and_hashes, split_method
from .vocab import count_fields

logger = get_logger("data.sources")

MEMORY_CHUNK = 2000  # examples per chunk of a corpus in memory


# ----------------------------------------------------------------------------- the plan

@dataclass(frozen=True)
class Plan:
    """What reading the user's files takes, decided before the first worker starts (plain
    values, so a mapper's workers get it with their jobs)."""

    fmt: str  # jsonl / tsv / csv / conll / parquet
    task: str  # the corpus format read (Data.task, or the fields of the first record)
    task_given: bool
    files: dict  # role -> [paths]
    specs: dict  # role -> the Data key's value
    skip_invalid: bool
    split_seed: int
    label_names: tuple = None  # given (Data.label_names) or None
    carve: tuple = ()  # splits carved from the train file
    tag_scheme: str = "auto"
    limit: int = None
    ship_bytes: bool = False  # chunks carry their records (a mapper's workers may be elsewhere)
    limits: ReadLimits = field(default_factory=ReadLimits.of)
    layouts: dict = field(default_factory=dict)  # path -> its ``columns.Layout`` (None: plain)
    eval_only_labels: bool = False  # Data.allow_eval_only_labels
    read: tuple = None  # the fields a record is read for: a request's texts; None: the format's

    def chunks(self):
        for role in SPLITS:
            for path in self.files.get(role, ()):
                if self.fmt == "parquet":
                    yield from _parquet_chunks(role, path, self.ship_bytes)
                else:
                    yield from _chunks_of(role, path, self.limits, self.ship_bytes, self.fmt)


@dataclass(frozen=True)
class MemoryPlan:
    """A corpus already read (a built-in corpus): its splits are cut into slices."""

    corpus: Corpus

    @property
    def task(self):
        return self.corpus.task


def plan(cfg):
    """The ``Plan`` for the Data section ``cfg`` of a user-file corpus (``USER_FORMATS``)."""
    if cfg.corpus not in USER_FORMATS:
        raise ConfigError(f"Data.corpus {cfg.corpus!r}: not a file format ({USER_FORMATS})")
    if not cfg.train_file:
        raise ConfigError(f"Data.train_file: Data.corpus: {cfg.corpus} reads your own files; set "
                          f"Data.train_file (and optionally dev_file / test_file)")
    check_limit(cfg.limit)
    specs = {s: cfg.get(f"{s}_file") for s in SPLITS}
    specs = {s: v for s, v in specs.items() if v}
    files = {s: expand_inputs(spec) for s, spec in specs.items()}
    limits = ReadLimits.of(cfg)
    keys = columns.column_keys(cfg)
    _check_column_keys(cfg.corpus, keys, f"Data.corpus is {cfg.corpus}")
    task = _format_task(cfg.corpus, cfg.task, files["train"][0], limits, keys)
    names = cfg.get("label_names")
    layouts = {path: _layout(cfg.corpus, task, path, limits, keys)
               for paths in files.values() for path in paths}
    return Plan(cfg.corpus, task, cfg.task is not None, files, specs, bool(cfg.skip_invalid),
                cfg.split_seed, None if names is None else tuple(names),
                tuple(s for s in ("dev", "test") if s not in files),
                cfg.get("tag_scheme", "auto"), cfg.limit, parallel.has_mapper(), limits,
                layouts, bool(cfg.get("allow_eval_only_labels", False)))


def _check_column_keys(fmt, keys, what):
    """ConfigError when one of ``keys`` (``columns.column_keys``) names columns ``fmt`` does not
    have (``what``: where the format comes from, for the message)."""
    unread = [k for k in keys if (k == "columns" and fmt not in TABLE_SEPARATORS) or
              fmt == "conll"]
    if unread:
        raise ConfigError(f"Data.{unread[0]} names columns of a table (or fields of jsonl / "
                          f"parquet), but {what}, which has none to name "
                          f"(conll: the token first, the tag last); remove Data.{unread[0]}")


def _format_task(fmt, task, first_file, limits, keys=None, default=DEFAULT_TASK):
    """The corpus format (task name) the files are read as: ``task`` (Data.task) when given,
    else the one the first record's fields (a table's header) tell, else ``default`` (a
    headerless table); CoNLL is tagging's."""
    keys = keys or {}
    if task is not None and task not in FORMATS:
        raise ConfigError(f"Data.task {task!r}: no corpus format of that name; the formats are "
                          f"{sorted(FORMATS)} (a task module registers its own, docs/TASKS.md)")
    if fmt == "conll":
        if task is not None and fmt not in formats_for(task):
            raise ConfigError(f"Data.task {task!r}: CoNLL files hold tagging data (a token and "
                              f"its tag per line); remove Data.task, or give {task} data as "
                              f"JSONL with {list(FORMATS[task].fields)} fields")
        return "tagging"
    if fmt in TABLE_SEPARATORS:
        tables = {t: f.fields for t, f in FORMATS.items() if f.table}
        if task is None:
            header = _first_cells(fmt, first_file, limits)
            task = (columns.resolvable(header, tables, keys, case=False)
                    if header is not None else None) or default
        if fmt not in formats_for(task):
            looks = sniff_format(first_file, limits)
            others = sorted(t for t in tables if t != DEFAULT_TASK)
            raise DataError(f"{first_file}: {fmt.upper()} files hold "
                            f"{'<TAB>'.join(FORMATS[DEFAULT_TASK].fields)} ({DEFAULT_TASK}) or "
                            f"the fields of {', '.join(others)} as columns, but the task is "
                            f"{task!r}, which has no table form; use a JSONL file with "
                            f"{list(FORMATS[task].fields)} fields"
                            + ("; this file looks like CoNLL (a token and its tag per line): "
                               "set Data.corpus: conll" if looks == "conll" else ""))
        return task
    if task is not None:
        return task
    return _columns_task(first_file, keys, default) if fmt == "parquet" else \
        _first_line_task(first_file, limits, keys, default)


def _first_object(path, limits):
    """(line, the first JSON object of a JSONL file) or (None, None): a line before it that is
    not one, a line over the bound or an unreadable file is reported by the scan."""
    try:
        with open_data_file(path, limits) as f:
            for n, raw in enumerate(bounded_lines(f, limits.max_line_bytes), 1):
                if raw is LONG_LINE:
                    break
                line = decode_line(raw, n)
                if isinstance(line, BadLine):
                    continue
                obj = None
                with contextlib.suppress(json.JSONDecodeError, RecursionError):
                    obj = json.loads(line)  # a line that is no JSON object: the scan says so
                if isinstance(obj, dict):
                    return n, obj
    except DataError:
        pass
    return None, None


def _first_cells(fmt, path, limits):
    """The cells of a table's first line, or None when it has no readable first line."""
    try:
        with open_data_file(path, limits) as f:
            raw = next(bounded_lines(f, limits.max_line_bytes), None)
    except DataError:
        return None
    if raw is None or raw is LONG_LINE:
        return None
    line = decode_line(raw, 1)
    if isinstance(line, BadLine) or not line.strip():
        return None
    if fmt == "tsv":
        return tsv_cells(line)
    cells = next(csv_records([raw.rstrip(b"\r\n")], 1))[1]
    return None if isinstance(cells, BadLine) else cells


def _conll_tagged(path, limits):
    """Whether a CoNLL file holds tags (``readers.conll_tagged``: its first token line has a
    tag); an unreadable start is read as tagged, the scan reporting it."""
    def lines():
        with open_data_file(path, limits) as f:
            for n, raw in enumerate(bounded_lines(f, limits.max_line_bytes), 1):
                line = LONG_LINE if raw is LONG_LINE else decode_line(raw, n)
                if line is LONG_LINE or isinstance(line, BadLine):
                    return
                yield line
    try:
        return conll_tagged(lines())
    except DataError:
        return True


def _first_line_task(path, limits, keys, default=DEFAULT_TASK):
    """The task the first JSON object's fields tell (by the format's names, else by the names
    ``columns`` recognises), else ``default``."""
    n, obj = _first_object(path, limits)
    if obj is None:
        looks = sniff_format(path, limits)
        if looks not in (None, "jsonl"):
            raise _looks_like(path, "jsonl", looks)
        return default
    task = infer_task(obj) if not keys else None
    task = task or columns.resolvable(list(obj), {t: f.fields for t, f in FORMATS.items()},
                                      keys, case=True)
    if task is None:
        raise DataError(f"{path}:{n}: cannot tell the task from fields {sorted(obj)}; a line "
                        f"needs text+label, tokens+tags or source+target (or the fields "
                        f"Data.text_field / label_field / tokens_field / tags_field name), or "
                        f"set Data.task")
    return task


def _columns_task(path, keys, default=DEFAULT_TASK):
    """The task a Parquet file's columns tell (every row has them all, so no row group is read
    before the scan, which reports a damaged one in input order), else ``default``."""
    parquet = _parquet_file(path)
    if not parquet.metadata.num_rows:
        return default
    names = parquet.schema_arrow.names
    return (infer_task(set(names)) if not keys else None) or \
        columns.resolvable(names, {t: f.fields for t, f in FORMATS.items()}, keys, True) or \
        default


def _layout(fmt, task, path, limits, keys, read=None):
    """The ``columns.Layout`` of one file (None: its fields are the format's, as they are);
    ``read``: a request's texts, the only fields resolved (``columns.table_layout``)."""
    fields = read or FORMATS[task].fields
    if fmt in TABLE_SEPARATORS:
        unread = None
        if read is not None:  # the format's other fields follow the texts in a headerless table
            order = FORMATS[task].fields
            unread = order[len(read):] if order[:len(read)] == read else ()
        return columns.table_layout(_first_cells(fmt, path, limits), fields, keys, path,
                                    unread)
    if fmt == "jsonl":
        n, obj = _first_object(path, limits)
        return None if obj is None else \
            columns.field_layout(list(obj), fields, keys, f"{path}:{n}")
    if fmt == "parquet":
        parquet = _parquet_file(path)
        return columns.field_layout(parquet.schema_arrow.names, fields, keys, path)
    return None


def _looks_like(path, fmt, looks):
    """The DataError of a file given as ``fmt`` that looks like another format."""
    return DataError(f"{path}: read as {fmt} (Data.corpus), but it looks like {looks}"
                     f"{LOOKS[looks]}; set Data.corpus: {looks}")


LOOKS = {"conll": " (a token and its tag per line, a blank line between sentences)",
         "jsonl": " (one JSON object per line)", "tsv": " (tab-separated columns)",
         "csv": " (comma-separated columns)"}


def format_hint(fmt, path, limits=None):
    """'; this file looks like X ...' when ``path`` looks like another format than ``fmt``,
    else '': for the error of a record that does not parse."""
    looks = sniff_format(path, limits)
    if looks is None or looks == fmt or (fmt == "csv" and looks == "tsv"):
        return ""
    return (f" (this file looks like {looks}{LOOKS[looks]}: set Data.corpus: {looks} if "
            f"it is)")


# ------------------------------------------------------------------------- pass 1: scan

@dataclass
class ChunkScan:
    """What pass 1 found in one chunk; per-example arrays are over its kept examples."""

    role: str
    path: str
    lines: int = 0
    header: bool = False
    examples: int = 0  # valid records (before label checks)
    error: str = None  # the first bad record's message (not skip_invalid): raised in order
    skipped: Counter = field(default_factory=Counter)
    first_skipped: dict = field(default_factory=dict)  # reason -> (line, message)
    label_skipped: Counter = field(default_factory=Counter)
    label_first: dict = field(default_factory=dict)
    label_error: str = None  # the first unknown label (raised after every record is read)
    kinds: dict = field(default_factory=dict)  # "str"/"int" -> (line, label) first seen
    first_label: object = None
    label_values: list = field(default_factory=list)  # distinct raw labels, first seen first
    label_lines: list = field(default_factory=list)  # the line each of them is first on
    label_codes: np.ndarray = None  # index into label_values per example (-1: no label)
    hashes: np.ndarray = None  # uint64 hash of each example's split key
    codes: np.ndarray = None  # SPLITS index of each example
    line_numbers: np.ndarray = None  # each example's line, when the scanner keeps them
    tags: list = None  # tagging: each example's tags
    counts: tuple = None  # the train split's token counts (``TokenCounting``)
    parsed: bytes = None  # the kept examples, ``pack_examples``'d (pass 2 parses none again)
    spilled: tuple = None  # (offset, size) where the worker wrote ``parsed`` into the temp file

    def add(self, sc):
        """Merge a later chunk of the same file (a file's merged scan is a ChunkScan too)."""
        self.lines += sc.lines
        self.header = self.header or sc.header
        self.examples += sc.examples
        self.skipped.update(sc.skipped)
        for reason, first in sc.first_skipped.items():
            self.first_skipped.setdefault(reason, first)
        self.label_skipped.update(sc.label_skipped)
        for reason, first in sc.label_first.items():
            self.label_first.setdefault(reason, first)
        for kind, first in sc.kinds.items():
            self.kinds.setdefault(kind, first)

    def finish(self):
        """The file's last chunk is merged: its skips logged; no valid record is an error."""
        if self.skipped:
            n, msg = next(iter(self.first_skipped.values()))
            logger.warning("%s: skipped %d invalid line(s) (%s); first: line %d: %s", self.path,
                           sum(self.skipped.values()),
                           ", ".join(f"{r}: {c}" for r, c in sorted(self.skipped.items())), n, msg)
        if not self.examples:
            raise _no_examples(self.path, self.lines, self.skipped)


SPILL_SLACK = 64 << 10  # room beyond a chunk's raw bytes: its packed header and offsets


class Scanner:
    """Pass 1 over one chunk (a job of ``ordered_map``)."""

    def __init__(self, plan, counting, line_numbers=False, spill=None):
        self.plan, self.counting, self.spill = plan, counting, spill
        self.fmt = FORMATS[plan.task]
        # each kept example's line: the tag-scheme checks and ``read_file`` read them
        self.line_numbers = line_numbers or self.fmt.labels == "tags"
        self.index = None if plan.label_names is None else \
            {name: i for i, name in enumerate(plan.label_names)}

    def records(self, chunk, scan, raws=None, loaded=None):
        """Yield (line, its example or the ``BadLine`` that says why it has none) of the chunk
        (``raws``: its lines, read already, the file's trailing blank lines cut; ``loaded``:
        their ``load_lines`` values)."""
        plan = self.plan
        layout = plan.layouts.get(chunk.path)
        rename = None if layout is None else layout.rename
        fields = plan.read or self.fmt.fields
        if plan.fmt == "parquet":
            for n, row in _parquet_rows(chunk, plan.limits):
                if not isinstance(row, BadLine):  # a row with a cell not UTF-8 is one already
                    row = self._parsed_or_bad(parse_object, row, plan.task, rename, plan.read)
                yield n, row
            return
        if chunk.error is not None:
            raise DataError(chunk.error)
        raws = _filled(chunk.raw_lines()) if raws is None else raws
        limit = plan.limits.max_line_bytes
        if plan.fmt == "conll":
            yield from conll_sentences(raws, chunk.first_line, tagged="tags" in fields)
            return
        header = int(layout is not None and layout.header and chunk.first_line == 1)
        if header:
            scan.header = True
        if plan.fmt == "csv":
            long = next((k for k, raw in enumerate(raws) if len(raw) > limit), None)
            for n, cells in csv_records(raws[header:long], chunk.first_line + header):
                if not isinstance(cells, BadLine):
                    cells = self._parsed_or_bad(table_row, cells, layout, fields,
                                                self.fmt.labels == "class", ",")
                yield n, cells
            if long is not None:
                raise long_line_error(f"{chunk.path}:{chunk.first_line + long}", limit)
            return
        for k, raw in enumerate(raws):
            n = chunk.first_line + k
            if len(raw) > limit:
                raise long_line_error(f"{chunk.path}:{n}", limit)
            if plan.fmt == "jsonl":  # parsed from its bytes (``parse_json_bytes``)
                yield n, self._parsed_or_bad(parse_json_bytes, raw, n, plan.task,
                                             NOT_LOADED if loaded is None else loaded[k], rename,
                                             plan.read)
                continue
            if k == 0 and header:
                continue
            line = decode_line(raw, n)
            if not isinstance(line, BadLine):
                line = self._parsed_or_bad(table_row, tsv_cells(line), layout, fields,
                                           self.fmt.labels == "class")
            yield n, line

    def _parsed(self, chunk, scan):
        """(line numbers, examples) of the chunk's valid records, skips counted in ``scan``.  A
        JSONL chunk of a flat format is loaded at once (``readers.load_lines``) and, when all
        its lines are the common case, made into examples at once (``readers.flat_examples``);
        else its records are parsed one at a time, as any other chunk's (a loaded line is not
        parsed again).  Blank lines ending a chunk are the file's last ones (``chunks``): they
        are not read."""
        raws = loaded = None
        if chunk.error is None and self.plan.fmt != "parquet":
            raws = _filled(chunk.raw_lines())
        if self.plan.fmt == "jsonl" and self.fmt.flat and chunk.error is None:
            layout = self.plan.layouts.get(chunk.path)
            if raws and max(map(len, raws)) <= self.plan.limits.max_line_bytes:
                loaded = load_lines(raws)
                if layout is not None:
                    loaded = [renamed(o, layout.rename) if o is not UNPARSED else o
                              for o in loaded]
                examples = flat_examples(loaded, self.fmt.fields)
                if examples is not None:
                    scan.lines = len(raws)
                    return np.arange(chunk.first_line, chunk.first_line + len(raws)), examples
                if layout is not None:
                    loaded = None  # parsed again line by line, renamed there
        numbers, examples = [], []
        for n, ex in self.records(chunk, scan, raws, loaded):
            scan.lines += 1
            if isinstance(ex, BadLine):
                if not self.plan.skip_invalid:
                    scan.error = (f"{chunk.path}:{n}: {ex.message} {_SKIP_HINT}"
                                  f"{format_hint(self.plan.fmt, chunk.path, self.plan.limits)}")
                    break
                scan.skipped[ex.reason] += 1
                scan.first_skipped.setdefault(ex.reason, (n, ex.message))
                continue
            numbers.append(n)
            examples.append(ex)
        return np.asarray(numbers, np.int64), examples

    def _parsed_or_bad(self, parse, *args):
        """``parse(*args)``, or the BadLine it raises; a value nested deeper than Python can
        read or print (a hostile line: thousands of arrays inside each other) is one too."""
        try:
            return parse(*args)
        except BadLine as bad:
            return bad
        except RecursionError:
            return BadLine("bad_json", f"a value is nested too deeply to read; each line must be "
                                       f"one JSON object such as {self.fmt.example_line}")

    def _known_labels(self, chunk, numbers, examples, scan):
        """The examples whose class label is in Data.label_names: an unknown one is the chunk's
        label error (raised once every record is read), or skipped (Data.skip_invalid)."""
        bad = [k for k, ex in enumerate(examples) if label_id(ex["label"], self.index) is None]
        if not bad:
            return numbers, examples
        names, k = self.plan.label_names, bad[0]
        message = (f"label {examples[k]['label']!r} is not one of the {len(names)} classes "
                   f"{list(names)}; fix the label or list it in Data.label_names")
        if not self.plan.skip_invalid:
            scan.label_error = f"{chunk.path}:{numbers[k]}: {message} {_SKIP_HINT}"
            return numbers, examples
        scan.label_skipped["unknown_label"] += len(bad)
        scan.label_first.setdefault("unknown_label", (int(numbers[k]), message))
        keep = np.ones(len(examples), bool)
        keep[bad] = False
        return numbers[keep], [ex for ex, k in zip(examples, keep.tolist()) if k]

    def __call__(self, job):
        """Pass 1 over a chunk (``job``: the chunk, or (chunk, (at, size)): room in the temp
        file, where the worker writes the packed examples when they fit, instead of sending them
        back) -> ``ChunkScan``."""
        chunk, room = job if isinstance(job, tuple) else (job, None)
        plan, fmt = self.plan, self.fmt
        scan = ChunkScan(chunk.role, chunk.path)
        try:
            numbers, examples = self._parsed(chunk, scan)
        except DataError as e:  # a line over Data.max_line_bytes, a gzip bomb: in input order
            scan.error = str(e)
            return scan
        if scan.error is not None:  # a bad record: raised in input order
            return scan
        scan.examples = len(examples)
        if fmt.labels == "class" and self.index is not None:
            numbers, examples = self._known_labels(chunk, numbers, examples, scan)
        # the key as once labels are ids: a label name is not part of it
        name = key_field(fmt.fields)
        keys = [ex[name] for ex in examples] if name is not None else \
            [example_key(ex, ("label",)) for ex in examples]
        keys_utf8 = [k.encode("utf-8", "surrogatepass") for k in keys]
        split_codes, scan.hashes = split_codes_and_hashes(keys_utf8, plan.split_seed)
        if chunk.role == "train" and plan.carve:
            to_code = np.asarray([SPLITS.index(s if s in plan.carve else "train")
                                  for s in SPLITS], np.uint8)
            scan.codes = to_code[split_codes]
        else:
            scan.codes = np.full(len(examples), SPLITS.index(chunk.role), np.uint8)
        scan.line_numbers = numbers if self.line_numbers else np.zeros(0, np.int64)
        if fmt.labels == "class":
            self._label_columns(numbers, examples, scan)
        else:
            scan.label_codes = np.zeros(0, np.int32)
        scan.tags = [ex["tags"] for ex in examples] if fmt.labels == "tags" else None
        scan.parsed = pack_examples(examples, {name: keys_utf8} if name is not None else None)
        if room is not None and len(scan.parsed) <= room[1]:
            self.spill.write_at(scan.parsed, room[0])
            scan.parsed, scan.spilled = None, (room[0], len(scan.parsed))
        if self.counting is not None:
            train = examples if not (scan.codes != 0).any() else \
                [ex for ex, c in zip(examples, scan.codes.tolist()) if c == 0]
            scan.counts = count_fields(train, self.counting)
        return scan

    @staticmethod
    def _label_columns(numbers, examples, scan):
        """The chunk's distinct raw labels (first seen first), each example's index into them,
        the first label and the line of the first name and of the first id."""
        index = {}
        codes = [index.setdefault(ex["label"], len(index)) for ex in examples]
        scan.label_values = list(index)
        scan.label_codes = np.asarray(codes, np.int32)
        if scan.label_values:
            scan.first_label = scan.label_values[0]
            _, first_at = np.unique(scan.label_codes, return_index=True)
            scan.label_lines = np.asarray(numbers)[first_at].tolist()
            for label, n in zip(scan.label_values, scan.label_lines):
                kind = "str" if isinstance(label, str) else "int"
                scan.kinds.setdefault(kind, (n, label))


@dataclass
class _ChunkRef:
    """What the parent keeps of a chunk for pass 2 (and the merge's rules)."""

    role: str
    path: str
    codes: np.ndarray
    hashes: np.ndarray  # the merge's rules read these two; None after them
    label_values: list
    label_codes: np.ndarray
    spill: tuple  # (offset, size) of its packed examples in the temp file
    label_lines: list = None  # the line each of label_values is first on
    keep: np.ndarray = None  # examples kept by the merge's rules (None: all)
    bases: dict = None  # split -> doc id of its first example of that split
    counts: dict = None  # split -> its examples of that split


class Scanned:
    """The corpus after pass 1: ``corpus`` (splits hold example counts), ``counts`` (the train
    split's token counts, or None), and the pass-2 jobs (``jobs``, read on a worker by
    ``reader()``).  ``close`` it."""

    def __init__(self, corpus, counts, refs=None, spill=None, limit=None, memory=None):
        self.corpus, self.counts = corpus, counts
        self.refs, self.spill, self.limit, self.memory = refs, spill, limit, memory

    def close(self):
        if self.spill is not None:
            self.spill.close()

    def reader(self):
        """What reads a job on a worker (picklable; a mapper's workers get the examples with
        their jobs, so it holds no corpus then)."""
        ship = parallel.has_mapper()
        return ChunkReader(self.corpus.label_names,
                           self.memory is None and FORMATS[self.corpus.task].labels == "class",
                           self.limit, None if ship else self.spill, None if ship else self.memory)

    def jobs(self, splits):
        """Pass-2 jobs over the examples of ``splits``, in input order (small picklable values;
        with a mapper they carry their examples, or their bytes)."""
        ship = parallel.has_mapper()
        if self.memory is not None:  # forked workers read the slice from the corpus they inherit
            for split in (s for s in SPLITS if s in splits):
                examples = self.memory.splits[split]
                for start in range(0, len(examples), MEMORY_CHUNK):
                    end = min(start + MEMORY_CHUNK, len(examples))
                    yield split, start, end, examples[start:end] if ship else None
            return
        for ref in self.refs:
            if not any(ref.counts[s] and (self.limit is None or ref.bases[s] < self.limit)
                       for s in splits):
                continue
            data = bytes(self.spill.read_at(ref.spill[1], ref.spill[0])) if ship else ref.spill
            yield (ref.bases, ref.codes, ref.keep, data, tuple(splits))


class ChunkReader:
    """Pass 2's read of one job -> {split: (doc id of the first, [examples])}, labels as ids."""

    def __init__(self, label_names, class_labels, limit, spill, memory):
        self.index = {name: i for i, name in enumerate(label_names)}
        self.class_labels, self.limit, self.spill, self.memory = class_labels, limit, spill, memory

    def __call__(self, job):
        if len(job) == 4:  # a slice of a corpus in memory
            split, start, end, rows = job
            return {split: (start, self.memory.splits[split][start:end] if rows is None else rows)}
        bases, codes, keep, data, splits = job
        if isinstance(data, tuple):  # (offset, size) in the temp file this process inherited
            data = self.spill.read_at(data[1], data[0])
        examples = unpack_examples(data, {"label": self._label_ids} if self.class_labels else None)
        res = {}
        for code, split in enumerate(SPLITS):
            if split not in splits:
                continue
            chosen = codes == code if keep is None else (codes == code) & keep
            base, picked = bases[split], np.flatnonzero(chosen)
            if self.limit is not None:
                picked = picked[:max(0, self.limit - base)]
            if len(picked) == len(examples):
                res[split] = (base, examples)
            elif len(picked):
                res[split] = (base, [examples[k] for k in picked.tolist()])
        return res

    def _label_ids(self, labels):
        ids = {label: label_id(label, self.index) for label in set(labels)}
        return [ids[label] for label in labels]


def scan(plan, counting, num_proc, spill_dir=None):
    """Pass 1 -> ``Scanned``.  ``counting``: the ``vocab.TokenCounting`` of the train split's
    tokens, or None (a vocabulary is given).  Raises the first bad record in input order.  The
    packed examples go to an anonymous temp file in ``spill_dir`` (None: the system's)."""
    if isinstance(plan, MemoryPlan):
        corpus = plan.corpus
        counts = None
        if counting is not None:  # a built-in corpus: small enough for one process
            counts = count_fields(corpus.splits["train"], counting)
        sizes = Corpus(corpus.task, {s: len(corpus.splits[s]) for s in SPLITS},
                       corpus.label_names, corpus.stats)
        return Scanned(sizes, counts, memory=corpus)
    spill = BlockFile(tempfile.TemporaryFile(dir=spill_dir))
    try:
        return _Merge(plan, counting, spill).run(num_proc)
    except BaseException:
        spill.close()
        raise


def _sum_counts(parts, counting):
    total = tuple(Counter() for _ in counting.groups)
    for part in parts:
        for t, c in zip(total, part):
            t.update(c)
    return total


class _CountJob:
    """Pass 2's read, then counting: the train split's tokens once the merge dropped some."""

    def __init__(self, reader, counting):
        self.reader, self.counting = reader, counting

    def __call__(self, job):
        got = self.reader(job).get("train")
        return count_fields(got[1] if got else [], self.counting)


class _Merge:
    """Pass 1's chunks merged in input order, then the corpus-wide rules, once."""

    def __init__(self, plan, counting, spill):
        self.plan, self.counting, self.spill = plan, counting, spill
        self.fmt = FORMATS[plan.task]
        self.files, self.refs, self.end = {}, [], 0
        self.kinds, self.first_label, self.label_error = {}, None, None
        self.counts = None if counting is None else tuple(Counter() for _ in counting.groups)
        self.tag_files = {}  # path -> FileData of its tags (tagging data)

    def run(self, num_proc):
        plan = self.plan
        size = sum(os.path.getsize(p) for ps in plan.files.values() for p in ps
                   if os.path.isfile(p))
        bar = tqdm(desc="read", unit=" lines", unit_scale=True, mininterval=2,
                   disable=size < (64 << 20))
        current = None
        # a worker writes a chunk's packed examples into the temp file itself, in room kept for
        # them by the order of the chunks, so they do not go through the pool's pipe and this
        # process's writes (a mapper's workers, maybe on other machines, send them back)
        writes = not parallel.has_mapper()
        scanner = Scanner(plan, self.counting, spill=self.spill if writes else None)
        jobs = self._rooms(plan.chunks()) if writes else plan.chunks()
        # closed on an error here: the pool ends now, not whenever the map is garbage-collected
        with contextlib.closing(ordered_map(scanner, jobs, num_proc)) as scans:
            for sc in scans:
                if current is not None and sc.path != current.path:
                    current.finish()
                if sc.error is not None:
                    raise DataError(sc.error)
                current = self.files.setdefault(sc.path, ChunkScan(sc.role, sc.path))
                current.add(sc)
                self._add(sc)
                bar.update(sc.lines)
        bar.close()
        if current is not None:
            current.finish()
        names, label_stats = self._tag_rules() if self.fmt.labels == "tags" else \
            (self._class_rules(), {})
        if self.label_error:
            raise DataError(self.label_error)
        sizes = self._bases()
        scanned = Scanned(self._corpus(names, sizes, label_stats), self.counts,
                          self.refs, self.spill, plan.limit)
        if plan.limit is not None:
            scanned.corpus.splits = record_limit(scanned.corpus.stats, sizes, plan.limit)
        # pass 2's workers are forked from this process: what only the rules above read is
        # dropped first, so they do not map it
        for ref in self.refs:
            ref.hashes = ref.label_codes = None
        dropped = any(r.keep is not None and not r.keep.all() for r in self.refs)
        if self.counting is not None and (dropped or plan.limit is not None):
            scanned.counts = _sum_counts(ordered_map(_CountJob(scanned.reader(), self.counting),
                                                     scanned.jobs(("train",)), num_proc),
                                         self.counting)
        check_tag_scheme_key(plan.tag_scheme, plan.fmt, scanned.corpus)
        return scanned

    def _reserve(self, size):
        """The offset of room for ``size`` bytes in the temp file (whole blocks: ``BlockFile``).
        ``_rooms`` reserves too, in this thread: the map reads its jobs where it is iterated."""
        at, self.end = self.end, self.end + block_aligned(size)
        return at

    def _rooms(self, chunks):
        """(chunk, (at, size) of its room in the temp file) of each chunk of lines: its raw
        bytes and ``SPILL_SLACK``, which its packed examples fit in (a text's UTF-8 is no longer
        than its JSON string; a Parquet chunk, or one that does not fit, is sent back and
        written here).  The temp file is written sparsely: room a chunk does not fill takes no
        disk on a file system with sparse files (ext4, XFS, Btrfs, tmpfs)."""
        for chunk in chunks:
            raw = len(chunk.data) if chunk.data is not None else chunk.size
            if chunk.row_group is not None or chunk.error is not None:
                yield chunk
                continue
            yield chunk, (self._reserve(raw + SPILL_SLACK), raw + SPILL_SLACK)

    def _add(self, sc):
        if sc.spilled is None:  # sent back: written after the rooms kept so far
            sc.spilled = (self._reserve(len(sc.parsed)), len(sc.parsed))
            self.spill.write_at(sc.parsed, sc.spilled[0])
        self.refs.append(_ChunkRef(sc.role, sc.path, sc.codes, sc.hashes, sc.label_values,
                                   sc.label_codes, sc.spilled, sc.label_lines))
        for kind, (n, lab) in sc.kinds.items():
            self.kinds.setdefault(kind, (f"{sc.path}:{n}", lab))
        if self.first_label is None:
            self.first_label = sc.first_label
        self.label_error = self.label_error or sc.label_error
        if self.counts is not None:
            for total, c in zip(self.counts, sc.counts):
                total.update(c)
        if sc.tags is not None:
            fd = self.tag_files.get(sc.path)
            if fd is None:
                fd = self.tag_files[sc.path] = FileData(sc.path, self.plan.task)
            k = len(self.refs) - 1
            fd.examples += [{"tags": t, "at": (k, i)} for i, t in enumerate(sc.tags)]
            fd.line_numbers += sc.line_numbers.tolist()

    # ------------------------------------------------------------- class labels
    def _class_rules(self):
        """The label names as the data gives them: Data.label_names, else the sorted names, or
        ids 0..max.  Names and ids mixed: an error, or (Data.skip_invalid) the examples of the
        other kind than the first label's are skipped."""
        plan = self.plan
        if self.fmt.labels != "class":
            return []
        if plan.label_names is not None:
            return list(plan.label_names)
        first = self.first_label
        kind = "str" if isinstance(first, str) else "int"
        other = "int" if kind == "str" else "str"
        if other in self.kinds:
            if not plan.skip_invalid:
                where, lab = self.kinds[other]
                raise DataError(f"{where}: {_mixed_kinds(lab, first)} {_SKIP_HINT}")
            self._skip_other_kind(first, other)
        self._check_label_column()
        if not plan.eval_only_labels:
            self._check_eval_only(
                ((r.path, v, n) for r in self.refs if r.role != "train" for v, n in
                 zip(r.label_values, r.label_lines) if isinstance(v, str) == (kind == "str")),
                {v for r in self.refs if r.role == "train" for v in r.label_values}, "label")
        seen = {v for r in self.refs for v in r.label_values
                if isinstance(v, str) == (kind == "str")}
        return sorted(seen) if kind == "str" else [str(i) for i in range(max(seen) + 1)]

    @staticmethod
    def _check_eval_only(found, train, what):
        """A ``what`` (a class label, a tag type) of ``found`` ((path, value, line) in the
        dev/test files) that the train file never has is a DataError naming the nearest train
        one (a typo), unless Data.allow_eval_only_labels."""
        for path, value, n in found:
            if value in train:
                continue
            known = sorted(map(str, train))
            near = difflib.get_close_matches(str(value), known, n=1, cutoff=0.0)
            shown = ", ".join(map(repr, known[:12])) + (", ..." if len(known) > 12 else "")
            raise DataError(
                f"{path}:{n}: {what} {value!r} is not in the train file, which has {len(known)}: "
                f"{shown}" + (f"; did you mean {near[0]!r}?" if near else "") + f" A {what} "
                f"train never shows cannot be learnt: fix it; or list the classes in "
                f"Data.label_names, or set Data.allow_eval_only_labels: true if it is meant")

    def _check_label_column(self):
        """A table's label column that looks like text is refused: the first line of a
        headerless file whose label is on no other line (a header not recognised), or labels
        most of which are each one example's (the columns in another order)."""
        plan = self.plan
        if plan.fmt not in TABLE_SEPARATORS:
            return
        counts, first = Counter(), {}  # over the train file(s): label -> examples, (path, line)
        firsts = Counter()  # label -> the headerless files whose line 1 has it
        for ref in self.refs:
            if ref.role != "train" or not ref.label_values:
                continue
            per = np.bincount(ref.label_codes, minlength=len(ref.label_values))
            layout = plan.layouts.get(ref.path)
            unsaid = layout is not None and not layout.header and not layout.stated
            for value, c, n in zip(ref.label_values, per.tolist(), ref.label_lines):
                counts[value] += c
                first.setdefault(value, (ref.path, n))
                firsts[value] += int(n == 1 and unsaid)
        how = ("name the columns in a header line (text, label, ...: docs/guide/data.md) or by "
               "Data.text_field / Data.label_field, or give a headerless file's order with "
               "Data.columns, e.g. [label, text]")
        for value, k in firsts.items():
            if k and k == counts[value] and isinstance(value, str):
                path = first[value][0]
                raise DataError(f"{path}:1: the first line looks like a header the reader does "
                                f"not know: its label {value!r} is on no other line; {how}. If "
                                f"the line is data, say the order with Data.columns: "
                                f"{list(plan.layouts[path].names)}")
        examples, classes = sum(counts.values()), len(counts)
        if classes >= 20 and classes > examples / 2:
            value = counts.most_common()[-1][0]
            path, n = first[value]
            raise DataError(f"{path}:{n}: the label column looks like text: "
                            f"{classes} classes for {examples} train examples (e.g. label "
                            f"{value!r:.60}); check which column is which: {how}. If these "
                            f"are the classes, list them in Data.label_names")

    def _skip_other_kind(self, first, other):
        for ref in self.refs:
            flags = np.asarray([isinstance(v, str) == (other == "str") for v in ref.label_values],
                               bool)
            drop = flags[ref.label_codes]
            if drop.any():
                ref.keep = ~drop
                self.files[ref.path].label_skipped["mixed_label_kinds"] += int(drop.sum())
        for fs in self.files.values():
            if other in fs.kinds and fs.label_skipped.get("mixed_label_kinds"):
                n, lab = fs.kinds[other]
                fs.label_first.setdefault("mixed_label_kinds", (n, _mixed_kinds(lab, first)))
        logger.warning("skipped the examples whose label is a %s: the first label (%r) is a %s",
                       "name" if other == "str" else "class id", first,
                       "class id" if other == "str" else "name")

    # ------------------------------------------------------------- tags
    def _tag_rules(self):
        """Tagging data: every file's lines fit one tag scheme (``readers.check_tag_scheme``),
        then all files' (``readers.map_tags``), in input order; the examples they skip are
        dropped from pass 2 and counted as the file's label skips.  -> (names, stats)."""
        plan, files = self.plan, []
        for path in dict.fromkeys(p for paths in plan.files.values() for p in paths):
            fd, fs = self.tag_files.get(path, FileData(path, plan.task)), self.files[path]
            check_tag_scheme([fd], plan.tag_scheme, plan.skip_invalid)
            if not fd.examples:
                raise _no_examples(path, fs.lines, fs.skipped + fd.skipped)
            files.append(fd)
        if plan.label_names is None and not plan.eval_only_labels:
            # a file may be read as train and as dev/test too: it counts as train
            train_paths = set(plan.files.get("train", ()))
            train = {_tag_type(t) for fd in files if fd.path in train_paths
                     for ex in fd.examples for t in ex["tags"]}
            self._check_eval_only(
                ((fd.path, _tag_type(t), n) for fd in files if fd.path not in train_paths
                 for ex, n in zip(fd.examples, fd.line_numbers) for t in ex["tags"]),
                train, "tag type")
        names, label_stats = map_tags(files, plan.label_names, plan.skip_invalid, plan.tag_scheme)
        for ref in self.refs:
            ref.keep = np.zeros(len(ref.codes), bool)
        for fd in files:
            fs = self.files[fd.path]
            fs.label_skipped.update(fd.skipped)
            fs.label_first.update(fd.first_skipped)
            for ex in fd.examples:
                k, i = ex["at"]
                self.refs[k].keep[i] = True
        return names, label_stats

    # ------------------------------------------------------------- splits and stats
    def _bases(self):
        """Each chunk's doc id per split (after the skips) -> the split sizes."""
        sizes = dict.fromkeys(SPLITS, 0)
        for ref in self.refs:
            codes = ref.codes if ref.keep is None else ref.codes[ref.keep]
            per = np.bincount(codes, minlength=len(SPLITS))
            ref.bases = dict(sizes)
            ref.counts = {s: int(per[i]) for i, s in enumerate(SPLITS)}
            for i, s in enumerate(SPLITS):
                sizes[s] += int(per[i])
        return sizes

    def _corpus(self, names, sizes, label_stats):
        plan = self.plan
        file_stats = {role: _file_stats(plan, role, [self.files[p] for p in paths])
                      for role, paths in plan.files.items()}
        skipped_total = sum(sum(fs.get("skipped", {}).values()) for fs in file_stats.values())
        stats = {"corpus": plan.fmt, "task": plan.task,
                 "task_from": "Data.task" if plan.task_given else "fields of the first line",
                 "files": file_stats,
                 "split": {"sizes": dict(sizes),
                           "from": {s: ("file" if s in plan.files else "train_file, by stable hash")
                                    for s in SPLITS}},
                 "skipped_total": skipped_total, **label_stats}
        if len(plan.files) < 3:
            stats["split"]["method"] = split_method(plan.split_seed)
        overlap = self._overlap()
        if overlap:
            stats["split"]["texts_in_two_splits"] = overlap
            logger.warning("the same text appears in two splits %s: evaluation on it is "
                           "optimistic; remove the duplicates from your files", overlap)
        if self.fmt.labels == "class":
            stats["per_label"] = self._per_label(names)
        return Corpus(plan.task, dict(sizes), names, stats)

    def _overlap(self):
        keys = {s: [] for s in SPLITS}
        for ref in self.refs:
            codes, hashes = (ref.codes, ref.hashes) if ref.keep is None else \
                (ref.codes[ref.keep], ref.hashes[ref.keep])
            for i, s in enumerate(SPLITS):
                keys[s].append(hashes[codes == i])
        unique = {s: _sorted_unique(np.concatenate(v)) if v else np.zeros(0, np.uint64)
                  for s, v in keys.items()}
        overlap = {}
        source = {s: self.plan.specs.get(s, self.plan.specs["train"]) for s in SPLITS}
        for a, b in (("train", "dev"), ("train", "test"), ("dev", "test")):
            if source[a] == source[b] and b in self.plan.specs:
                continue  # one file read as both (a verify file): the same texts, by design
            n = _common_count(unique[a], unique[b])
            if n:
                overlap[f"{a}&{b}"] = n
        return overlap

    def _per_label(self, names):
        index = {name: i for i, name in enumerate(names)}
        counts = np.zeros((len(SPLITS), len(names)), np.int64)
        for ref in self.refs:
            ids = np.asarray([-1 if (j := label_id(v, index)) is None else j
                              for v in ref.label_values], np.int64)[ref.label_codes]
            codes = ref.codes
            if ref.keep is not None:
                ids, codes = ids[ref.keep], codes[ref.keep]
            ok = ids >= 0
            np.add.at(counts, (codes[ok].astype(np.int64), ids[ok]), 1)
        return {s: {name: int(counts[i, j]) for j, name in enumerate(names)}
                for i, s in enumerate(SPLITS)}


def _tag_type(tag):
    """What a tag says beyond its chunk prefix (``B-PER`` -> ``PER``), or the tag itself."""
    parts = tagschemes.split_tag(tag)
    return tag if parts is None or not parts[1] else parts[1]


def _filled(raws):
    """A chunk's lines without the blank lines that end it (the file's last lines)."""
    end = len(raws)
    while end and not raws[end - 1].strip():
        end -= 1
    return raws if end == len(raws) else raws[:end]


def _sorted_unique(values):
    """The distinct values, sorted, by a sort: numpy 2's ``np.unique`` without return values
    builds a hash table, far slower than sorting for millions of distinct 64-bit hashes."""
    values = np.sort(values)
    keep = np.ones(len(values), dtype=bool)
    np.not_equal(values[1:], values[:-1], out=keep[1:])
    return values[keep]


def _common_count(a, b):
    """How many values two sorted arrays of distinct values share (a search of the shorter in
    the longer; ``np.intersect1d`` sorts both again)."""
    if len(a) < len(b):
        a, b = b, a
    if not len(b):
        return 0
    at = np.minimum(np.searchsorted(a, b), len(a) - 1)
    return int(np.count_nonzero(a[at] == b))


def _no_examples(path, lines, skipped):
    """The error of a file none of whose records is kept."""
    return DataError(f"{path}: no valid examples ({lines} lines read"
                     f"{', all skipped as invalid' if skipped else ''}); check the file")


def _mixed_kinds(label, first):
    kind = "name" if isinstance(first, str) else "class id"
    return (f"label {label!r} is a {'name' if isinstance(label, str) else 'class id'} but the "
            f"first label ({first!r}) is a {kind}; use names or ids throughout")


def _file_stats(plan, role, fds):
    """The stats of a split's file, or of its shards merged."""
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
    return out


# ------------------------------------------------------------- a corpus in memory

def read_file(path, fmt, task=None, skip_invalid=False, tag_scheme="auto", limits=None,
              keys=None):
    """One file read whole by pass 1's reader -> ``FileData`` (labels as written; a tagging
    file's lines checked against one tag scheme), for tools and tests: a store build reads its
    files through ``scan``.  ``keys``: the Data keys naming its columns
    (``columns.column_keys``)."""
    limits, keys = limits or ReadLimits.of(), keys or {}
    task = _format_task(fmt, task, path, limits, keys)
    one = Plan(fmt, task, True, {"train": [path]}, {"train": path}, bool(skip_invalid), 0,
               limits=limits, layouts={path: _layout(fmt, task, path, limits, keys)})
    scanner, fd = Scanner(one, None, line_numbers=True), FileData(path, task)
    merged = ChunkScan("train", path)  # the file's lines and skips, merged as a build merges
    for chunk in one.chunks():
        sc = scanner(chunk)
        if sc.error is not None:
            raise DataError(sc.error)
        fd.examples += unpack_examples(sc.parsed)
        fd.line_numbers += sc.line_numbers.tolist()
        merged.add(sc)
    fd.lines, fd.header, fd.skipped, fd.first_skipped = \
        merged.lines, merged.header, merged.skipped, merged.first_skipped
    if FORMATS[task].labels == "tags":
        check_tag_scheme([fd], tag_scheme, skip_invalid)
    if not fd.examples:
        raise _no_examples(path, fd.lines, fd.skipped)
    return fd


SUFFIX_FORMATS = {".jsonl": "jsonl", ".json": "jsonl", ".tsv": "tsv", ".csv": "csv",
                  ".conll": "conll", ".bio": "conll", ".iob": "conll", ".parquet": "parquet"}


def formats_for(task):
    """The user-file formats (Data.corpus values) that can hold ``task``'s corpus format: JSONL
    and Parquet any (a field per key or column), TSV and CSV one with a table form, CoNLL one
    labelled by a tag per token (a token and its tag per line)."""
    fmt = FORMATS[task]
    return tuple(f for f in USER_FORMATS if f in ("jsonl", "parquet") or
                 (f in TABLE_SEPARATORS and fmt.table) or (f == "conll" and fmt.labels == "tags"))


def format_of(path):
    """The user-file format (a Data.corpus value) a file's suffix names (``.gz`` aside), or None."""
    base = path[:-3] if path.endswith(".gz") else path
    return SUFFIX_FORMATS.get(os.path.splitext(base)[1].lower())


def join_tokens(tokens):
    """A tagging example's tokens as the one text a request holds: characters joined as they
    are, longer tokens (words) with a space between, which a word tokenizer splits again."""
    return "".join(tokens) if all(len(t) == 1 for t in tokens) else " ".join(tokens)


def request_records(path, fields, fmt=None, keys=None, limits=None):
    """(line, (text, ...) | DataError) of each record of a data file in a training format
    (``fmt``, by default its suffix's: ``format_of``), streamed in input order: read chunk by
    chunk (a Parquet file batch by batch) by pass 1's reader (``Scanner.records``), so memory
    stays bounded whatever the file's size.  A record's texts come in the order of ``fields``
    (format field names; a tagging record's tokens are ``join_tokens``'d into its text); only
    those fields are resolved and read (``Plan.read``), so a label column is neither needed nor
    read (a headerless table: ``columns.table_layout``'s ``unread``; a CoNLL file of tokens
    only: ``readers.conll_tagged``); ``keys``: the Data keys naming its columns
    (``columns.column_keys``).  A
    bad record is its line's DataError (``file:line: why``) and the records after it are still
    read.  For inference over a corpus file as training reads it.

    Refused as a whole (DataError, before any record): a file whose format cannot be told, or
    whose header names no column for a field (``columns``), a headerless table wider than the
    texts and the label, or a file whose records hold no text the model reads.  Reading stops with a DataError where no record end can be found (a line over
    Data.max_line_bytes, a gzip bomb: ``data.chunks``)."""
    fmt = fmt or format_of(path)
    if fmt is None:
        raise DataError(f"{path}: cannot tell the format from the suffix; use one of "
                        f"{sorted(SUFFIX_FORMATS)}")
    limits, keys = limits or ReadLimits.of(), keys or {}
    _check_column_keys(fmt, keys, f"{path} is {fmt}")
    task = _format_task(fmt, None, path, limits, keys, _request_format(fmt, fields))
    read = FORMATS[task].fields
    missing = [f for f in fields if f not in read and not (f == "text" and "tokens" in read)]
    if missing:
        raise DataError(f"{path}: read as {task} data ({list(read)}), which has no "
                        f"{missing[0]!r} for this model; give a file of the model's task")
    # a tagging corpus's tokens are the text (its tags checked as training checks them); other
    # records are read for the texts alone: a label column neither required nor read
    texts = None if "tokens" in read else tuple(fields)
    if fmt == "conll" and not _conll_tagged(path, limits):
        texts = ("tokens",)  # a CoNLL file of tokens only, one per line
    one = Plan(fmt, task, True, {"train": [path]}, {"train": path}, False, 0, limits=limits,
               layouts={path: _layout(fmt, task, path, limits, keys, texts)}, read=texts)
    scanner = Scanner(one, None)
    for chunk in one.chunks():
        for n, ex in scanner.records(chunk, ChunkScan("train", path)):
            if isinstance(ex, BadLine):
                yield n, DataError(f"{path}:{n}: {ex.message}")
                continue
            if "tokens" in ex:
                ex = {**ex, "text": join_tokens(ex["tokens"])}
            yield n, tuple(ex[f] for f in fields)


def _request_format(fmt, fields):
    """The corpus format a request's ``fields`` are read from in a file that tells none (a
    headerless table, a Parquet file of no format's columns): of those ``fmt`` can hold that
    have the fields, the one with the most (a headerless text pair: text_a<TAB>text_b<TAB>label;
    QA's question and context), else the default."""
    holding = [t for t, f in FORMATS.items() if set(fields) <= set(f.fields) and
               fmt in formats_for(t)]
    return max(holding, key=lambda t: len(FORMATS[t].fields), default=DEFAULT_TASK)


def load_corpus(data_cfg):
    """The corpus ``Data.corpus`` names, read whole -> ``Corpus`` with example lists (labels as
    ids); ``data_cfg``: the Data section (or a dict).  A built-in corpus is its reader's; user
    files are read by the chunked path, its examples gathered (for tools, tests and the corpora
    tasks derive; a store build reads through ``scan`` and holds no example list)."""
    cfg = data_section(data_cfg)
    if cfg.corpus in BUILT_IN:
        return load_built_in(cfg)
    return read_corpus(cfg)


def read_corpus(cfg):
    """The user files of ``cfg`` read whole -> ``Corpus`` with example lists (labels as ids):
    the chunked path, its examples gathered (for tools and tests; a store build never does)."""
    scanned = scan(plan(cfg), None, 1)
    try:
        splits, read = {s: [] for s in SPLITS}, scanned.reader()
        for job in scanned.jobs(SPLITS):
            for split, (_, rows) in read(job).items():
                splits[split] += rows
        corpus = scanned.corpus
        return Corpus(corpus.task, splits, corpus.label_names, corpus.stats)
    finally:
        scanned.close()
