"""User data files: the line formats, their parsers and checks, and bounded reading.

JSONL (one object per line: classification / tagging / seq2seq, and the formats task modules
register), TSV ``text<TAB>label`` and Parquet (one row = one JSONL object's fields).  Every
record is checked: a bad one raises ``BadLine`` naming what is wrong and how to fix it, which
the reader (``data.sources``) reports as ``file:line`` or, with ``Data.skip_invalid``, skips and
counts per reason.  Nothing is dropped silently: an empty text is an error like any other.

Reading is bounded whatever the file holds (``ReadLimits``): a line is read at most
``Data.max_line_bytes`` bytes far (``bounded_lines``), so a line longer than that, or a file
without line ends, stops the build after that much; a ``.gz`` file that expands beyond
``Data.max_decompressed_ratio`` times the compressed bytes read so far (a gzip bomb) stops it
too (``open_data_file``).

Tagging lines must all fit one tag scheme (BIO, BIOES, BMES or plain; ``data.tagschemes``),
checked per file and over all files (``check_tag_scheme``, ``map_tags``), before any training.
"""
import csv
import glob
import gzip
import io
import json
import os
import zlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import orjson

from ..config import ConfigError
from ..config_schema import SCHEMA
from ..utils.log import get_logger
from . import tagschemes
from .errors import CHECK_DATA_FILES, DataError, unreadable_data_file

logger = get_logger("data.readers")

_SKIP_HINT = "(or set Data.skip_invalid: true to skip such lines and count them)"
DEFAULT_TASK = "classification"  # a JSONL file whose first line tells no task; TSV files


class BadLine(Exception):
    """One line is unusable: ``reason`` is a short counter key, ``message`` says how to fix."""

    def __init__(self, reason, message):
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass
class FileData:
    """The valid examples of one file, with the line each came from and what was skipped."""

    path: str
    task: str
    examples: list = field(default_factory=list)
    line_numbers: list = field(default_factory=list)
    lines: int = 0  # data lines seen (a TSV header not counted)
    skipped: Counter = field(default_factory=Counter)  # reason -> lines skipped
    first_skipped: dict = field(default_factory=dict)  # reason -> (line, message)
    header: bool = False


# ---------------------------------------------------------------- bounded reading

@dataclass(frozen=True)
class ReadLimits:
    """What reading one data file may cost: the longest line in bytes (its line end not
    counted) and how many times the compressed bytes a ``.gz`` file may expand to (None: not
    checked).  Plain values, so a streaming build's workers get them with their chunks."""

    max_line_bytes: int
    max_decompressed_ratio: float = None

    @classmethod
    def of(cls, data_cfg=None):
        """The limits a ``Data`` section (a Config or a dict) sets; the schema's defaults for
        keys it does not set, or for None."""
        data_cfg = {} if data_cfg is None else data_cfg
        values = {k: data_cfg.get(k, SCHEMA["Data"][k].default)
                  for k in ("max_line_bytes", "max_decompressed_ratio")}
        if not isinstance(values["max_line_bytes"], int) or values["max_line_bytes"] < 1:
            raise ConfigError(f"Data.max_line_bytes must be a positive number of bytes, got "
                              f"{values['max_line_bytes']!r}")
        ratio = values["max_decompressed_ratio"]
        if ratio is not None and ratio < 1:
            raise ConfigError(f"Data.max_decompressed_ratio must be >= 1 (null: no check), got "
                              f"{ratio!r}")
        return cls(**values)


# A .gz file's ratio is checked only once this much is decompressed: a small file's ratio says
# nothing (a few repeated lines compress a hundredfold or more) and it costs little to read.
RATIO_FREE_BYTES = 8 << 20


class _GzipWithinRatio(io.RawIOBase):
    """The decompressed bytes of a ``.gz`` file, refused (DataError) once they exceed
    ``max_ratio`` times the compressed bytes read so far: a bomb stops early, at a cost bounded
    by the ratio times its compressed size, wherever in the file it expands."""

    def __init__(self, path, compressed, max_ratio):
        self.path, self.max_ratio = path, max_ratio
        self._compressed = compressed
        self._gzip = gzip.GzipFile(fileobj=compressed, mode="rb")
        self.decompressed = 0

    def readable(self):
        return True

    def readinto(self, buffer):
        try:
            n = self._gzip.readinto(buffer)
        except (OSError, EOFError, zlib.error) as e:  # gzip.BadGzipFile is an OSError
            raise DataError(f"{self.path}: cannot decompress ({e}); the file is not gzip'd or "
                            f"is cut short: check it, or drop the .gz suffix of a plain file") \
                from None
        self.decompressed += n
        if self.max_ratio is not None and self.decompressed > RATIO_FREE_BYTES:
            compressed = self._compressed.tell()
            if self.decompressed > self.max_ratio * compressed:
                raise DataError(
                    f"{self.path}: the first {compressed:,} compressed bytes decompress to "
                    f"{self.decompressed:,} bytes, more than Data.max_decompressed_ratio "
                    f"({self.max_ratio:g}) times as many; text corpora compress far less, so "
                    f"this looks like a gzip bomb or not a corpus. If the file is right, raise "
                    f"the bound, e.g. -o Data.max_decompressed_ratio="
                    f"{int(4 * self.decompressed / compressed)} (null: no check)")
        return n

    def close(self):
        if not self.closed:
            self._gzip.close()
            self._compressed.close()
        super().close()


def open_data_file(path, limits):
    """``path`` opened for reading bytes; a ``.gz`` file decompressed within ``limits``' ratio."""
    try:
        f = open(path, "rb")
    except OSError as e:
        raise unreadable_data_file(path, e, "open") from None
    if not path.endswith(".gz"):
        return f
    return io.BufferedReader(_GzipWithinRatio(path, f, limits.max_decompressed_ratio))


class _LongLine:
    def __repr__(self):
        return "LONG_LINE"


LONG_LINE = _LongLine()  # what ``bounded_lines`` yields for a line over its bound


def bounded_lines(f, max_line_bytes):
    """Yield each line of the binary file ``f`` (bytes, with its line end), reading at most
    ``max_line_bytes + 1`` bytes of a line at a time: a longer line yields ``LONG_LINE``
    instead once that much of it is read (a caller that stops there read no more), and the
    rest of it is read past in pieces of that size when the caller goes on.  Memory stays
    bounded however long a line is, or a file without line ends."""
    while True:
        raw = f.readline(max_line_bytes + 1)
        if not raw:
            return
        if len(raw) <= max_line_bytes or raw.endswith(b"\n"):
            yield raw
            continue
        yield LONG_LINE
        while raw and not raw.endswith(b"\n"):
            raw = f.readline(max_line_bytes + 1)


def long_line_error(where, limit, what="the line"):
    """The DataError for a line (or a Parquet cell) over Data.max_line_bytes at ``where``
    (``file:line``).  It names the bound, not the length: reading stops at the bound."""
    return DataError(f"{where}: {what} is longer than Data.max_line_bytes ({limit:,} bytes), "
                     f"the most one example may take (each costs many times its size in memory "
                     f"while it is read and encoded). Check the file: one that long is more "
                     f"often a file without line ends, or in another format, than one example. "
                     f"If such examples are real, raise the bound, e.g. "
                     f"-o Data.max_line_bytes={4 * limit}")


def decode_line(raw, n):
    """One raw line (bytes) at line number ``n`` -> its text without the line end, or a
    ``BadLine`` when it is not UTF-8 (reported on its own line, not as a whole-file failure)."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return BadLine("not_utf8", f"not valid UTF-8 (bad byte {raw[e.start:e.start + 1]!r} "
                                   f"at byte {e.start} of the line); re-save the file as UTF-8, "
                                   f"e.g. iconv -f GBK -t UTF-8 in > out")
    if n == 1 and line.startswith("\ufeff"):
        line = line[1:]  # a UTF-8 byte-order mark is not part of the data
    return line.rstrip("\r\n")


def _check_cell_bytes(path, batch, first_row, limit):
    """DataError naming the first cell of a text column of ``batch`` over ``limit`` bytes."""
    import pyarrow as pa
    import pyarrow.compute as pc

    for name, column in zip(batch.schema.names, batch.columns):
        kind = column.type
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or
                pa.types.is_binary(kind) or pa.types.is_large_binary(kind)):
            continue
        over = pc.greater(pc.binary_length(column), limit)
        if pc.any(over).as_py():
            k = pc.index(over, True).as_py()
            raise long_line_error(f"{path}:{first_row + k}", limit, f"field {name!r}")


def expand_inputs(spec):
    """A file, a directory (its files, sorted) or a glob pattern -> the files to read."""
    if os.path.isdir(spec):
        files = sorted(os.path.join(spec, f) for f in os.listdir(spec)
                       if not f.startswith(".") and os.path.isfile(os.path.join(spec, f)))
    elif glob.has_magic(spec):
        files = sorted(f for f in glob.glob(spec) if os.path.isfile(f))
    else:
        return [spec]
    if not files:
        raise DataError(f"{spec}: no data files {'in this directory' if os.path.isdir(spec) else 'match this pattern'}; "
                        f"{CHECK_DATA_FILES}")
    return files


def _plain_text(value):
    """Whether ``value`` is a text ``_require_text`` takes as it is (the common case)."""
    return type(value) is str and value and not value.isspace()


def _plain_label(value):
    """The class label ``_check_label`` makes of ``value`` in the common case (a non-blank name,
    stripped, or an id >= 0), else None."""
    kind = type(value)
    if kind is str:
        return value.strip() or None
    return value if kind is int and value >= 0 else None


def _require_text(value, name, reason_empty="empty_text"):
    if _plain_text(value):
        return value
    if not isinstance(value, str):
        raise BadLine("wrong_type", f"field {name!r} must be a string, got "
                                    f"{type(value).__name__} {value!r:.60}")
    if not value.strip():
        raise BadLine(reason_empty, f"field {name!r} is empty; every example needs a non-empty "
                                    f"{name} (remove the line or fill it in)")
    return value


def _check_label(value):
    label = _plain_label(value)
    if label is not None:
        return label
    # bool is an int subclass in Python: JSON true/false must not become class 1/0.
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise BadLine("wrong_type", f"field 'label' must be a class id (integer >= 0) or a class "
                                    f"name (string), got {type(value).__name__} {value!r:.60}")
    if isinstance(value, int) and value < 0:
        raise BadLine("bad_label", f"label {value} is negative; class ids start at 0")
    if isinstance(value, str) and not value.strip():
        raise BadLine("bad_label", "field 'label' is an empty string; give a class name or id")
    return value.strip() if isinstance(value, str) else value


def _parse_tagging(obj):
    # no "tags": a CoNLL file of tokens only, read for inference (``conll_sentences``)
    tokens, tags = obj["tokens"], obj.get("tags")
    for name, seq in (("tokens", tokens), ("tags", tags)):
        if seq is None and name == "tags":
            continue
        if not isinstance(seq, list) or not all(isinstance(t, str) for t in seq):
            raise BadLine("wrong_type", f"field {name!r} must be a list of strings, got {seq!r:.80}")
    if not tokens:
        raise BadLine("empty_text", "field 'tokens' is empty; every example needs at least one token")
    if any(t == "" for t in tokens):
        raise BadLine("empty_text", f"token {tokens.index('')} is an empty string; drop it (and "
                                    f"its tag) or give the real token")
    if tags is not None and len(tokens) != len(tags):
        raise BadLine("length_mismatch", f"{len(tokens)} tokens but {len(tags)} tags; give exactly "
                                         f"one tag per token")
    return {"tokens": tokens, "tags": tags}  # tags: check_tag_scheme, over whole files


def parse_flat(obj, fields):
    """A flat format's JSON object (its ``fields`` are texts, but a class ``label``) -> the
    example, its fields in ``fields`` order.  Raises BadLine."""
    return {name: _check_label(obj[name]) if name == "label" else _require_text(obj[name], name)
            for name in fields}


UNPARSED = object()  # ``load_lines``' value of a line orjson refuses
NOT_LOADED = object()  # ``parse_json_bytes``: the line is not loaded yet


def load_lines(raws):
    """orjson's value of each JSONL line (bytes), or ``UNPARSED`` for a line it refuses: what
    ``parse_json_bytes`` starts from, made for a chunk at once."""
    loads, values = orjson.loads, []
    append = values.append
    for raw in raws:
        try:
            append(loads(raw))
        except orjson.JSONDecodeError:
            append(UNPARSED)
    return values


def flat_examples(values, fields):
    """``load_lines``' values of a flat format's lines -> their examples, when every one is the
    common case: a JSON object whose values are all strings or integers (no float, bool, null
    or nesting), with the ``fields``, texts that ``_plain_text`` takes and a label
    ``_plain_label`` takes (``parse_json_bytes`` of each line gives the same).  Else None: the
    caller parses the lines one at a time, which gives each bad line's message."""
    if not all([type(o) is dict for o in values]) or \
            not all([type(v) is str or type(v) is int for o in values for v in o.values()]):
        return None
    columns = []
    try:
        for name in fields:
            column = [o[name] for o in values]
            if name == "label":
                column = [_plain_label(v) for v in column]
                if None in column:
                    return None
            elif not all([_plain_text(v) for v in column]):
                return None
            columns.append(column)
    except KeyError:
        return None
    return [dict(zip(fields, row)) for row in zip(*columns)]


def infer_task(obj):
    """The task whose fields a JSON object has, or None; when several formats' fields are all
    there, the one with the most fields ({"text_a", "text_b", "label"} is a labelled text pair,
    not an unlabelled one)."""
    found = [task for task, spec in FORMATS.items() if all(n in obj for n in spec.fields)]
    return max(found, key=lambda task: len(FORMATS[task].fields), default=None)


def parse_json_line(line, task, rename=None, read=None):
    """One JSONL line -> example dict (labels still raw); ``rename``: the file's field ->
    format field (``columns.Layout.rename``), None: its fields are the format's; ``read``:
    ``parse_object``'s.  Raises BadLine."""
    spec = FORMATS[task]
    if not line.strip():
        raise BadLine("blank_line", "blank line; remove it (every line must be one JSON object)")
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise BadLine("bad_json", f"invalid JSON ({e.msg} at column {e.colno}); each line must be "
                                  f"one JSON object such as {spec.example_line}") from None
    return parse_object(obj, task, rename, read)


def parse_json_bytes(raw, n, task, loaded=NOT_LOADED, rename=None, read=None):
    """One raw JSONL line (bytes, its line end or not) at line ``n`` -> example dict: what
    ``decode_line`` then ``parse_json_line`` give, BadLine included.  orjson parses the UTF-8
    bytes themselves (no decoded copy of the line, and several times faster than ``json`` on
    non-ASCII text); a line it refuses (not UTF-8, a BOM, blank, NaN, an escaped lone
    surrogate, bad JSON), or one holding a number it reads as a float (it reads integers
    beyond 64 bits as floats), goes the ``json`` way, so every example and every message is
    that one's.  ``loaded``: ``load_lines``' value of the line, when made already."""
    obj = load_lines([raw])[0] if loaded is NOT_LOADED else loaded
    if obj is UNPARSED or _holds_float(obj):
        line = decode_line(raw, n)
        if isinstance(line, BadLine):
            raise line
        return parse_json_line(line, task, rename, read)
    return parse_object(obj, task, rename, read)


def _holds_float(value):
    """Whether a parsed JSON value is or holds a float."""
    kind = type(value)
    if kind is dict:
        value = value.values()
    elif kind is not list:
        return kind is float
    for v in value:
        kind = type(v)
        if kind is float or ((kind is dict or kind is list) and _holds_float(v)):
            return True
    return False


def renamed(obj, rename):
    """A JSON object's fields as the format's (``rename``: the file's field -> format field);
    an object that is no dict as it is."""
    if type(obj) is not dict:
        return obj
    return {field: obj[name] for name, field in rename.items() if name in obj}


def parse_object(obj, task, rename=None, read=None):
    """One JSON object (a JSONL line, a Parquet row) -> example dict.  ``read``: the fields read
    (a request's texts, each a non-empty string: ``parse_flat``), None: all the format's, as
    its parse checks them.  Raises BadLine."""
    spec = FORMATS[task]
    if not isinstance(obj, dict):
        raise BadLine("not_an_object", f"expected a JSON object, got {type(obj).__name__}; each "
                                       f"line must look like {spec.example_line}")
    if rename is not None:
        obj = renamed(obj, rename)
    names = read or spec.fields
    for name in names:  # every field there: no list built per line
        if name not in obj:
            break
    else:
        return spec.parse_object(obj) if read is None else parse_flat(obj, read)
    missing = [n for n in names if n not in obj]
    if missing:
        needs = f"task {task} needs" if read is None else "the model reads"
        raise BadLine("missing_field", f"missing field {' and '.join(map(repr, missing))} "
                                       f"({needs} {', '.join(map(repr, names))}, e.g. "
                                       f"{spec.example_line}; fields here: {sorted(obj)}; "
                                       f"another name for a field: Data.text_field, "
                                       f"label_field, ...)")
    return spec.parse_object(obj)


TABLE_SEPARATORS = {"tsv": "\t", "csv": ","}
_SEPARATOR_WORDS = {"\t": ("tab-separated", "<TAB>", "remove tabs inside the texts or use JSONL"),
                    ",": ("comma-separated", ",", 'quote a field that holds a comma: "a, b"')}


def table_row(cells, layout, fields, class_label, separator="\t"):
    """One table row's cells -> {field: value} by ``layout`` (``columns.Layout``); the field
    ``label`` is a class label when ``class_label`` (digits -> a class id).  Raises BadLine."""
    if len(cells) != layout.width:
        what, joiner, fix = _SEPARATOR_WORDS[separator]
        if len(cells) == 1 and not cells[0].strip():
            raise BadLine("blank_line", f"blank line; remove it (every line must be "
                                        f"{joiner.join(layout.names)})")
        raise BadLine("column_count", f"expected {layout.width} {what} columns "
                                      f"({joiner.join(layout.names)}), found {len(cells)}; {fix}")
    out = {}
    for name, i in zip(fields, layout.picks):
        cell = cells[i]
        if class_label and name == "label":
            cell = cell.strip()
            out[name] = _check_label(int(cell) if cell.isdigit() else cell)
        else:
            out[name] = _require_text(cell, name)
    return out


def tsv_cells(line):
    """A TSV line's cells: split at every tab (no quoting: a quote is text, as TSV corpora
    write it)."""
    if not line.strip():
        return [""]
    return line.split("\t")


def csv_records(lines, first_line):
    """(line, cells | BadLine) of each CSV record of ``lines`` (raw bytes, line ends cut): the
    standard ``csv`` module's reading (quotes, doubled quotes, separators and line ends inside a
    quoted field); a record's line is its first.  A quoted field left open runs to the end of
    ``lines`` (a chunk ends where every quote is closed, ``chunks``) and is refused there."""
    pending, quotes, start = [], 0, None
    for k, raw in enumerate(lines):
        n = first_line + k
        line = decode_line(raw, n)
        if isinstance(line, BadLine):
            yield n, line
            pending, quotes = [], 0
            continue
        if not pending:
            start = n
        pending.append(line)
        quotes += line.count('"')
        if quotes % 2:
            continue
        text = "\n".join(pending)
        pending, quotes = [], 0
        if not text.strip():
            yield start, [""]
            continue
        try:
            yield start, next(csv.reader([text], strict=True))
        except csv.Error as e:
            yield start, BadLine("bad_csv", f"not a CSV record ({e}); a field holding a quote, "
                                            f"comma or line end is quoted and its quotes doubled: "
                                            f'"say ""hi"", then go"')
    if pending:
        yield start, BadLine("bad_csv", "a quoted field opened on this line is never closed; "
                                        "close it, or double a quote inside a quoted field")


CONLL_DOCSTART = "-DOCSTART-"


def conll_sentences(lines, first_line, tagged=True):
    """(line of its first token, {"tokens", "tags"} | BadLine) of each sentence of CoNLL
    ``lines`` (raw bytes, line ends cut): a token per line, its tag in the last column
    (whitespace- or tab-separated: a line with a tab is split at tabs only, so a token may hold
    spaces), a blank line between sentences (any number of them, at the end too), and
    ``-DOCSTART-`` lines skipped.  A bad line makes its sentence the BadLine (at that line).
    ``tagged`` False: a file of tokens only (``conll_tagged``; read for inference), each line
    one token and nothing else, a sentence's "tags" None."""
    tokens, tags, start, bad = [], [], None, None
    for k, raw in enumerate(lines + [b""]):
        n = first_line + k
        line = decode_line(raw, n)
        if isinstance(line, BadLine):
            bad = bad or (n, line)
            start = start or n
            continue
        if not line.strip():
            if bad is not None:
                yield bad
            elif tokens:
                yield start, _or_bad(_parse_tagging,
                                     {"tokens": tokens, "tags": tags if tagged else None})
            tokens, tags, start, bad = [], [], None, None
            continue
        cells = line.split("\t") if "\t" in line else line.split()
        if cells[0].strip() == CONLL_DOCSTART:
            continue
        start = start or n
        if bad is not None:
            continue
        if not tagged and len(cells) > 1:
            bad = (n, BadLine("column_count", f"a CoNLL file of tokens only (its first token "
                                              f"line has one column) holds one token per line, "
                                              f"found {len(cells)} columns: {line[:60]!r}; give "
                                              f"every token its tag, or none"))
            continue
        if tagged and (len(cells) < 2 or not cells[-1].strip()):
            bad = (n, BadLine("column_count", f"a token line holds the token and its tag (the "
                                              f"last column), found {len(cells)} column(s): "
                                              f"{line[:60]!r}; a blank line ends a sentence"))
            continue
        tokens.append(cells[0].strip() if "\t" in line else cells[0])
        tags.append(cells[-1].strip())


def conll_tagged(lines):
    """Whether a CoNLL file whose first ``lines`` (decoded, line ends cut) are these holds tags:
    its first token line has more than one column (a token-only file: one)."""
    for line in lines:
        cells = line.split("\t") if "\t" in line else line.split()
        if cells and cells[0].strip() != CONLL_DOCSTART:
            return len(cells) > 1
    return True


def _or_bad(parse, *args):
    """``parse(*args)``, or the BadLine it raises."""
    try:
        return parse(*args)
    except BadLine as bad:
        return bad


def sniff_format(path, limits=None):
    """The user-file format the start of ``path`` looks like (jsonl, csv, tsv, conll), or None:
    for the error of a file read as another format."""
    try:
        with open_data_file(path, limits or ReadLimits.of()) as f:
            head = f.read(64 << 10)
    except (DataError, OSError):
        return None
    lines = [ln.decode("utf-8", "replace").rstrip("\r") for ln in head.split(b"\n")[:200]]
    filled = [ln for ln in lines if ln.strip()]
    if not filled:
        return None
    if all(ln.lstrip().startswith("{") for ln in filled[:20]):
        return "jsonl"
    has_blank = any(not ln.strip() for ln in lines[1:-1])  # a blank line between lines
    tokens = [ln for ln in filled[:50] if not ln.startswith(CONLL_DOCSTART)] or filled[:1]
    columns = [len(ln.split("\t") if "\t" in ln else ln.split()) for ln in tokens]
    short = all(len(ln) < 40 for ln in tokens)
    if short and has_blank and min(columns) >= 2 and len(set(columns)) == 1:
        return "conll"
    if all("\t" in ln for ln in filled[:20]):
        return "tsv"
    if all("," in ln for ln in filled[:20]):
        return "csv"
    return None


# ---------------------------------------------------------------- labels

def map_tags(files, label_names, skip_invalid, tag_scheme):
    """Tagging data's labels over all files (``FileData`` of tags, in input order) -> (the tag
    names in id order, what goes into corpus stats): tags stay strings (the contract); every
    line fits one tag scheme (``check_tag_scheme``); the names fix their order (tag id = index).  Lines that do not fit are dropped from
    ``fd.examples`` (Data.skip_invalid) or raise DataError."""
    scheme, evidence = check_tag_scheme(files, tag_scheme, skip_invalid, label_names)
    logger.info("tag scheme: %s (from %s)", scheme.upper(), evidence)
    if label_names is None:
        names = tagschemes.order({t for fd in files for ex in fd.examples for t in ex["tags"]},
                                 scheme)
    else:
        allowed, names = set(label_names), list(label_names)

        def unknown_tag(ex, where):
            tag = next((t for t in ex["tags"] if t not in allowed), None)
            return None if tag is None else ("unknown_label", f"tag {tag!r} is not in Data."
                                             f"label_names {names}; add it there or fix the tag")
        for fd in files:
            _check_lines(fd, unknown_tag, skip_invalid)
    added = tagschemes.complete(names, scheme)
    if added and label_names is not None:  # the user's tag ids stay as given
        raise ConfigError(f"Data.label_names: a {scheme.upper()} tag set needs {added} too, so "
                          f"that the scheme can be told from the names (export, evaluation); "
                          f"add them to Data.label_names")
    if added:  # so that the scheme can be told from the label names alone (export, report)
        names = tagschemes.order(set(names) | set(added), scheme)
        logger.info("tag scheme %s: added the label(s) %s that the data does not use, so that "
                    "the label names say the scheme", scheme.upper(), added)
    if tagschemes.detect(names) != scheme:  # only plain tags can look like chunks
        raise ConfigError(f"Data.tag_scheme: plain, but the tags ({', '.join(names[:4])}) read as "
                          f"{tagschemes.detect(names).upper()} chunks, and evaluation and export "
                          f"tell the scheme from the tag names; set Data.tag_scheme: "
                          f"{tagschemes.detect(names)} (token accuracy is reported too) or name "
                          f"the tags without chunk prefixes")
    info = {"scheme": scheme, "from": evidence}
    if added:
        info["labels_added"] = added
    return names, {"tag_scheme": info}


def check_tag_scheme(files, tag_scheme="auto", skip_invalid=False, label_names=None):
    """Check that every tagging line of ``files`` fits one tag scheme -> (scheme, evidence).

    The scheme is ``tag_scheme`` when given, else the one ``label_names`` use, else the one
    the tags use: the first line whose tags mix schemes with the lines before it fails (or is
    skipped).  Then each line must fit the scheme (BIOES/BMES chunks well formed).
    """
    if tag_scheme != "auto":
        scheme, evidence = tag_scheme, "Data.tag_scheme"
    elif label_names is not None:
        try:
            scheme, evidence = tagschemes.detect(label_names), "Data.label_names"
        except ValueError as e:
            raise ConfigError(f"Data.label_names: {e}; use the tags of one scheme, or set "
                              f"Data.tag_scheme") from None
    else:
        scheme, evidence = _detect_scheme(files, skip_invalid)
    hint = "" if evidence == "Data.tag_scheme" else (f"; the data reads as {scheme.upper()} from "
                                                     f"{evidence}; use one scheme, or set "
                                                     f"Data.tag_scheme")

    def misfit(ex, where):
        problem = tagschemes.sequence_problem(ex["tags"], scheme)
        return None if problem is None else problem + hint
    for fd in files:
        _check_lines(fd, misfit, skip_invalid)
    return scheme, evidence


def _detect_scheme(files, skip_invalid):
    """The scheme of the tags, line by line: a line that makes them mix fails (or is skipped)."""
    seen, first_at = set(), {}  # tag -> "file:line" of its first use

    def mixes(ex, where):
        new = set(ex["tags"]) - seen
        if not new:
            return None
        try:
            tagschemes.detect(seen | new)
        except ValueError as e:
            if not seen:
                return f"the tags of this line mix schemes: {e}; use one tag scheme per corpus"
            shown = ", ".join(f"{t} at {first_at[t]}" for t in sorted(seen)[:3])
            return (f"tags {sorted(new)[:3]} do not fit the {tagschemes.detect(seen).upper()} tags "
                    f"of the lines before ({shown}): {e}; use one tag scheme per corpus, or set "
                    f"Data.tag_scheme")
        seen.update(new)
        first_at.update((t, where) for t in new)
        return None

    for fd in files:
        _check_lines(fd, mixes, skip_invalid)
    scheme = tagschemes.detect(seen)
    shown = [t for t in tagschemes.order(seen, scheme) if t != tagschemes.OUTSIDE][:3]
    return scheme, "the tags (" + ", ".join(f"{t} first at {first_at[t]}" for t in shown) + ")"


def label_set_line(names, shown=40):
    """The line a run logs as it starts: the classes (tags) it learns, in id order."""
    more = f", ... ({len(names) - shown} more)" if len(names) > shown else ""
    return f"labels ({len(names)}, ids in this order): {', '.join(names[:shown])}{more}"


def label_id(label, index):
    """A raw class label's id in ``index`` (name -> id), or None when it is not one."""
    if isinstance(label, str):
        return index.get(label)
    return label if label < len(index) else None


def _check_lines(fd, check, skip_invalid):
    """``check(example, "file:line")`` -> None, a message (reason ``bad_tag``), or (reason,
    message) for each example of ``fd`` in order; raise on the first problem or skip (and
    count) the bad examples."""
    keep = []
    for i, ex in enumerate(fd.examples):
        n = fd.line_numbers[i]
        where = f"{fd.path}:{n}"
        problem = check(ex, where)
        if problem is None:
            keep.append(i)
            continue
        why, message = problem if isinstance(problem, tuple) else ("bad_tag", problem)
        if not skip_invalid:
            raise DataError(f"{where}: {message} {_SKIP_HINT}")
        fd.skipped[why] += 1
        fd.first_skipped.setdefault(why, (n, message))
    dropped = len(fd.examples) - len(keep)
    if dropped:
        fd.examples = [fd.examples[i] for i in keep]
        fd.line_numbers = [fd.line_numbers[i] for i in keep]
        logger.warning("%s: skipped %d example(s) with bad labels", fd.path, dropped)


# ---------------------------------------------------------------- corpus formats

@dataclass(frozen=True)
class CorpusFormat:
    """How one task's examples are written in JSONL (and TSV) and checked: the corpus line
    format a task reads (``FORMATS``, by task name; ``register_format``)."""

    fields: tuple
    example_line: str
    parse: Callable       # JSON object -> example dict; raises BadLine.  None: a flat format
    text_fields: tuple    # the fields a vocabulary counts (a string, or a token list)
    labels: str = None    # "class": one class label per line (names or ids); "tags": tags
    table: bool = False   # has a table form (TSV / CSV: a column per field, ``table_row``)

    @property
    def flat(self):
        """Whether every field is a text but a class ``label`` (``parse_flat``): pass 1 parses
        a chunk of such lines at once (``flat_examples``)."""
        return self.parse is None

    def parse_object(self, obj):
        """A JSON object holding every field -> the example dict.  Raises BadLine."""
        return parse_flat(obj, self.fields) if self.parse is None else self.parse(obj)


FORMATS = {
    "classification": CorpusFormat(("text", "label"),
                                   '{"text": "这本书很好", "label": "positive"}',
                                   None, ("text",), "class", table=True),
    "tagging": CorpusFormat(("tokens", "tags"),
                            '{"tokens": ["江", "泽", "民"], "tags": ["B-PER", "I-PER", "I-PER"]}',
                            _parse_tagging, ("tokens",), "tags"),
    "seq2seq": CorpusFormat(("source", "target"), '{"source": "中国", "target": "zhong1 guo2"}',
                            None, ("source", "target")),
}


def register_format(name, fmt):
    """Add a task's corpus line format (a task module registers its own at import: data knows
    no task).  The same format again is a no-op; another one under a taken name an error."""
    if FORMATS.get(name, fmt) != fmt:
        raise ValueError(f"corpus format {name!r} is registered already")
    FORMATS[name] = fmt
