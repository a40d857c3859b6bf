"""A closed-loop HTTP load client (asyncio + aiohttp): C requests in flight, each sent as soon
as the previous one answered; one pre-encoded JSON body per request, cycled.

    python benchmarks/closed_loop.py SPEC.json OUT.json

SPEC: {"url", "bodies": [JSON body, ...], "concurrency", "warmup_s", "duration_s",
"answer": "openai" | "oip", "dim"}.  Every answer is read and parsed as a client would, and
checked: status 200 and one embedding of ``dim`` floats (``openai``: ``data[0].embedding``;
``oip``: the ``embedding`` output tensor); anything else counts as an error.  Requests that
answer inside the measured window (after ``warmup_s``, for ``duration_s``) give the QPS and the
latency percentiles.  The client's own CPU time over the whole run (``time.process_time``: this
process only, which holds nothing but the client) is reported per request, so the comparison
can say what the load cost the shared cores.

A process of its own, run by benchmarks/embed_vs_triton.py: no ppvarlen or Paddle import, so
it starts in well under a second and its CPU is the client's alone.  aiohttp rather than httpx:
it is the cheaper of the two per request, and the client shares the cores with the servers.
"""
import asyncio
import itertools
import json
import math
import sys
import time

import aiohttp

ANSWERS = ("openai", "oip")


def embedding_of(answer, payload):
    """The first embedding of a parsed answer (``answer``: which API answered), else None."""
    try:
        if answer == "openai":
            return payload["data"][0]["embedding"]
        return next(t["data"] for t in payload["outputs"] if t["name"] == "embedding")
    except (KeyError, IndexError, TypeError, StopIteration):
        return None


def percentile(sorted_values, q):
    """The q-th percentile (nearest rank) of ascending values; None when there are none."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(q / 100.0 * len(sorted_values)))
    return sorted_values[rank - 1]


def summary(latencies_s, in_window, total, errors, duration_s, cpu_s, wall_s, concurrency):
    """The run's numbers (latencies in ms) from what the workers recorded."""
    lat = sorted(latencies_s)

    def ms(q):
        v = percentile(lat, q)
        return None if v is None else round(1000.0 * v, 3)
    return {"concurrency": concurrency, "qps": round(in_window / duration_s, 1),
            "requests_in_window": in_window, "requests_total": total,
            "errors": len(errors), "first_errors": errors[:3],
            "p50_ms": ms(50), "p90_ms": ms(90), "p99_ms": ms(99),
            "mean_ms": round(1000.0 * sum(lat) / len(lat), 3) if lat else None,
            "client_cpu_s": round(cpu_s, 3), "wall_s": round(wall_s, 3),
            "client_cpu_ms_per_request": round(1000.0 * cpu_s / total, 3) if total else None,
            "client_cpu_cores_busy": round(cpu_s / wall_s, 3) if wall_s else None}


async def closed_loop(url, bodies, concurrency, warmup_s, duration_s, answer, dim):
    if answer not in ANSWERS:
        raise ValueError(f"answer {answer!r}: one of {ANSWERS}")
    encoded = [json.dumps(b, ensure_ascii=False).encode("utf-8") for b in bodies]
    next_body = itertools.cycle(encoded).__next__  # one shared order: every text in turn
    latencies, errors = [], []
    counts = {"total": 0, "in_window": 0}
    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=120)
    headers = {"Content-Type": "application/json"}
    cpu0, start = time.process_time(), time.perf_counter()
    opens, closes = start + warmup_s, start + warmup_s + duration_s

    async def worker(session):
        while time.perf_counter() < closes:
            body = next_body()
            sent = time.perf_counter()
            try:
                async with session.post(url, data=body, headers=headers) as r:
                    status, raw = r.status, await r.read()
            except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                status, raw = None, repr(e).encode("utf-8")
            done = time.perf_counter()
            counts["total"] += 1
            problem = None
            if status is None:
                problem = f"no answer: {raw.decode('utf-8')[:200]}"
            elif status != 200:
                problem = f"HTTP {status}: {raw[:200].decode('utf-8', 'replace')}"
            else:
                vector = embedding_of(answer, json.loads(raw))
                if vector is None or len(vector) != dim:
                    problem = f"no embedding of {dim} floats in {raw[:200]!r}"
            if problem:
                errors.append(problem)
            elif opens <= done <= closes:
                counts["in_window"] += 1
                latencies.append(done - sent)

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    wall = time.perf_counter() - start
    return summary(latencies, counts["in_window"], counts["total"], errors, duration_s,
                   time.process_time() - cpu0, wall, concurrency)


def run_spec(spec):
    return asyncio.run(closed_loop(spec["url"], spec["bodies"], int(spec["concurrency"]),
                                   float(spec["warmup_s"]), float(spec["duration_s"]),
                                   spec["answer"], int(spec["dim"])))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[0], encoding="utf-8") as f:
        result = run_spec(json.load(f))
    with open(argv[1], "w", encoding="utf-8") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
