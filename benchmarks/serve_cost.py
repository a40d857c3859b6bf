"""What one text costs ppvarlen-serve: server CPU per answered text, next to the engine's.

    PYTHONPATH=$PWD python benchmarks/serve_cost.py --model-dir output/quickstart/export \\
        --variant base=/tmp/ppvarlen-main --variant new=. [--concurrency 32 64] \\
        [--requests 1500] [--rounds 3] [--protocol http grpc] [--deploy KEY=VALUE]

Each ``--variant NAME=CHECKOUT[,KEY=VALUE...]`` is a ppvarlen checkout (e.g. ``git archive
main | tar -x -C DIR``) served as its own ``ppvarlen-serve`` process
(``CHECKOUT/deploy/python/serve.py`` with ``PYTHONPATH=CHECKOUT``, ONNX backend, 1 math
thread, a 5 ms batching wait, the Deploy keys given after it), all of them up side by side
for the whole run.  Load: perf_analyzer (found as ``serve_vs_triton.py`` finds
it), one text of the export's test split per request, closed loop, each point at least
``--requests`` requests per window over 3 windows.  Points run interleaved (round, concurrency,
protocol, then every variant back to back; every other round in the reverse variant order)
so a burst of load from the other jobs on a shared machine hits every variant.

Per point and variant: the server's CPU seconds (utime + stime of its process, all threads,
and of its children: the gRPC front end is a process of its own) over the texts it answered
(``inference_count`` of its statistics extension) — what the other jobs on the machine move far less than QPS — and
texts/s and the mean batch (texts / batches, the same extension).  "main thread": the part of
the CPU the process's main thread used, REST's event loop (gRPC runs on a loop of its own
thread, the batcher and ONNX Runtime in theirs).  ``ppvarlen-infer`` on the same texts
(before the servers start, one math thread) gives the offline ms per text and texts/s; "x
offline" is a variant's CPU per text over that, "share of offline" its texts/s over that.
``--deploy KEY=VALUE`` sets a Deploy key for every variant (e.g. ``batch_overhead_tokens``,
which each server otherwise measures at start, a noisy constant on a shared machine).
Medians over the rounds; every measurement in ``--out``/serve_cost.json.
"""
import argparse
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

import httpx
import serve_vs_triton as svt  # the sibling benchmark: perf_analyzer, processes, machine

from ppvarlen.serve.bench import free_port
from ppvarlen.runtime.manifest import load_manifest
from ppvarlen.utils.io import atomic_write_json

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_s(stat_path):
    with open(stat_path, encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()  # after "pid (comm)": state is field 3
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def process_cpu_s(pid):
    """(utime + stime of the server's processes, of its main thread) in seconds: the main
    thread runs the event loop (HTTP), the others the batcher, the gRPC relay and the
    runtime; a child process (the gRPC front end of a checkout that has one) counts too."""
    return svt.process_tree_cpu_s(pid), _cpu_s(f"/proc/{pid}/task/{pid}/stat")


def counts(url, model):
    """(texts answered, batches run) from the statistics extension."""
    body = httpx.get(f"{url}/v2/models/{model}/stats", timeout=30).json()
    stats = body["model_stats"]
    return (sum(int(m["inference_count"]) for m in stats),
            sum(int(m["execution_count"]) for m in stats))


def overhead_tokens(url, model):
    """The batcher's cost of a forward pass in tokens (measured at start unless
    Deploy.batch_overhead_tokens is set), from the model configuration extension."""
    config = httpx.get(f"{url}/v2/models/{model}/config", timeout=30).json()
    value = config.get("parameters", {}).get("batch_overhead_tokens", {}).get("string_value")
    return int(value) if value not in (None, "None") else None


def perf_command(binary, model, url, protocol, concurrency, input_file, requests, csv_path):
    return [binary, "-m", model, "-u", url, "-i", protocol, "--input-data", input_file,
            "--shape", "text:1", "--concurrency-range", f"{concurrency}:{concurrency}",
            "--measurement-mode", "count_windows", "--measurement-request-count",
            str(requests), "--percentile=99",
            "--stability-percentage", str(svt.STABILITY_PERCENTAGE),
            "--max-trials", str(svt.WINDOWS), "-f", csv_path, "--verbose-csv"]


def measure(binary, env, model, server, protocol, concurrency, input_file, requests, work, tag):
    """One perf_analyzer run against ``server`` (dict: pid, http, grpc) -> its costs."""
    csv_path = os.path.join(work, f"{tag}.csv")
    url = server[protocol].removeprefix("http://")
    cmd = perf_command(binary, model, url, protocol, concurrency, input_file, requests, csv_path)
    load = round(os.getloadavg()[0], 2)
    texts0, batches0 = counts(server["http"], model)
    cpu0, start = process_cpu_s(server["pid"]), time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    cpu1, wall = process_cpu_s(server["pid"]), time.perf_counter() - start
    texts1, batches1 = counts(server["http"], model)
    texts, batches = texts1 - texts0, batches1 - batches0
    cpu, loop_cpu = cpu1[0] - cpu0[0], cpu1[1] - cpu0[1]
    out = {"command": shlex.join(cmd), "loadavg_1m_before": load, "wall_s": round(wall, 2),
           "texts": texts, "batches": batches, "server_cpu_s": round(cpu, 3),
           "cpu_ms_per_text": round(1000 * cpu / texts, 3) if texts else None,
           "loop_cpu_ms_per_text": round(1000 * loop_cpu / texts, 3) if texts else None,
           "texts_per_s": round(texts / wall, 1),
           "mean_batch": round(texts / batches, 2) if batches else None,
           "cores_busy": round(cpu / wall, 2)}
    if r.returncode != 0 or not os.path.isfile(csv_path):
        out["error"] = (r.stdout + r.stderr)[-1500:]
        return out
    with open(csv_path, encoding="utf-8") as f:
        row = svt.parse_perf_csv(f.read())[-1]
    m = svt.measurement_from_row(row)
    out.update(qps=m["qps"], p99_ms=m["p99_ms"])
    return out


def offline_cost(model_dir, texts_file, work):
    """ppvarlen-infer on the texts: texts/s and CPU ms per text (its process's user + sys)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    run = svt.run_infer(model_dir, texts_file, os.path.join(work, "infer.jsonl"))
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    # the whole process (start-up, loading) over the texts: an upper bound of the engine's
    # cost per text; texts/s is ppvarlen-infer's own (its timed part)
    run["cpu_ms_per_text_whole_process"] = round(1000 * cpu / run["texts"], 3)
    run["wall_ms_per_text"] = round(1000 * run["seconds"] / run["texts"], 3)
    return run


def start_variant(name, checkout, model_dir, ports, protocols, work, deploy=()):
    cmd = [sys.executable, os.path.join(checkout, "deploy", "python", "serve.py"),
           "--model-dir", model_dir, "--backend", "onnx", "--host", "127.0.0.1",
           "--port", str(ports["http"])]
    for key in ("max_wait_ms=5", "max_batch_size=64", "threads=1", *deploy):
        cmd += ["-o", f"Deploy.{key}"]
    cmd += ["--grpc-port", str(ports["grpc"])] if "grpc" in protocols else []
    env = {**os.environ, "PYTHONPATH": os.path.abspath(checkout)}
    log_path = os.path.join(work, f"serve_{name}.log")
    proc = svt.start_process(cmd, log_path, env=env)
    return proc, shlex.join(cmd), log_path


def summarize(measurements, variants, offline):
    """Medians per (protocol, concurrency, variant)."""
    rows = []
    keys = sorted({(m["protocol"], m["concurrency"]) for m in measurements})
    for protocol, c in keys:
        for v in variants:
            ms = [m for m in measurements if (m["protocol"], m["concurrency"], m["variant"])
                  == (protocol, c, v) and m.get("cpu_ms_per_text")]
            if not ms:
                continue

            def med(key):
                values = [m[key] for m in ms if m.get(key) is not None]
                return round(statistics.median(values), 3) if values else None
            row = {"protocol": protocol, "concurrency": c, "variant": v, "rounds": len(ms),
                   **{k: med(k) for k in ("cpu_ms_per_text", "loop_cpu_ms_per_text",
                                          "texts_per_s", "mean_batch", "p99_ms",
                                          "cores_busy")}}
            row["cpu_per_text_x_offline"] = round(row["cpu_ms_per_text"]
                                                  / offline["wall_ms_per_text"], 2)
            row["texts_per_s_share_of_offline"] = round(row["texts_per_s"]
                                                        / offline["texts_per_s"], 3)
            rows.append(row)
    return rows


def format_table(rows, variants):
    head = ("| protocol | c | variant | CPU ms / text | of it, main thread | x offline | texts/s "
            "| share of offline | mean batch | p99 ms | cores busy | CPU vs " + variants[0] + " |")
    lines = [head, "|" + "---|" * 12]
    base = {(r["protocol"], r["concurrency"]): r for r in rows if r["variant"] == variants[0]}
    for r in rows:
        b = base.get((r["protocol"], r["concurrency"]))
        vs = f"{r['cpu_ms_per_text'] / b['cpu_ms_per_text']:.2f}x" if b else "-"
        lines.append(f"| {r['protocol']} | {r['concurrency']} | {r['variant']} | "
                     f"{r['cpu_ms_per_text']:.3f} | {r['loop_cpu_ms_per_text']:.3f} | "
                     f"{r['cpu_per_text_x_offline']:.2f} | "
                     f"{r['texts_per_s']:.0f} | {r['texts_per_s_share_of_offline']:.0%} | "
                     f"{r['mean_batch']} | {r['p99_ms']} | {r['cores_busy']} | {vs} |")
    return "\n".join(lines)


def run(args):
    binary, looked = svt.find_perf_analyzer()
    if binary is None:
        raise svt.SetupError(svt.perf_analyzer_howto(looked))
    env = svt.perf_analyzer_env(binary)
    model_dir = os.path.abspath(args.model_dir)
    model = load_manifest(model_dir).get("model_name") or "model"
    variants, variant_deploy = {}, {}
    for spec in args.variant:  # NAME=CHECKOUT[,KEY=VALUE...]
        name, rest = spec.split("=", 1)
        checkout, *keys = rest.split(",")
        variants[name], variant_deploy[name] = checkout, keys
    texts = svt.texts_for_run(model_dir, args.texts)
    work = tempfile.mkdtemp(prefix="serve_cost_")
    input_file = os.path.join(work, "perf_input.json")
    with open(input_file, "w", encoding="utf-8") as f:
        json.dump({"data": [{"text": [t]} for t in texts]}, f, ensure_ascii=False)
    texts_file = os.path.join(work, "texts.txt")
    with open(texts_file, "w", encoding="utf-8") as f:
        f.writelines(t + "\n" for t in texts * 3)
    results = {"benchmark": "serve_cost", "machine": svt.machine(), "model_dir": model_dir,
               "variants": {n: {"checkout": os.path.abspath(p), "deploy": variant_deploy[n]}
                            for n, p in variants.items()},
               "settings": vars(args), "measurements": []}
    offline = results["offline"] = offline_cost(model_dir, texts_file, work)
    print(f"ppvarlen-infer: {offline['texts_per_s']} texts/s, {offline['wall_ms_per_text']} "
          f"ms/text (whole process {offline['cpu_ms_per_text_whole_process']} CPU ms/text)",
          flush=True)
    servers, procs = {}, {}
    try:
        for name, checkout in variants.items():
            ports = {"http": free_port(), "grpc": free_port()}
            proc, cmd, log_path = start_variant(name, checkout, model_dir, ports,
                                                args.protocol, work,
                                                args.deploy + variant_deploy[name])
            procs[name] = proc
            servers[name] = {"pid": proc.pid, "http": f"http://127.0.0.1:{ports['http']}",
                             "grpc": f"127.0.0.1:{ports['grpc']}", "command": cmd,
                             "log": log_path}
        for name, s in servers.items():
            svt._wait_ready(f"{s['http']}/v2/models/{model}/ready", procs[name], name, 240,
                            s["log"])
        results["servers"] = {n: {"command": s["command"],
                                  "batch_overhead_tokens": overhead_tokens(s["http"], model)}
                              for n, s in servers.items()}
        for n, s in results["servers"].items():
            print(f"{n}: a forward pass costs as much as {s['batch_overhead_tokens']} tokens "
                  f"(the batcher's planning constant)", flush=True)
        for name, s in servers.items():  # first connections and batch shapes, not recorded
            for p in args.protocol:
                measure(binary, env, model, s, p, 8, input_file, 200, work, f"warm_{name}_{p}")
        names = list(variants)
        plan = [(r, c, p, v) for r in range(args.rounds) for c in args.concurrency
                for p in args.protocol for v in (names if r % 2 == 0 else names[::-1])]
        for k, (r, c, p, v) in enumerate(plan, 1):
            m = measure(binary, env, model, servers[v], p, c, input_file, args.requests, work,
                        f"r{r}_c{c}_{p}_{v}")
            m.update(round=r, concurrency=c, protocol=p, variant=v)
            results["measurements"].append(m)
            print(f"[{k}/{len(plan)}] r{r} c={c} {p} {v}: "
                  + (f"FAILED {m['error'][-300:]}" if "error" in m else
                     f"{m['cpu_ms_per_text']} CPU ms/text ({m['loop_cpu_ms_per_text']} in "
                     f"the loop), {m['texts_per_s']} texts/s, "
                     f"batch {m['mean_batch']}, p99 {m['p99_ms']} ms, "
                     f"load {m['loadavg_1m_before']}"), flush=True)
    finally:
        for p in procs.values():
            svt.stop_process(p)
    results["summary"] = summarize(results["measurements"], names, offline)
    os.makedirs(args.out, exist_ok=True)
    atomic_write_json(os.path.join(args.out, "serve_cost.json"), results)
    m = results["machine"]
    print(f"\nmachine: {m.get('cpu_model')}, {m['cpu_count']} cores, flags "
          f"{' '.join(m.get('cpu_simd_flags', []))}; load at start {m.get('loadavg')}")
    print(f"offline (ppvarlen-infer): {offline['wall_ms_per_text']} ms/text, "
          f"{offline['texts_per_s']} texts/s")
    print(format_table(results["summary"], names))
    return results


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-dir", required=True, help="a classification export (e.g. the "
                    "quickstart's output/quickstart/export)")
    ap.add_argument("--variant", action="append", required=True,
                    metavar="NAME=CHECKOUT[,KEY=VALUE...]",
                    help="a ppvarlen checkout to serve, with Deploy settings of its own (repeat: "
                    "the first is the reference)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[32, 64])
    ap.add_argument("--protocol", nargs="+", choices=svt.PROTOCOLS, default=["http"])
    ap.add_argument("--requests", type=int, default=1500, help="requests per window "
                    "(3 windows a point)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--texts", type=int, default=0, help="use only the first N texts (0: all)")
    ap.add_argument("--deploy", action="append", default=[], metavar="KEY=VALUE",
                    help="a Deploy setting for every variant, e.g. batch_overhead_tokens=60 "
                    "(the same planning constant for all, instead of each measuring its own)")
    ap.add_argument("--out", default="output/bench/serve_cost")
    args = ap.parse_args(argv)
    try:
        run(args)
    except svt.SetupError as e:
        raise SystemExit(str(e)) from None


if __name__ == "__main__":
    main()
