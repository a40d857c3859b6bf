"""How many math threads a predictor runs: ``threads: auto`` (``Deploy.threads``,
``ppvarlen-infer --threads auto``, ``Predictor(..., threads="auto")``) is decided on the host
that serves, after the backend and precision: in precision auto's child process
(``precision_choice.choose``), or in the serving process when the precision is explicit
(``precision_choice._threads_here``).

For ONNX Runtime: more math threads shorten a batch only when the engine has enough work to share,
and on a server they take cores from the front end (HTTP, JSON, tokenizing), which runs
beside the engine.  So the rule prices both, from the engine's cost per text on served-like
batches (``served_like_batches``), timed here at 1 thread (``c1``, CPU seconds) and at ``n``
= the usable cores (``wall_n`` and ``cpu_n``; threads that spin while they wait count):

    texts/s with 1 thread   ~ min(1 / c1,     n / (c1 + F))
    texts/s with n threads  ~ min(1 / wall_n, n / (cpu_n + F))

(the engine thread's own speed, or the cores shared with the front end's ``F`` =
``FRONT_END_CPU_S`` CPU seconds per text), and ``n`` threads serve when they beat one by
``precision_choice.AUTO_MIN_GAIN``.  A model whose engine costs little next to ``F`` cannot
gain that much whatever one thread costs (one thread never costs more CPU than ``n``): it is
decided from the ``n``-thread timing alone, with no second engine loaded.

Paddle Inference is not timed: it gets the usable cores.  Its math-thread count behaves as
state of the process: a one-thread predictor created after a two-thread one in the same process
ran at the same wall time per text as it, so the two cannot be timed side by side; served, the
cores measured faster for both model sizes tried (docs/PRECISION.md).
"""
import random
import time

from ppvarlen.utils.log import get_logger
from ppvarlen.utils.parallel import omp_limit, release_memory, usable_cores

from ppvarlen.runtime import admission, timing

log = get_logger("runtime.threads")

# A one-text request's CPU outside the engine (HTTP, JSON, tokenizing, the batcher): measured
# on ppvarlen-serve (docs/PRECISION.md, Math threads); gRPC's front end costs more than REST's.
FRONT_END_CPU_S = 0.0005
TIME_BUDGET_S = 4.0
MAX_ROUNDS = 5
CONFIRM_ROUNDS = 3  # more rounds before one thread is chosen over the cores
SERVED_TEXTS = 24  # lengths drawn per timing round
GROUPS = (1, 2, 4)  # texts per batch in turn: what the length-aware batcher forms for a few callers
# wall, process CPU (another engine's spinning pool threads count: they take cores from the
# front end too), the calling thread's CPU (all a one-thread engine uses, whatever spins)
CLOCKS = (time.perf_counter, time.process_time, time.thread_time)
BANDS = (("p50", 0.5), ("p95", 0.45), ("p99", 0.04), ("max", 0.01))  # upper quantile, mass


def math_cores(environ=None):
    """The most math threads ``auto`` tries: the usable cores, or fewer when
    ``OMP_NUM_THREADS`` says so (a limit set for this process, e.g. by Ray for an actor; not
    the "1" Paddle's import writes when it is unset).  ``environ``: a mapping read instead."""
    limit, cores = omp_limit(environ), usable_cores()
    return cores if limit is None else min(cores, limit)


def count(threads):
    """A thread setting as a count where nothing is timed (the export's parity runners,
    ``ppvarlen-infer``'s file runs: large batches, no front end sharing the cores):
    ``auto`` is ``math_cores()``."""
    return math_cores() if threads == "auto" else int(threads)


def wall_clock_verdict(choice):
    """Whether ``choice`` (``choose``'s) is one thread by a wall-time comparison with the cores:
    other work on the host while it was timed can have decided it (wall time is what the
    cores lose to neighbours), so it is timed again at the next start, not kept."""
    timing = choice.get("threads_timing") or {}
    return choice.get("threads") == 1 and "wall_ms_per_text" in timing


def resolve(threads, workers=1):
    """A thread setting -> an int, or ``"auto"`` left for ``choose``: with several workers
    the usable cores are split between them instead (each runs batches at the same time)."""
    count, why = _untimed(threads, workers)
    if count is None:
        return "auto"
    if threads == "auto":
        log.info("threads %s", why)
    return count


def untimed_reason(threads, workers=1, device="cpu", served=None):
    """Why a count no timing chose serves: the ``threads`` and ``workers`` settings as
    ``resolve`` settles them untimed; ``served``: the count the predictor runs, when it was
    built with another one (a library caller's ``Predictor(threads=N)``)."""
    count, why = _untimed(threads, workers, device)
    if served is not None and served != count:
        return f"as the predictor was built ({served} math thread(s))"
    return why


def _untimed(threads, workers=1, device="cpu"):
    """(count, why) of a thread setting settled without timing, or (None, None): ``choose``
    times it.  The one place the untimed rule is written."""
    if threads != "auto":
        return int(threads), "as set (Deploy.threads)"
    if device != "cpu":
        return 1, f"auto on {device}: 1 math thread (the device does the math)"
    usable = math_cores()
    if usable > 1 and workers <= 1:
        return None, None
    count = max(1, usable // max(1, workers))
    limit = omp_limit()
    limited = f", OMP_NUM_THREADS={limit}" if limit == usable else ""
    return count, (f"auto, not timed: {count} math thread(s) per predictor ({usable} usable "
                   f"core(s){limited}; {workers} worker(s))")


def profile_lengths(profile, max_len, n, rng):
    """``n`` token lengths drawn from the manifest's ``length_profile`` bands (``BANDS``:
    half up to p50, 45% to p95, ...; uniform within a band), sorted; a missing quantile is
    ``max_len``."""
    edges, low = [], 1
    for key, mass in BANDS:
        high = max(low, int(min(max_len, profile.get(key) or max_len)))
        edges.append((low, high, mass))
        low = high
    lengths = []
    for _ in range(n):
        u, acc = rng.random(), 0.0
        for low, high, mass in edges:
            acc += mass
            if u <= acc:
                break
        lengths.append(max(1, min(max_len, rng.randint(low, high))))
    return sorted(lengths)


def served_like_batches(predictor, seed=0, texts=SERVED_TEXTS, groups=GROUPS):
    """Id rows as a server of a few concurrent callers runs them: ``texts`` lengths from the
    export's length profile, sorted, cut into ``groups`` of 1, 2 and 4 in turn."""
    rng = random.Random(seed)
    first, high = admission.id_range(predictor)
    lengths = profile_lengths(predictor.manifest.get("length_profile") or {},
                              predictor.max_len, texts, rng)
    batches, start, k = [], 0, 0
    while start < len(lengths):
        size = groups[k % len(groups)]
        batches.append([[rng.randrange(first, high) for _ in range(n)]
                        for n in lengths[start:start + size]])
        start, k = start + size, k + 1
    return batches


def time_per_text(predictors, batches, budget_s=TIME_BUDGET_S, clocks=CLOCKS, min_rounds=1,
                  warm=()):
    """{key: (wall, process CPU, this thread's CPU) seconds per text} of each predictor on
    ``batches`` (``timing.interleaved``, each clock's fastest round)."""
    texts = sum(len(b) for b in batches)
    best, _, _ = timing.interleaved(predictors, batches, budget_s, MAX_ROUNDS, clocks, clocks[0],
                                    min_rounds, warm)
    return {key: tuple(t / texts for t in times) for key, times in best.items()}


def rate_one(c1, n):
    return min(1.0 / c1, n / (c1 + FRONT_END_CPU_S))


def rate_many(wall_n, cpu_n, n):
    return min(1.0 / wall_n, n / (cpu_n + FRONT_END_CPU_S))


def ceiling_gain(cpu_n, n):
    """The most ``n`` threads could gain over one, knowing only their CPU per text (one
    thread costs at most that)."""
    return n / (cpu_n + FRONT_END_CPU_S) / rate_one(cpu_n, n)


def paddle_cores(n):
    """Paddle Inference's choice: the ``n`` cores, untimed (module docstring)."""
    reason = (f"Paddle Inference: the {n} usable cores, not timed (its math-thread count is "
              f"state of the process, so one process cannot time two counts side by side; "
              f"served, the cores measured faster for a small and a large model)")
    log.info("threads auto: %d for paddle: %s", n, reason)
    return {"threads": n, "threads_reason": reason, "threads_timing": {}}


def _gain(timed, n):
    """What ``n`` threads serve over one, from ``time_per_text`` of both (the rule)."""
    (_, _, c1), (wall_n, cpu_n, _) = timed[1], timed[n]
    return rate_many(wall_n, cpu_n, n) / rate_one(c1, n)


def _ms(seconds):
    return f"{1000 * seconds:.2f}"


def choose(many, load_one, n, min_gain, batches=None):
    """``many``: the chosen engine loaded with ``n`` threads; ``load_one()`` loads it with one
    -> {"threads", "threads_reason", "threads_timing"} (module docstring's rule)."""
    if many.backend == "paddle":
        return paddle_cores(n)
    batches = batches or served_like_batches(many)
    # one round: a slow one only raises the bound, which costs a second engine, not the choice
    wall_n, cpu_n, _ = time_per_text({n: many}, batches, budget_s=0)[n]
    bound = ceiling_gain(cpu_n, n)
    if bound < min_gain:
        reason = (f"{n} threads could serve at most {bound:.2f}x one: the engine's "
                  f"{_ms(cpu_n)} ms of CPU per text is small next to the front end's "
                  f"{_ms(FRONT_END_CPU_S)}")
        timing = {"cpu_ms_per_text": {str(n): round(1000 * cpu_n, 3)}}
        count = 1
    else:
        pair = {1: load_one(), n: many}
        # two rounds at least: wall_n is wall time, which a burst of other work during a lone
        # round would inflate for the server's whole life
        timed = time_per_text(pair, batches, min_rounds=2, warm={n})
        if _gain(timed, n) < min_gain:
            # a verdict of one thread is timed again: the cores' wall time was seen to stay
            # up for seconds at a time while one thread's did not, and each clock's fastest
            # round only falls with more rounds towards what the engines cost unhindered
            log.info("threads auto: %d threads looked no faster than one (%.2fx); timing %d "
                     "more rounds", n, _gain(timed, n), CONFIRM_ROUNDS)
            more = time_per_text(pair, batches, budget_s=0, min_rounds=CONFIRM_ROUNDS,
                                 warm=set(pair))
            timed = {k: tuple(map(min, timed[k], more[k])) for k in timed}
        del pair
        release_memory()  # a serving process times here too: the session's heap goes back
        (_, _, c1), (wall_n, cpu_n, _) = timed[1], timed[n]
        gain = _gain(timed, n)
        count = n if gain >= min_gain else 1
        reason = (f"{n} threads {'serve' if count == n else 'would serve only'} {gain:.2f}x "
                  f"one (per text: 1 thread {_ms(c1)} ms CPU; {n} threads {_ms(wall_n)} ms wall, "
                  f"{_ms(cpu_n)} ms CPU; front end {_ms(FRONT_END_CPU_S)} ms)")
        timing = {"cpu_ms_per_text": {"1": round(1000 * c1, 3), str(n): round(1000 * cpu_n, 3)},
                  "wall_ms_per_text": {str(n): round(1000 * wall_n, 3)},
                  "gain": round(gain, 3)}
    log.info("threads auto: %d for %s %s (%d usable cores): %s", count, many.backend,
             many.precision, n, reason)
    return {"threads": count, "threads_reason": reason, "threads_timing": timing}
