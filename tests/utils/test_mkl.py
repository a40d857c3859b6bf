"""ppvarlen._mkl: MKL's AVX2 kernels on AMD CPUs, decided from /proc/cpuinfo and the environment."""
import os
import re
import subprocess
import sys

from ppvarlen import _mkl

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def cpuinfo(vendor, flags):
    one = f"processor\t: 0\nvendor_id\t: {vendor}\nflags\t\t: {' '.join(flags)}\n\n"
    return one + one.replace("processor\t: 0", "processor\t: 1")


def host_expectation():
    """The rule, read off this host's /proc/cpuinfo independently of _mkl: "5" on an AMD CPU
    with AVX2 and FMA, else unset."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            first_cpu = f.read().split("\n\n")[0]
    except OSError:
        return None
    vendor = re.search(r"^vendor_id\s*:\s*(\S+)", first_cpu, re.M)
    flags = re.search(r"^flags\s*:(.*)$", first_cpu, re.M)
    amd = vendor is not None and vendor.group(1) == "AuthenticAMD"
    return "5" if amd and flags and {"avx2", "fma"} <= set(flags.group(1).split()) else None


def test_amd_with_avx2_gets_the_avx2_kernels():
    value, why = _mkl.decide(cpuinfo("AuthenticAMD", ["sse2", "avx", "avx2", "fma"]), {})
    assert value == "5" and "MKL_DEBUG_CPU_TYPE=5" in why


def test_intel_and_old_amd_and_unknown_cpus_are_left_alone():
    for text in (cpuinfo("GenuineIntel", ["avx2", "fma", "avx512f"]),
                 cpuinfo("AuthenticAMD", ["sse2", "avx"]), ""):
        value, why = _mkl.decide(text, {})
        assert value is None and "MKL chooses its own kernels" in why


def test_a_users_setting_and_the_opt_out_win():
    amd = cpuinfo("AuthenticAMD", ["avx2", "fma"])
    assert _mkl.decide(amd, {"MKL_DEBUG_CPU_TYPE": "2"}) == (
        None, "MKL_DEBUG_CPU_TYPE=2 was set before ppvarlen: kept")
    value, why = _mkl.decide(amd, {"PPVARLEN_MKL_AVX2": "0"})
    assert value is None and why.startswith("PPVARLEN_MKL_AVX2=0")


def test_a_command_start_sets_the_variable_for_this_host_and_children_inherit_it():
    """What a ppvarlen command's start (``cli.command_settings``) does on the machine running the
    tests matches the decision; ``import ppvarlen`` alone sets nothing."""
    env = {k: v for k, v in os.environ.items() if k not in ("MKL_DEBUG_CPU_TYPE", "PPVARLEN_MKL_AVX2")}
    child = ("subprocess.run([sys.executable, '-c', 'import os; print(os.environ.get(\"MKL_DEBUG_CPU_TYPE\"))'],"
             " capture_output=True, text=True).stdout.strip()")
    code = ("import os, subprocess, sys, ppvarlen, ppvarlen.cli\n"
            "print(os.environ.get('MKL_DEBUG_CPU_TYPE'))\n"
            "ppvarlen.cli.command_settings()\n"
            "print(os.environ.get('MKL_DEBUG_CPU_TYPE'))\n"
            f"print({child})")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    expected = host_expectation()
    assert r.stdout.split() == ["None"] + [str(expected)] * 2
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                       env={**env, "PPVARLEN_MKL_AVX2": "0"}, timeout=300)
    assert r.stdout.split() == ["None", "None", "None"]


def test_apply_keeps_its_first_decision_for_the_log():
    """The trainer's log line after a command already applied it names the decision, not
    'was set before ppvarlen'."""
    env = {k: v for k, v in os.environ.items() if k not in ("MKL_DEBUG_CPU_TYPE", "PPVARLEN_MKL_AVX2")}
    code = "from ppvarlen import _mkl\nprint(_mkl.apply() == _mkl.apply())"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=env,
                       timeout=300)
    assert r.stdout.split() == ["True"], r.stderr
