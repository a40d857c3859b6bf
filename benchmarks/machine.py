"""The machine a benchmark ran on, as its JSON records it: the CPU model and the SIMD flags
that matter for these kernels (from /proc/cpuinfo), the core count, Python, the load average.

Imported by the benchmarks beside it (``from machine import machine``: a script's own
directory is first on ``sys.path`` when Python runs it).
"""
import os
import re
import sys

SIMD_PREFIXES = ("avx", "amx", "fma", "sse4")


def simd_flags(cpuinfo_text):
    """The SIMD flags of the first CPU listed (sorted), from /proc/cpuinfo's text."""
    flags = re.search(r"^flags\s*:\s*(.*)$", cpuinfo_text, re.M)
    return sorted(f for f in (flags.group(1).split() if flags else [])
                  if f.startswith(SIMD_PREFIXES))


def machine(cpuinfo_path="/proc/cpuinfo"):
    info = {"cpu_count": os.cpu_count(), "python": sys.version.split()[0], "cpu_model": None,
            "cpu_simd_flags": []}
    try:
        with open(cpuinfo_path, encoding="utf-8") as f:
            text = f.read()
    except OSError:
        text = None
    if text is not None:
        model = re.search(r"^model name\s*:\s*(.*)$", text, re.M)
        info["cpu_model"] = model.group(1).strip() if model else None
        info["cpu_simd_flags"] = simd_flags(text)
    info["loadavg"] = [round(x, 2) for x in os.getloadavg()]
    return info
