"""ppvarlen-serve vs a Triton server (PyTriton) on the same export, both driven by perf_analyzer.

    PYTHONPATH=$PWD python benchmarks/serve_vs_triton.py --setup-triton-venv /tmp/tritonvenv  # once
    PYTHONPATH=$PWD python benchmarks/serve_vs_triton.py --model-dir output/quickstart/export \\
        [--triton-python /tmp/tritonvenv/bin/python] [--quick] [--out output/bench/serve_vs_triton]

The two servers, up side by side for the whole run, on free 127.0.0.1 ports:

- ppvarlen-serve (``deploy/python/serve.py``, REST + gRPC) with ``--backend onnx`` and
  ``Deploy.max_wait_ms`` / ``max_batch_size`` / ``threads`` as given;
- the Triton anchor (``benchmarks/triton_anchor.py``, run by the Python of a separate venv
  holding PyTriton): Triton's dynamic batcher (``max_queue_delay`` = max_wait_ms,
  ``max_batch_size`` the same) in front of a Python function that tokenises as the export says,
  pads the batch to its longest text and runs the same ``onnx/model.onnx`` in ONNX Runtime with
  the same thread count.  Same input and output names, so one perf_analyzer input file serves.

Before any load: the anchor's token ids must equal ppvarlen's (``Predictor.encode``) on every
input text and both servers must answer the same labels and probabilities on a sample, or the
run stops.  Input texts: the export's real test split (``ppvarlen.serve.bench.split_texts``:
sentiment reviews, one per request).  perf_analyzer then measures every (concurrency,
protocol) point on both servers, interleaved (ppvarlen c=1 REST, Triton c=1 REST, ppvarlen c=1
gRPC, ...; every other round starts with Triton), each point three fixed windows: on 2 shared
cores perf_analyzer's own stability test rarely passes, so it is relaxed (``-s``) and the three
windows are reported merged, as perf_analyzer does.  ``ppvarlen-infer`` runs on the same texts
before the servers start and after they stop (the offline rate the serving target compares to).

Writes ``serve_vs_triton.json`` (every measurement, perf_analyzer's server-side statistics, the
machine, the versions, every command) and ``serve_vs_triton.png``; prints the ratio table and
whether the targets were met.  No number here gates anything.  benchmarks/embed_vs_triton.py
(the embedding task's /v1/embeddings against the same anchor) runs on these functions.
"""
import argparse
import csv
import io
import json
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from importlib.metadata import PackageNotFoundError, version

import httpx

from ppvarlen.serve.protocols.oip import codec as oip
from ppvarlen.serve.bench import free_port, split_texts
from ppvarlen.runtime.manifest import load_manifest
from ppvarlen.runtime.predictor import Predictor
from ppvarlen.utils.io import atomic_save_png, atomic_write_json

from machine import machine

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ANCHOR = os.path.join(REPO, "benchmarks", "triton_anchor.py")
SERVERS = ("ppvarlen", "triton")
PROTOCOLS = ("http", "grpc")
CONCURRENCIES = (1, 8, 32, 64)
QUICK_CONCURRENCIES = (1, 8)
# where tools/get_perf_analyzer.sh installs perf_analyzer (a wrapper that sets its library path)
DEFAULT_PERF_ANALYZER = os.path.join(REPO, ".perf_analyzer", "perf_analyzer")
CUDA_RUNTIME_LIB = os.path.join("nvidia", "cuda_runtime", "lib")
TRITON_PACKAGES = ["nvidia-pytriton==0.7.*", "onnxruntime", "numpy"]
# perf_analyzer's stability rule (max/min of the last 3 windows within s%) with s this large
# (a 1000x spread) accepts the first three windows: a fixed measurement length, whatever the
# machine's noise (at c=1 one stall on a shared core moves a 1 s window's p99 over 10x)
STABILITY_PERCENTAGE = 100000
WINDOWS = 3
TARGET_QPS_RATIO = 2.0
TARGET_OFFLINE_SHARE = 0.6
# benchmarks/triton_anchor.py's outputs, named and ordered as ppvarlen's OIP answer
ANCHOR_OUTPUTS = ("label", "label_id", "probs", "num_tokens", "truncated")
EQUAL_PROBS_TOLERANCE = 1e-3  # different padding in the two batchers moves float sums a little


def perf_analyzer_howto(looked_at=()):
    """What to do when perf_analyzer is missing or does not start (the exact command)."""
    where = " Looked at:" + "".join(f"\n  - {p}" for p in looked_at) if looked_at else ""
    return f"""perf_analyzer was not found or does not start.{where}
It ships inside PyPI's tritonclient 2.41.0 wheel (PyPI's `perf-analyzer` package is an empty
placeholder); without a GPU it needs Debian's libb64-0d and libcudart.so.12 from PyPI's
nvidia-cuda-runtime-cu12. This checkout's script installs all three from packages:

  bash tools/get_perf_analyzer.sh      # -> {DEFAULT_PERF_ANALYZER}

Then run this benchmark again: it looks at $PERF_ANALYZER, then PATH, then
{DEFAULT_PERF_ANALYZER} (a binary unpacked by hand finds its {CUDA_RUNTIME_LIB}/ in a
directory above it; $PERF_ANALYZER_LIBS overrides)."""


class SetupError(RuntimeError):
    """Something the benchmark needs is missing; the message says how to get it."""


class TokenizationMismatch(RuntimeError):
    """The Triton anchor's token ids differ from ppvarlen's: the comparison would be unfair."""


class AnswerMismatch(RuntimeError):
    """The two servers answer different labels or probabilities for the same texts."""


# ---------------------------------------------------------------- finding the tools

def find_perf_analyzer(environ=None, which=shutil.which):
    """(path of perf_analyzer, places looked at); path None when none is there."""
    environ = os.environ if environ is None else environ
    candidates = []
    if environ.get("PERF_ANALYZER"):
        candidates.append(environ["PERF_ANALYZER"])
    on_path = which("perf_analyzer")
    candidates.append(on_path or "perf_analyzer on PATH")
    candidates.append(DEFAULT_PERF_ANALYZER)
    for c in candidates:
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return c, candidates
    return None, candidates


def cuda_runtime_dir(binary, environ=None):
    """The directory of libcudart.so.12 for perf_analyzer: $PERF_ANALYZER_LIBS, else the
    nearest ``nvidia/cuda_runtime/lib`` in a directory above the binary; None if neither."""
    environ = os.environ if environ is None else environ
    if environ.get("PERF_ANALYZER_LIBS"):
        return environ["PERF_ANALYZER_LIBS"]
    here = os.path.dirname(os.path.abspath(binary))
    while True:
        lib = os.path.join(here, CUDA_RUNTIME_LIB)
        if os.path.isfile(os.path.join(lib, "libcudart.so.12")):
            return lib
        parent = os.path.dirname(here)
        if parent == here:
            return None
        here = parent


def perf_analyzer_env(binary):
    env = dict(os.environ)
    lib = cuda_runtime_dir(binary)
    if lib:
        env["LD_LIBRARY_PATH"] = lib + (":" + env["LD_LIBRARY_PATH"]
                                        if env.get("LD_LIBRARY_PATH") else "")
    return env


def perf_analyzer_version(binary):
    """Its version line; SetupError (with the how-to) when it does not start."""
    try:
        r = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=60,
                           env=perf_analyzer_env(binary))
    except OSError as e:
        raise SetupError(f"{binary}: {e}\n\n{perf_analyzer_howto([binary])}") from None
    text = (r.stdout + r.stderr).strip()
    if r.returncode != 0 or "Perf Analyzer Version" not in text:
        raise SetupError(f"{binary} --version failed (exit {r.returncode}): {text[-800:]}\n\n"
                         f"{perf_analyzer_howto([binary])}")
    return text.splitlines()[0]


# ---------------------------------------------------------------- the PyTriton venv

# PyTriton 0.7's Python-backend stub embeds a CPython whose C RLock has no
# ``_recursion_count``, which the stdlib's multiprocessing.resource_tracker of this Python
# (3.11.7) calls: the model fails to load.  Handing the tracker the pure-Python RLock
# before its first use fixes it.  This edits the installed copy in the benchmark's own venv.
PATCH_MARK = "# ppvarlen benchmarks/serve_vs_triton.py:"
PATCH_BEFORE = "tracker_fd = resource_tracker.getfd()"


class PatchError(RuntimeError):
    """The PyTriton file is not the one the patch was written for."""


def patch_resource_tracker_source(source):
    """(source with the RLock fix before ``resource_tracker.getfd()``, changed?)."""
    if PATCH_MARK in source:
        return source, False
    lines = source.split("\n")
    at = next((i for i, line in enumerate(lines) if line.strip() == PATCH_BEFORE), None)
    if at is None:
        raise PatchError(f"no line `{PATCH_BEFORE}` in pytriton/proxy/data.py: another PyTriton "
                         f"version than 0.7; install nvidia-pytriton==0.7.* in the venv")
    indent = lines[at][:len(lines[at]) - len(lines[at].lstrip())]
    fix = [f"{PATCH_MARK} the stub's _thread.RLock lacks _recursion_count,",
           "# which this Python's resource_tracker calls; use the pure-Python RLock",
           "if not hasattr(resource_tracker._resource_tracker._lock, '_recursion_count'):",
           "    import threading as _threading",
           "    resource_tracker._resource_tracker._lock = _threading._PyRLock()"]
    return "\n".join(lines[:at] + [indent + f for f in fix] + lines[at:]), True


def pytriton_data_file(python):
    code = ("import importlib.util, os; s = importlib.util.find_spec('pytriton'); "
            "print(os.path.join(list(s.submodule_search_locations)[0], 'proxy', 'data.py') "
            "if s else '')")
    r = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120,
                       env=_anchor_env())
    path = r.stdout.strip()
    if r.returncode != 0 or not path:
        raise SetupError(f"{python} has no pytriton; make the venv with "
                         f"`python benchmarks/serve_vs_triton.py --setup-triton-venv DIR`")
    return path


def setup_triton_venv(directory, base_python="python3.11"):
    """Make ``directory`` a venv with PyTriton (never the project's own venv), and patch it."""
    python = os.path.join(directory, "bin", "python")
    steps = []
    if not os.path.isfile(python):
        steps.append([base_python, "-m", "venv", directory])
    steps.append([python, "-m", "pip", "install", *TRITON_PACKAGES])
    for cmd in steps:
        print("+ " + shlex.join(cmd), flush=True)
        subprocess.run(cmd, check=True, env=_anchor_env())  # this checkout is no package there
    apply_patch(python)
    return python


def apply_patch(python):
    path = pytriton_data_file(python)
    with open(path, encoding="utf-8") as f:
        source = f.read()
    patched, changed = patch_resource_tracker_source(source)
    if changed:
        with open(path, "w", encoding="utf-8") as f:
            f.write(patched)
        print(f"patched {path}: multiprocessing's resource tracker gets a pure-Python RLock "
              f"(PyTriton's stub has a C RLock without _recursion_count)", flush=True)
    else:
        print(f"{path}: already patched", flush=True)


def check_patched(python):
    path = pytriton_data_file(python)
    with open(path, encoding="utf-8") as f:
        if PATCH_MARK not in f.read():
            raise SetupError(f"{path} is not patched: Triton's Python stub cannot load a model "
                             f"on this Python without it.  Run `python "
                             f"benchmarks/serve_vs_triton.py --setup-triton-venv "
                             f"{os.path.dirname(os.path.dirname(python))}` (it patches that "
                             f"venv's copy only)")


def venv_versions(python):
    code = ("import json, importlib.metadata as m\nout = {}\n"
            "for n in ('nvidia-pytriton', 'tritonclient', 'onnxruntime', 'numpy'):\n"
            "    try: out[n] = m.version(n)\n    except m.PackageNotFoundError: out[n] = None\n"
            "print(json.dumps(out))")
    r = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120,
                       env=_anchor_env())
    return json.loads(r.stdout) if r.returncode == 0 else {"error": r.stderr[-500:]}


# ---------------------------------------------------------------- the plan and its parsing

def interleaved_plan(concurrencies, protocols=PROTOCOLS, servers=SERVERS, rounds=1):
    """[(round, concurrency, protocol, server)] in run order: for each concurrency, each
    protocol, both servers back to back, so a burst of load from elsewhere hits both; every
    other round puts the other server first, so neither always runs right after the other."""
    plan = []
    for r in range(rounds):
        order = list(servers) if r % 2 == 0 else list(reversed(servers))
        for c in concurrencies:
            for p in protocols:
                plan.extend((r, c, p, s) for s in order)
    return plan


def perf_analyzer_command(binary, model, url, protocol, concurrency, input_file,
                          window_ms, csv_path):
    return [binary, "-m", model, "-u", url, "-i", protocol, "--input-data", input_file,
            "--shape", "text:1", "--concurrency-range", f"{concurrency}:{concurrency}",
            "--measurement-interval", str(int(window_ms)), "--percentile=99",
            "--stability-percentage", str(STABILITY_PERCENTAGE), "--max-trials", str(WINDOWS),
            "-f", csv_path, "--verbose-csv"]


def _number(text):
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return int(value) if value.is_integer() else value


def parse_perf_csv(text):
    """perf_analyzer's ``-f`` CSV -> one dict per row (numbers as numbers; times in µs)."""
    rows = list(csv.DictReader(io.StringIO(text)))
    return [{k.strip(): _number(v) if _number(v) is not None else v for k, v in row.items()
             if k is not None} for row in rows]


def measurement_from_row(row):
    """The numbers this benchmark reports, from one CSV row (latencies in ms)."""
    def ms(key):
        return None if row.get(key) is None else round(row[key] / 1000.0, 3)
    return {"qps": row.get("Inferences/Second"),
            "p50_ms": ms("p50 latency"), "p90_ms": ms("p90 latency"),
            "p95_ms": ms("p95 latency"), "p99_ms": ms("p99 latency"),
            "client_send_us": row.get("Client Send"), "client_recv_us": row.get("Client Recv"),
            "network_server_send_recv_us": row.get("Network+Server Send/Recv"),
            "server_queue_us": row.get("Server Queue"),
            "server_compute_input_us": row.get("Server Compute Input"),
            "server_compute_infer_us": row.get("Server Compute Infer"),
            "server_compute_output_us": row.get("Server Compute Output")}


_STDOUT_NUMBERS = {
    "client_requests": r"Client:\s*\n\s*Request count:\s*(\d+)",
    "server_inference_count": r"Inference count:\s*(\d+)",
    "server_execution_count": r"Execution count:\s*(\d+)",
    "server_successful_requests": r"Successful request count:\s*(\d+)",
    "server_avg_request_latency_us": r"Avg request latency:\s*(\d+)\s*usec",
}


def parse_perf_stdout(text):
    """Counts from perf_analyzer's printed report: the client's requests and the server-side
    statistics (None each where the server gave none); the server's mean batch size."""
    out = {}
    for key, pattern in _STDOUT_NUMBERS.items():
        m = re.search(pattern, text)
        out[key] = int(m.group(1)) if m else None
    inferences, executions = out["server_inference_count"], out["server_execution_count"]
    out["server_mean_batch"] = round(inferences / executions, 2) if inferences and executions \
        else None
    return out


# ---------------------------------------------------------------- checks before load

def compare_ids(texts, ppvarlen_ids, anchor_ids):
    """[{index, text, ppvarlen, anchor}] of the texts whose ids differ (empty: all equal)."""
    if len(ppvarlen_ids) != len(texts) or len(anchor_ids) != len(texts):
        return [{"index": None, "text": None,
                 "ppvarlen": f"{len(ppvarlen_ids)} id lists", "anchor": f"{len(anchor_ids)} id "
                 f"lists for {len(texts)} texts"}]
    return [{"index": i, "text": t, "ppvarlen": list(a), "anchor": list(b)}
            for i, (t, a, b) in enumerate(zip(texts, ppvarlen_ids, anchor_ids))
            if list(a) != list(b)]


def check_tokenization(texts, ppvarlen_ids, anchor_ids):
    """Raise TokenizationMismatch naming the first differing text; else the count checked."""
    bad = compare_ids(texts, ppvarlen_ids, anchor_ids)
    if bad:
        first = bad[0]
        where = "" if first["index"] is None else \
            f"; first: text {first['index']} {first['text'][:40]!r}: ppvarlen " \
            f"{first['ppvarlen'][:12]}... vs the Triton anchor {first['anchor'][:12]}..."
        raise TokenizationMismatch(
            f"the Triton anchor tokenises {len(bad)} of {len(texts)} texts differently from "
            f"ppvarlen{where}.  Refusing to measure: the two servers would not do the same "
            f"work.  Fix AnchorTokenizer in benchmarks/triton_anchor.py")
    return len(texts)


def served_outputs(predictor):
    """(OIP input names, OIP output names) ppvarlen-serve gives this export."""
    return (list(predictor.task.oip_inputs),
            [n for n, *_ in oip.outputs(predictor.task.name, predictor.label_names)])


def check_anchor_can_mirror(inputs, outputs, expected=ANCHOR_OUTPUTS,
                            what="a text classifier's"):
    """SetupError unless ppvarlen serves this export with the anchor's input and outputs
    (``expected``: the outputs this benchmark's anchor gives, ``what`` names them)."""
    if inputs != ["text"] or outputs != list(expected):
        raise SetupError(f"ppvarlen-serve answers this export with inputs {inputs} and outputs "
                         f"{outputs}; the Triton anchor of this benchmark mirrors {what} "
                         f"(['text'] -> {list(expected)}) only")


def ppvarlen_ids(model_dir, texts, expected=ANCHOR_OUTPUTS, what="a text classifier's"):
    """ppvarlen's token ids of each text (``Predictor.encode``, the serving path), once the
    export is checked to be one the anchor mirrors."""
    predictor = Predictor(model_dir, "onnx")
    check_anchor_can_mirror(*served_outputs(predictor), expected, what)
    out = []
    for t in texts:
        encoded = predictor.encode(t)
        if len(encoded.windows) != 1:
            raise TokenizationMismatch(f"ppvarlen makes {len(encoded.windows)} windows of a "
                                       f"text; the anchor only truncates")
        out.append(encoded.windows[0])
    return out


def anchor_ids(python, model_dir, texts, work):
    src, dst = os.path.join(work, "anchor_texts.json"), os.path.join(work, "anchor_ids.json")
    with open(src, "w", encoding="utf-8") as f:
        json.dump(texts, f, ensure_ascii=False)
    r = subprocess.run([python, ANCHOR, "--model-dir", model_dir, "--encode", src,
                        "--ids-out", dst], capture_output=True, text=True, timeout=300,
                       env=_anchor_env())
    if r.returncode != 0:
        raise SetupError(f"the anchor's tokenizer failed: {r.stderr[-2000:]}")
    with open(dst, encoding="utf-8") as f:
        return json.load(f)


def compare_answers(ppvarlen_body, triton_body):
    """(max |prob difference|, [outputs whose values differ]) between the two servers' OIP
    answers to the same texts: every output but ``probs`` must be equal (the label, its id,
    the token count, the truncation flag), ``probs`` close; a missing output or another
    length differs."""
    def tensors(body):
        return {t["name"]: t["data"] for t in body["outputs"]}
    a, b = tensors(ppvarlen_body), tensors(triton_body)
    differ = sorted(n for n in set(a) | set(b)
                    if n != "probs" and (n not in a or n not in b or a[n] != b[n]))
    pa, pb = a.get("probs", []), b.get("probs", [])
    if len(pa) != len(pb) or not pa:
        return float("inf"), differ + ["probs"]
    return max(abs(x - y) for x, y in zip(pa, pb)), differ


def infer_body(texts, batched):
    """An OIP REST infer body of ``texts``: ``batched`` [B, 1] (Triton's batching models take
    the batch as the first dim) or [B] (ppvarlen's text tensor carries the batch)."""
    shape = [len(texts), 1] if batched else [len(texts)]
    return {"inputs": [{"name": "text", "datatype": "BYTES", "shape": shape, "data": texts}]}


def check_answers(http, model, texts):
    bodies = {}
    for server, batched in (("ppvarlen", False), ("triton", True)):
        r = httpx.post(f"{http[server]}/v2/models/{model}/infer", json=infer_body(texts, batched),
                       timeout=60)
        r.raise_for_status()
        bodies[server] = r.json()
    diff, differ = compare_answers(bodies["ppvarlen"], bodies["triton"])
    if differ or diff > EQUAL_PROBS_TOLERANCE:
        raise AnswerMismatch(f"the servers answer {len(texts)} sample texts differently: "
                             f"outputs {differ} differ, max probability difference {diff:.2e} "
                             f"(allowed {EQUAL_PROBS_TOLERANCE}).  Refusing to measure")
    return {"texts": len(texts), "max_prob_diff": diff, "outputs_equal": sorted(
        t["name"] for t in bodies["ppvarlen"]["outputs"] if t["name"] != "probs")}


# ---------------------------------------------------------------- servers

def _anchor_env():
    # the anchor's venv only: nothing of this checkout or of the project's venv on its path
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


def _wait_ready(url, proc, what, timeout_s, log_path):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SetupError(f"{what} exited with code {proc.returncode}; its log "
                             f"{log_path}:\n{_tail(log_path)}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise SetupError(f"{what} was not ready within {timeout_s}s; its log {log_path}:\n"
                     f"{_tail(log_path)}")


def _tail(path, chars=3000):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()[-chars:]
    except OSError:
        return ""


def start_process(cmd, log_path, env=None):
    log = open(log_path, "w", encoding="utf-8")
    # a session of its own: stopping it reaches Triton's server and stub, which it started
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
    proc.log_file = log
    return proc


def stop_process(proc, timeout_s=60):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    try:  # anything of its session still up (Triton's children) goes too
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.log_file.close()


def process_tree_cpu_s(pid):
    """User + system CPU seconds of a process and its descendants so far."""
    import psutil  # installed with the project's dependencies (visualdl's), not one of them

    try:
        root = psutil.Process(pid)
        procs = [root] + root.children(recursive=True)
    except psutil.NoSuchProcess:
        return None
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def server_commands(args, model_dir, model, ports):
    """{"ppvarlen": serve.py's command, "triton": the anchor's}: the same export, batching
    wait, batch size and math threads (``args``), each on its ``ports`` (http, grpc)."""
    serve_cmd = [sys.executable, os.path.join(REPO, "deploy", "python", "serve.py"),
                 "--model-dir", model_dir, "--backend", "onnx", "--host", "127.0.0.1",
                 "--port", str(ports["ppvarlen"]["http"]),
                 "--grpc-port", str(ports["ppvarlen"]["grpc"]),
                 "-o", f"Deploy.max_wait_ms={args.max_wait_ms}",
                 "-o", f"Deploy.max_batch_size={args.max_batch_size}",
                 "-o", f"Deploy.threads={args.threads}"]
    anchor_cmd = [args.triton_python, ANCHOR, "--model-dir", model_dir, "--model-name", model,
                  "--http-port", str(ports["triton"]["http"]),
                  "--grpc-port", str(ports["triton"]["grpc"]),
                  "--max-wait-ms", str(args.max_wait_ms),
                  "--max-batch-size", str(args.max_batch_size), "--threads", str(args.threads)]
    return {"ppvarlen": serve_cmd, "triton": anchor_cmd}


def start_servers(commands, http, model, work, procs):
    """Start both (``procs`` gets each process as it starts, so the caller's ``finally``
    stops what did) and wait until each says its model is ready."""
    procs["ppvarlen"] = start_process(commands["ppvarlen"],
                                      os.path.join(work, "ppvarlen_serve.log"))
    procs["triton"] = start_process(commands["triton"], os.path.join(work, "triton_anchor.log"),
                                    env=_anchor_env())
    _wait_ready(http["ppvarlen"] + f"/v2/models/{model}/ready", procs["ppvarlen"],
                "ppvarlen-serve", 180, os.path.join(work, "ppvarlen_serve.log"))
    _wait_ready(http["triton"] + f"/v2/models/{model}/ready", procs["triton"],
                "the Triton anchor", 300, os.path.join(work, "triton_anchor.log"))


def idle_cpu_share(procs, seconds=5):
    """What each idle server costs the one under load (both stay up for the whole run)."""
    before = {s: process_tree_cpu_s(p.pid) for s, p in procs.items()}
    time.sleep(seconds)
    return {s: round((process_tree_cpu_s(p.pid) - before[s]) / seconds, 3)
            for s, p in procs.items()}


# ---------------------------------------------------------------- offline rate

def run_infer(model_dir, texts_file, out_path, threads=1):
    """ppvarlen-infer on the texts at ``threads`` math threads (the servers'): its summary
    (stderr) plus texts/s = texts / seconds."""
    cmd = [sys.executable, os.path.join(REPO, "deploy", "python", "infer.py"), "--model-dir",
           model_dir, "--input", texts_file, "--backend", "onnx", "--output", out_path,
           "--threads", str(threads), "--no-progress"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    summary = None
    for line in reversed(r.stderr.strip().splitlines()):
        if line.startswith("{"):
            summary = json.loads(line)
            break
    if r.returncode != 0 or summary is None:
        raise RuntimeError(f"ppvarlen-infer failed (exit {r.returncode}): {r.stderr[-2000:]}")
    return {"command": shlex.join(cmd), "texts": summary["texts"],
            "seconds": summary["seconds"],
            "texts_per_s": round(summary["texts"] / summary["seconds"], 1),
            "padding_efficiency": summary.get("padding_efficiency"),
            "loadavg_1m_after": round(os.getloadavg()[0], 2)}


# ---------------------------------------------------------------- summary

def summarize(measurements, concurrencies, protocols=PROTOCOLS):
    """Rows per (protocol, concurrency): each server's median QPS and p99 over its rounds, and
    the ppvarlen / Triton ratios (QPS: higher is better for ppvarlen; p99: lower is)."""
    rows = []
    for p in protocols:
        for c in concurrencies:
            row = {"protocol": p, "concurrency": c}
            for s in SERVERS:
                got = [m for m in measurements if m["server"] == s and m["protocol"] == p
                       and m["concurrency"] == c and m.get("qps")]
                row[f"{s}_qps"] = round(statistics.median(m["qps"] for m in got), 1) \
                    if got else None
                row[f"{s}_p99_ms"] = round(statistics.median(m["p99_ms"] for m in got), 2) \
                    if got else None
                cpu = [m["server_cpu_ms_per_text"] for m in got
                       if m.get("server_cpu_ms_per_text") is not None]
                row[f"{s}_cpu_ms_per_text"] = round(statistics.median(cpu), 3) if cpu else None
                row[f"{s}_qps_each_round"] = [m["qps"] for m in got]
                row[f"{s}_p99_ms_each_round"] = [m["p99_ms"] for m in got]
            row["qps_ratio"] = ratio(row["ppvarlen_qps"], row["triton_qps"])
            row["p99_ratio"] = ratio(row["ppvarlen_p99_ms"], row["triton_p99_ms"])
            row["cpu_ratio"] = ratio(row["ppvarlen_cpu_ms_per_text"],
                                      row["triton_cpu_ms_per_text"])
            rows.append(row)
    return rows


def ratio(a, b):
    """a / b to 2 places; None when either is missing."""
    return round(a / b, 2) if a is not None and b else None


def evaluate_targets(rows, offline_texts_per_s):
    """The issue's two targets, each {met, ...} with every point that misses and by how much."""
    misses, checked = [], 0
    for row in rows:
        if row["concurrency"] < 8:
            continue
        checked += 1
        why = []
        if row["qps_ratio"] is None or row["qps_ratio"] < TARGET_QPS_RATIO:
            short = None if row["qps_ratio"] is None else \
                round(100 * (1 - row["qps_ratio"] / TARGET_QPS_RATIO), 1)
            why.append(f"QPS {row['qps_ratio']}x Triton's (target {TARGET_QPS_RATIO}x"
                       + (f", {short}% short)" if short is not None else ")"))
        if row["p99_ratio"] is None or row["p99_ratio"] > 1.0:
            why.append(f"p99 {row['ppvarlen_p99_ms']} vs {row['triton_p99_ms']} ms "
                       f"({row['p99_ratio']}x Triton's)")
        if why:
            misses.append(f"c={row['concurrency']} {row['protocol']}: " + "; ".join(why))
    qps_target = {"target": f"ppvarlen >= {TARGET_QPS_RATIO}x Triton's QPS at every "
                            f"concurrency >= 8, p99 no worse", "points": checked,
                  "met": checked > 0 and not misses, "misses": misses}
    top = max((r["concurrency"] for r in rows), default=None)
    shares = {}
    for row in rows:
        if row["concurrency"] == top and row["ppvarlen_qps"] and offline_texts_per_s:
            shares[row["protocol"]] = round(row["ppvarlen_qps"] / offline_texts_per_s, 3)
    offline_target = {"target": f"ppvarlen QPS at c={top} >= {TARGET_OFFLINE_SHARE:.0%} of "
                                f"ppvarlen-infer's texts/s", "concurrency": top,
                      "offline_texts_per_s": offline_texts_per_s, "share": shares,
                      "met": bool(shares) and all(v >= TARGET_OFFLINE_SHARE
                                                  for v in shares.values())}
    return {"qps_and_p99": qps_target, "offline_share": offline_target}


def format_table(rows):
    head = ("protocol", "c", "ppvarlen QPS", "Triton QPS", "QPS ratio", "ppvarlen p99 ms",
            "Triton p99 ms", "p99 ratio", "CPU ms/text ppvarlen / Triton")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = (r["protocol"].upper() if r["protocol"] == "http" else "gRPC", r["concurrency"],
                 r["ppvarlen_qps"], r["triton_qps"],
                 None if r["qps_ratio"] is None else f"{r['qps_ratio']}x",
                 r["ppvarlen_p99_ms"], r["triton_p99_ms"],
                 None if r["p99_ratio"] is None else f"{r['p99_ratio']}x",
                 None if r.get("cpu_ratio") is None else
                 f"{r['ppvarlen_cpu_ms_per_text']} / {r['triton_cpu_ms_per_text']}")
        lines.append("| " + " | ".join("—" if v is None else str(v) for v in cells) + " |")
    return "\n".join(lines)


def plot(results, path):
    from matplotlib.figure import Figure  # no pyplot: the process's backend stays as it was

    rows = results["summary"]
    fig = Figure(figsize=(15, 4.4))
    a, b, cpu = fig.subplots(1, 3)
    styles = {("ppvarlen", "http"): ("C0", "-"), ("ppvarlen", "grpc"): ("C0", "--"),
              ("triton", "http"): ("C1", "-"), ("triton", "grpc"): ("C1", "--")}
    for (server, protocol), (color, line) in styles.items():
        pts = [r for r in rows if r["protocol"] == protocol and r[f"{server}_qps"]]
        xs = [r["concurrency"] for r in pts]
        label = f"{'ppvarlen-serve' if server == 'ppvarlen' else 'Triton (PyTriton)'} " \
                f"{'REST' if protocol == 'http' else 'gRPC'}"
        a.plot(xs, [r[f"{server}_qps"] for r in pts], line, color=color, marker="o", label=label)
        b.plot(xs, [r[f"{server}_p99_ms"] for r in pts], line, color=color, marker="o",
               label=label)
        cpu.plot(xs, [r[f"{server}_cpu_ms_per_text"] for r in pts], line, color=color,
                 marker="o", label=label)
    offline = results["offline"]["texts_per_s_mean"]
    if offline:
        a.axhline(offline, color="C2", linestyle=":", label="ppvarlen-infer texts/s")
        a.axhline(TARGET_OFFLINE_SHARE * offline, color="C2", linestyle="-.", linewidth=0.8,
                  label=f"{TARGET_OFFLINE_SHARE:.0%} of it")
    style_axes(((a, "throughput", "requests / s (one text each)"),
                (b, "client p99 latency", "ms"),
                (cpu, "server CPU per text (all its processes)", "CPU ms / text")),
               sorted({r["concurrency"] for r in rows}), "concurrent requests (perf_analyzer)")
    a.legend(fontsize=8)
    save_figure(fig, path, f"same export, 1 math thread each, max_wait "
                           f"{results['settings']['max_wait_ms']} ms; 2 shared cores (contended)")


def style_axes(axes_titles_units, concurrencies, xlabel):
    """Each (axis, title, unit): concurrency on a log2 x axis, ticks at the points measured."""
    for ax, title, unit in axes_titles_units:
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(concurrencies), [str(c) for c in concurrencies])
        ax.set_xlabel(xlabel)
        ax.set_ylabel(unit)
        ax.set_title(title)
        ax.grid(alpha=0.3)


def save_figure(fig, path, title):
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    atomic_save_png(fig, path, dpi=100)


# ---------------------------------------------------------------- the run

def ppvarlen_version():
    try:
        v = version("ppvarlen")
    except PackageNotFoundError:
        v = None
    r = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True,
                       text=True)
    dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return {"version": v, "commit": r.stdout.strip() or None, "uncommitted_changes": bool(dirty)}


def inference_count(stats_body):
    """Texts a server has answered, from its statistics extension's answer (both servers
    serve Triton's ``/v2/models/NAME/stats``)."""
    return sum(int(m.get("inference_count", 0)) for m in stats_body.get("model_stats", []))


def cpu_ms_per_text(cpu_before, cpu_after, count_before, count_after):
    """The server's CPU time (all its processes) per text answered over one perf_analyzer
    run: what a text costs, which a shared machine's noise moves less than QPS."""
    if None in (cpu_before, cpu_after, count_before, count_after) or count_after <= count_before:
        return None
    return round(1000.0 * (cpu_after - cpu_before) / (count_after - count_before), 3)


def measure(binary, env, model, url, protocol, concurrency, input_file, window_ms, work, tag,
            server=None):
    """One perf_analyzer run; ``server``: (its pid, its REST base URL) for the CPU cost."""
    def snapshot():
        if server is None:
            return None, None
        stats = httpx.get(f"{server[1]}/v2/models/{model}/stats", timeout=30).json()
        return process_tree_cpu_s(server[0]), inference_count(stats)

    csv_path = os.path.join(work, f"{tag}.csv")
    cmd = perf_analyzer_command(binary, model, url, protocol, concurrency, input_file,
                                window_ms, csv_path)
    load_before = round(os.getloadavg()[0], 2)
    timeout = WINDOWS * window_ms / 1000 * 4 + 120
    cpu0, count0 = snapshot()
    start = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    wall = time.perf_counter() - start
    cpu1, count1 = snapshot()
    out = {"command": shlex.join(cmd), "loadavg_1m_before": load_before,
           "wall_s": round(wall, 1), "exit_code": r.returncode,
           "server_cpu_ms_per_text": cpu_ms_per_text(cpu0, cpu1, count0, count1),
           "server_cpu_cores_busy": None if None in (cpu0, cpu1) else round((cpu1 - cpu0) / wall,
                                                                            2)}
    if r.returncode != 0 or not os.path.isfile(csv_path):
        out["error"] = (r.stdout + r.stderr)[-1500:]
        return out
    with open(csv_path, encoding="utf-8") as f:
        rows = parse_perf_csv(f.read())
    out.update(measurement_from_row(rows[-1]))
    out.update(parse_perf_stdout(r.stdout))
    return out


def texts_for_run(model_dir, limit):
    # one text per line for ppvarlen-infer's .txt input: a text with a line break would split
    texts = [t for t in split_texts(model_dir) if t.strip() and "\n" not in t and "\r" not in t]
    return texts[:limit] if limit else texts


def check_tools(triton_python):
    """(perf_analyzer's path, its version line, its environment) once it starts and the
    PyTriton venv is there and patched; SetupError saying how to get what is missing."""
    binary, looked = find_perf_analyzer()
    if binary is None:
        raise SetupError(perf_analyzer_howto(looked))
    pa_version = perf_analyzer_version(binary)
    if not os.path.isfile(triton_python):
        raise SetupError(f"{triton_python} not found: make the PyTriton venv with `python "
                         f"benchmarks/serve_vs_triton.py --setup-triton-venv /tmp/tritonvenv` "
                         f"(a venv of its own: PyTriton 0.7 wants numpy<2)")
    check_patched(triton_python)
    return binary, pa_version, perf_analyzer_env(binary)


def record_load(results):
    """The load average at the end and over the measurements (each took it before it ran)."""
    results["machine"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    loads = [m["loadavg_1m_before"] for m in results["measurements"]]
    results["machine"]["loadavg_1m_during"] = {"min": min(loads), "max": max(loads),
                                              "median": statistics.median(loads)} if loads else None


def machine_line(m):
    return (f"machine: {m.get('cpu_model')}, {m['cpu_count']} cores (shared with other jobs), "
            f"flags {' '.join(m.get('cpu_simd_flags', []))}; load average (1 min) during the "
            f"run {m.get('loadavg_1m_during')}")


def run(args):
    started = time.time()
    binary, pa_version, pa_env = check_tools(args.triton_python)
    model_dir = os.path.abspath(args.model_dir)
    manifest = load_manifest(model_dir)
    model = manifest.get("model_name") or "model"
    concurrencies = QUICK_CONCURRENCIES if args.quick else tuple(args.concurrency)
    rounds = 1 if args.quick else args.rounds
    window_ms = 1000 if args.quick else args.window_ms
    texts = texts_for_run(model_dir, 300 if args.quick else args.texts)
    work = tempfile.mkdtemp(prefix="serve_vs_triton_")
    os.makedirs(args.out, exist_ok=True)
    print(f"{len(texts)} texts; perf_analyzer {binary} ({pa_version}); work dir {work}",
          flush=True)

    results = {"benchmark": "serve_vs_triton", "model_dir": model_dir, "model_name": model,
               "machine": machine(), "quick": bool(args.quick),
               "versions": {"ppvarlen": ppvarlen_version(), "perf_analyzer": pa_version,
                            "triton_venv": venv_versions(args.triton_python),
                            "project_venv": venv_versions(sys.executable)},
               "settings": {"max_wait_ms": args.max_wait_ms,
                            "max_batch_size": args.max_batch_size, "threads": args.threads,
                            "concurrencies": list(concurrencies), "protocols": list(PROTOCOLS),
                            "rounds": rounds, "window_ms": window_ms, "windows": WINDOWS,
                            "stability_percentage": STABILITY_PERCENTAGE,
                            "texts": len(texts),
                            "mean_text_chars": round(statistics.mean(map(len, texts)), 1)},
               "commands": {}, "measurements": []}

    # 1. the same ids, or nothing is measured
    ours = ppvarlen_ids(model_dir, texts)
    theirs = anchor_ids(args.triton_python, model_dir, texts, work)
    results["tokenization_check"] = {"texts": check_tokenization(texts, ours, theirs),
                                     "equal": True}
    print(f"token ids equal on all {len(texts)} texts", flush=True)

    # 2. inputs: perf_analyzer cycles through the entries; ppvarlen-infer reads the same lines
    input_file = os.path.join(work, "perf_input.json")
    with open(input_file, "w", encoding="utf-8") as f:
        json.dump({"data": [{"text": [t]} for t in texts]}, f, ensure_ascii=False)
    texts_file = os.path.join(work, "texts.txt")
    with open(texts_file, "w", encoding="utf-8") as f:
        f.writelines(t + "\n" for t in texts * args.infer_repeat)
    offline = [run_infer(model_dir, texts_file, os.path.join(work, "infer_before.jsonl"),
                         args.threads)]
    print(f"ppvarlen-infer before the servers: {offline[0]['texts_per_s']} texts/s", flush=True)

    ports = {"ppvarlen": {"http": free_port(), "grpc": free_port()},
             "triton": {"http": free_port(), "grpc": free_port()}}
    commands = server_commands(args, model_dir, model, ports)
    results["commands"] = {"ppvarlen_serve": shlex.join(commands["ppvarlen"]),
                           "triton_anchor": shlex.join(commands["triton"]),
                           "benchmark": shlex.join([sys.executable] + sys.argv)}
    http = {s: f"http://127.0.0.1:{ports[s]['http']}" for s in SERVERS}
    procs = {}
    try:
        start_servers(commands, http, model, work, procs)
        results["versions"]["tritonserver"] = httpx.get(http["triton"] + "/v2",
                                                        timeout=10).json().get("version")
        sample = texts[:24] + sorted(texts, key=len)[-8:]  # the longest are truncated
        results["answer_check"] = check_answers(http, model, sample)
        print(f"answers equal on {len(sample)} sample texts (max prob diff "
              f"{results['answer_check']['max_prob_diff']:.1e})", flush=True)

        results["idle_cpu_share_of_a_core"] = idle_cpu_share(procs)

        urls = {s: {"http": f"127.0.0.1:{ports[s]['http']}",
                    "grpc": f"127.0.0.1:{ports[s]['grpc']}"} for s in SERVERS}
        for s in SERVERS:  # warm-up, not recorded: first connections, first batch shapes
            for p in PROTOCOLS:
                measure(binary, pa_env, model, urls[s][p], p, 8, input_file, 500, work,
                        f"warmup_{s}_{p}")
        plan = interleaved_plan(concurrencies, PROTOCOLS, SERVERS, rounds)
        for k, (r, c, p, s) in enumerate(plan, 1):
            m = measure(binary, pa_env, model, urls[s][p], p, c, input_file, window_ms, work,
                        f"r{r}_c{c}_{p}_{s}", server=(procs[s].pid, http[s]))
            m.update({"round": r, "concurrency": c, "protocol": p, "server": s})
            results["measurements"].append(m)
            shown = "FAILED " + m["error"][-200:] if "error" in m else \
                f"{m['qps']} QPS, p99 {m['p99_ms']} ms, server mean batch " \
                f"{m['server_mean_batch']}, {m['server_cpu_ms_per_text']} CPU ms/text, " \
                f"load {m['loadavg_1m_before']}"
            print(f"[{k}/{len(plan)}] round {r} c={c} {p} {s}: {shown}", flush=True)
    finally:
        for s, p in procs.items():
            stop_process(p)
    offline.append(run_infer(model_dir, texts_file, os.path.join(work, "infer_after.jsonl"),
                             args.threads))
    print(f"ppvarlen-infer after the servers: {offline[1]['texts_per_s']} texts/s", flush=True)

    rate = round(statistics.mean(o["texts_per_s"] for o in offline), 1)
    results["offline"] = {"runs": offline, "texts_per_s_mean": rate}
    results["summary"] = summarize(results["measurements"], concurrencies)
    results["targets"] = evaluate_targets(results["summary"], rate)
    record_load(results)
    results["wall_s"] = round(time.time() - started, 1)
    atomic_write_json(os.path.join(args.out, "serve_vs_triton.json"), results)
    plot(results, os.path.join(args.out, "serve_vs_triton.png"))
    print_report(results)
    shutil.rmtree(work, ignore_errors=True)
    return results


def print_report(results):
    print("\n" + machine_line(results["machine"]))
    print(format_table(results["summary"]))
    o = results["offline"]
    print(f"ppvarlen-infer on the same texts: {o['texts_per_s_mean']} texts/s "
          f"(runs: {[r['texts_per_s'] for r in o['runs']]})")
    for name, t in results["targets"].items():
        status = "MET" if t["met"] else "NOT MET"
        extra = "; ".join(t.get("misses", [])) if name == "qps_and_p99" else \
            f"share at c={t['concurrency']}: {t['share']}"
        print(f"target {t['target']}: {status}" + (f" ({extra})" if extra else ""))
    print(f"wall time {results['wall_s']} s")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", help="a classification export (manifest.json, onnx/)")
    parser.add_argument("--triton-python", default="/tmp/tritonvenv/bin/python",
                        help="the Python of the venv holding PyTriton (--setup-triton-venv)")
    parser.add_argument("--setup-triton-venv", metavar="DIR",
                        help="make DIR a venv with PyTriton + onnxruntime + numpy, patch it, exit")
    parser.add_argument("--quick", action="store_true",
                        help="smoke test: c=1 and 8, 1 round, 1 s windows, 300 texts")
    parser.add_argument("--concurrency", type=int, nargs="+", default=list(CONCURRENCIES))
    parser.add_argument("--rounds", type=int, default=2, help="sweeps over every point")
    parser.add_argument("--window-ms", type=int, default=3000,
                        help=f"one of the {WINDOWS} perf_analyzer windows per point")
    parser.add_argument("--texts", type=int, default=0, help="at most this many (0: all)")
    parser.add_argument("--infer-repeat", type=int, default=3,
                        help="copies of the texts ppvarlen-infer reads (a longer, steadier run)")
    parser.add_argument("--max-wait-ms", type=float, default=5.0)
    parser.add_argument("--max-batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1, help="math threads of each server")
    parser.add_argument("--out", default="output/bench/serve_vs_triton")
    args = parser.parse_args(argv)
    try:
        if args.setup_triton_venv:
            setup_triton_venv(args.setup_triton_venv)
            return 0
        if not args.model_dir:
            parser.error("--model-dir is required (or --setup-triton-venv DIR)")
        run(args)
    except (SetupError, TokenizationMismatch, AnswerMismatch, PatchError) as e:
        print(f"serve_vs_triton: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
