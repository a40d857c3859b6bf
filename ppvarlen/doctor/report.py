"""The doctor's report: one ``CheckResult`` per check, a terminal table and a JSON document."""
import math
import textwrap

import numpy as np

# warn: the check found something a user should know that the deployment decided on purpose
# (an export's recorded long-text policy): reported with its advice, not a failure (exit 0)
PASS, WARN, FAIL, NOT_APPLICABLE = "pass", "warn", "fail", "n/a"
TABLE_WIDTH = 100


class CheckResult:
    """One check's verdict: ``status`` pass / warn / fail / n/a, ``summary`` (one line of
    measured evidence), ``evidence`` (the numbers), ``fix`` (what to do when it fails or warns,
    or why it does not apply) and ``pitfalls`` (docs/PITFALLS.md entries it catches)."""

    def __init__(self, number, title, status, summary, evidence=None, fix=None, pitfalls=()):
        self.number, self.title, self.status = number, title, status
        self.summary, self.evidence, self.fix = summary, evidence or {}, fix
        self.pitfalls = list(pitfalls)

    def as_dict(self):
        return {"number": self.number, "check": self.title, "status": self.status,
                "summary": self.summary, "evidence": self.evidence, "fix": self.fix,
                "pitfalls": self.pitfalls}


def exit_code(results):
    """0 when nothing fails (warnings included), 1 when a check does."""
    return 1 if any(r.status == FAIL for r in results) else 0


def plain(value):
    """``value`` as strict JSON data: numpy scalars and arrays as Python ones, a non-finite
    float as its name ("inf", "nan"), since JSON has no such numbers."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return plain(value.tolist())
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def document(model, results):
    """The JSON report: the model as loaded (what was fed to which input) and every check."""
    return plain({"model": model.describe(), "checks": [r.as_dict() for r in results],
                  "failed": [r.number for r in results if r.status == FAIL],
                  "warnings": [r.number for r in results if r.status == WARN],
                  "exit_code": exit_code(results)})


def _wrapped(text, indent):
    return textwrap.wrap(text, TABLE_WIDTH - indent, subsequent_indent="") or [""]


def format_table(model, results):
    """The terminal report: what was loaded and fed, a table of the checks, then the fixes."""
    about = model.describe()
    lines = [f"ppvarlen-doctor: {about['path']}",
             f"  loaded as: {about['kind']}, run with {about['runtime']}"]
    for name, what in about["fed"].items():
        lines.append(f"  fed {name}: {what}")
    for name in about["unmapped"]:
        shape = next(i for i in about["inputs"] if i["name"] == name)["shape"]
        lines.append(f"  input {name} {shape}: no rule maps it (checks that run the model: n/a)")
    for note in about["notes"]:
        lines += ["  " + line for line in _wrapped(note, 2)]
    tok = about["tokenizer"]
    lines.append(f"  tokenizer: {tok['kind']} at {tok['source']}, vocab {tok['vocab_size']}"
                 if tok else "  tokenizer: none (pass --tokenizer DIR for checks 7 and 8)")
    head = f"  {'#':>2}  {'check':<28} {'result':<6}  evidence"
    lines += ["", head, "  " + "-" * (len(head) - 2 + 40)]
    indent = 2 + 2 + 2 + 28 + 1 + 6 + 2
    for r in results:
        evidence = _wrapped(r.summary, indent)
        status = r.status.upper() if r.status == FAIL else r.status
        lines.append(f"  {r.number:>2}  {r.title:<28} {status:<6}  {evidence[0]}")
        lines += [" " * indent + more for more in evidence[1:]]
    for status, heading in ((FAIL, "fixes"), (WARN, "warnings (deliberate, still worth a look)")):
        advised = [r for r in results if r.status == status and r.fix]
        if advised:
            lines += ["", f"  {heading}:"]
        for r in advised:
            cited = f" (docs/PITFALLS.md {', '.join(map(str, r.pitfalls))})" if r.pitfalls else ""
            text = _wrapped(f"{r.number}. {r.title}: {r.fix}{cited}", 4)
            lines += ["    " + text[0]] + ["       " + more for more in text[1:]]
    failed = [str(r.number) for r in results if r.status == FAIL]
    warned = [str(r.number) for r in results if r.status == WARN]
    lines += ["", f"  {len(failed)} of {len(results)} checks failed" +
              (f" ({', '.join(failed)})" if failed else "") +
              (f", {len(warned)} warned ({', '.join(warned)})" if warned else "") +
              "; exit " + str(exit_code(results))]
    return "\n".join(lines)
