"""Load test: concurrent loopback clients against the server, dynamic batching on vs off.

For each setting the server is started as its own process (``deploy/python/serve.py``
on a free 127.0.0.1 port), warmed up, then driven by ``concurrency`` clients that
each send one text per request, drawn from the test split of the export's task
(sentiment reviews; g2p sources for a seq2seq export), until
``max_requests`` are done or ``duration_s`` has passed.  Reports QPS,
P50/P95/P99 latency, errors, and the server's own batch and padding numbers.
"""
import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time

import httpx
import numpy as np

from ppvarlen.runtime.manifest import load_manifest
from ppvarlen.config import load_config
from ppvarlen.data.sources import load_corpus
from ppvarlen.tasks import get_task
from ppvarlen.utils.io import atomic_save_png, atomic_write_json
from ppvarlen.utils.log import get_logger
from ppvarlen.utils.parallel import child_environ

log = get_logger("serve.bench")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SETTINGS = {  # name -> Deploy overrides
    "dynamic_batching": {},
    "one_at_a_time": {"max_batch_size": 1, "max_wait_ms": 0},
}


def split_texts(export_dir):
    """Texts of the real test split for the export's task (real length distribution)."""
    manifest = load_manifest(export_dir, verify=False)
    task = get_task(manifest["task"])
    corpus = load_corpus(load_config(overrides=task.bench_overrides(manifest)).Data)
    return [ex[task.text_field] for ex in corpus.splits["test"]]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(export_dir, backend, deploy_overrides, port, startup_timeout=120,
                 log_path=None, args=(), repo=None):
    """serve.py in a child process; returns (process, url) once /health answers.  ``log_path``:
    its output goes to that file (a long run: a pipe nobody reads would fill and stall it),
    else stderr is kept for the error; ``args``: more serve.py arguments (``--precision``);
    ``repo``: another ppvarlen checkout to serve from (a benchmark's variant), run in that
    checkout (a variant whose own child processes put the working directory first on their
    path then imports its own code there too), this one's otherwise."""
    root = os.path.abspath(repo) if repo else REPO
    cmd = [sys.executable, os.path.join(root, "deploy", "python", "serve.py"), "--model-dir",
           os.path.abspath(export_dir), "--backend", backend, "--port", str(port), *args]
    for k, v in deploy_overrides.items():
        cmd += ["-o", f"Deploy.{k}={v}"]
    # a fresh choice cache: each start times its own auto choice, as the benchmark measures
    choices = tempfile.TemporaryDirectory(prefix="ppvarlen-choices-")
    env = child_environ(PPVARLEN_CHOICE_CACHE_DIR=choices.name)
    if repo:
        env["PYTHONPATH"] = root
    cwd = root if repo else None
    if log_path is None:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True, env=env, cwd=cwd)
    else:
        with open(log_path, "w") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd)
    proc.choice_cache = choices  # removed by stop_server
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + startup_timeout
    # one client for the polls: each new one builds a TLS context, far more CPU than a poll,
    # taken from the server starting beside it
    with httpx.Client(timeout=1) as client:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                tail = proc.stderr.read()[-2000:] if log_path is None else f"its log: {log_path}"
                raise RuntimeError(f"server exited with code {proc.returncode}: {tail}")
            try:
                if client.get(url + "/health").status_code == 200:
                    return proc, url
            except httpx.TransportError:
                pass
            time.sleep(0.2)
    stop_server(proc)
    raise RuntimeError(f"server did not answer /health within {startup_timeout}s")


def stop_server(proc):
    if proc.poll() is None:
        proc.terminate()  # SIGTERM: uvicorn drains and exits
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if getattr(proc, "choice_cache", None) is not None:
        proc.choice_cache.cleanup()


class _Connection:
    """A bare HTTP/1.1 keep-alive connection: the client's own overhead must not be what
    the benchmark measures (an httpx client costs more CPU per request than the server
    on a 2-core machine)."""

    def __init__(self, host, port):
        self.host, self.port = host, port
        self.reader = self.writer = None

    async def post_json(self, path, payload):
        body = json.dumps(payload, ensure_ascii=False).encode("utf-8")
        head = (f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        try:
            self.writer.write(head.encode("ascii") + body)
            await self.writer.drain()
            raw = await self.reader.readuntil(b"\r\n\r\n")
            lines = raw.decode("latin-1").split("\r\n")
            status = int(lines[0].split(" ", 2)[1])
            headers = {k.strip().lower(): v.strip() for k, _, v in
                       (ln.partition(":") for ln in lines[1:] if ln)}
            payload = await self.reader.readexactly(int(headers.get("content-length", 0)))
            if headers.get("connection", "").lower() == "close":
                self.close()
            return status, payload
        except (OSError, asyncio.IncompleteReadError):
            self.close()
            raise

    def close(self):
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


async def drive(url, texts, concurrency, max_requests, duration_s, seed=0):
    """Closed-loop clients, one text per request; latencies (s) of successes, status counts."""
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    rng = random.Random(seed)
    order = [rng.randrange(len(texts)) for _ in range(max_requests)]
    latencies, statuses = [], {}
    next_request = 0
    deadline = time.monotonic() + duration_s

    async def one_client():
        nonlocal next_request
        conn = _Connection(host, int(port))
        while next_request < max_requests and time.monotonic() < deadline:
            text = texts[order[next_request]]
            next_request += 1
            t0 = time.perf_counter()
            try:
                status, _ = await conn.post_json("/predict", {"texts": [text]})
                key = str(status)
            except (OSError, asyncio.IncompleteReadError) as e:
                key = type(e).__name__
            dt = time.perf_counter() - t0
            statuses[key] = statuses.get(key, 0) + 1
            if key == "200":
                latencies.append(dt)
        conn.close()

    start = time.perf_counter()
    await asyncio.gather(*(one_client() for _ in range(concurrency)))
    return latencies, statuses, time.perf_counter() - start


def summarize(latencies, statuses, wall):
    lat = np.array(latencies) * 1000.0
    ok = int(lat.size)
    total = sum(statuses.values())
    return {"requests": total, "ok": ok, "errors": total - ok, "statuses": statuses,
            "seconds": round(wall, 3), "qps": round(ok / wall, 2) if wall > 0 else None,
            "latency_ms": {k: round(float(np.percentile(lat, q)), 2) if ok else None
                           for k, q in (("p50", 50), ("p95", 95), ("p99", 99))}}


def run_benchmark(export_dir, out_dir, backend="auto", concurrency=16, max_requests=2000,
                  duration_s=30.0, warmup_requests=50, texts=None, settings=None, seed=0,
                  common_overrides=None):
    """Benchmark every setting in ``settings`` (default: batching on vs off); JSON + PNG.

    ``common_overrides``: Deploy keys applied to every setting (e.g. ``{"threads": 1}``).
    The first setting's server chooses what ``auto`` leaves open (``backend``, and the
    precision and threads unless ``common_overrides`` names them); the others serve that
    choice as named, so that only the settings differ between them.
    """
    texts = texts if texts is not None else split_texts(export_dir)
    settings = settings or SETTINGS
    results = {"export_dir": os.path.abspath(export_dir), "requested_backend": backend,
               "concurrency": concurrency, "max_requests": max_requests, "duration_s": duration_s,
               "texts_pool": len(texts),
               "mean_text_chars": round(float(np.mean([len(t) for t in texts])), 1),
               "cpu_count": os.cpu_count(), "common_overrides": common_overrides or {},
               "settings": {}}
    chosen = None  # the first server's backend, precision and threads
    for name, overrides in settings.items():
        deploy = {**(common_overrides or {}), **overrides}
        if chosen is not None:
            deploy = {"precision": chosen["precision"], "threads": chosen["threads"], **deploy}
        proc, url = start_server(export_dir, chosen["backend"] if chosen else backend, deploy,
                                 free_port())
        try:
            health = httpx.get(url + "/health").json()
            served = {k: health[k] for k in ("backend", "precision", "threads")}
            if chosen is None:
                chosen = served
                results.update(chosen)
                log.info("%s served on %s in %s with %s thread(s): the other settings too",
                         name, chosen["backend"], chosen["precision"], chosen["threads"])
            asyncio.run(drive(url, texts, concurrency, warmup_requests, 60, seed + 1))
            before = httpx.get(url + "/metrics.json").json()
            lat, statuses, wall = asyncio.run(drive(url, texts, concurrency, max_requests,
                                                    duration_s, seed))
            after = httpx.get(url + "/metrics.json").json()
        finally:
            stop_server(proc)
        summary = summarize(lat, statuses, wall)
        batches = after["batches"] - before["batches"]
        items = after["items"] - before["items"]
        real = after["real_tokens"] - before["real_tokens"]
        padded = after["padded_tokens"] - before["padded_tokens"]
        summary["server"] = {"deploy_overrides": overrides, "served": served, "batches": batches,
                             "mean_batch_size": round(items / batches, 2) if batches else None,
                             "padding_efficiency": round(real / padded, 4) if padded else None,
                             "settings": after["settings"]}
        results["settings"][name] = summary
        log.info("%s: %s", name, json.dumps(summary))
    s = results["settings"]
    if "dynamic_batching" in s and "one_at_a_time" in s and s["one_at_a_time"]["qps"]:
        results["qps_speedup"] = round(s["dynamic_batching"]["qps"] / s["one_at_a_time"]["qps"], 2)
    os.makedirs(out_dir, exist_ok=True)
    atomic_write_json(os.path.join(out_dir, "bench.json"), results)
    plot(results, os.path.join(out_dir, "bench.png"))
    return results


def plot(results, path):
    from matplotlib.figure import Figure  # no pyplot: the process's backend stays as it was

    names = list(results["settings"])
    fig = Figure(figsize=(10, 4))
    a, b = fig.subplots(1, 2)
    qps = [results["settings"][n]["qps"] or 0 for n in names]
    colors = [f"C{i}" for i in range(len(names))]  # the same colour per setting in both plots
    a.bar(names, qps, color=colors)
    a.set_ylabel("requests / s")
    a.set_title(f"QPS ({results['concurrency']} clients, {results['backend']} "
                f"{results['precision']})")
    width = 0.8 / len(names)
    for i, n in enumerate(names):
        lat = results["settings"][n]["latency_ms"]
        b.bar(np.arange(3) + i * width, [lat[k] or 0 for k in ("p50", "p95", "p99")], width,
              label=n, color=colors[i])
    b.set_xticks(np.arange(3) + width * (len(names) - 1) / 2, ["P50", "P95", "P99"])
    b.set_ylabel("latency (ms)")
    b.set_title("latency")
    b.legend()
    fig.tight_layout()
    atomic_save_png(fig, path, dpi=100)
