"""Run every check on one model: ``diagnose`` -> (LoadedModel, [CheckResult]); ``run_doctor``
is the command (table on the terminal, JSON report, exit code)."""
from ppvarlen.data.errors import DataError
from ppvarlen.runtime.infer import read_texts
from ppvarlen.utils.io import atomic_write_json

from . import sources
from .length_checks import check_dimensions, check_positions, check_truncation
from .output_checks import check_batch, check_edge_rows, check_padding, check_precision
from .report import document, exit_code, format_table
from .tokenizer_check import check_tokenizer

CHECKS = (check_dimensions, check_padding, check_batch, check_edge_rows, check_precision,
          check_positions, check_tokenizer)


def read_user_texts(path):
    """(texts, unreadable line count) of a .txt (a text per line) or .jsonl ({"text"}) file;
    blank lines are skipped."""
    texts, unreadable = [], 0
    for _, item in read_texts(path):
        if isinstance(item, DataError):
            unreadable += 1
        elif item.strip():
            texts.append(item)
    return texts, unreadable


def diagnose(model_path, tokenizer_dir=None, texts_file=None, backend=None):
    texts, unreadable = read_user_texts(texts_file) if texts_file else (None, 0)
    model = sources.load(model_path, tokenizer_dir, backend)
    results = [check(model, texts) for check in CHECKS]
    results.append(check_truncation(model, texts, unreadable))
    return model, results


def run_doctor(model_path, tokenizer_dir=None, texts_file=None, json_path=None, backend=None):
    model, results = diagnose(model_path, tokenizer_dir, texts_file, backend)
    print(format_table(model, results))
    if json_path:
        atomic_write_json(json_path, document(model, results))
        print(f"  report: {json_path}")
    return exit_code(results)
