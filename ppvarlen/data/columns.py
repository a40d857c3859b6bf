"""Which column of a user's table (TSV, CSV), or which field of a JSONL object or Parquet row,
holds which field of the task's corpus format: named by a header, never taken by position
silently.

A field is found by the Data key that names it (``Data.text_field``, ``text_pair_field``,
``label_field``, ``tokens_field``, ``tags_field``), else by the names commonly used for it
(``RECOGNISED``: ``text``, ``text_a``, ``sentence``, ``label``, ...): its own name first, then
exactly one other recognised name.  A field no column gives, or two columns that could both be
it, is refused naming the columns found and the key to set.  Columns the format does not read
are logged, not read.

A table's first line is its header when it names a column (a recognised name or one a key
gives); a headerless table is read in the order ``Data.columns`` gives once, else in the
format's own order (``text<TAB>label``), the order files without a header have always had.

A request's read (``ppvarlen-infer``: ``table_layout``'s ``unread``, ``field_layout`` given the
request's fields) resolves the request's texts only, by the same rule: a label column is neither
required nor read.  A headerless table there is the texts alone (one column: the text) or the
format's order (text<TAB>label); any other width is refused.
"""
from dataclasses import dataclass

from ..utils.log import get_logger
from .errors import DataError

logger = get_logger("data.columns")

# format field -> (the Data key naming its column, the column names recognised without it)
RECOGNISED = {
    "text": ("text_field", ("text", "text_a", "sentence", "content", "review", "query")),
    "text_a": ("text_field", ("text_a", "sentence1", "query", "text")),
    "text_b": ("text_pair_field", ("text_b", "text_pair", "sentence2")),
    "label": ("label_field", ("label", "labels", "tag", "class", "category")),
    "tokens": ("tokens_field", ("tokens", "words", "chars")),
    "tags": ("tags_field", ("tags", "ner_tags", "labels")),
}
FIELD_KEYS = ("text_field", "text_pair_field", "label_field", "tokens_field", "tags_field")
COLUMN_KEYS = FIELD_KEYS + ("columns",)


def column_keys(data_cfg):
    """The keys of a Data section (a Config or a dict) that name columns, those set only:
    plain values for the plan."""
    return {k: data_cfg.get(k) for k in COLUMN_KEYS if data_cfg.get(k) is not None}


@dataclass(frozen=True)
class Layout:
    """How one file's columns (or fields) give the format's fields.

    ``names``: the file's columns (its header, ``Data.columns``, or the format's fields);
    ``picks``: the column of each format field, in the format's field order; ``header``: the
    first line is the header (not data); ``rename``: JSONL / Parquet field -> format field, or
    None when the fields are the format's own."""

    names: tuple
    picks: tuple
    header: bool = False
    rename: dict = None
    stated: bool = False  # the order is Data.columns' (a headerless table said so)

    @property
    def width(self):
        return len(self.names)


def _key_and_names(field):
    return RECOGNISED.get(field, (None, (field,)))


def _norm(name, case):
    return name if case else name.strip().lower()


def resolve(names, fields, keys, where, case=False):
    """The index in ``names`` (the columns of ``where``) of each of ``fields`` -> tuple.  Raises
    DataError naming the columns found and the key to set.  ``case``: names are compared as
    written (JSON fields), else stripped and lower-cased (table headers)."""
    found = [_norm(n, case) for n in names]
    picks = []
    for field in fields:
        key, recognised = _key_and_names(field)
        given = keys.get(key) if key else None
        if given is not None:
            at = [i for i, n in enumerate(found) if n == _norm(given, case)]
            if not at:
                raise DataError(f"{where}: Data.{key} is {given!r}, but there is no such "
                                f"{'field' if case else 'column'} (found: {list(names)}); set "
                                f"Data.{key} to one of them")
        else:
            at = [i for i, n in enumerate(found) if n == field] or \
                [i for i, n in enumerate(found) if n in recognised]
            if len(at) != 1:
                what = "field" if case else "column"
                how = (f"name it with Data.{key}" if key else
                       f"name it {field!r}") + (" (a headerless table: Data.columns)"
                                                 if not case else "")
                if at:
                    raise DataError(f"{where}: {what}s {[names[i] for i in at]} could each be "
                                    f"the {field!r}; {how}")
                raise DataError(f"{where}: no {what} is the {field!r} (found: {list(names)}; "
                                f"recognised: {list(recognised)}); {how}")
        picks.append(at[0])
    for field, i in zip(fields, picks):
        others = [f for f, j in zip(fields, picks) if j == i and f != field]
        if others:
            raise DataError(f"{where}: {names[i]!r} would be both the {field!r} and the "
                            f"{others[0]!r}; name each with its Data key "
                            f"({', '.join(k for k in FIELD_KEYS)})")
    return tuple(picks)


def known_names(fields, keys):
    """Every name a column of ``fields`` may have (recognised or given), lower-cased."""
    out = set()
    for field in fields:
        key, recognised = _key_and_names(field)
        out.update(recognised)
        out.add(field)
        if key and keys.get(key):
            out.add(keys[key].strip().lower())
    return out


def table_layout(first_cells, fields, keys, where, unread=None):
    """The ``Layout`` of a table whose first line has the cells ``first_cells`` (None: the file
    has no readable first line; the scan reports it).

    ``unread``: a request's read (``ppvarlen-infer``), None for training.  Then ``fields`` are
    the request's texts, the only columns resolved, and ``unread`` the format's other fields (its
    label): not required, not read, but a column named as one still marks a header, and a
    headerless table's first line tells its order (``_headerless_request``)."""
    given = keys.get("columns")
    if given is not None:
        names = tuple(given)
        header = first_cells is not None and \
            [_norm(c, False) for c in first_cells] == [_norm(c, False) for c in names]
        return _logged(Layout(names, resolve(names, fields, keys,
                                             f"{where} (Data.columns {list(names)})"), header,
                              stated=True), fields, where)
    cells = [_norm(c, False) for c in (first_cells or ())]
    if first_cells is not None and known_names(tuple(fields) + tuple(unread or ()), keys) & \
            set(cells):
        names = tuple(c.strip() for c in first_cells)
        return _logged(Layout(names, resolve(names, fields, keys, f"{where} header"), True),
                       fields, where)
    set_keys = [k for k in FIELD_KEYS if k in keys]
    if set_keys:
        raise DataError(f"{where}: Data.{set_keys[0]} names a column, but the first line is no "
                        f"header ({'<TAB>'.join(first_cells or ())[:80]!r}); give the columns' "
                        f"order with Data.columns, e.g. Data.columns: {list(fields)}")
    if unread is not None and first_cells is not None:
        return _headerless_request(len(first_cells), tuple(fields), tuple(unread), where)
    return Layout(tuple(fields), tuple(range(len(fields))))


def _headerless_request(width, fields, unread, where):
    """The ``Layout`` of a headerless table read for a request's texts ``fields``, by its first
    line's ``width``: the texts alone (one column: the text), or the texts then the format's
    other fields, the order training reads (text<TAB>label).  Another width is refused: which
    column is which cannot be told."""
    for names in (fields, fields + unread):
        if width == len(names):
            return Layout(names, tuple(range(len(fields))))
    orders = " or ".join(dict.fromkeys(str(list(n)) for n in (fields, fields + unread)))
    key = _key_and_names(fields[0])[0]
    named = f"any name given with -o Data.{key}=NAME" if key else "no other name"
    raise DataError(f"{where}: no header, and its first line has {width} columns; a headerless "
                    f"table's columns are read as {orders}, so which column is the {fields[0]!r} cannot "
                    f"be told. Add a header line naming the columns (the {fields[0]!r} one "
                    f"{fields[0]!r}, or {named}), or name the {width} columns in order with "
                    f"-o Data.columns=[...], the {fields[0]!r} one {fields[0]!r}")


def field_layout(names, fields, keys, where):
    """The ``Layout`` of a JSONL file whose first object (or a Parquet file whose columns) has
    the fields ``names``: None when it holds the format's fields and no key renames one."""
    if all(f in names for f in fields) and not any(
            keys.get(_key_and_names(f)[0]) not in (None, f) for f in fields):
        return None
    try:
        picks = resolve(tuple(names), fields, keys, where, case=True)
    except DataError:
        if any(k in keys for k in FIELD_KEYS):
            raise
        return None  # each line's error names the fields it lacks, and the keys
    names = tuple(names)
    rename = {names[i]: f for f, i in zip(fields, picks)}
    logger.info("%s: fields read as %s", where,
                ", ".join(f"{f} <- {s!r}" for s, f in rename.items()))
    return Layout(names, picks, rename=rename)


def _logged(layout, fields, where):
    """The layout, its columns other than the fields logged (they are not read)."""
    unread = [n for i, n in enumerate(layout.names) if i not in layout.picks]
    if unread or tuple(layout.names[i] for i in layout.picks) != tuple(fields):
        logger.info("%s: columns read as %s%s", where,
                    ", ".join(f"{f} <- {layout.names[i]!r}" for f, i in zip(fields, layout.picks)),
                    f"; not read: {unread}" if unread else "")
    return layout


def resolvable(names, formats, keys, case):
    """The format (task) whose fields all resolve among ``names`` with the most fields, or None
    (the caller resolves its default format's fields, which names what is wrong);
    ``formats``: {task: fields}."""
    best = None
    for task, fields in formats.items():
        try:
            resolve(tuple(names), fields, keys, "", case)
        except DataError:
            continue
        if best is None or len(fields) > len(formats[best]):
            best = task
    return best
