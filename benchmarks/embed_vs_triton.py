"""ppvarlen-serve's /v1/embeddings vs the same ONNX embedding model behind Triton's batcher.

    PYTHONPATH=$PWD python benchmarks/embed_vs_triton.py [--model-dir EXPORT] \\
        [--triton-python /tmp/tritonvenv/bin/python] [--quick] [--out output/bench/embed_vs_triton]

The export: without ``--model-dir`` the benchmark makes one under OUT/export (kept for the next
run): a RANDOM-INIT ``transformer_embed`` (the sizes of configs/sentiment/transformer.yaml's
encoder: hidden 64, 2 layers, 2 heads, FFN 128; mean pooling, L2-normalised), its char
vocabulary from the sentiment train split, max_len 256, exported to ONNX by the exporter with
its parity check.  Untrained: speed does not depend on the weights.

The servers, the PyTriton venv and perf_analyzer are benchmarks/serve_vs_triton.py's (its
functions, not copies): ppvarlen-serve with ``--backend onnx`` and the Triton anchor
(benchmarks/triton_anchor.py in its embedding mode: tokenise as the export says, pad the batch
to its longest text, ONNX Runtime, FP32 [B, D] out), 1 math thread each, Triton's
``max_queue_delay`` = ``Deploy.max_wait_ms``, the same max batch size.  Before any load: the
anchor's token ids equal ppvarlen's on every input text, and /v1/embeddings, ppvarlen's OIP and
Triton's OIP answer the same embeddings on a sample, or the run stops.

Load, one real review per request, at each concurrency (8 and 32), interleaved in one run
(every other round starts with the other server):

- closed-loop client (benchmarks/closed_loop.py, one process, asyncio + aiohttp):
  ppvarlen's ``/v1/embeddings`` (the OpenAI body), ppvarlen's OIP REST infer, Triton's OIP
  REST infer -- the same client for all three, so its cost is comparable; its CPU per request
  is recorded (perf_analyzer cannot speak the OpenAI API: its 2.41 ``--service-kind`` is
  triton / tfserving / torchserve / triton_c_api);
- perf_analyzer over OIP REST for both servers (the second view; serve_vs_triton's
  ``measure``).

Writes ``embed_vs_triton.json`` (every measurement, the machine, versions, commands) and
``embed_vs_triton.png``; prints the table.  No number here gates anything.
"""
import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

import httpx
import numpy as np
import paddle

import serve_vs_triton as svt
from machine import machine
from ppvarlen.config import load_config
from ppvarlen.data.sources import load_corpus
from ppvarlen.data.vocab import TextEncoder
from ppvarlen.serve.bench import free_port
from ppvarlen.runtime.manifest import load_manifest
from ppvarlen.export.exporter import export_model
from ppvarlen.models import build_model
from ppvarlen.utils.io import atomic_write_json

HERE = os.path.dirname(os.path.abspath(__file__))
CLIENT = os.path.join(HERE, "closed_loop.py")
CONCURRENCIES = (8, 32)
# the anchor's outputs for an embedding export, named and ordered as ppvarlen's OIP answer
EMBED_OUTPUTS = ("embedding", "num_tokens", "truncated")
EMBED_WHAT = "an embedding model's"
MODEL = {"name": "transformer_embed", "hidden_size": 64, "num_layers": 2, "num_heads": 2,
         "ffn_size": 128, "dropout": 0.0, "max_position": 512, "pooling": "mean",
         "normalize": True}
MAX_LEN = 256
MODEL_NAME = "embed_bench"
# the closed-loop client's targets and perf_analyzer's, each (view, target)
CLIENT_TARGETS = ("ppvarlen_openai", "ppvarlen_oip", "triton_oip")
SERVER_OF = {"ppvarlen_openai": "ppvarlen", "ppvarlen_oip": "ppvarlen", "triton_oip": "triton"}
PERF_TARGETS = svt.SERVERS
# the table's rows: (view, ppvarlen's target, Triton's, what the row compares)
COMPARISONS = (("client", "ppvarlen_openai", "triton_oip",
                "client: ppvarlen /v1/embeddings vs Triton OIP"),
               ("client", "ppvarlen_oip", "triton_oip", "client: ppvarlen OIP vs Triton OIP"),
               ("perf_analyzer", "ppvarlen", "triton", "perf_analyzer: OIP REST, both"))
EQUAL_EMBEDDING_TOLERANCE = 1e-4  # other padding in the two batchers moves float sums a little
# what the summary reports of each point, and the places its medians are rounded to
NUMBERS = {"qps": 1, "p50_ms": 1, "p99_ms": 1, "server_cpu_ms_per_text": 3,
           "client_cpu_ms_per_request": 3}


# ---------------------------------------------------------------- the export

def length_profile(lengths):
    """The manifest's token-length profile (p50/p95/p99/max) of ``lengths``."""
    a = np.asarray(lengths)
    return {"p50": int(np.percentile(a, 50)), "p95": int(np.percentile(a, 95)),
            "p99": int(np.percentile(a, 99)), "max": int(a.max())}


def make_export(out_dir, train_texts, model_keys=None, max_len=MAX_LEN, seed=0):
    """A random-init transformer_embed over a char vocabulary of ``train_texts``, exported
    to ONNX (with the exporter's parity check) -> the export's manifest."""
    paddle.seed(seed)
    encoder = TextEncoder.build(train_texts, kind="char")
    model_cfg = dict(MODEL, **(model_keys or {}))
    model = build_model(model_cfg, encoder.vocab_size, 0, encoder.pad_id, "embedding")
    model.eval()
    lengths = [min(len(t) + 2, max_len) for t in train_texts]
    meta = {"task": "embedding", "model_name": MODEL_NAME, "label_names": [],
            "special_ids": encoder.special_ids, "max_len": max_len,
            "max_position": model_cfg["max_position"], "long_text": "truncate",
            "length_profile": length_profile(lengths),
            "embedding": {"dim": model_cfg["hidden_size"], "pooling": model_cfg["pooling"],
                          "normalize": model_cfg["normalize"]}}
    cfg = load_config(overrides=["Data.corpus=sentiment", f"Data.max_len={max_len}"])
    return export_model(model, meta, encoder, cfg, out_dir, ("onnx",), ("fp32",), verify=True)


def sentiment_splits():
    corpus = load_corpus(load_config(overrides=["Data.corpus=sentiment"]).Data)
    return corpus.splits


# ---------------------------------------------------------------- bodies and answers

def openai_body(texts, model):
    return {"input": texts[0] if len(texts) == 1 else list(texts), "model": model,
            "encoding_format": "float"}


def compare_embeddings(openai_answer, ppvarlen_oip_answer, triton_oip_answer):
    """{max_diff_openai_vs_triton, max_diff_oip_vs_triton, differ: [outputs not equal]}:
    the embeddings of the three answers to the same texts (max |difference| over every value),
    and ppvarlen's OIP ``num_tokens`` / ``truncated`` against Triton's (equal, or listed)."""
    def tensors(body):
        return {t["name"]: t["data"] for t in body["outputs"]}
    ours, theirs = tensors(ppvarlen_oip_answer), tensors(triton_oip_answer)
    rows = [d["embedding"] for d in sorted(openai_answer["data"], key=lambda d: d["index"])]
    flat_openai = [x for row in rows for x in row]

    def max_diff(a, b):
        if len(a) != len(b) or not a:
            return float("inf")
        return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))
    triton_embedding = theirs.get("embedding", [])
    differ = sorted(n for n in ("num_tokens", "truncated")
                    if n not in ours or n not in theirs or ours[n] != theirs[n])
    return {"max_diff_openai_vs_triton": max_diff(flat_openai, triton_embedding),
            "max_diff_oip_vs_triton": max_diff(ours.get("embedding", []), triton_embedding),
            "differ": differ}


def check_answers(http, model, texts):
    """The three routes' answers to ``texts`` must agree (svt.AnswerMismatch otherwise)."""
    answers = {}
    for key, url, body in (
            ("openai", f"{http['ppvarlen']}/v1/embeddings", openai_body(texts, model)),
            ("ppvarlen_oip", f"{http['ppvarlen']}/v2/models/{model}/infer",
             svt.infer_body(texts, False)),
            ("triton_oip", f"{http['triton']}/v2/models/{model}/infer",
             svt.infer_body(texts, True))):
        r = httpx.post(url, json=body, timeout=60)
        r.raise_for_status()
        answers[key] = r.json()
    out = compare_embeddings(answers["openai"], answers["ppvarlen_oip"], answers["triton_oip"])
    worst = max(out["max_diff_openai_vs_triton"], out["max_diff_oip_vs_triton"])
    if out["differ"] or worst > EQUAL_EMBEDDING_TOLERANCE:
        raise svt.AnswerMismatch(f"the servers answer {len(texts)} sample texts differently: "
                                 f"outputs {out['differ']} differ, max embedding difference "
                                 f"{worst:.2e} (allowed {EQUAL_EMBEDDING_TOLERANCE}).  "
                                 f"Refusing to measure")
    out["texts"] = len(texts)
    return out


# ---------------------------------------------------------------- the plan and the client

def interleaved_plan(concurrencies, rounds):
    """[(round, concurrency, view, target)]: at each concurrency the client's three targets,
    then perf_analyzer's two servers, each view's order reversed every other round
    (serve_vs_triton's ``interleaved_plan`` per view)."""
    client = svt.interleaved_plan(concurrencies, ("client",), CLIENT_TARGETS, rounds)
    perf = svt.interleaved_plan(concurrencies, ("perf_analyzer",), PERF_TARGETS, rounds)
    order = list(concurrencies)
    return sorted(client + perf, key=lambda p: (p[0], order.index(p[1])))  # stable: client first


def client_spec(target, http, model, texts, concurrency, warmup_s, duration_s, dim):
    """What closed_loop.py runs for one point: ``target`` one of CLIENT_TARGETS."""
    if target == "ppvarlen_openai":
        url, bodies, answer = f"{http['ppvarlen']}/v1/embeddings", \
            [openai_body([t], model) for t in texts], "openai"
    else:
        server = SERVER_OF[target]
        url, answer = f"{http[server]}/v2/models/{model}/infer", "oip"
        bodies = [svt.infer_body([t], server == "triton") for t in texts]
    return {"url": url, "bodies": bodies, "concurrency": concurrency, "warmup_s": warmup_s,
            "duration_s": duration_s, "answer": answer, "dim": dim}


def run_client(spec, work, tag, server_pid):
    """closed_loop.py in a process of its own on ``spec``; its numbers, plus the server's CPU
    per request over the client's whole run (warm-up included, as are its requests)."""
    spec_path, out_path = os.path.join(work, f"{tag}.spec.json"), os.path.join(work, f"{tag}.json")
    with open(spec_path, "w", encoding="utf-8") as f:
        json.dump(spec, f, ensure_ascii=False)
    load_before = round(os.getloadavg()[0], 2)
    cpu0 = svt.process_tree_cpu_s(server_pid)
    r = subprocess.run([sys.executable, CLIENT, spec_path, out_path], capture_output=True,
                       text=True, timeout=spec["warmup_s"] + spec["duration_s"] + 300)
    cpu1 = svt.process_tree_cpu_s(server_pid)
    if r.returncode != 0:
        return {"error": r.stderr[-1500:], "loadavg_1m_before": load_before}
    with open(out_path, encoding="utf-8") as f:
        out = json.load(f)
    out["loadavg_1m_before"] = load_before
    out["server_cpu_ms_per_text"] = svt.cpu_ms_per_text(cpu0, cpu1, 0, out["requests_total"])
    out["server_cpu_cores_busy"] = None if None in (cpu0, cpu1) else \
        round((cpu1 - cpu0) / out["wall_s"], 2)
    return out


# ---------------------------------------------------------------- summary

def summarize(measurements, concurrencies):
    """Per concurrency: each (view, target)'s median of NUMBERS over its rounds; then per
    COMPARISONS row the ppvarlen / Triton ratios."""
    rows = []
    for c in concurrencies:
        row = {"concurrency": c}
        for view, targets in (("client", CLIENT_TARGETS), ("perf_analyzer", PERF_TARGETS)):
            for t in targets:
                got = [m for m in measurements if m["view"] == view and m["target"] == t
                       and m["concurrency"] == c and m.get("qps") and not m.get("errors")]
                key = f"{view}:{t}"
                for n, places in NUMBERS.items():
                    vals = [m[n] for m in got if m.get(n) is not None]
                    row[f"{key}:{n}"] = round(float(statistics.median(vals)), places) \
                        if vals else None
                row[f"{key}:qps_each_round"] = [m["qps"] for m in got]
        for view, ours, theirs, _ in COMPARISONS:
            for n in ("qps", "p50_ms", "p99_ms"):
                row[f"{view}:{ours}/{theirs}:{n}_ratio"] = svt.ratio(
                    row[f"{view}:{ours}:{n}"], row[f"{view}:{theirs}:{n}"])
        rows.append(row)
    return rows


def format_table(rows):
    head = ("comparison", "c", "ppvarlen QPS", "Triton QPS", "QPS ratio",
            "p50 ms ppvarlen / Triton", "p99 ms ppvarlen / Triton",
            "server CPU ms/text ppvarlen / Triton", "client CPU ms/request ppvarlen / Triton")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def pair(row, view, ours, theirs, n):
        a, b = row[f"{view}:{ours}:{n}"], row[f"{view}:{theirs}:{n}"]
        return None if a is None and b is None else \
            f"{'—' if a is None else a} / {'—' if b is None else b}"
    for view, ours, theirs, what in COMPARISONS:
        for r in rows:
            q = r[f"{view}:{ours}/{theirs}:qps_ratio"]
            cells = (what, r["concurrency"], r[f"{view}:{ours}:qps"], r[f"{view}:{theirs}:qps"],
                     None if q is None else f"{q}x", pair(r, view, ours, theirs, "p50_ms"),
                     pair(r, view, ours, theirs, "p99_ms"),
                     pair(r, view, ours, theirs, "server_cpu_ms_per_text"),
                     pair(r, view, ours, theirs, "client_cpu_ms_per_request"))
            lines.append("| " + " | ".join("—" if v is None else str(v) for v in cells) + " |")
    return "\n".join(lines)


def plot(results, path):
    from matplotlib.figure import Figure  # no pyplot: the process's backend stays as it was

    rows = results["summary"]
    fig = Figure(figsize=(11, 4.4))
    qps_ax, p99_ax = fig.subplots(1, 2)
    styles = {("client", "ppvarlen_openai"): ("C0", "-", "ppvarlen /v1/embeddings (client)"),
              ("client", "ppvarlen_oip"): ("C0", ":", "ppvarlen OIP REST (client)"),
              ("client", "triton_oip"): ("C1", "-", "Triton OIP REST (client)"),
              ("perf_analyzer", "ppvarlen"): ("C0", "--", "ppvarlen OIP REST (perf_analyzer)"),
              ("perf_analyzer", "triton"): ("C1", "--", "Triton OIP REST (perf_analyzer)")}
    xs = [r["concurrency"] for r in rows]
    for (view, target), (color, line, label) in styles.items():
        for ax, n in ((qps_ax, "qps"), (p99_ax, "p99_ms")):
            ax.plot(xs, [r[f"{view}:{target}:{n}"] for r in rows], line, color=color,
                    marker="o", label=label)
    svt.style_axes(((qps_ax, "throughput", "requests / s (one text each)"),
                    (p99_ax, "client p99 latency", "ms")), xs, "concurrent requests")
    qps_ax.legend(fontsize=7)
    s = results["settings"]
    svt.save_figure(fig, path, f"embedding export (random-init transformer_embed, D={s['dim']}), "
                               f"1 math thread each, max_wait {s['max_wait_ms']} ms; 2 shared "
                               f"cores")


# ---------------------------------------------------------------- the run

def texts_for_run(test_texts, limit):
    texts = [t for t in test_texts if t.strip()]
    return texts[:limit] if limit else texts


def run(args):
    started = time.time()
    binary, pa_version, pa_env = svt.check_tools(args.triton_python)
    os.makedirs(args.out, exist_ok=True)
    splits = sentiment_splits()
    if args.model_dir:
        model_dir, made = os.path.abspath(args.model_dir), False
    else:
        model_dir, made = os.path.abspath(os.path.join(args.out, "export")), True
        if not os.path.isfile(os.path.join(model_dir, "manifest.json")):
            print(f"making the export (random-init transformer_embed) in {model_dir}", flush=True)
            make_export(model_dir, [ex["text"] for ex in splits["train"]])
    manifest = load_manifest(model_dir)
    model, dim = manifest.get("model_name") or "model", int(manifest["embedding"]["dim"])
    quick = bool(args.quick)
    concurrencies = CONCURRENCIES if not args.concurrency else tuple(args.concurrency)
    rounds, window_ms = (1, 1000) if quick else (args.rounds, args.window_ms)
    warmup_s, duration_s = (1.0, 2.0) if quick else (args.warmup_s, args.duration_s)
    texts = texts_for_run([ex["text"] for ex in splits["test"]], 300 if quick else args.texts)
    work = tempfile.mkdtemp(prefix="embed_vs_triton_")
    print(f"{len(texts)} texts; perf_analyzer {binary} ({pa_version}); work dir {work}",
          flush=True)
    results = {"benchmark": "embed_vs_triton", "model_dir": model_dir, "model_name": model,
               "export": {"made_by_this_run": made, "model": MODEL if made else None,
                          "weights": "random init (untrained)" if made else "given",
                          "embedding": manifest["embedding"], "max_len": manifest["max_len"]},
               "machine": machine(), "quick": quick,
               "versions": {"ppvarlen": svt.ppvarlen_version(), "perf_analyzer": pa_version,
                            "triton_venv": svt.venv_versions(args.triton_python),
                            "project_venv": svt.venv_versions(sys.executable)},
               "settings": {"max_wait_ms": args.max_wait_ms, "dim": dim,
                            "max_batch_size": args.max_batch_size, "threads": args.threads,
                            "concurrencies": list(concurrencies), "rounds": rounds,
                            "perf_analyzer_window_ms": window_ms, "windows": svt.WINDOWS,
                            "client_warmup_s": warmup_s, "client_duration_s": duration_s,
                            "texts": len(texts),
                            "mean_text_chars": round(statistics.mean(map(len, texts)), 1)},
               "commands": {}, "measurements": []}

    ours = svt.ppvarlen_ids(model_dir, texts, EMBED_OUTPUTS, EMBED_WHAT)
    theirs = svt.anchor_ids(args.triton_python, model_dir, texts, work)
    results["tokenization_check"] = {"texts": svt.check_tokenization(texts, ours, theirs),
                                     "equal": True}
    print(f"token ids equal on all {len(texts)} texts", flush=True)
    input_file = os.path.join(work, "perf_input.json")
    with open(input_file, "w", encoding="utf-8") as f:
        json.dump({"data": [{"text": [t]} for t in texts]}, f, ensure_ascii=False)

    ports = {s: {"http": free_port(), "grpc": free_port()} for s in svt.SERVERS}
    commands = svt.server_commands(args, model_dir, model, ports)
    results["commands"] = {"ppvarlen_serve": shlex.join(commands["ppvarlen"]),
                           "triton_anchor": shlex.join(commands["triton"]),
                           "benchmark": shlex.join([sys.executable] + sys.argv)}
    http = {s: f"http://127.0.0.1:{ports[s]['http']}" for s in svt.SERVERS}
    procs = {}
    try:
        svt.start_servers(commands, http, model, work, procs)
        results["versions"]["tritonserver"] = httpx.get(http["triton"] + "/v2",
                                                        timeout=10).json().get("version")
        sample = texts[:24] + sorted(texts, key=len)[-8:]  # the longest are truncated
        results["answer_check"] = check_answers(http, model, sample)
        print(f"embeddings equal on {len(sample)} sample texts: {results['answer_check']}",
              flush=True)
        results["idle_cpu_share_of_a_core"] = svt.idle_cpu_share(procs)
        for s in svt.SERVERS:  # warm-up, not recorded: first connections, first batch shapes
            svt.measure(binary, pa_env, model, f"127.0.0.1:{ports[s]['http']}", "http", 8,
                        input_file, 500, work, f"warmup_{s}")
        for t in CLIENT_TARGETS:
            run_client(client_spec(t, http, model, texts, 8, 0.0, 1.0, dim), work,
                       f"warmup_{t}", procs[SERVER_OF[t]].pid)
        plan = interleaved_plan(concurrencies, rounds)
        for k, (r, c, view, target) in enumerate(plan, 1):
            tag = f"r{r}_c{c}_{view}_{target}"
            if view == "client":
                m = run_client(client_spec(target, http, model, texts, c, warmup_s, duration_s,
                                           dim), work, tag, procs[SERVER_OF[target]].pid)
            else:
                m = svt.measure(binary, pa_env, model, f"127.0.0.1:{ports[target]['http']}",
                                "http", c, input_file, window_ms, work, tag,
                                server=(procs[target].pid, http[target]))
            m.update({"round": r, "concurrency": c, "view": view, "target": target})
            results["measurements"].append(m)
            shown = "FAILED " + str(m["error"])[-200:] if "error" in m else \
                f"{m['qps']} QPS, p50 {m['p50_ms']} ms, p99 {m['p99_ms']} ms, " \
                f"{m.get('server_cpu_ms_per_text')} server CPU ms/text, client CPU ms/request " \
                f"{m.get('client_cpu_ms_per_request')}, errors {m.get('errors', 0)}, " \
                f"load {m['loadavg_1m_before']}"
            print(f"[{k}/{len(plan)}] round {r} c={c} {view} {target}: {shown}", flush=True)
    finally:
        for p in procs.values():
            svt.stop_process(p)
    results["summary"] = summarize(results["measurements"], concurrencies)
    svt.record_load(results)
    results["wall_s"] = round(time.time() - started, 1)
    atomic_write_json(os.path.join(args.out, "embed_vs_triton.json"), results)
    plot(results, os.path.join(args.out, "embed_vs_triton.png"))
    print_report(results)
    return results


def print_report(results):
    print("\n" + svt.machine_line(results["machine"]))
    print(format_table(results["summary"]))
    print(f"wall time {results['wall_s']} s")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", help="an embedding export (default: make one in OUT/export)")
    parser.add_argument("--triton-python", default="/tmp/tritonvenv/bin/python",
                        help="the Python of the venv holding PyTriton (serve_vs_triton.py "
                             "--setup-triton-venv)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke test: 1 round, 2 s client points, 1 s perf_analyzer windows, "
                             "300 texts")
    parser.add_argument("--concurrency", type=int, nargs="+", default=None,
                        help=f"default {' '.join(map(str, CONCURRENCIES))}")
    parser.add_argument("--rounds", type=int, default=2, help="sweeps over every point")
    parser.add_argument("--window-ms", type=int, default=3000,
                        help=f"one of the {svt.WINDOWS} perf_analyzer windows per point")
    parser.add_argument("--warmup-s", type=float, default=2.0,
                        help="client: seconds of load before the measured window")
    parser.add_argument("--duration-s", type=float, default=10.0,
                        help="client: the measured window")
    parser.add_argument("--texts", type=int, default=0, help="at most this many (0: all)")
    parser.add_argument("--max-wait-ms", type=float, default=5.0)
    parser.add_argument("--max-batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1, help="math threads of each server")
    parser.add_argument("--out", default="output/bench/embed_vs_triton")
    args = parser.parse_args(argv)
    try:
        run(args)
    except (svt.SetupError, svt.TokenizationMismatch, svt.AnswerMismatch) as e:
        print(f"embed_vs_triton: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
