"""User data files: JSONL (classification / tagging / seq2seq) and TSV ``text<TAB>label``.

Every line is checked.  A bad line raises ``DataError`` naming ``file:line``, what is
wrong and how to fix it; with ``skip_invalid`` it is skipped instead and counted per
reason (logged, and returned in ``FileData.skipped``).  Nothing is dropped silently:
an empty text is an error like any other.

Labels are mapped to ids only after all files are read (``map_labels``), so train,
dev and test share one label set.
"""
import json
import re
from collections import Counter
from dataclasses import dataclass, field

from ..utils.log import get_logger
from .errors import DataError

logger = get_logger("data.readers")

TASK_FIELDS = {
    "classification": ("text", "label"),
    "tagging": ("tokens", "tags"),
    "seq2seq": ("source", "target"),
}
_EXAMPLE_LINE = {
    "classification": '{"text": "这本书很好", "label": "positive"}',
    "tagging": '{"tokens": ["江", "泽", "民"], "tags": ["B-PER", "I-PER", "I-PER"]}',
    "seq2seq": '{"source": "中国", "target": "zhong1 guo2"}',
}
_TAG_RE = re.compile(r"O|[BI]-\S+")
_SKIP_HINT = "(or set Data.skip_invalid: true to skip such lines and count them)"


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
    first_skipped: dict = field(default_factory=dict)  # reason -> "line N: message"
    header: bool = False

    def stats(self):
        out = {"lines": self.lines, "examples": len(self.examples)}
        if self.header:
            out["header_line"] = True
        if self.skipped:
            out["skipped"] = dict(sorted(self.skipped.items()))
            out["first_skipped"] = dict(sorted(self.first_skipped.items()))
        return out


def _decoded_lines(path):
    """Yield (line_number, text or BadLine); each line decoded on its own so a bad byte
    is reported on its line, not as a whole-file failure."""
    try:
        f = open(path, "rb")
    except OSError as e:
        raise DataError(f"{path}: cannot open data file ({e.strerror}); check Data.train_file / "
                        f"dev_file / test_file") from None
    with f:
        for n, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                yield n, BadLine("not_utf8", f"not valid UTF-8 (bad byte {raw[e.start:e.start + 1]!r} "
                                             f"at byte {e.start} of the line); re-save the file as UTF-8, "
                                             f"e.g. iconv -f GBK -t UTF-8 in > out")
                continue
            if n == 1 and line.startswith("\ufeff"):
                line = line[1:]  # a UTF-8 byte-order mark is not part of the data
            yield n, line.rstrip("\r\n")


def _require_text(value, name, reason_empty="empty_text"):
    if not isinstance(value, str):
        raise BadLine("wrong_type", f"field {name!r} must be a string, got "
                                    f"{type(value).__name__} {value!r:.60}")
    if not value.strip():
        raise BadLine(reason_empty, f"field {name!r} is empty; every example needs a non-empty "
                                    f"{name} (remove the line or fill it in)")
    return value


def _check_label(value):
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
    tokens, tags = obj["tokens"], obj["tags"]
    for name, seq in (("tokens", tokens), ("tags", tags)):
        if not isinstance(seq, list) or not all(isinstance(t, str) for t in seq):
            raise BadLine("wrong_type", f"field {name!r} must be a list of strings, got {seq!r:.80}")
    if not tokens:
        raise BadLine("empty_text", "field 'tokens' is empty; every example needs at least one token")
    if any(t == "" for t in tokens):
        raise BadLine("empty_text", f"token {tokens.index('')} is an empty string; drop it (and "
                                    f"its tag) or give the real token")
    if len(tokens) != len(tags):
        raise BadLine("length_mismatch", f"{len(tokens)} tokens but {len(tags)} tags; give exactly "
                                         f"one tag per token")
    for i, tag in enumerate(tags):
        if not _TAG_RE.fullmatch(tag):
            raise BadLine("bad_tag", f"tag {i} is {tag!r}; tags must be BIO strings: 'O', 'B-TYPE' "
                                     f"or 'I-TYPE' (e.g. B-PER)")
    return {"tokens": tokens, "tags": tags}


def infer_task(obj):
    """The task whose two fields a JSON object has, or None."""
    for task, names in TASK_FIELDS.items():
        if all(n in obj for n in names):
            return task
    return None


def parse_json_line(line, task):
    """One JSONL line -> example dict (labels still raw).  Raises BadLine."""
    if not line.strip():
        raise BadLine("blank_line", "blank line; remove it (every line must be one JSON object)")
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise BadLine("bad_json", f"invalid JSON ({e.msg} at column {e.colno}); each line must be "
                                  f"one JSON object such as {_EXAMPLE_LINE[task]}") from None
    if not isinstance(obj, dict):
        raise BadLine("not_an_object", f"expected a JSON object, got {type(obj).__name__}; each "
                                       f"line must look like {_EXAMPLE_LINE[task]}")
    names = TASK_FIELDS[task]
    missing = [n for n in names if n not in obj]
    if missing:
        raise BadLine("missing_field", f"missing field {' and '.join(map(repr, missing))} (task "
                                       f"{task} needs {names[0]!r} and {names[1]!r}, e.g. "
                                       f"{_EXAMPLE_LINE[task]}; fields here: {sorted(obj)})")
    if task == "classification":
        return {"text": _require_text(obj["text"], "text"), "label": _check_label(obj["label"])}
    if task == "tagging":
        return _parse_tagging(obj)
    return {"source": _require_text(obj["source"], "source"),
            "target": _require_text(obj["target"], "target")}


def parse_tsv_line(line):
    """One ``text<TAB>label`` line -> example dict.  A label of digits is a class id."""
    if not line.strip():
        raise BadLine("blank_line", "blank line; remove it (every line must be text<TAB>label)")
    cols = line.split("\t")
    if len(cols) != 2:
        raise BadLine("column_count", f"expected 2 tab-separated columns (text<TAB>label), found "
                                      f"{len(cols)}; remove tabs inside the text or use JSONL")
    text, label = cols
    _require_text(text, "text")
    label = label.strip()
    return {"text": text, "label": _check_label(int(label) if label.isdigit() else label)}


def _is_tsv_header(line):
    return [c.strip().lower() for c in line.split("\t")] == ["text", "label"]


def read_file(path, fmt, task=None, skip_invalid=False):
    """Read one ``jsonl`` or ``tsv`` file -> FileData.

    ``task=None`` (jsonl only) takes the task from the fields of the first JSON object.
    """
    if fmt == "tsv":
        task = task or "classification"
        if task != "classification":
            raise DataError(f"{path}: TSV files hold text<TAB>label (classification), but the task "
                            f"is {task!r}; use a JSONL file with {TASK_FIELDS[task]} fields")
    out = FileData(path=path, task=task)
    for n, line in _decoded_lines(path):
        if fmt == "tsv" and n == 1 and isinstance(line, str) and _is_tsv_header(line):
            out.header = True
            continue
        out.lines += 1
        try:
            if isinstance(line, BadLine):
                raise line
            if fmt == "tsv":
                example = parse_tsv_line(line)
            else:
                if out.task is None and line.strip():
                    out.task = _task_from_first_line(path, n, line)
                example = parse_json_line(line, out.task or "classification")
        except BadLine as bad:
            if not skip_invalid:
                raise DataError(f"{path}:{n}: {bad.message} {_SKIP_HINT}") from None
            out.skipped[bad.reason] += 1
            out.first_skipped.setdefault(bad.reason, f"line {n}: {bad.message}")
            continue
        out.examples.append(example)
        out.line_numbers.append(n)
    if out.task is None:
        out.task = "classification"
    if out.skipped:
        logger.warning("%s: skipped %d invalid line(s) (%s); first: %s", path,
                       sum(out.skipped.values()),
                       ", ".join(f"{r}: {c}" for r, c in sorted(out.skipped.items())),
                       next(iter(out.first_skipped.values())))
    if not out.examples:
        raise DataError(f"{path}: no valid examples ({out.lines} lines read"
                        f"{', all skipped as invalid' if out.skipped else ''}); check the file")
    return out


def _task_from_first_line(path, n, line):
    try:
        obj = json.loads(line)
    except json.JSONDecodeError:
        return None  # parse_json_line reports the bad JSON on this line
    task = infer_task(obj) if isinstance(obj, dict) else None
    if task is None and isinstance(obj, dict):
        raise DataError(f"{path}:{n}: cannot tell the task from fields {sorted(obj)}; a line needs "
                        f"text+label, tokens+tags or source+target, or set Data.task")
    return task


# ---------------------------------------------------------------- labels

def _order_tags(tags):
    """BIO tag names: 'O' first, then by entity type with B- before I-."""
    rest = sorted((t for t in tags if t != "O"), key=lambda t: (t[2:], t[0]))
    return (["O"] if "O" in tags else []) + rest


def map_labels(files, label_names=None, skip_invalid=False):
    """Turn raw labels into ids in place, over all files at once; return the label names.

    classification: names given (``Data.label_names``) -> a name maps to its index and an
    id must be < len(names); otherwise string labels -> sorted set of names, integer
    labels -> ids as given, names "0".."max".  Mixing names and ids is an error.
    tagging: tags stay strings (the contract); the names fix their order (tag id = index).
    """
    task = files[0].task
    if task == "seq2seq":
        return []
    if task == "tagging":
        if label_names is None:
            seen = {t for fd in files for ex in fd.examples for t in ex["tags"]}
            return _order_tags(seen)
        allowed = set(label_names)
        for fd in files:
            _drop(fd, lambda ex: next((t for t in ex["tags"] if t not in allowed), None),
                  lambda t: ("unknown_label", f"tag {t!r} is not in Data.label_names "
                                              f"{list(label_names)}; add it there or fix the tag"),
                  skip_invalid)
        return list(label_names)

    if label_names is None:
        first = next(ex["label"] for fd in files for ex in fd.examples)
        kind = str if isinstance(first, str) else int
        for fd in files:
            _drop(fd, lambda ex: None if isinstance(ex["label"], kind) else ex["label"],
                  lambda lab: ("mixed_label_kinds",
                               f"label {lab!r} is a {'name' if isinstance(lab, str) else 'class id'} "
                               f"but the first label ({first!r}) is a "
                               f"{'name' if kind is str else 'class id'}; use names or ids "
                               f"throughout"),
                  skip_invalid)
        labels = {ex["label"] for fd in files for ex in fd.examples}
        label_names = sorted(labels) if kind is str else [str(i) for i in range(max(labels) + 1)]
    index = {name: i for i, name in enumerate(label_names)}
    for fd in files:
        _drop(fd, lambda ex: None if _label_id(ex["label"], index) is not None else ex["label"],
              lambda lab: ("unknown_label",
                           f"label {lab!r} is not one of the {len(label_names)} classes "
                           f"{list(label_names)}; fix the label or list it in Data.label_names"),
              skip_invalid)
        for ex in fd.examples:
            ex["label"] = _label_id(ex["label"], index)
    return list(label_names)


def _label_id(label, index):
    if isinstance(label, str):
        return index.get(label)
    return label if label < len(index) else None


def _drop(fd, find_problem, describe, skip_invalid):
    """Check every example of ``fd``; raise on the first problem or skip the bad ones."""
    keep = []
    for i, ex in enumerate(fd.examples):
        problem = find_problem(ex)
        if problem is None:
            keep.append(i)
            continue
        reason, message = describe(problem)
        n = fd.line_numbers[i]
        if not skip_invalid:
            raise DataError(f"{fd.path}:{n}: {message} {_SKIP_HINT}")
        fd.skipped[reason] += 1
        fd.first_skipped.setdefault(reason, f"line {n}: {message}")
    dropped = len(fd.examples) - len(keep)
    if dropped:
        fd.examples = [fd.examples[i] for i in keep]
        fd.line_numbers = [fd.line_numbers[i] for i in keep]
        logger.warning("%s: skipped %d example(s) with bad labels", fd.path, dropped)
