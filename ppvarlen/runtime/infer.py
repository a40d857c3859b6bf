"""Batch inference over a file: one prediction per input line, in input order, streamed.

Input: ``.jsonl``, one request item per line in the fields the task declares
(``Task.line_fields``: the names of its OIP inputs): ``{"text": ...}`` (classification,
tagging; a seq2seq export also reads ``{"source": ...}``, the seq2seq data format),
``{"text_a": ..., "text_b": ...}`` (text pairs, the pair corpus's fields) or ``{"question":
..., "context": ...}`` (extractive QA); other fields are ignored, so a corpus file is read as
it is.  ``.txt`` (one text per line) for a task whose item is one text.  A file in another
format training reads (``.tsv``, ``.csv``, ``.conll``, ``.parquet``, plain or gzip'd) is read
by the training reader (``data.sources.request_records``: columns by name, a CoNLL sentence's
tokens joined into its text), streamed as well: chunk by chunk (a Parquet file batch by
batch), a record numbered by its first line (a Parquet file by its row).  Only the item's text
columns are resolved (the fields above, by ``data.columns``' one rule): a label column is not
needed and not read, so a ``text``-only or ``id,text`` table or Parquet file is predicted.  A
headerless table is the texts alone (one column: the text) or the texts then the label, by its
first line's width; a CoNLL file holds tokens with their tags or tokens only, by its first token
line.  Such a file is refused as a whole only before its first record is read (a header naming
no column the model reads, a headerless table of another width, a file of another task's
fields) or where its records cannot be told apart any further (a line over
Data.max_line_bytes).  Each line's texts become the task's request
item (``Task.oip_item``), encoded as the server encodes it (``Task.encode_request``).
Output: JSONL, line ``i`` answering input line ``i``: ``{"line": n, **prediction}``
or ``{"line": n, "error": why}`` for a line (a record) that could not be used (a field
missing or not a string, a table row of the wrong width, a CoNLL line without a tag, named
with the line; also reported on stderr); the other lines are still predicted.
An embedding export's vectors can go to ``.npy`` or Parquet instead (by the output's suffix or
``output_format``; ``embedding_files``), written window by window as well.

The server's bound on a text holds here too: a text longer than ``Deploy.max_text_chars``
characters (each text of an item) is refused with its line's error record, and a line is read
no further than the bytes its item's texts can take in JSON (``line_bytes_bound``): a longer
line is refused after that much, read past in pieces of that size, so one huge line (or a
file without line ends) costs bounded memory and the lines after it are still predicted.

The file is read in windows of ``window`` usable items (and at most ``WINDOW_CHARS``
characters of their texts; lines that cannot be used ride along): each window is tokenised,
sorted by length into token-budget batches by the predictor, and its records are written in
input order before the next window is read, so memory stays bounded whatever the file size and
the first records appear after one window.  A file output is written to a temporary file and
moved into place at the end (an interrupted run leaves the old output, or none).

The summary counts the texts the export truncated (and warns when there are any:
truncation is never silent) and those run as several windows; its ``seconds`` is
the wall time from the first line read to the last record written (tokenising,
batching, the model and writing; model loading not included), the same span the
progress bar's rate covers, and ``model_seconds`` the share spent in batching and
the model.
"""
import collections
import contextlib
import json
import os
import sys
import time

from tqdm import tqdm

from ppvarlen.config_schema import SCHEMA
from ppvarlen.data.errors import DataError
from ppvarlen.data.readers import LONG_LINE, bounded_lines
from ppvarlen.data.sources import SUFFIX_FORMATS, format_of, request_records
from ppvarlen.tasks.base import Task
from ppvarlen.utils.io import atomic_text_writer

from ppvarlen.runtime import embedding_files

WINDOW = 4096  # usable texts sorted and batched together; larger windows pack denser batches
# A window also closes at this many characters, so a file of very long lines stays bounded.
WINDOW_CHARS = 1 << 22
MAX_TEXT_CHARS = SCHEMA["Deploy"]["max_text_chars"].default
# JSON may escape each character of a text as \uXXXX, twice for one beyond the BMP; a line
# also holds fields besides the texts (ids, labels, metadata), given this much room.
JSON_BYTES_PER_CHAR = 12
OTHER_FIELDS_BYTES = 1 << 20
JSON_TYPES = {dict: "an object", list: "an array", str: "a string", int: "a number",
              float: "a number", bool: "true/false", type(None): "null"}


def line_bytes_bound(max_text_chars, texts=1):
    """The longest input line worth reading: ``texts`` texts (a request item's) of
    ``max_text_chars`` characters, JSON escaped, and the other fields of its line."""
    return JSON_BYTES_PER_CHAR * max_text_chars * texts + OTHER_FIELDS_BYTES


def line_example(task):
    """A JSONL line of ``task``'s request item, for messages: ``{"text_a": "...", ...}``."""
    return "{" + ", ".join(f'"{names[0]}": "..."' for names in task.line_fields()) + "}"


def check_input(path, task=None):
    """DataError unless ``path`` is an existing .jsonl file (or .txt, for a task whose item
    is one text); returns its extension."""
    task = task or Task()
    fields = task.line_fields()
    example = line_example(task)
    ext = os.path.splitext(path)[1].lower()
    one_text = len(fields) == 1
    if ext not in (".txt", ".jsonl") and format_of(path) is None:
        txt = " or .txt (a text per line)" if one_text else ""
        others = ", ".join(sorted(set(SUFFIX_FORMATS) - {".jsonl"}))
        raise DataError(f"{path}: input must be .jsonl ({example} per line){txt}, or a "
                        f"training data file ({others}), got {ext or 'no extension'}")
    if ext == ".txt" and not one_text:
        names = ", ".join(f'"{names[0]}"' for names in fields)
        raise DataError(f"{path}: a {task.name} request item has {len(fields)} texts ({names}) "
                        f"and a .txt line holds one; write .jsonl lines {example}")
    if not os.path.isfile(path):
        raise DataError(f"{path}: input file not found")
    return ext


def _lines(path, max_line_bytes):
    """(line number, line or LONG_LINE) streamed, split where Python's text mode splits: \\n,
    \\r\\n and \\r; a line over ``max_line_bytes`` is LONG_LINE, read no further."""
    n = 0
    with open(path, "rb") as f:
        for raw in bounded_lines(f, max_line_bytes):
            if raw is LONG_LINE:
                n += 1
                yield n, LONG_LINE
                continue
            raw = raw[:-1] if raw.endswith(b"\n") else raw
            raw = raw[:-1] if raw.endswith(b"\r") else raw
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(f"{path}:{n + 1}: not valid UTF-8 ({e}); save the file as "
                                f"UTF-8") from None
            for part in line.split("\r"):  # a lone \r ends a line in text mode too
                n += 1
                yield n, part


def _json_type(value):
    return JSON_TYPES.get(type(value), type(value).__name__)


def _line_texts(line, task, where):
    """[(field, text)] of a JSONL line's request item, one per ``Task.line_fields`` entry,
    or a DataError naming the line and the field."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        return DataError(f"{where}: not valid JSON ({e.msg})")
    except RecursionError:
        return DataError(f"{where}: not valid JSON here (nested too deeply)")
    example = line_example(task)
    if not isinstance(obj, dict):
        return DataError(f"{where}: expected an object {example}, got {_json_type(obj)}")
    texts = []
    for names in task.line_fields():
        key = next((k for k in names if k in obj), None)
        if key is None:
            also = "".join(f' (or "{k}")' for k in names[1:])
            return DataError(f'{where}: field "{names[0]}"{also} is missing; expected an '
                             f'object {example}')
        if not isinstance(obj[key], str):
            return DataError(f'{where}: field "{key}" must be a string, got '
                             f'{_json_type(obj[key])}; expected an object {example}')
        texts.append((key, obj[key]))
    return texts


def iter_items(path, task=None, max_text_chars=MAX_TEXT_CHARS, column_keys=None):
    """(line_no, request item | DataError) for every line of a .txt or .jsonl file (or record
    of a training data file), streamed.

    ``task``: whose request items the lines hold (``Task.line_fields``, ``Task.oip_item``;
    default one text, ``{"text": ...}``).  A text over ``max_text_chars`` characters
    (Deploy.max_text_chars; each text of an item), or a line longer than the item's texts
    take, is a DataError like any unusable line.  ``column_keys``: the Data keys naming a
    training data file's columns (``columns.column_keys``: Data.text_field, Data.columns, ...).
    """
    task = task or Task()
    ext = check_input(path, task)
    if ext not in (".txt", ".jsonl"):
        yield from _data_file_items(path, task, max_text_chars, column_keys)
        return
    if column_keys:
        key = next(iter(column_keys))
        raise DataError(f"{path}: Data.{key} names a column of a training data file (.tsv, "
                        f".csv, .parquet), but a {ext} line holds the request item itself "
                        f"({line_example(task)}); drop -o Data.{key}")
    count = len(task.line_fields())
    bound = line_bytes_bound(max_text_chars, count)
    takes = ("a text of {} characters takes" if count == 1 else
             f"{count} texts of {{}} characters each take")
    for n, line in _lines(path, bound):
        where = f"{path}:{n}"
        if line is LONG_LINE:
            most = takes.format(f"Deploy.max_text_chars ({max_text_chars:,})")
            yield n, DataError(f"{where}: line is longer than {bound:,} bytes, more than "
                               f"{most}; not read. Split the text, or raise the limit, e.g. "
                               f"-o Deploy.max_text_chars={4 * max_text_chars}")
            continue
        texts = [("text", line)] if ext == ".txt" else _line_texts(line, task, where)
        if isinstance(texts, DataError):
            yield n, texts
            continue
        long = next(((key, t) for key, t in texts if len(t) > max_text_chars), None)
        if long is not None:
            yield n, _too_long(where, *long, max_text_chars)
            continue
        yield n, task.oip_item(tuple(t for _, t in texts))


def _data_file_items(path, task, max_text_chars, column_keys):
    """``iter_items`` of a file in a training format: its records' texts (``request_records``,
    streamed; a bad record is its line's DataError)."""
    fields = tuple(names[0] for names in task.line_fields())
    for n, texts in request_records(path, fields, keys=column_keys):
        if isinstance(texts, DataError):
            yield n, texts
            continue
        key, text = next(((k, t) for k, t in zip(fields, texts) if len(t) > max_text_chars),
                         (None, None))
        if key is not None:
            yield n, _too_long(f"{path}:{n}", key, text, max_text_chars)
            continue
        yield n, task.oip_item(texts)


def _too_long(where, key, text, max_text_chars):
    return DataError(f"{where}: {key} has {len(text):,} characters; at most "
                     f"{max_text_chars:,} (Deploy.max_text_chars, as the server). "
                     f"Split the text, or raise the limit, e.g. "
                     f"-o Deploy.max_text_chars={len(text)}")


def read_texts(path, task=None, max_text_chars=MAX_TEXT_CHARS, column_keys=None):
    """``iter_items`` as a list (small files and tests)."""
    return list(iter_items(path, task, max_text_chars, column_keys))


def item_chars(item):
    """Characters of a request item's texts: one text, a pair's list or a QA object's values
    (a window's character budget)."""
    if isinstance(item, str):
        return len(item)
    return sum(len(t) for t in (item.values() if isinstance(item, dict) else item))


def encoded_windows(predictor, input_path, rows, size=WINDOW, max_chars=WINDOW_CHARS):
    """Windows of ``[(line_no, error record | None, EncodedText | None)]`` from ``rows``
    (``(line_no, request item | DataError)``, as ``iter_items`` yields them).

    A window closes at ``size`` items that encode (so the batches are those of a whole-file
    run cut every ``size`` usable texts, whatever bad lines sit between them) or at about
    ``max_chars`` characters of them; bad lines ride along uncounted (reported on stderr when
    met), but at most ``3 x size`` of them wait in one window.
    """
    if size < 1:
        raise ValueError(f"window must be >= 1, got {size}")
    cur, good, chars = [], 0, 0
    for n, item in rows:
        encoded = None
        if not isinstance(item, DataError):
            size_chars = item_chars(item)
            if good and (good >= size or chars + size_chars > max_chars):
                yield cur
                cur, good, chars = [], 0, 0
            try:
                encoded = predictor.task.encode_request(predictor, item, None)
            except DataError as e:
                item = DataError(f"{input_path}:{n}: {e}")
        if encoded is None:
            print(f"bad line: {item}", file=sys.stderr)
            cur.append((n, {"line": n, "error": str(item)}, None))
            if len(cur) - good >= 3 * size:
                yield cur
                cur, good, chars = [], 0, 0
            continue
        cur.append((n, None, encoded))
        good += 1
        chars += size_chars
    if cur:
        yield cur


def count_lines(path, chunk=1 << 24):
    """Lines in ``path`` for the progress bar's total (ends of line + an unterminated last)."""
    count, last = 0, b"\n"
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            count += block.count(b"\n")
            last = block[-1:]
    return count + (last != b"\n")


class _Totals:
    """What the summary counts, accumulated window by window."""

    def __init__(self):
        self.texts = self.predicted = self.truncated = self.windowed = 0
        self.model_seconds = 0.0
        self.answers = collections.Counter()  # the task's answer counters (Task.answer_counts)


def _predict_window(predictor, window, totals):
    """Records for one window of ``encoded_windows``, in input order."""
    records = [rec for _, rec, _ in window]
    encoded = [(k, item) for k, (_, _, item) in enumerate(window) if item is not None]
    if encoded:
        start = time.perf_counter()
        results = predictor.predict_encoded([item for _, item in encoded])
        totals.model_seconds += time.perf_counter() - start
        for (k, item), pred in zip(encoded, results):
            records[k] = {"line": window[k][0], **pred}
            totals.truncated += bool(item.truncated)
            totals.windowed += len(item.windows) > 1
        totals.answers.update(predictor.task.answer_counts(results))
    totals.texts += len(window)
    totals.predicted += len(encoded)
    return records


@contextlib.contextmanager
def _open_output(output_path):
    if output_path:
        with atomic_text_writer(output_path) as f:
            yield f
    else:
        yield sys.stdout


def truncation_warning(predictor, truncated, texts):
    """The warning line for ``truncated`` of ``texts`` texts cut to the export's max_len."""
    return (f"{truncated:,} of {texts:,} texts were longer than the export's max_len "
            f"({predictor.max_len} tokens) and were truncated to it: the export's long_text "
            f"policy is 'truncate'; their records say \"truncated\": true. To read whole texts, "
            f"{predictor.task.too_long_fix()}")


@contextlib.contextmanager
def _open_records(predictor, output_path, fmt):
    """A function writing one window's records: JSONL lines, or an embedding export's rows
    into a .npy / Parquet file (``embedding_files``)."""
    if fmt == "jsonl":
        with _open_output(output_path) as out:
            def write(records):
                out.write("".join(json.dumps(rec, ensure_ascii=False) + "\n"
                                  for rec in records))
                out.flush()
            yield write
        return
    spec = predictor.task.embedding_spec(predictor.manifest)
    with embedding_files.array_writer(fmt, output_path, spec) as rows:
        yield rows.write


def check_output(predictor, output_path, fmt):
    """DataError unless ``fmt`` can be written for ``predictor``'s export."""
    if fmt not in embedding_files.FORMATS:
        raise DataError(f"output format {fmt!r}: one of {list(embedding_files.FORMATS)}")
    if fmt == "jsonl":
        return
    if output_path is None:
        raise DataError(f"a {fmt} output is a file: pass --output PATH")
    if predictor.task.embedding_spec(predictor.manifest) is None:
        raise DataError(f"{output_path}: .npy and Parquet outputs hold embeddings, and this "
                        f"export is a {predictor.task.name} model; write JSONL (--output "
                        f"X.jsonl)")


def run_file(predictor, input_path, output_path=None, progress=True, window=WINDOW,
             max_text_chars=MAX_TEXT_CHARS, output_format=None, column_keys=None):
    """Predict every line of ``input_path`` (the request items of ``predictor``'s task);
    write JSONL to ``output_path`` (or stdout), or for an embedding export the embeddings
    as .npy / Parquet (``output_format``, default by the suffix: ``embedding_files``).  A
    text over ``max_text_chars`` (Deploy.max_text_chars) gets an error record.
    ``column_keys``: the Data keys naming a training data file's columns (``iter_items``).

    Returns the summary dict (see the module docstring): texts, predicted, failed,
    truncated, windowed, seconds, model_seconds, texts/s, tokens/s, padding efficiency,
    warnings.
    """
    ext = check_input(input_path, predictor.task)
    fmt = embedding_files.output_format(output_path, output_format)
    check_output(predictor, output_path, fmt)
    real0, padded0 = predictor.real_tokens, predictor.padded_tokens
    out0, steps0 = predictor.real_target_tokens, predictor.padded_target_tokens
    totals = _Totals()
    # a line per text in .txt / .jsonl; other formats' records are not lines
    total = count_lines(input_path) if progress and ext in (".txt", ".jsonl") else None
    # smoothing=0: the bar shows texts over the time since it opened, as the summary does
    bar = tqdm(total=total, unit="text", smoothing=0, disable=not progress, file=sys.stderr)
    start = time.perf_counter()
    with _open_records(predictor, output_path, fmt) as write:
        rows = iter_items(input_path, predictor.task, max_text_chars, column_keys)
        for chunk in encoded_windows(predictor, input_path, rows, window):
            write(_predict_window(predictor, chunk, totals))
            bar.update(len(chunk))
    seconds = time.perf_counter() - start
    bar.close()
    real = predictor.real_tokens - real0
    padded = predictor.padded_tokens - padded0

    def per_s(x, digits):
        return round(x / seconds, digits) if seconds > 0 else None

    warnings = []
    if totals.truncated:
        warnings.append(truncation_warning(predictor, totals.truncated, totals.texts))
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    summary = {"input": input_path, "output": output_path, "output_format": fmt,
               "backend": predictor.backend, "precision": predictor.precision,
               "threads": predictor.threads,
               "texts": totals.texts, "predicted": totals.predicted,
               "failed": totals.texts - totals.predicted,
               "truncated": totals.truncated, "windowed": totals.windowed,
               "window": window,
               "timing": "seconds: first line read to last record written (tokenising, "
                         "batching, model, writing; not model loading); texts_per_s: all input "
                         "lines over those seconds, as the progress bar; model_seconds: batching "
                         "and the model only",
               "seconds": round(seconds, 4), "model_seconds": round(totals.model_seconds, 4),
               "texts_per_s": per_s(totals.texts, 2),
               "tokens_per_s": per_s(real, 1),
               "padding_efficiency": round(real / padded, 4) if padded else None,
               **totals.answers}
    if predictor.task.generates:  # decoder steps that produced output vs steps run
        steps = predictor.padded_target_tokens - steps0
        summary["output_tokens_per_s"] = per_s(predictor.real_target_tokens - out0, 1)
        summary["decode_steps_efficiency"] = (round((predictor.real_target_tokens - out0) / steps,
                                                    4) if steps else None)
    summary["warnings"] = warnings
    return summary
