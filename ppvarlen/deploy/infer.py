"""Batch inference over a file: one prediction per input line, in input order.

Input: ``.txt`` (one text per line) or ``.jsonl`` (``{"text": ...}`` per line; a seq2seq
export also reads ``{"source": ...}``, the seq2seq data format, other fields ignored).
Output: JSONL, line ``i`` answering input line ``i``: ``{"line": n, **prediction}``
or ``{"line": n, "error": why}`` for a line that could not be used (also reported
on stderr); the other lines are still predicted.
"""
import json
import os
import sys
import time

from ppvarlen.data.errors import DataError
from ppvarlen.utils.io import atomic_write_text
from ppvarlen.utils.log import get_logger

log = get_logger("deploy.infer")
CHUNK = 4096  # texts sorted and batched together; bounds memory on huge files


def read_texts(path, field="text"):
    """[(line_no, text | DataError)] for every line of a .txt or .jsonl file.

    ``field``: the JSONL key holding the text ("text"; "source" is also read for seq2seq).
    """
    ext = os.path.splitext(path)[1].lower()
    if ext not in (".txt", ".jsonl"):
        raise DataError(f"{path}: input must be .txt (a text per line) or .jsonl "
                        f"({{\"text\": ...}} per line), got {ext or 'no extension'}")
    if not os.path.isfile(path):
        raise DataError(f"{path}: input file not found")
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not valid UTF-8 ({e}); save it as UTF-8") from None
    if lines and lines[-1] == "":
        lines.pop()  # the newline that ends the last line
    out = []
    for n, line in enumerate(lines, 1):
        line = line.rstrip("\r")
        if ext == ".txt":
            out.append((n, line))
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            out.append((n, DataError(f"{path}:{n}: not valid JSON ({e.msg})")))
            continue
        key = field if isinstance(obj, dict) and field in obj else "text"
        if not isinstance(obj, dict) or not isinstance(obj.get(key), str):
            names = " or ".join(f'"{k}"' for k in dict.fromkeys(("text", field)))
            out.append((n, DataError(f"{path}:{n}: expected an object with a string field "
                                     f"{names}")))
            continue
        out.append((n, obj[key]))
    return out


def run_file(predictor, input_path, output_path=None, progress=True):
    """Predict every line of ``input_path``; write JSONL to ``output_path`` (or stdout).

    Returns the summary dict (texts, failed, texts/s, tokens/s, padding efficiency).
    """
    from tqdm import tqdm

    rows = read_texts(input_path, predictor.task.text_field)
    real0, padded0 = predictor.real_tokens, predictor.padded_tokens
    out0, steps0 = predictor.real_target_tokens, predictor.padded_target_tokens
    start = time.perf_counter()  # tokenising counts: it is part of serving a file
    records = [None] * len(rows)
    encoded = []  # (row index, EncodedText)
    for r, (n, text) in enumerate(rows):
        if isinstance(text, DataError):
            records[r] = {"line": n, "error": str(text)}
            continue
        try:
            encoded.append((r, predictor.encode(text)))
        except DataError as e:
            records[r] = {"line": n, "error": f"{input_path}:{n}: {e}"}
    for rec in records:
        if rec is not None:
            print(f"bad line: {rec['error']}", file=sys.stderr)

    bar = tqdm(total=len(encoded), unit="text", disable=not progress, file=sys.stderr)
    for c in range(0, len(encoded), CHUNK):
        chunk = encoded[c:c + CHUNK]
        for (r, _), pred in zip(chunk, predictor.predict_encoded([e for _, e in chunk])):
            records[r] = {"line": rows[r][0], **pred}
        bar.update(len(chunk))
    bar.close()
    seconds = time.perf_counter() - start
    real = predictor.real_tokens - real0
    padded = predictor.padded_tokens - padded0

    text = "".join(json.dumps(rec, ensure_ascii=False) + "\n" for rec in records)
    if output_path:
        atomic_write_text(output_path, text)
    else:
        sys.stdout.write(text)
    done = len(encoded)
    summary = {"input": input_path, "output": output_path, "backend": predictor.backend,
               "texts": len(rows), "predicted": done, "failed": len(rows) - done,
               "seconds": round(seconds, 4),
               "texts_per_s": round(done / seconds, 2) if seconds > 0 else None,
               "tokens_per_s": round(real / seconds, 1) if seconds > 0 else None,
               "padding_efficiency": round(real / padded, 4) if padded else None,
               **predictor.task.answer_counts([rec for rec in records if "error" not in rec])}
    if predictor.task.generates:  # decoder steps that produced output vs steps run
        steps = predictor.padded_target_tokens - steps0
        summary["output_tokens_per_s"] = (round((predictor.real_target_tokens - out0) / seconds, 1)
                                          if seconds > 0 else None)
        summary["decode_steps_efficiency"] = (round((predictor.real_target_tokens - out0) / steps,
                                                    4) if steps else None)
    return summary
