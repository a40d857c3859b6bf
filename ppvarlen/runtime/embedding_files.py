"""Embeddings of a corpus as arrays (``ppvarlen-infer --output X.npy | X.parquet``), streamed.

``infer.run_file`` hands each window's records to the writer as soon as they are predicted;
the writer puts them into the file at once and keeps none, so memory is one window whatever
the corpus size.  Both files are written to a temporary file and renamed at the end
(``utils.io.atomic_binary_writer``): a failed run leaves no partial output.

* ``.npy`` (``NpyRows``): one float32 ``[N, D]`` array, row i answering input line i + 1.
  numpy's own header writer (``np.lib.format.write_array_header_1_0``) pads the header so
  the row count can grow in place; the header is written for 0 rows first and rewritten
  for N at the end, in the same bytes.  A ``.npy`` has no place to say which line a row
  answers, so every line must be usable: the first bad line stops the run (DataError).
* Parquet (``ParquetRows``, pyarrow's ``ParquetWriter``; the optional extra
  ``ppvarlen[parquet]``): one row group per window, columns ``line`` (int64), the task's
  vector field (``embedding``: a fixed-size list of D float32), ``num_tokens`` (int32, special
  tokens excluded),
  ``truncated`` (bool).  A bad line has no row (``line`` says which input line each row
  answers); it is reported as for JSONL output and the run exits 1.
"""
import contextlib
import os

import numpy as np

from ppvarlen.data.errors import DataError
from ppvarlen.utils.io import atomic_binary_writer

FORMATS = ("jsonl", "npy", "parquet")
SUFFIXES = {".npy": "npy", ".parquet": "parquet", ".pq": "parquet"}


def output_format(path, chosen=None):
    """The output's format: ``chosen`` (``--format``) or the one its suffix says (JSONL
    otherwise, and for stdout)."""
    if chosen is not None:
        return chosen
    return SUFFIXES.get(os.path.splitext(path or "")[1].lower(), "jsonl")


def _rows(records, field):
    """(line numbers, float32 [n, D], num_tokens, truncated) of the predicted records, their
    vectors under ``field``."""
    good = [r for r in records if "error" not in r]
    return (np.array([r["line"] for r in good], np.int64),
            np.asarray([r[field] for r in good], np.float32),
            np.array([r["num_tokens"] for r in good], np.int32),
            np.array([r["truncated"] for r in good], np.bool_))


class NpyRows:
    """A float32 ``[N, D]`` .npy file written window by window (``f``: a seekable binary
    file; ``spec``: the task's ``embedding_spec``)."""

    def __init__(self, f, spec):
        self.f, self.field, self.dim, self.count = f, spec["field"], spec["dim"], 0
        self.data_start = self._header(0)

    def _header(self, count):
        self.f.seek(0)
        np.lib.format.write_array_header_1_0(self.f, {"descr": "<f4", "fortran_order": False,
                                                      "shape": (count, self.dim)})
        return self.f.tell()

    def write(self, records):
        bad = next((r for r in records if "error" in r), None)
        if bad is not None:
            raise DataError(f"{bad['error']}; a .npy output holds one row per input line, so "
                            f"every line must be usable: fix or remove the line, or write "
                            f".parquet (its 'line' column says which input line each row "
                            f"answers; bad lines are left out)")
        _, vectors, _, _ = _rows(records, self.field)
        self.f.write(vectors.astype("<f4", copy=False).tobytes())
        self.count += len(vectors)

    def close(self):
        end = self.f.tell()
        if self._header(self.count) != self.data_start:  # numpy pads for 21 digits of rows
            raise RuntimeError("the .npy header grew when the row count was written")
        self.f.seek(end)


class ParquetRows:
    """A Parquet file written one row group per window (``f``: a binary file; ``spec``: the
    task's ``embedding_spec``, whose field names the vectors' column)."""

    def __init__(self, f, spec):
        pa, pq = _pyarrow()
        self.pa, self.field, self.dim = pa, spec["field"], spec["dim"]
        self.schema = pa.schema([("line", pa.int64()),
                                 (self.field, pa.list_(pa.float32(), self.dim)),
                                 ("num_tokens", pa.int32()), ("truncated", pa.bool_())])
        self.writer = pq.ParquetWriter(f, self.schema)
        self.row_groups = 0

    def write(self, records):
        lines, vectors, tokens, truncated = _rows(records, self.field)
        if not len(lines):
            return
        pa = self.pa
        vectors = pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), self.dim)
        self.writer.write_table(pa.Table.from_arrays(
            [pa.array(lines), vectors, pa.array(tokens), pa.array(truncated)],
            schema=self.schema), row_group_size=len(lines))
        self.row_groups += 1

    def close(self):
        self.writer.close()


WRITERS = {"npy": NpyRows, "parquet": ParquetRows}


def _pyarrow():
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError("Parquet output needs pyarrow, which is not installed: install the "
                        "parquet extra, ppvarlen[parquet] (or write .npy)") from None
    return pa, pq


@contextlib.contextmanager
def array_writer(fmt, path, spec):
    """The writer of ``fmt`` (npy | parquet) of the embeddings ``spec`` describes
    (``Task.embedding_spec``) into ``path`` (atomic: the file appears when the block ends
    without an error)."""
    if fmt == "parquet":
        _pyarrow()  # refuse before the temporary file exists
    with atomic_binary_writer(path) as f:
        writer = WRITERS[fmt](f, spec)
        try:
            yield writer
        except BaseException:
            with contextlib.suppress(Exception):  # the file is removed; the first error counts
                writer.close()
            raise
        writer.close()
