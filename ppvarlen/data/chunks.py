"""A corpus file as ordered chunks of records, and a chunk's parsed examples as compact bytes.

Line files (JSONL / TSV, plain or gzip'd) are cut into chunks of whole lines (``_chunks_of``:
about ``CHUNK_BYTES``, a byte range of a plain file or a ``.gz``'s decompressed bytes), Parquet
files into their row groups (``_parquet_chunks``, each read in batches of
``PARQUET_BATCH_ROWS`` rows).  Reading is bounded (``readers.ReadLimits``):
files are opened with ``readers.open_data_file`` (a ``.gz`` within
``Data.max_decompressed_ratio``), the parent holds at most ``Data.max_line_bytes`` of an
unfinished line, and a chunk that stops there carries the error, raised in input order.
``pack_examples`` / ``unpack_examples``: what pass 1 spills and pass 2 reads back (plain bytes,
nothing pickled).  The passes themselves: ``data.sources``.
"""
import json
from dataclasses import dataclass

import numpy as np

from .errors import DataError
from .readers import BadLine, ReadLimits, _check_cell_bytes, long_line_error, open_data_file

CHUNK_BYTES = 4 << 20  # a chunk of whole lines: a few thousand examples, a few MB per worker
PARQUET_BATCH_ROWS = 4096  # rows of a row group read at once (a row group may be the whole file)
PARQUET_READ_BUFFER = 1 << 20  # bytes of a column chunk read at once when streaming its batches


@dataclass(frozen=True)
class Chunk:
    """Records of one file: bytes [offset, offset + size) of a plain line file, ``data`` (a
    gzip'd file's decompressed lines, or any chunk's bytes when shipped), or Parquet row group
    ``row_group`` (``rows``: its table, when shipped); ``first_line`` numbers its first record.
    ``error``: reading the file stopped here (a line over Data.max_line_bytes, a gzip bomb); the
    chunk carries the message so that it is raised in input order, as a bad line's is."""

    role: str  # the Data key's split: train / dev / test
    path: str
    first_line: int
    offset: int = 0
    size: int = 0
    data: bytes = None
    error: str = None
    row_group: int = None
    rows: list = None

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


def _chunks_of(role, path, limits=None, ship=False, fmt="jsonl"):
    """Chunks of whole records, in order, at least one per file (an empty file is reported).
    ``ship``: every chunk carries its bytes (workers on other machines cannot read ``path``);
    otherwise only a gzip'd file's do and a worker reads its byte range itself.  ``fmt``: the
    file's format, which says where a record ends (``RECORD_ENDS``)."""
    limits = limits or ReadLimits.of()
    with open_data_file(path, limits) as f:
        yield from _line_chunks(role, path, f, limits.max_line_bytes,
                                carry_data=ship or path.endswith(".gz"),
                                record_end=RECORD_ENDS.get(fmt, _after_filled_line))


def _after_filled_line(block, carried):
    """Where a chunk of a line format may end in ``block``: after its last line end that ends a
    line with something on it (0: nowhere).  Blank lines go to the next chunk, so that blank
    lines ending a chunk are the file's last ones (tolerated) and no others."""
    return _back_over_blank_lines(block, block.rfind(b"\n") + 1)


def _back_over_blank_lines(block, cut):
    """``cut`` (just after a line end, or 0) moved back before the blank lines that end
    ``block[:cut]``."""
    while cut:
        start = block.rfind(b"\n", 0, cut - 1) + 1
        if block[start:cut].strip():
            return cut
        cut = start
    return 0


def _after_blank_line(block, carried):
    """CoNLL: after the last blank line (a sentence never spans two chunks; 0: none)."""
    ends = [at + len(blank) for blank in (b"\n\n", b"\n\r\n")
            if (at := block.rfind(blank)) >= 0]
    return max(ends, default=0)


def _after_closed_quotes(block, carried):
    """CSV: after the last line end, of a line with something on it, outside every quoted field
    (the quotes before it, from the chunk's start, are even: a doubled quote counts twice)."""
    quotes = sum(piece.count(b'"') for piece in carried)
    cut = _after_filled_line(block, carried)
    inside = (quotes + block.count(b'"', 0, cut)) % 2
    while cut and inside:
        before = block.rfind(b"\n", 0, cut - 1) + 1
        inside = (inside + block.count(b'"', before, cut)) % 2
        cut = before
    return _back_over_blank_lines(block, cut)  # blank lines hold no quote


RECORD_ENDS = {"conll": _after_blank_line, "csv": _after_closed_quotes}


def _line_chunks(role, path, f, max_line_bytes, carry_data, record_end=_after_filled_line):
    """``_chunks_of`` over the open binary file ``f``.

    Each block is read once and searched once, for its last record end (``record_end``).  A
    record that runs past a block is kept as the list of its pieces and joined once, when its
    end is found, so the work is linear in the file's size however long its lines (joining the
    pieces block by block would copy a long line again for every block it spans).  Once an
    unfinished record holds more than ``max_line_bytes``, the chunks end with one that carries
    the error."""
    line, offset, sent = 1, 0, False
    open_line, open_bytes = [], 0  # the pieces of the record the last block ended in
    while True:
        try:
            block = f.read(CHUNK_BYTES)
        except DataError as e:  # a .gz file beyond Data.max_decompressed_ratio, or broken
            yield Chunk(role, path, line, offset, error=str(e))
            return
        # 0 at the end of the file: the open record is the last one
        cut = record_end(block, open_line) if block else 0
        if block and not cut:
            open_line.append(block)
            open_bytes += len(block)
            if open_bytes > max_line_bytes:
                yield Chunk(role, path, line, offset,
                            error=str(long_line_error(f"{path}:{line}", max_line_bytes)))
                return
            continue
        body = b"".join(open_line + [block[:cut]])
        open_line = [block[cut:]] if cut < len(block) else []
        open_bytes = len(block) - cut
        if body or not sent:
            yield Chunk(role, path, line, offset, len(body), body if carry_data else None)
            sent = True
        line += body.count(b"\n")
        offset += len(body)
        if not block:
            return


def parquet_error(path, error, row_group=None, first_row=None):
    """DataError of a Parquet file pyarrow cannot read (a truncated file, not Parquet, a damaged
    row group): the file, the row group, pyarrow's words on one line, and the fix."""
    where = path if row_group is None else \
        f"{path}: row group {row_group} (0-based; its first row is row {first_row})"
    said = " ".join(str(error).split()) or type(error).__name__
    return DataError(f"{where}: cannot read as Parquet (pyarrow: {said}); the file is damaged or "
                     f"not Parquet: write it again (e.g. pyarrow.parquet.write_table) and check "
                     f"that pyarrow.parquet.ParquetFile({path!r}).read() reads it")


def pyarrow_errors():
    """What pyarrow raises for a file it cannot read: its ArrowException family (ArrowInvalid
    is also a ValueError) and OSError (ArrowIOError is OSError itself)."""
    import pyarrow as pa

    return OSError, pa.ArrowException


def _parquet_file(path, streamed=False):
    """``pyarrow.parquet.ParquetFile`` of ``path``; ``streamed``: its column chunks read
    ``PARQUET_READ_BUFFER`` bytes at a time (pyarrow otherwise reads a row group's column chunk
    whole, even to hand out its first batch)."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(f"{path}: reading Parquet needs pyarrow, which is not installed: install "
                        f"the parquet extra, ppvarlen[parquet] (or give JSONL / TSV files)") \
            from None
    try:
        if streamed:
            return pq.ParquetFile(path, pre_buffer=False, buffer_size=PARQUET_READ_BUFFER)
        return pq.ParquetFile(path)
    except pyarrow_errors() as e:
        raise parquet_error(path, e) from None


def _parquet_chunks(role, path, ship=False):
    """One chunk per row group (at least one per file, so that an empty file is reported)."""
    meta = _parquet_file(path).metadata
    first = 1
    for i in range(meta.num_row_groups):
        rows = _row_group(path, i, first) if ship else None
        yield Chunk(role, path, first, row_group=i, rows=rows)
        first += meta.row_group(i).num_rows
    if not meta.num_row_groups:
        yield Chunk(role, path, 1)


def _row_group(path, i, first_row):
    """Row group ``i`` of ``path`` as a table; DataError (naming its ``first_row``) when pyarrow
    cannot read it."""
    parquet = _parquet_file(path)
    try:
        return parquet.read_row_group(i)
    except pyarrow_errors() as e:
        raise parquet_error(path, e, i, first_row) from None


def _row_group_batches(path, i, first_row):
    """Row group ``i`` of ``path`` as record batches of at most ``PARQUET_BATCH_ROWS`` rows (a
    row group may hold the whole file: it is never held at once); DataError (naming its
    ``first_row``) when pyarrow cannot read it."""
    batches = _parquet_file(path, streamed=True).iter_batches(batch_size=PARQUET_BATCH_ROWS,
                                                              row_groups=[i])
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except pyarrow_errors() as e:
            raise parquet_error(path, e, i, first_row) from None
        yield batch


def _parquet_rows(chunk, limits):
    """(row number, dict) of the chunk's row group, read batch by batch (its shipped table at
    once); a text cell over Data.max_line_bytes stops the reading as a line over it does.  A
    row with a string cell that is not UTF-8 (pyarrow does not check when it writes) is a
    ``BadLine``, skipped under Data.skip_invalid."""
    if chunk.row_group is None:  # an empty file
        return
    first = chunk.first_line
    batches = [chunk.rows] if chunk.rows is not None else \
        _row_group_batches(chunk.path, chunk.row_group, first)
    for batch in batches:
        _check_cell_bytes(chunk.path, batch, first, limits.max_line_bytes)
        try:
            rows = batch.to_pylist()
        except UnicodeDecodeError:
            rows = [_row_or_bad(batch, k) for k in range(batch.num_rows)]
        for k, row in enumerate(rows):
            yield first + k, row
        first += batch.num_rows


def _row_or_bad(table, k):
    """Row ``k`` of ``table`` as a dict, or the BadLine naming its cell that is not UTF-8."""
    row = table.slice(k, 1)
    for name, column in zip(row.schema.names, row.columns):
        try:
            column.to_pylist()
        except UnicodeDecodeError as e:
            return BadLine("not_utf8", f"field {name!r} is not valid UTF-8 (bad byte "
                                       f"{e.object[e.start:e.start + 1]!r} at byte {e.start} of "
                                       f"the cell); write the file again with UTF-8 text")
    return row.to_pylist()[0]


def pack_examples(examples, utf8=None):
    """Examples (dicts with the same keys) -> bytes: a JSON header, then per field a string
    column as int64 UTF-8 offsets + the UTF-8 blob, an int column as int64 values, any other
    column (e.g. a list of answers) as its values' JSON.  Plain bytes, nothing pickled: the
    spill of pass 1 is read back by ``unpack_examples`` without parsing a line again.
    ``utf8``: {field: its strings' UTF-8 bytes (``surrogatepass``)} made already (the split
    keys), not encoded again."""
    utf8 = utf8 or {}
    names = list(examples[0]) if examples else []
    mixed = any(list(ex) != names for ex in examples)  # keys differ: one column of examples
    columns = []
    for name in [""] if mixed else names:
        if name in utf8 and not mixed:
            columns.append((name, "str", utf8[name]))
            continue
        values = examples if mixed else [ex[name] for ex in examples]  # dicts: JSON below
        if all(type(v) is str for v in values):
            columns.append((name, "str", [v.encode("utf-8", "surrogatepass") for v in values]))
        elif all(type(v) is int for v in values) and \
                all(-(1 << 63) <= v < (1 << 63) for v in values):
            columns.append((name, "int", np.asarray(values, "<i8").tobytes()))
        else:
            columns.append((name, "json", [json.dumps(v, ensure_ascii=False).encode(
                "utf-8", "surrogatepass") for v in values]))
    parts, fields = [], []
    for name, kind, data in columns:
        if kind != "int":  # strings / JSON: their int64 offsets, then the bytes joined
            offsets = np.zeros(len(data) + 1, "<i8")
            np.cumsum([len(b) for b in data], out=offsets[1:])
            parts.append(offsets.tobytes())
            data = b"".join(data)
        parts.append(data)
        fields.append([name, kind, len(data)])
    header = json.dumps({"count": len(examples), "fields": fields}).encode()
    return len(header).to_bytes(8, "little") + header + b"".join(parts)


def unpack_examples(data, convert=None):
    """``pack_examples``' bytes -> the examples (dicts in the same key order); ``convert``:
    {field: function of its column's values -> new values} (e.g. class labels -> ids)."""
    size = int.from_bytes(data[:8], "little")
    header = json.loads(bytes(data[8:8 + size]))
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
        examples = columns[0][1]  # whole examples as JSON (their keys differ)
        for name, fn in (convert or {}).items():
            values = fn([ex[name] for ex in examples])
            for ex, value in zip(examples, values):
                ex[name] = value
        return examples
    for name, fn in (convert or {}).items():
        columns = [(c, fn(values) if c == name else values) for c, values in columns]
    return [dict(zip([c[0] for c in columns], row)) for row in zip(*[c[1] for c in columns])] \
        if columns else [{} for _ in range(n)]
