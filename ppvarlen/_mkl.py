"""MKL's AVX2 kernels on AMD CPUs.

Paddle's CPU wheel (3.3.1) links MKL 2019.0 Update 5, which picks its kernels by CPU vendor: on
an AMD CPU it takes a generic path, measurably slower than numpy's OpenBLAS on the same GEMM and
in training (benchmarks/train_throughput.py --what anchor; docs/BENCHMARKS.md).  MKL up to
2020.0 honours ``MKL_DEBUG_CPU_TYPE=5``: use the AVX2 kernels.  ``apply()`` sets it when a
ppvarlen command starts (``ppvarlen.cli``, before the command imports paddle) and when a
``Trainer`` is built; MKL reads the variable at its first call, so it reaches every Paddle
kernel of that process and the processes it starts (data-parallel workers, export
subprocesses).  ``import ppvarlen`` sets nothing: a library user's process keeps its own
environment.  The limit: a script that ran Paddle math before building a Trainer has had MKL
choose already; it sets the variable itself before that (PITFALLS 38).

Only set when the CPU is AMD with AVX2 and FMA (the kernels need both) and the variable is unset;
on Intel it would cap MKL at AVX2, so it is left alone there.  ``PPVARLEN_MKL_AVX2=0`` keeps MKL's
own choice.  ``describe()`` is the line the trainer logs.  Newer MKL ignores the variable.
"""
import os

OPT_OUT = "PPVARLEN_MKL_AVX2"
VARIABLE = "MKL_DEBUG_CPU_TYPE"


def cpu_flags(cpuinfo_text):
    """(vendor, set of flags) of the first processor in a /proc/cpuinfo text."""
    vendor, flags = "", set()
    first = cpuinfo_text.split("\n\n", 1)[0]  # every processor repeats them: read one block
    for line in first.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "vendor_id":
            vendor = value.strip()
        elif key == "flags":
            flags = set(value.split())
    return vendor, flags


def decide(cpuinfo_text, environ):
    """(value to set or None, why) for MKL_DEBUG_CPU_TYPE."""
    if environ.get(OPT_OUT, "").strip().lower() in ("0", "false", "no", "off"):
        return None, f"{OPT_OUT}={environ[OPT_OUT]}: MKL chooses its own kernels"
    if VARIABLE in environ:
        return None, f"{VARIABLE}={environ[VARIABLE]} was set before ppvarlen: kept"
    vendor, flags = cpu_flags(cpuinfo_text)
    if vendor != "AuthenticAMD":
        return None, f"CPU vendor {vendor or 'unknown'}: MKL chooses its own kernels"
    if not {"avx2", "fma"} <= flags:
        return None, "AMD CPU without AVX2+FMA: MKL chooses its own kernels"
    return "5", (f"AMD CPU with AVX2: {VARIABLE}=5 (MKL's AVX2 kernels; {OPT_OUT}=0 keeps MKL's "
                 f"generic path)")


def _read_cpuinfo():
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:  # not Linux: nothing to decide from
        return ""


_applied = {}  # this process's decision, once made (a second call must not read its own variable)


def apply(environ=None):
    """Decide for this host and set the variable in ``environ`` (this process's environment by
    default); returns the line the run log shows.  A second call in the process returns the
    first decision."""
    if environ is None:
        if "line" not in _applied:
            _applied["line"] = apply(os.environ)
        return _applied["line"]
    value, why = decide(_read_cpuinfo(), environ)
    if value is not None:
        environ[VARIABLE] = value
    return "MKL: " + why


def describe():
    """What applies to this process now (read-only), for benchmark output."""
    return "MKL: " + decide(_read_cpuinfo(), os.environ)[1]
