"""Which precision to serve: ``auto`` is decided on the host that serves, one rule for the
server, ``ppvarlen-infer`` and ``Predictor(..., precision="auto")``.

``manifest["precision_measured"][backend][precision]`` (written by ``--verify``,
ppvarlen/export/precision_speed.py) says whether the precision passed the export's gates
(only a verified precision is a candidate) and how many examples/s it ran on the export
host's CPU (used for warnings only: another CPU can order the precisions either way).

* an explicit precision is served as asked (``resolve``); on CPU, one measured slower than
  fp32 on the export host logs a warning with both numbers (fp16 with no measurement: a
  warning too, ONNX Runtime's fp16 kernels are for CUDA).
* bf16 on a CPU without bf16 instructions (avx512_bf16 / AMX): Paddle Inference
  logs "CPU does not support BFLOAT16 calculations" at glog level and runs fp32
  kernels; that is said here as a warning, and ``auto`` never picks such a bf16.
* ``auto`` off CPU serves fp32 (CPU timings say nothing about a GPU).

``auto`` on CPU (``load_admitted``; the export host's timings say nothing about another CPU:
AVX2-only, AVX-512, AMX) loads fp32 and every precision the export verified that this CPU
can run, admits each
(``admission.admit``; one that fails is skipped with a log line), times the admitted ones on
the batches of what the caller will run (``WORKLOADS``: a server's requests, or files;
``measure``: interleaved rounds until ``TIME_BUDGET_S``) and serves
the fastest that beats fp32 by ``AUTO_MIN_GAIN`` (when fp32 is the only candidate, it loads
as if asked for: ``_nothing_to_choose``).  The choice, both speeds and the CPU's
flags are logged and kept as ``predictor.precision_choice`` (the server shows it on
``/health``, ``/v2/models/M/config`` and ``/metrics``).  ``backend="auto"`` (Deploy.backend)
chooses the backend by the same rule: the candidates of every backend the export holds are
timed together, keyed (backend, precision), and a reduced precision must beat the faster
backend's fp32.

``threads="auto"`` (Deploy.threads) is decided in the same child, after the backend and
precision, on the chosen engine (``threads_choice``).  With only the threads left to the host
(on ONNX Runtime, an explicit precision or fp32 alone; Paddle's are not timed) there is no
child: they are timed in this process on the engine it serves (``_threads_here``).

The candidates are loaded and timed in a child process (``choose_in_child``); this process
then loads and admits only the chosen one.  Paddle Inference keeps every predictor's oneDNN
kernels in one per-process map of input shapes, bounded by one capacity and not emptied when a
predictor is freed: the shapes the other candidates ran would stay in it and push the served
engine's held shapes out (docs/PRECISION.md, Memory).

The server and ``ppvarlen-infer`` keep what was timed for their next start on this host
(``load_admitted(cache=True)``, ``choice_cache``): a kept choice is loaded and admitted with
nothing timed.
"""
import contextlib
import functools
import importlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time

from ppvarlen.utils import parallel
from ppvarlen.utils.log import get_logger, setup_logging

from ppvarlen.runtime import admission, choice_cache, threads_choice, timing
from ppvarlen.runtime.choice_cache import cpu_flags
from ppvarlen.runtime.manifest import UnservableExportError, load_manifest

log = get_logger("runtime.precision")
_quiet = threading.local()  # set while auto loads candidates: not "requested", so no warnings


def cpu_supports_bf16():
    from paddle.base import core

    return bool(core.supports_bfloat16())


def measured(manifest, backend):
    """{precision: entry} the export verified for ``backend`` (with examples/s when timed)."""
    section = (manifest.get("precision_measured") or {}).get(backend) or {}
    return {p: e for p, e in section.items() if isinstance(e, dict) and e.get("verified")}


def _speed(entry):
    return (entry or {}).get("examples_per_s")


# ``auto`` leaves fp32 only for a precision at least this much faster on the serving host:
# the timing is a few interleaved rounds on a possibly shared CPU, and e.g. int8 of the
# BiGRU-CRF tagger (only its emission head quantizes) times within noise of fp32 while it
# changes some tags (docs/PRECISION.md).
AUTO_MIN_GAIN = 1.10


def resolve(manifest, backend, precision, device="cpu"):
    """The precision an engine loads for a request of ``precision``: an explicit one as
    asked (warned about on CPU when it is slow or not really run), ``auto`` off CPU fp32.
    ``auto`` on CPU is timed on this host: ``load_admitted``."""
    if precision == "auto":
        if device == "cpu":
            raise ValueError("precision auto on CPU is chosen by load_admitted (timed on this "
                             "host), not from the manifest")
        log.info("--precision auto on %s: serving fp32 (the export's timings are from the "
                 "export host's CPU; pass --precision fp16/bf16 to choose)", device)
        return "fp32"
    if device == "cpu" and not getattr(_quiet, "on", False):
        warn_if_slower(manifest, backend, precision)
        if precision == "bf16" and not cpu_supports_bf16():
            log.warning("precision bf16 requested but this CPU has no bf16 instructions "
                        "(avx512_bf16/AMX): Paddle Inference runs its fp32 kernels, so this is "
                        "fp32 in effect; use --precision fp32 (or int8 with --backend onnx)")
    return precision


def warn_if_slower(manifest, backend, precision):
    """Log (and return) a warning when ``precision`` was measured slower than fp32 on CPU."""
    if precision == "fp32":
        return None
    entries = (manifest.get("precision_measured") or {}).get(backend) or {}
    mine, ref = _speed(entries.get(precision)), _speed(entries.get("fp32"))
    message = None
    if mine and ref and mine < ref:
        message = (f"precision {precision} was measured SLOWER than fp32 on CPU for backend "
                   f"{backend} ({mine:.1f} vs {ref:.1f} examples/s on the export host); serving "
                   f"it anyway as requested — use --precision fp32 or auto")
    elif mine is None and precision == "fp16":
        message = (f"precision fp16 on CPU was not measured for backend {backend}; ONNX Runtime's "
                   f"fp16 kernels target CUDA and its CPU path usually runs slower than fp32")
    if message:
        log.warning(message)
    return message


# ---------------------------------------------------------------- chosen on the serving host

# Timing the candidates on the serving host stops after the first round that ends past this
# many seconds (or after MAX_ROUNDS): start-up pays at most this plus one round (a model big
# enough for one round to outlast the budget runs exactly one).  A round runs each admitted
# precision once over the workload's batches (less work than admitting it); they run untimed
# first unless they are the admission batches, which admitting ran.
TIME_BUDGET_S = 3.0
MAX_ROUNDS = 5


def as_requested(precision, requested=None):
    """The record of a precision served because it was asked for (or the only one loaded)."""
    return {"precision": precision, "requested": requested or precision,
            "reason": "requested", "texts_per_cpu_s": {}}


def host_candidates(manifest, backend, quiet=False):
    """The reduced precisions the export verified that this host can run (logged when not,
    unless ``quiet``)."""
    say = (lambda *args: None) if quiet else log.info
    out = []
    for p, entry in sorted(measured(manifest, backend).items()):
        if p == "fp32":
            continue
        if p == "bf16" and not entry.get("cpu_bf16"):
            say("precision auto: bf16 skipped: the export host had no bf16 instructions, "
                "so its parity check ran fp32 kernels; export on a CPU with avx512_bf16/"
                "AMX to verify bf16")
            continue
        if p == "bf16" and not cpu_supports_bf16():
            say("precision auto: bf16 (verified on the export host) skipped: this CPU has "
                "no bf16 instructions (avx512_bf16/AMX), Paddle would run fp32 kernels")
            continue
        out.append(p)
    return out


def admission_batches(predictor, seed=0):
    """The batches admission ran (``admission.admit`` with the same seed): its smoke rows, and
    the padding check's batch per length of the export's grid."""
    return [admission.smoke_rows(predictor, seed)] + [
        rows for _, rows in admission.padding_batches(predictor, seed)]


# What ``auto`` times the candidates on, by what the caller will run (``load_admitted``'s
# ``workload``; the engines can rank differently on small and large batches):
# - "requests": a server's traffic, a text or a few per request: the batches ``threads auto``
#   times (``threads_choice.served_like_batches``: lengths drawn from the export's length
#   profile, sorted, in groups of 1, 2 and 4 texts);
# - "files": ``ppvarlen-infer``, a Ray batch job, a library caller's ``Predictor``: the
#   admission batches (4 rows each, of mixed lengths up to ``max_len``): fuller than a
#   server's, already run by admission (no untimed pass); a file's own batches of up to 64
#   texts would take minutes per candidate to time on a large model.
WORKLOADS = {
    "requests": (threads_choice.served_like_batches,
                 f"served-like batches of the export's length profile, "
                 f"{threads_choice.SERVED_TEXTS} texts in groups of "
                 f"{', '.join(map(str, threads_choice.GROUPS[:-1]))} and "
                 f"{threads_choice.GROUPS[-1]}"),
    "files": (admission_batches, "the admission batches"),
}


def measure(predictors, batches, budget_s=TIME_BUDGET_S, clock=time.process_time,
            wall=time.monotonic, warm=()):
    """{precision: texts per CPU second} of each predictor on ``batches``, timed by
    ``timing.interleaved`` until ``budget_s`` or ``MAX_ROUNDS`` -> (speeds, rounds, wall
    seconds); ``warm``: keys that ran ``batches`` already (no untimed pass).  A round is timed
    in this process's CPU seconds (``clock``, all threads): on a CPU shared with other jobs,
    waiting for a core costs wall time, not CPU time, and the wall-clock ratio of two
    precisions swings with the neighbours' load."""
    texts = sum(len(b) for b in batches)
    best, rounds, took = timing.interleaved(predictors, batches, budget_s, MAX_ROUNDS, (clock,),
                                            wall, warm=warm)
    return {p: texts / max(s[0], 1e-9) for p, s in best.items()}, rounds, took


def pick(speeds):
    """The fastest of {(backend, precision): speed}; a reduced precision only when it beats
    the fastest fp32 by ``AUTO_MIN_GAIN`` (between backends' fp32, the faster)."""
    ref = max(v for (_, p), v in speeds.items() if p == "fp32")
    fast = {k: v for k, v in speeds.items() if k[1] == "fp32" or v >= AUTO_MIN_GAIN * ref}
    return max(sorted(fast), key=lambda k: fast[k])


def export_backends(manifest, precision="auto"):
    """The backends an export holds (Paddle first) that hold ``precision`` (``auto``: any):
    what ``Deploy.backend: auto`` chooses among."""
    held = manifest.get("precisions") or {}
    return [b for b in ("paddle", "onnx") if b in (manifest.get("backends") or {})
            and (precision == "auto" or precision in held.get(b, ["fp32"]))]


def _auto_backend(load):
    """True when ``load`` (a ``functools.partial`` of ``Predictor``) leaves the backend to
    the serving host: ``backend="auto"``."""
    return isinstance(load, functools.partial) and load.keywords.get("backend") == "auto"


@contextlib.contextmanager
def _candidate():
    _quiet.on = True
    try:
        yield
    finally:
        _quiet.on = False


def load_admitted(load, export_dir, requested="auto", device="cpu", renderers=(), cache=False,
                  workload="files", _lookup=True):
    """The admitted predictor of ``export_dir`` for ``requested`` (Deploy.precision), its
    choice in ``predictor.precision_choice`` and its admission report in
    ``predictor.admission``.  ``load(export_dir, precision=p)`` makes a ``Predictor`` (a
    ``functools.partial`` of a module-level callable with JSON keyword arguments: ``auto``
    describes it to a child process, ``describe_loader``); ``renderers`` go to
    ``admission.admit``.

    An explicit precision is served as asked; its admission failure names it ("int8:
    padding check: ...").  ``auto`` on CPU: see the module docstring; a candidate that fails
    to load or admit is skipped with a log line, fp32 still serves.  A loader with
    ``backend="auto"`` (``Deploy.backend: auto``) on CPU chooses the backend the same way,
    among the export's backends that hold the requested precision (every verified one for
    ``auto``); off CPU it loads Paddle Inference.  ``cache``: what ``auto`` timed is kept for
    the next load on this host, and a kept choice is loaded without timing (``choice_cache``;
    one that no longer loads or passes admission is forgotten and the candidates timed
    again).  ``workload``: what the predictor will run, which ``auto`` times the candidates on
    (``WORKLOADS``: a server's ``"requests"`` or ``"files"``)."""
    if workload not in WORKLOADS:
        raise ValueError(f"workload {workload!r}: one of {', '.join(WORKLOADS)}")
    again = functools.partial(load_admitted, load, export_dir, requested, device, renderers,
                              cache, workload, _lookup=False)  # a kept choice failed: time again
    any_backend = _auto_backend(load)
    if any_backend and device != "cpu":
        log.info("backend auto on %s: serving Paddle Inference (the %s path; CPU timings say "
                 "nothing about it)", device, device)
        load, any_backend = functools.partial(load, backend="paddle"), False
    # what the shortcuts below read; None when it cannot be read (the usual path says why)
    manifest = _readable_manifest(export_dir) if any_backend or requested == "auto" else None
    only = _only_backend(manifest, requested) if any_backend else None
    if only is not None:  # nothing to choose: as if that backend were asked for (no child)
        load, any_backend = functools.partial(load, backend=only), False
    threads = load.keywords.get("threads") if isinstance(load, functools.partial) else None
    if threads == "auto" and device != "cpu":
        log.info("threads %s", threads_choice.untimed_reason("auto", device=device))
        load, threads = functools.partial(load, threads=1), 1
    untimed = None  # threads auto decided here, with no child (Paddle: the cores)
    if threads == "auto" and device == "cpu":
        threads = threads_choice.resolve("auto")  # one usable core: 1, not timed
        if threads == "auto" and load.keywords.get("backend") == "paddle":
            untimed = threads_choice.paddle_cores(threads_choice.math_cores())
            threads = untimed["threads"]
        load = functools.partial(load, threads=threads)
    plain = _nothing_to_choose(load, manifest) \
        if requested == "auto" and device == "cpu" and not any_backend else None
    if plain is not None:  # fp32 serves: no candidates to load and time, no child
        requested = "fp32"
    auto = device == "cpu" and (requested == "auto" or any_backend)
    parts = _cache_parts(load, export_dir, requested, workload) \
        if cache and (auto or threads == "auto") else None
    kept = choice_cache.lookup(parts) if _lookup else None
    if threads == "auto" and requested != "auto" and not any_backend:
        return _threads_here(load, export_dir, requested, renderers, plain, parts, kept, again)
    choice = None
    if kept is not None:
        choice = _recalled(kept)
    elif auto:
        choice = choose_in_child(load, export_dir, requested, workload) if CHOOSE_IN_CHILD \
            else choose(load, export_dir, requested, workload)
        _keep(parts, choice)
    try:
        chosen = {"backend": choice["backend"]} if any_backend else {}
        if threads == "auto":
            chosen["threads"] = choice["threads"]
        # a precision auto chose was not requested: no warnings about it
        with _candidate() if requested == "auto" and auto else contextlib.nullcontext():
            predictor = load(export_dir, precision=choice["precision"] if auto else requested,
                             **chosen)
        _admit(predictor, renderers)
    except Exception as e:  # noqa: BLE001 - a kept choice is timed again; a new one raises
        if kept is None:
            raise
        return _forget(kept, e, again)
    predictor.precision_choice = choice or plain or as_requested(predictor.precision, requested)
    if untimed is not None:
        predictor.precision_choice.update(untimed)
    predictor.precision_choice.setdefault("backend", predictor.backend)
    return predictor


def _readable_manifest(export_dir):
    """The export's manifest, or None when it cannot be read (the usual path loads it again
    and says why)."""
    try:
        return load_manifest(export_dir, verify=False)
    except Exception:  # noqa: BLE001 - reported by the usual path
        return None


def _only_backend(manifest, requested):
    """The backend ``backend="auto"`` has no choice of: the only one of the export's backends
    that holds ``requested`` (``auto``: the export's only backend), logged; None when there
    are several or none, or no ``manifest`` (unreadable)."""
    if manifest is None:
        return None
    try:
        held = export_backends(manifest, requested)
    except Exception:  # noqa: BLE001 - a misshapen manifest: the usual path says why
        return None
    if len(held) != 1:
        return None
    log.info("backend auto: %s, %s", held[0], "the export's only backend" if requested == "auto"
             else f"the one backend of this export that holds precision {requested}")
    return held[0]


def _admit(predictor, renderers):
    """``predictor`` with its admission report; a failure names a precision other than fp32."""
    try:
        predictor.admission = admission.admit(predictor, renderers=renderers)
    except admission.AdmissionError as e:
        if predictor.precision != "fp32":
            e.args = (f"{predictor.precision}: {e}",)
        raise
    return predictor


def _nothing_to_choose(load, manifest):
    """``auto``'s record of fp32 when the export verified no other precision this host runs
    for the loader's backend (so there is nothing to time), else None.  A loader whose backend
    cannot be read, or a manifest that cannot (None, or misshapen), goes the usual way (which
    reports what is wrong)."""
    if not isinstance(load, functools.partial) or manifest is None:
        return None
    backend = load.keywords.get("backend", "paddle")
    try:
        if host_candidates(manifest, backend, quiet=True):
            return None
    except Exception:  # noqa: BLE001 - the usual path loads it again and says why it fails
        return None
    host_candidates(manifest, backend)  # why each verified one is skipped here, logged once
    reason = "no other precision the export verified runs here"
    log.info("precision auto: fp32 for backend %s (%s; CPU flags: %s)", backend, reason,
             " ".join(cpu_flags()) or "unknown")
    return {**as_requested("fp32", "auto"), "backend": backend, "reason": reason}


def _cache_parts(load, export_dir, requested, workload):
    """``choice_cache.key_parts`` of a choice made with ``load`` (None: a loader that cannot
    be described is not cached)."""
    loader = describe_loader(load)
    return None if loader is None else choice_cache.key_parts(loader, export_dir, requested,
                                                              workload)


def _keep(parts, choice):
    """Keep ``choice`` for the next start (``choice_cache``), unless it could be the host's
    load rather than the engines that decided it (``threads_choice.wall_clock_verdict``)."""
    if parts is None:
        return
    if threads_choice.wall_clock_verdict(choice):
        log.info("auto: not kept for the next start: one math thread won a wall-time "
                 "comparison with the cores, which other work on the host can decide; "
                 "timed again at each start")
        return
    choice_cache.store(parts, choice)


def _recalled(kept):
    """A kept choice (``choice_cache.lookup``), logged as such."""
    choice = dict(kept["choice"], cached=kept["path"], chosen_at=kept["chosen_at"])
    what = [f"precision {choice['precision']}"] if "precision" in choice else []
    what += [f"backend {choice['backend']}"] if "backend" in choice else []
    what += [f"{choice['threads']} math threads"] if "threads" in choice else []
    log.info("auto: %s, as timed on this host at %s (%s; kept in %s: delete it to time "
             "again)", ", ".join(what), choice["chosen_at"],
             choice["reason"] if "reason" in choice else choice.get("threads_reason"),
             kept["path"])
    # /health and the model config show the reasons: say the timing is an earlier start's
    for key in ("reason", "threads_reason"):
        if isinstance(choice.get(key), str):
            choice[key] += f" (timed at {choice['chosen_at']}, kept)"
    return choice


def _forget(kept, error, again):
    log.warning("auto: the choice kept in %s fails here now (%s); forgotten, timing again",
                kept["path"], error)
    choice_cache.forget(kept)
    return again()


def _threads_here(load, export_dir, precision, renderers, record=None, parts=None, kept=None,
                  again=None):
    """``threads: auto`` on ONNX Runtime with the precision settled (asked for, or fp32 alone
    for ``auto``, whose ``record`` is kept): only the threads are left to choose, so they are
    timed here, with no child process.  The engine is loaded with the
    usable cores and admitted, timed against a one-thread session of it (``threads_choice``;
    that session is freed and its heap given back), and served as it is, or loaded again
    with one thread when one serves more.  A child would start an interpreter and load and
    admit the same engine a second time; ONNX Runtime sessions leave nothing behind in the
    process once freed, unlike Paddle's one oneDNN map (module docstring).  ``kept``: the
    threads a previous load timed (``choice_cache``), loaded as they are; ``parts``: the key
    a newly timed choice is kept under."""
    if kept is not None:
        chosen = _recalled(kept)
        try:
            predictor = _admit(load(export_dir, precision=precision, threads=chosen["threads"]),
                               renderers)
        except Exception as e:  # noqa: BLE001 - timed again, which raises it if it still fails
            return _forget(kept, e, again)
    else:
        n = threads_choice.math_cores()
        predictor = _admit(load(export_dir, precision=precision, threads=n), renderers)
        chosen = threads_choice.choose(
            predictor, lambda: load(export_dir, precision=precision, threads=1), n,
            AUTO_MIN_GAIN)
        _keep(parts, chosen)
        if chosen["threads"] != predictor.threads:
            predictor = None
            parallel.release_memory()
            predictor = _admit(load(export_dir, precision=precision,
                                    threads=chosen["threads"]), renderers)
    predictor.precision_choice = {**(record or as_requested(predictor.precision, precision)),
                                  **chosen, "backend": predictor.backend}
    return predictor


# Tests that patch this module's functions (they do not reach a child process) choose in-process.
CHOOSE_IN_CHILD = True
# A child that has not chosen by then is killed and the choice made here: loading, admitting
# and timing the candidates of the largest exports takes a minute or two.
CHILD_TIMEOUT_S = 900
# The child is a fresh interpreter running this, not a multiprocessing "spawn": spawn runs the
# parent's main script again in the child, and a script without an ``if __name__ ==
# "__main__"`` guard (a console wrapper of main_serve, say) would start a second server there.
_CHILD_CODE = "from ppvarlen.runtime.precision_choice import _child_main; _child_main()"


def describe_loader(load):
    """``load`` as JSON a child process rebuilds it from: {"callable": "module:qualname",
    "kwargs": {...}} -> None when it is not a ``functools.partial`` of a module-level callable
    with JSON keyword arguments only (a closure, say).  Data, not a pickle: the child runs
    nothing the request could smuggle in beyond importing the callable it names."""
    if not isinstance(load, functools.partial) or load.args:
        return None
    func = load.func
    module, name = getattr(func, "__module__", None), getattr(func, "__qualname__", "")
    if not module or module == "__main__" or "<" in name:  # the child cannot import it
        return None
    try:
        json.dumps(load.keywords)
    except (TypeError, ValueError):
        return None
    return {"callable": f"{module}:{name}", "kwargs": dict(load.keywords)}


def rebuild_loader(description):
    """The loader ``describe_loader`` described."""
    module, _, name = description["callable"].partition(":")
    func = importlib.import_module(module)
    for part in name.split("."):
        func = getattr(func, part)
    return functools.partial(func, **description["kwargs"])


def choose_in_child(load, export_dir, requested="auto", workload="files"):
    """``choose(load, export_dir, requested, workload)`` run in a child process (module
    docstring: the candidates' kernels stay out of this process) -> the choice.  When the child fails, the choice is
    made here instead, so its error (an fp32 that fails admission, a broken export) is
    raised as itself."""
    loader = describe_loader(load)
    if loader is None:
        return _choose_here("it could not start: its loader is not a functools.partial of a "
                            "module-level callable with JSON keyword arguments", load,
                            export_dir, requested, workload)
    request = json.dumps({"loader": loader, "export_dir": export_dir, "parent": os.getpid(),
                          "requested": requested, "workload": workload,
                          "level": get_logger("ppvarlen").level}).encode("utf-8")
    # the child imports the loader's module from the same paths as this process, and only
    # those: -P keeps ``-c`` from putting the working directory first, where another
    # ppvarlen (a checkout beside the export, say) would be imported instead of this one
    path = [p or os.getcwd() for p in sys.path]
    env = parallel.child_environ(PYTHONPATH=os.pathsep.join(path))
    try:
        done = subprocess.run([sys.executable, "-P", "-c", _CHILD_CODE], input=request,
                              stdout=subprocess.PIPE, env=env, timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return _choose_here(f"it had not chosen after {CHILD_TIMEOUT_S}s and was killed",
                            load, export_dir, requested, workload)
    except OSError as e:
        return _choose_here(f"it could not start: {e}", load, export_dir, requested, workload)
    try:
        reply = json.loads(done.stdout.decode("utf-8"))
    except ValueError:
        reply = {"error": f"it exited with status {done.returncode} and no answer"}
    if "error" in reply:
        return _choose_here(reply["error"], load, export_dir, requested, workload)
    return reply


def _choose_here(why, load, export_dir, requested, workload):
    log.warning("precision auto: timing the candidates in a child process failed (%s); "
                "choosing in this process", why)
    return choose(load, export_dir, requested, workload)


def _child_main():
    """The child of ``choose_in_child``: its request as JSON on stdin, the choice -- or the
    error -- as JSON on stdout."""
    answer = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # whatever else prints to stdout (Paddle, a loader) goes to the log instead
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's: it kills this one
    # a process inherits its parent's mask, and a repository's server holds SIGTERM blocked
    # (serve.signals.sigterm_held): SIGTERM stops this one as it stops any
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    request = json.load(sys.stdin)
    if not parallel.die_with_parent(request["parent"]):
        return
    setup_logging(request["level"] or logging.INFO)
    try:
        reply = choose(rebuild_loader(request["loader"]), request["export_dir"],
                       request["requested"], request["workload"])
    except Exception as e:  # noqa: BLE001 - the parent chooses again and raises the error
        reply = {"error": f"it reported {type(e).__name__}: {e}"}
    with answer:
        json.dump(reply, answer)


def _candidates(fp32, requested):
    """The precisions of ``fp32``'s backend to time for ``requested``: fp32 and the reduced
    ones the export verified that this host can run (``auto``), or the one asked for."""
    if requested == "auto":
        return ["fp32"] + host_candidates(fp32.manifest, fp32.backend)
    return [requested]


def choose(load, export_dir, requested="auto", workload="files"):
    """The ``auto`` choice on this CPU (module docstring), made in this process: loads, admits
    and times the candidates, frees them -> {precision, backend, requested, reason,
    texts_per_cpu_s}, and with a loader of ``threads="auto"`` the math threads chosen for
    the chosen engine (``threads_choice.choose``: threads, threads_reason, threads_timing).
    A loader with ``backend="auto"`` times the candidates of every
    backend of the export that holds ``requested`` (an explicit precision: that one on each),
    on the batches of ``workload`` (``WORKLOADS``)."""
    many = None  # threads auto: the usable cores, tried against one thread (threads_choice)
    if isinstance(load, functools.partial) and load.keywords.get("threads") == "auto":
        many = threads_choice.math_cores()
        load = functools.partial(load, threads=many)
    if not _auto_backend(load):
        backends, several = [None], False
    else:
        # the manifest is checked in full (files, hashes) when each candidate loads it
        backends = export_backends(load_manifest(export_dir, verify=False), requested)
        if not backends:
            raise UnservableExportError(f"no backend of {export_dir} holds precision "
                                        f"{requested!r} (manifest.precisions); re-export with "
                                        f"it or ask for another")
        several = len(backends) > 1
    first_precision = "fp32" if requested == "auto" else requested
    admitted, failures = {}, []
    for backend in backends:
        own = {} if backend is None else {"backend": backend}
        try:
            with _candidate() if requested == "auto" else contextlib.nullcontext():
                first = load(export_dir, precision=first_precision, **own)
            first.admission = admission.admit(first)
        except Exception as e:  # noqa: BLE001 - one backend failing leaves the others
            if not several:
                raise
            log.warning("backend auto: %s skipped: its %s fails on this host: %s",
                        backend, first_precision, e)
            failures.append(f"{backend}: {e}")
            continue
        admitted[(first.backend, first_precision)] = first
        for p in _candidates(first, requested)[1:]:
            try:
                with _candidate():
                    candidate = load(export_dir, precision=p, **own)
                candidate.admission = admission.admit(candidate)
            except Exception as e:  # noqa: BLE001 - a candidate that fails anything is not served
                log.warning("precision auto: %s (verified on the export host) skipped: it fails "
                            "on this host: %s", p, e)
                continue
            admitted[(candidate.backend, p)] = candidate
    if not admitted:
        raise UnservableExportError("backend auto: no backend of this export loads and passes "
                                    "admission here: " + "; ".join(failures))
    flags = " ".join(cpu_flags()) or "unknown"
    what = "backend and precision" if several else "precision"
    name = (lambda k: f"{k[0]} {k[1]}") if several else (lambda k: k[1])
    only = next(iter(admitted))
    if len(admitted) == 1:
        reason = ("no other precision the export verified runs and passes admission here"
                  if requested == "auto" else "the one backend that runs it here")
        if requested == "auto" or several:
            log.info("%s auto: %s for backend %s (%s; CPU flags: %s)", what, only[1], only[0],
                     reason, flags)
        choice = {**as_requested(only[1], requested), "backend": only[0], "reason": reason}
        return _with_threads(choice, admitted, only, load, export_dir, many)
    make_batches, timed_on = WORKLOADS[workload]
    batches = make_batches(admitted[only])
    if workload == "requests" and not admitted[only].manifest.get("length_profile"):
        timed_on += (" (the manifest has no length_profile: lengths up to max_len, half of "
                     "them max_len; an export records it from the training data, or "
                     "--pretrained-dir's from --verify-file)")
    # admitting each candidate ran the admission batches ("files"), so their shapes' kernels
    # are set up: no untimed pass of those
    speeds, rounds, took = measure(admitted, batches,
                                   warm=set(admitted) if workload == "files" else ())
    chosen = pick(speeds)
    shown = ", ".join(f"{name(k)} {v:.1f}" for k, v in sorted(speeds.items()))
    fp32s = [k for k in speeds if k[1] == "fp32"]
    if requested != "auto":
        reason = f"fastest on this host ({shown} texts/CPU-s)"
    elif chosen[1] == "fp32" and len(fp32s) < len(speeds):
        reason = (f"no precision beat fp32 by {AUTO_MIN_GAIN:.2f}x on this host ({shown} "
                  f"texts/CPU-s)")
    else:  # against the next fastest (one backend: its fp32)
        versus = max((k for k in (speeds if several else fp32s) if k != chosen), key=speeds.get)
        reason = (f"fastest on this host: {name(chosen)} {speeds[chosen]:.1f} vs {name(versus)} "
                  f"{speeds[versus]:.1f} texts/CPU-s")
    log.info("%s auto: %s for backend %s: %s (timed on %s; %d interleaved rounds in %.1fs%s; "
             "CPU flags: %s)", what, chosen[1], chosen[0], reason, timed_on, rounds, took,
             "" if shown in reason else f": {shown} texts/CPU-s", flags)
    choice = {"precision": chosen[1], "backend": chosen[0], "requested": requested,
              "reason": reason, "texts_per_cpu_s": {name(k): round(v, 1)
                                                    for k, v in speeds.items()}}
    return _with_threads(choice, admitted, chosen, load, export_dir, many)


def _with_threads(choice, admitted, key, load, export_dir, many):
    """``choice`` with the math threads ``threads: auto`` chose for the engine ``key`` of
    ``admitted`` (loaded with ``many`` threads), then every candidate freed."""
    if many is not None:
        own = {"backend": key[0]} if _auto_backend(load) else {}
        with _candidate():
            choice.update(threads_choice.choose(
                admitted[key], lambda: load(export_dir, precision=key[1], threads=1, **own),
                many, AUTO_MIN_GAIN))
    admitted.clear()
    return choice
