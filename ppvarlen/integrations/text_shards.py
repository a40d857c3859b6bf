"""Input shards for distributed inference: JSONL / Parquet rows with their file and row number.

``plan_units(path)`` lists the units of work of a file or a directory of shards: a
piece of a JSONL file (cut at line ends) or one row group of a Parquet file, so one
big file is read by many tasks.  ``read_unit(unit)`` returns one record per input row, in
file order:
``{"file", "row", "id", "text", "error"}`` — ``row`` counts from 1 within its file
(JSONL: the line number), ``id`` is the row's own id field as JSON text ("null" when
absent) and ``error`` says why the row cannot be predicted ("" when it can).  A bad
row (not UTF-8, not JSON, text missing / not a string / empty) is never dropped:
it comes back with its reason so the job can count it and write it to the rejects.  A file
or row group pyarrow cannot read stops the job with the store build's DataError
(``data.chunks.parquet_error``: the file, the row group, the fix).

Ray's own readers (``ray.data.read_json`` / ``read_parquet``) fail the whole block on
one line that is not UTF-8 and do not give row numbers, hence this reader.  No Ray here.
"""
import json
import os

from ppvarlen.data.chunks import parquet_error, pyarrow_errors
from ppvarlen.data.errors import DataError

KINDS = {".jsonl": "jsonl", ".parquet": "parquet"}


def list_files(path):
    """Sorted input files of ``path`` (a file, or a directory of .jsonl / .parquet shards).

    Names starting with "." or "_" (``_SUCCESS`` markers, temp files) are not inputs;
    any other file in the directory must be a shard, so nothing is skipped by accident.
    """
    if os.path.isfile(path):
        files = [path]
    elif os.path.isdir(path):
        files = sorted(os.path.join(root, f) for root, _, names in os.walk(path) for f in names
                       if not f.startswith((".", "_")))
        if not files:
            raise DataError(f"{path}: directory has no input shards (.jsonl or .parquet)")
    else:
        raise DataError(f"{path}: input not found (give a .jsonl / .parquet file or a directory "
                        f"of them)")
    other = [f for f in files if os.path.splitext(f)[1].lower() not in KINDS]
    if other:
        raise DataError(f"{other[0]}: input must be .jsonl ({{\"text\": ...}} per line) or "
                        f".parquet (a string column); {len(other)} such file(s) under {path}")
    kinds = {KINDS[os.path.splitext(f)[1].lower()] for f in files}
    if len(kinds) > 1:
        raise DataError(f"{path}: mixes .jsonl and .parquet shards; keep one format per job")
    return files


def jsonl_units(path, rel, unit_bytes):
    """A JSONL file cut into pieces of about ``unit_bytes``, each ending at a line end.

    Cutting needs one pass over the file on the driver (counting newlines, so each
    piece knows its first line number); it lets one big file feed many actors.
    """
    units, offset, line = [], 0, 1
    with open(path, "rb") as f:
        while True:
            piece = f.read(unit_bytes)
            if not piece:
                break
            piece += f.readline()  # finish the line the piece stopped in
            units.append({"path": path, "file": rel, "kind": "jsonl", "offset": offset,
                          "length": len(piece), "row_group": -1, "first_row": line})
            offset += len(piece)
            line += piece.count(b"\n")
    return units


def parquet_units(path, rel):
    import pyarrow.parquet as pq

    try:
        meta = pq.ParquetFile(path).metadata
    except pyarrow_errors() as e:
        raise parquet_error(path, e) from None
    units, first = [], 1
    for g in range(meta.num_row_groups):
        units.append({"path": path, "file": rel, "kind": "parquet", "offset": -1, "length": -1,
                      "row_group": g, "first_row": first})
        first += meta.row_group(g).num_rows
    return units


def plan_units(path, unit_bytes=8 << 20):
    """Units of work for a file or a directory of shards: pieces of ~``unit_bytes`` of a
    JSONL file, or Parquet row groups.  ``file`` is the path relative to the input
    directory (the input file's directory for a single file), as written to the outputs."""
    if unit_bytes < 1:
        raise ValueError(f"unit_bytes must be >= 1, got {unit_bytes}")
    base = path if os.path.isdir(path) else os.path.dirname(path)
    units = []
    for f in list_files(path):
        rel = os.path.relpath(f, base)
        units += (jsonl_units(f, rel, unit_bytes) if f.lower().endswith(".jsonl")
                  else parquet_units(f, rel))
    return units


def _record(unit, row, id_json, text, error):
    return {"file": unit["file"], "row": row, "id": id_json, "text": text, "error": error}


def check_text(value, field):
    """'' if ``value`` can be predicted, else why not."""
    if value is None:
        return f'"{field}" is missing or null'
    if not isinstance(value, str):
        return f'wrong type: "{field}" is {type(value).__name__}, expected a string'
    if not value.strip():
        return f'empty text: "{field}" has no non-space character'
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:  # a JSON "\\ud800" escape: a lone surrogate
        return f'not UTF-8: "{field}" holds a lone surrogate at character {e.start}'
    return ""


def read_jsonl(unit, text_field="text", id_field="id"):
    with open(unit["path"], "rb") as f:
        f.seek(unit["offset"])
        lines = f.read(unit["length"]).split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()  # the newline that ends the piece's last line
    out = []
    for n, raw in enumerate(lines, unit["first_row"]):
        try:
            line = raw.rstrip(b"\r").decode("utf-8")
        except UnicodeDecodeError as e:
            out.append(_record(unit, n, "null", "", f"not UTF-8: byte {raw[e.start]:#04x} at "
                               f"position {e.start}; save the file as UTF-8"))
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            out.append(_record(unit, n, "null", "", f"not valid JSON ({e.msg})"))
            continue
        if not isinstance(obj, dict):
            out.append(_record(unit, n, "null", "", f'expected an object like {{"{text_field}": '
                               f'"..."}}, got {type(obj).__name__}'))
            continue
        text = obj.get(text_field)
        error = check_text(text, text_field)
        out.append(_record(unit, n, json.dumps(obj.get(id_field), ensure_ascii=False),
                           "" if error else text, error))
    return out


def read_parquet_group(unit, text_field="text", id_field="id"):
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(unit["path"])
    except pyarrow_errors() as e:
        raise parquet_error(unit["path"], e) from None
    names = pf.schema_arrow.names
    if text_field not in names:
        raise DataError(f"{unit['path']}: no column {text_field!r} (columns: {names}); pass "
                        f"--text-field")
    try:
        table = pf.read_row_group(unit["row_group"],
                                  columns=[text_field] + ([id_field] if id_field in names else []))
    except pyarrow_errors() as e:
        raise parquet_error(unit["path"], e, unit["row_group"], unit["first_row"]) from None
    column = table.column(text_field)
    ids = table.column(id_field).to_pylist() if id_field in names else [None] * len(column)
    kind = column.type
    is_text = pa.types.is_string(kind) or pa.types.is_large_string(kind) or \
        pa.types.is_binary(kind) or pa.types.is_large_binary(kind)
    # Read strings as bytes: pyarrow does not check UTF-8 when reading, decoding here does.
    values = column.cast(pa.large_binary()).to_pylist() if is_text else column.to_pylist()
    out = []
    for k, (value, ident) in enumerate(zip(values, ids)):
        row, id_json = unit["first_row"] + k, json.dumps(ident, ensure_ascii=False, default=str)
        if isinstance(value, bytes):
            try:
                value = value.decode("utf-8")
            except UnicodeDecodeError as e:
                out.append(_record(unit, row, id_json, "", f"not UTF-8: byte "
                                   f"{value[e.start]:#04x} at position {e.start}"))
                continue
        elif value is not None:  # a numeric / nested column: every row has the wrong type
            out.append(_record(unit, row, id_json, "", f'wrong type: "{text_field}" is '
                               f"{kind}, expected a string"))
            continue
        error = check_text(value, text_field)
        out.append(_record(unit, row, id_json, "" if error else value, error))
    return out


def read_unit(unit, text_field="text", id_field="id"):
    """Every row of one unit, in file order (see the module docstring)."""
    if unit["kind"] == "jsonl":
        return read_jsonl(unit, text_field, id_field)
    return read_parquet_group(unit, text_field, id_field)
