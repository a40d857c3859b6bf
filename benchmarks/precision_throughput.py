"""Speed per precision: eager, Paddle Inference fp32/bf16, ONNX Runtime fp32/fp16/int8, one run.

    # a trained checkpoint (e.g. configs/sentiment/transformer.yaml)
    python benchmarks/precision_throughput.py -c configs/sentiment/transformer.yaml \\
        --checkpoint output/sentiment_transformer/best --work output/bench/prec_transformer
    # an ERNIE-3.0-medium-shaped PaddleNLP ErnieModel, random init (no download)
    python benchmarks/precision_throughput.py -c configs/sentiment/transformer.yaml \\
        --ernie-medium --work output/bench/prec_ernie_medium --max-examples 256
    # int8 vs ORT fp32 only (eager ERNIE-medium takes ~18 min per 256 texts)
    python benchmarks/precision_throughput.py -c configs/sentiment/transformer.yaml \
        --ernie-medium --work output/bench/prec_ernie_medium --max-examples 256 \
        --int8-variants int8_full_range --only onnx_int8,onnx_int8_full_range

Batches are the server's: the test split's texts (a random sample of
``--max-examples``), length-sorted into ``Deploy.max_batch_tokens`` /
``Deploy.max_batch_size`` batches, the way the predictor groups a queue of
texts.  The model is exported through the ppvarlen exporter (fp32, bf16, fp16,
int8; ``--verify`` off, agreement measured here against eager on the same
batches), extra int8 variants are quantized next to it (dynamic: quint8 weights,
per-channel, 8-bit weights without ``reduce_range``; static QDQ calibrated on
train-split batches with the export's uint8 activations, ``int8_static_qdq``, or
int8 ones, ``int8_static_s8``, or with each MatMul's output requantized to uint8,
``int8_static_requant``).  Every runner is
warmed up, then ``--repeats`` passes run interleaved (so load from the other
processes on the machine falls on all alike); the median pass is reported.
Paddle Inference int8 is absent: see docs/PRECISION.md.
Writes ``{work}/precision_throughput.json`` and ``.png`` (or into ``--out``).

``--serve``: the served comparison instead.  The model is exported the way
``ppvarlen-export`` does by default (``Export.precision: [auto]``, verified: the
task-metric gate on the test split, ``-o Export.parity_max_examples=N`` bounds it;
``--train-steps`` gives a random-init model a few AdamW steps first, so its answers are
decided rather than near-tied), then served four times side by side: ``ppvarlen-serve``'s
default (``--backend auto --precision auto``), ``--precision auto`` on each backend
(``--backend paddle`` and ``--backend onnx``; what each picks is logged and read from
``/health``) and ``--backend onnx --precision fp32``, the reference.  Closed-loop clients
send one real review of the test split per request at each ``--concurrency``; points run
interleaved (round, concurrency, then the four servers back to back: A B C D A B C D), each
after a warm-up, with the load average and the server's CPU seconds per text recorded.
Writes ``serve_precision.json`` and ``.png``::

    python benchmarks/precision_throughput.py -c configs/sentiment/transformer.yaml \
        --ernie-base --serve --train-steps 300 --train-lr 3e-5 \
        -o Export.parity_max_examples=256 --calibration-examples 64 \
        --work output/bench/prec_serve --out output/bench/prec_serve
"""
import argparse
import json
import logging
import os
import statistics
import sys
import time

from plots import rounds_chart

from ppvarlen.config import add_config_args, load_config
from ppvarlen.export.precision_speed import one_pass
from ppvarlen.utils.io import atomic_save_png, owned_prefix, reap_dead_owners

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ERNIE_MEDIUM = {"hidden_size": 768, "num_hidden_layers": 6, "num_attention_heads": 12,
                "intermediate_size": 3072, "hidden_act": "gelu", "max_position_embeddings": 2048}
ERNIE_MEDIUM_VOCAB = 40000
ERNIE_BASE = dict(ERNIE_MEDIUM, num_hidden_layers=12)  # ERNIE-3.0-base: 12 x 768, 12 heads


def ernie_medium(cfg, encoder, label_names, train_lengths, shape=None, name="ernie_medium_random"):
    """ppvarlen's ErnieClassifier (PaddleNLP ErnieModel + linear head) at ERNIE-3.0-medium size
    (``shape``: another ErnieModel config, e.g. ``ERNIE_BASE``)."""
    import numpy as np
    import paddle

    from ppvarlen.models.ernie import ErnieClassifier, build_ernie_backbone

    paddle.seed(0)
    config = dict(shape or ERNIE_MEDIUM)
    max_position = config.pop("max_position_embeddings")
    backbone = build_ernie_backbone(None, config, ERNIE_MEDIUM_VOCAB, encoder.pad_id, max_position)
    model = ErnieClassifier(backbone, len(label_names), 0.1)
    model.eval()
    p = np.percentile(train_lengths, [50, 95, 99])
    meta = {"task": "classification", "model_name": name,
            "label_names": label_names, "num_labels": len(label_names),
            "special_ids": {"pad": encoder.pad_id, "unk": encoder.unk_id, "cls": encoder.cls_id,
                            "sep": encoder.sep_id, "bos": None, "eos": None},
            "max_len": cfg.Data.max_len, "max_position": max_position, "long_text": "truncate",
            "buckets": [], "length_profile": {"p50": float(p[0]), "p95": float(p[1]),
                                              "p99": float(p[2]), "max": int(max(train_lengths))}}
    return model, meta


def train_steps(model, train, steps, pad_id, lr=3e-5, rows=16, max_len=64, seed=0):
    """``steps`` AdamW steps on random train-split batches (``train``: encoded items with
    ``label``), texts cut to ``max_len``; -> the last ten losses.  A random-init head's
    logits are near-tied, so any rounding flips argmaxes and the metric gate measures noise;
    training decides the answers.  The rate warms up linearly over the first tenth of the
    steps and gradients are clipped to norm 1: Adam's first steps move every weight of a
    random-init 12-layer encoder at once, which without both throws the loss up."""
    import numpy as np
    import paddle

    rng = np.random.RandomState(seed)
    schedule = paddle.optimizer.lr.LinearWarmup(lr, max(1, steps // 10), 0.0, lr)
    opt = paddle.optimizer.AdamW(learning_rate=schedule, parameters=model.parameters(),
                                 grad_clip=paddle.nn.ClipGradByGlobalNorm(1.0))
    losses = []
    model.train()
    for step in range(steps):
        picked = [train[int(i)] for i in rng.choice(len(train), rows, replace=False)]
        ids = [list(x["input_ids"])[:max_len] for x in picked]
        width = max(map(len, ids))
        batch = np.full((rows, width), pad_id, dtype="int64")
        for r, row in enumerate(ids):
            batch[r, :len(row)] = row
        loss, _ = model(paddle.to_tensor(batch),
                        paddle.to_tensor(np.array([len(r) for r in ids], dtype="int64")),
                        paddle.to_tensor(np.array([int(x["label"]) for x in picked], dtype="int64")))
        loss.backward()
        opt.step()
        opt.clear_grad()
        schedule.step()
        losses.append(float(loss))
        print(f"train step {step + 1}/{steps}: loss {losses[-1]:.4f}", file=sys.stderr, flush=True)
    model.eval()
    return losses[-10:]


def trained_weights(model, train, args, pad_id):
    """``train_steps`` with ``args``' steps and rate, its weights kept in ``{work}`` (safetensors,
    ``models.weights``) and reused by a later run with the same steps and rate: a gate or a serve
    run repeated does not train again.  -> the last losses (None when reused)."""
    from ppvarlen.models.weights import load_weights, save_weights

    path = os.path.join(args.work,
                        f"trained_{args.train_steps}_steps_lr{args.train_lr:g}.safetensors")
    if os.path.exists(path):
        load_weights(model, path)
        print(f"trained weights reused from {path}", file=sys.stderr, flush=True)
        return None
    losses = train_steps(model, train, args.train_steps, pad_id, lr=args.train_lr)
    save_weights(model, path)
    return losses


def interleaved(runners, batches, repeats):
    """({name: [wall seconds per pass]}, {name: [process CPU seconds per pass]}), passes
    round-robin (the agreement pass was the warm-up).  CPU seconds (all threads of this
    process) are the steadier number on a CPU shared with other jobs: a pass that waits
    for a core costs wall time, not CPU time (spinning worker threads do count)."""
    seconds = {name: [] for name in runners}
    cpu = {name: [] for name in runners}
    for r in range(repeats):
        for name, run in runners.items():
            start = time.process_time()
            seconds[name].append(one_pass(run, batches))
            cpu[name].append(time.process_time() - start)
            print(f"pass {r + 1}/{repeats} {name}: {seconds[name][-1]:.2f}s wall, "
                  f"{cpu[name][-1]:.2f}s CPU", file=sys.stderr, flush=True)
    return seconds, cpu


# --int8-variants: quantize_onnx options of each extra int8 copy (static ones are calibrated
# on the benchmark's train sample)
INT8_VARIANTS = {"int8_full_range": dict(reduce_range=False),
                 "int8_quint8": dict(weight_type="quint8"),
                 "int8_per_channel": dict(per_channel=True),
                 "int8_static_qdq": dict(method="static"),
                 "int8_static_s8": dict(method="static", activation_type="qint8"),
                 "int8_static_requant": dict(method="static", matmul_outputs="quint8")}


def build_runners(export_dir, model, outputs, threads, int8_variants, calibration, only=None):
    """{name: runner}; with ``only`` (a set of names) just those are built.  ``outputs``: the
    task's output specs (a runner names the graph's outputs by them)."""
    from ppvarlen.export import parity
    from ppvarlen.export.quantize import quantize_onnx

    onnx_dir = os.path.join(export_dir, "onnx")
    paddle_dir = os.path.join(export_dir, "paddle")
    builders = {"eager": lambda: parity.dygraph_runner(model, outputs)}
    for precision in ("fp32", "bf16"):
        builders[f"paddle_{precision}"] = (lambda p=precision: parity.paddle_inference_runner(
            paddle_dir, outputs, p, threads=threads))
    for precision in ("fp32", "fp16", "int8"):
        name = "model.onnx" if precision == "fp32" else f"model_{precision}.onnx"
        builders[f"onnx_{precision}"] = (lambda n=name: parity.onnx_runner(
            os.path.join(onnx_dir, n), outputs, threads=threads))
    def variant(name):
        path = os.path.join(export_dir, "bench", f"{name}.onnx")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if not os.path.exists(path):
            options = dict(INT8_VARIANTS[name])
            if options.get("method") == "static":
                options["calibration_batches"] = calibration
            # written under this process' name and renamed in: a killed run leaves no half
            # file for the next run to time (and its debris is reaped then)
            reap_dead_owners(os.path.dirname(path))
            tmp = os.path.join(os.path.dirname(path), owned_prefix(".tmp-" + name) + "onnx")
            try:
                quantize_onnx(os.path.join(onnx_dir, "model.onnx"), tmp, **options)
                os.replace(tmp, path)
            finally:
                if os.path.exists(tmp):
                    os.remove(tmp)
        return parity.onnx_runner(path, outputs, threads=threads)
    for name in int8_variants:
        builders[f"onnx_{name}"] = lambda n=name: variant(n)
    unknown = set(only or ()) - set(builders)
    if unknown:
        raise SystemExit(f"--only: no runner(s) {sorted(unknown)}; choose from {sorted(builders)}")
    return {name: build() for name, build in builders.items() if not only or name in only}


def agreement(runners, batches, outputs):
    """Per runner vs eager (vs onnx_fp32 without eager) on the benchmark batches: argmax
    agreement, max |diff| of probs.

    Also the warm-up pass of every runner (oneDNN primitive caches, allocators)."""
    from ppvarlen.export import parity

    reference = "eager" if "eager" in runners else "onnx_fp32"
    backends = {k: v for k, v in runners.items() if k != reference}
    return parity.compare(runners[reference], backends, batches, outputs)


def start_server(export_dir, backend, precision, threads, log_path, timeout_s=900, deploy=()):
    """``ppvarlen-serve`` of ``export_dir`` on a free port, its log in ``log_path`` (the
    precision ``auto`` picked is logged there) -> (process, url) once /health answers.
    ``deploy``: more ``KEY=VALUE`` Deploy settings."""
    from ppvarlen.serve import bench

    overrides = {"threads": threads, **dict(item.split("=", 1) for item in deploy)}
    try:
        return bench.start_server(export_dir, backend, overrides, bench.free_port(),
                                  timeout_s, log_path=log_path, args=("--precision", precision))
    except RuntimeError as e:
        raise SystemExit(f"{backend} {precision}: {e}") from None


def serve_point(url, pid, texts, concurrency, warmup_s, duration_s, seed):
    """One closed-loop measurement: warm-up, then ``duration_s`` of ``concurrency`` clients,
    one text per request -> texts/s, latencies, the server's CPU seconds per text, load."""
    import asyncio

    import httpx
    import psutil  # installed with the project's dependencies (visualdl's)

    from ppvarlen.serve.bench import drive, summarize

    def process_tree_cpu_s(pid):
        root = psutil.Process(pid)
        return sum(sum(p.cpu_times()[:2]) for p in [root] + root.children(recursive=True))

    cap = int(1000 * (duration_s + warmup_s))
    asyncio.run(drive(url, texts, concurrency, cap, warmup_s, seed + 1))
    before = httpx.get(url + "/metrics.json", timeout=30).json()
    cpu0 = process_tree_cpu_s(pid)
    load0 = os.getloadavg()
    latencies, statuses, wall = asyncio.run(drive(url, texts, concurrency, cap, duration_s, seed))
    cpu1 = process_tree_cpu_s(pid)
    after = httpx.get(url + "/metrics.json", timeout=30).json()
    point = summarize(latencies, statuses, wall)
    batches = after["batches"] - before["batches"]
    items = after["items"] - before["items"]
    point.update({"texts_per_s": point["qps"], "batches": batches,
                  "mean_batch": round(items / batches, 2) if batches else None,
                  "server_cpu_s_per_text": round((cpu1 - cpu0) / max(point["ok"], 1), 4),
                  "load_average_before": [round(x, 2) for x in load0],
                  "load_average_after": [round(x, 2) for x in os.getloadavg()]})
    return point


def serve_rounds(servers, texts, concurrencies, rounds, warmup_s, duration_s, seed, label):
    """Closed-loop points over ``servers`` ({name: (process, url)}) interleaved: round,
    concurrency, then every server back to back, the order turned each round (a burst of load
    elsewhere hits every server) -> the points, each with ``label`` = its server's name."""
    points, order = [], list(servers)
    for rnd in range(rounds):
        for c in concurrencies:
            for name in order:
                proc, url = servers[name]
                p = serve_point(url, proc.pid, texts, c, warmup_s, duration_s, seed + rnd)
                p.update({label: name, "round": rnd + 1, "concurrency": c})
                points.append(p)
                print(f"round {rnd + 1} c={c} {label} {name}: {p['texts_per_s']} texts/s, mean "
                      f"batch {p['mean_batch']}, {p['server_cpu_s_per_text']} CPU s/text, load "
                      f"{p['load_average_before'][0]}", flush=True)
        order = order[1:] + order[:1]
    return points


def side_by_side_args(parser, concurrency, out):
    """The flags of a benchmark that loads servers of ``--export`` side by side in interleaved
    rounds (``serve_rounds``), with its defaults for ``--concurrency`` and ``--out``."""
    parser.add_argument("--export", required=True)
    parser.add_argument("--concurrency", type=int, nargs="+", default=concurrency)
    parser.add_argument("--duration-s", type=float, default=20.0)
    parser.add_argument("--warmup-s", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=out)
    return parser


def side_by_side_texts(args):
    """``args.out`` made, a killed run's half-written JSON or PNG reaped there -> the texts of
    the export's test split the clients send."""
    from ppvarlen.serve import bench

    os.makedirs(args.out, exist_ok=True)
    reap_dead_owners(args.out)
    return [t for t in bench.split_texts(args.export) if t.strip()]


def start_side_by_side(servers, export_dir, backend, precision, settings, out, prefix):
    """One ``ppvarlen-serve`` of ``export_dir`` per setting ({name: Deploy keys}), its log at
    OUT/PREFIX_NAME.log, added to ``servers`` ({name: (process, url)}, the caller's to stop)
    as each answers -> {name: its /health}; SystemExit naming a setting that did not start."""
    import httpx

    from ppvarlen.serve import bench

    health = {}
    for name, deploy in settings.items():
        try:
            servers[name] = bench.start_server(
                export_dir, backend, deploy, bench.free_port(), 900,
                log_path=os.path.join(out, f"{prefix}_{name.replace(' ', '_')}.log"),
                args=("--precision", precision))
        except RuntimeError as e:
            raise SystemExit(f"{prefix} {name}: {e}") from None
        health[name] = httpx.get(servers[name][1] + "/health", timeout=30).json()
    return health


def ratios_per_round(points, label, reference, key):
    """Each point's texts/s over ``reference({name: texts/s})`` of its round and concurrency
    -> {key(name, concurrency): [ratio per round]}, printed with the texts/s beside."""
    cells = {}
    for p in points:
        cells.setdefault((p["concurrency"], p["round"]), {})[p[label]] = p["texts_per_s"]
    ratios, texts_s = {}, {}
    for (c, _), got in cells.items():
        base = reference(got)
        for name, v in got.items():
            ratios.setdefault(key(name, c), []).append(round(v / base, 2))
            texts_s.setdefault(key(name, c), []).append(v)
    for k, rs in ratios.items():
        print(f"{k}: {texts_s[k]} texts/s, x the reference per round {rs} "
              f"(median {round(statistics.median(rs), 2)})")
    return ratios


def serve_comparison(args, cfg, model, meta, encoder, bundle):
    """The ``--serve`` mode (module docstring) -> the result dict written as JSON."""
    import httpx
    import psutil

    from ppvarlen.export.exporter import export_model, load_test_split, load_train_sample
    from ppvarlen.serve.bench import split_texts
    from ppvarlen.utils.io import atomic_write_json

    export_dir = os.path.join(args.work, "export_serve")
    trained = None
    if not os.path.exists(os.path.join(export_dir, "manifest.json")):
        if args.train_steps:
            trained = trained_weights(model, bundle.train, args, encoder.pad_id)
        export_model(model, meta, encoder, cfg, export_dir, ["paddle", "onnx"], ["auto"],
                     verify=True, test_examples=load_test_split(cfg, encoder, meta["task"]),
                     calibration_examples=lambda: load_train_sample(
                         cfg, encoder, meta["task"], limit=args.calibration_examples))
    with open(os.path.join(export_dir, "manifest.json")) as f:
        manifest = json.load(f)
    with open(os.path.join(export_dir, "parity.json")) as f:
        parity_report = json.load(f)
    texts = [t for t in split_texts(export_dir) if t.strip()]
    out = args.out or args.work
    os.makedirs(out, exist_ok=True)
    servers = {"auto": ("auto", "auto"), "auto_paddle": ("paddle", "auto"),
               "auto_onnx": ("onnx", "auto"), "onnx_fp32": ("onnx", "fp32")}
    autos = [n for n in servers if n.startswith("auto")]
    procs, urls, health = {}, {}, {}
    try:
        for name, (backend, precision) in servers.items():  # one at a time: auto times at load
            procs[name], urls[name] = start_server(
                export_dir, backend, precision, args.threads,
                os.path.join(out, f"server_{name}.log"),
                deploy=args.auto_deploy if name in autos else ())
            health[name] = httpx.get(urls[name] + "/health", timeout=30).json()
        auto_log = {}
        for name in autos:
            with open(os.path.join(out, f"server_{name}.log")) as f:
                auto_log[name] = [line.strip() for line in f if "precision auto" in line]
        points = []
        for round_no in range(args.rounds):
            for concurrency in args.concurrency:
                for name in servers:
                    point = serve_point(urls[name], procs[name].pid, texts, concurrency,
                                        args.warmup_s, args.duration_s, seed=round_no)
                    point.update(server=name, round=round_no + 1, concurrency=concurrency)
                    points.append(point)
                    print(f"round {point['round']} c={concurrency} {name}: "
                          f"{point['texts_per_s']} texts/s, mean batch {point['mean_batch']}, "
                          f"{point['errors']} errors, load {point['load_average_after'][0]}",
                          file=sys.stderr, flush=True)
        rss = {n: round(psutil.Process(p.pid).memory_info().rss / 2**20) for n, p in procs.items()}
    finally:
        for proc in procs.values():
            proc.terminate()
            try:
                proc.wait(60)
            except Exception:  # noqa: BLE001 - a server that does not drain is killed
                proc.kill()
    summary = {}
    for concurrency in args.concurrency:
        per = {n: [p["texts_per_s"] for p in points if p["server"] == n and
                   p["concurrency"] == concurrency] for n in servers}
        row = {"onnx_fp32_texts_per_s": per["onnx_fp32"]}
        for name in autos:
            ratios = [a / b for a, b in zip(per[name], per["onnx_fp32"]) if b]
            row[name] = {"texts_per_s": per[name],
                         "ratio_per_round": [round(r, 2) for r in ratios],
                         "ratio_median": round(statistics.median(ratios), 2) if ratios else None}
        summary[str(concurrency)] = row
    flags = next((line for line in open("/proc/cpuinfo") if line.startswith("flags")), "")
    result = {"mode": "serve", "model_name": meta["model_name"], "export": export_dir,
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "cpu_count": os.cpu_count(), "threads": args.threads,
              "cpu_flags": [f for f in flags.split() if f.startswith(("avx", "amx"))],
              "train_steps": args.train_steps, "last_train_losses": trained,
              "auto_deploy": args.auto_deploy,
              "texts_pool": len(texts), "duration_s": args.duration_s,
              "warmup_s": args.warmup_s, "rounds": args.rounds,
              "precisions_exported": manifest.get("precisions"),
              "metric_gate": parity_report.get("metric_gate"),
              "left_out": (manifest.get("precision_measured") or {}).get("left_out"),
              "auto_log": auto_log,
              "auto_chose": {n: health[n].get("precision") for n in autos},
              "auto_backend": {n: health[n].get("backend") for n in autos},
              "auto_reason": {n: health[n].get("precision_reason") for n in autos},
              "server_rss_mib_at_end": rss, "points": points, "summary": summary}
    atomic_write_json(os.path.join(out, "serve_precision.json"), result)
    plot_serve(result, os.path.join(out, "serve_precision.png"))
    for concurrency, row in summary.items():
        for name in autos:
            print(f"c={concurrency}: {name} ({result['auto_backend'][name]} "
                  f"{result['auto_chose'][name]}) "
                  f"{row[name]['texts_per_s']} vs onnx fp32 {row['onnx_fp32_texts_per_s']} "
                  f"texts/s: ratio per round {row[name]['ratio_per_round']}, median "
                  f"{row[name]['ratio_median']}")
    return result


def plot_serve(result, path):
    names = [n for n in result["auto_chose"]] + ["onnx_fp32"]
    concurrencies = sorted({p["concurrency"] for p in result["points"]})
    rounds_chart(
        path, [(c, f"concurrency {c}") for c in concurrencies],
        [(n, f"{n} ({result['auto_backend'][n]} {result['auto_chose'][n]})"
          if n != "onnx_fp32" else "ONNX Runtime fp32")
         for n in names],
        lambda name, c: [p["texts_per_s"] for p in result["points"]
                         if p["server"] == name and p["concurrency"] == c],
        "texts/s (dots: rounds, bar: median)",
        f"{result['model_name']} served, {result['cpu_count']} cores, {result['date']}")


def _ratio(value):
    return "-" if value is None else f"{value:.2f}"


def plot(result, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result["runners"])
    speeds = [result["runners"][n]["examples_per_s"] for n in names]
    fig, ax = plt.subplots(figsize=(9, 4))
    bars = ax.barh(names, speeds, color=["#888" if n == "eager" else "#36c" if "paddle" in n
                                         else "#c63" for n in names])
    for bar, n in zip(bars, names):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2,
                f" {result['runners'][n]['vs_onnx_fp32']:.2f}x ORT fp32", va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("examples/s (median of interleaved passes)")
    ax.set_title(f"{result['model_name']}: {result['examples']} test texts, {result['batches']} "
                 f"server batches, {result['threads']} threads (load {result['load_average'][0]:.1f})",
                 fontsize=9)
    fig.tight_layout()
    atomic_save_png(fig, path, dpi=110)


def _key_value(item):
    if "=" not in item:
        raise argparse.ArgumentTypeError(f"{item!r}: give KEY=VALUE, e.g. onednn_shape_grid=false")
    return item


def _variant_names(text):
    """--int8-variants: comma-separated names of INT8_VARIANTS, refused before any export."""
    names = [v for v in text.split(",") if v]
    unknown = [v for v in names if v not in INT8_VARIANTS]
    if unknown:
        raise argparse.ArgumentTypeError(f"no int8 variant(s) {unknown}; choose from "
                                         f"{sorted(INT8_VARIANTS)} ('' for none)")
    return names


def main():
    parser = add_config_args(argparse.ArgumentParser(description=__doc__))
    parser.add_argument("--checkpoint")
    parser.add_argument("--ernie-medium", action="store_true")
    parser.add_argument("--ernie-base", action="store_true",
                        help="12 layers instead of ERNIE-medium's 6 (random init as well)")
    parser.add_argument("--work", required=True, help="export dir + JSON/PNG go here")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-examples", type=int, default=None)
    parser.add_argument("--only", default="",
                        help="time only these runners (+ onnx_fp32, the reference without "
                             "eager), e.g. onnx_int8: eager ERNIE-medium takes ~18 min per "
                             "256 texts")
    parser.add_argument("--int8-variants", type=_variant_names,
                        default="int8_full_range,int8_quint8,int8_per_channel,int8_static_qdq",
                        help="extra int8 copies to time ('' for none): "
                             + ", ".join(INT8_VARIANTS))
    parser.add_argument("--out", default=None, help="JSON/PNG here (default: --work)")
    parser.add_argument("--serve", action="store_true",
                        help="serve auto (each backend) vs ONNX Runtime fp32 and load them (module "
                        "docstring)")
    parser.add_argument("--train-steps", type=int, default=0,
                        help="--serve with --ernie-*: AdamW steps before the export")
    parser.add_argument("--train-lr", type=float, default=3e-5,
                        help="--train-steps: the AdamW peak rate (after a linear warm-up)")
    parser.add_argument("--calibration-examples", type=int, default=256,
                        help="--serve: train texts the int8 scales are calibrated on (the "
                             "exporter's default 256)")
    parser.add_argument("--auto-deploy", action="append", default=[], metavar="KEY=VALUE",
                        type=_key_value,
                        help="--serve: a Deploy setting for the three auto servers only, "
                             "e.g. onednn_cache_bytes=6442450944 (repeatable)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--rounds", type=int, default=2, help="--serve: sweeps (A B A B)")
    parser.add_argument("--duration-s", type=float, default=60.0)
    parser.add_argument("--warmup-s", type=float, default=10.0)
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    import numpy as np
    import paddle

    from ppvarlen.data.collate import Collator
    from ppvarlen.store_build import build_datasets
    from ppvarlen.export import parity
    from ppvarlen.export.exporter import export_model
    from ppvarlen.utils.io import atomic_write_json

    logging.getLogger().setLevel(logging.WARNING)  # onnxruntime.quantization logs per node
    paddle.set_device("cpu")
    cfg = load_config(args.config, args.override)
    if args.checkpoint:
        from ppvarlen.engine.checkpoint import load_for_inference

        model, meta, encoder, _ = load_for_inference(args.checkpoint)
        bundle = build_datasets(cfg.Data, task_hint=meta["task"], encoder=encoder,
                                splits=("train", "test"))
    elif args.ernie_medium or args.ernie_base:
        bundle = build_datasets(cfg.Data, splits=("train", "test"))
        encoder = bundle.encoder
        train_lengths = [len(bundle.train[i]["input_ids"]) for i in range(len(bundle.train))]
        model, meta = ernie_medium(cfg, encoder, bundle.label_names, train_lengths,
                                   *((ERNIE_BASE, "ernie_base_random") if args.ernie_base else ()))
    else:
        parser.error("pass --checkpoint, --ernie-medium or --ernie-base")
    if args.serve:
        return serve_comparison(args, cfg, model, meta, encoder, bundle)
    rng = np.random.RandomState(0)
    test = [{"input_ids": bundle.test[i]["input_ids"]} for i in range(len(bundle.test))]
    if args.max_examples and args.max_examples < len(test):
        test = [test[i] for i in sorted(rng.choice(len(test), args.max_examples, replace=False))]
    collate = Collator(encoder.pad_id)
    _, server = parity.split_batches(test, collate, cfg.Deploy.max_batch_tokens,
                                     cfg.Deploy.max_batch_size)
    batches = [(b["input_ids"], b["seq_len"]) for b in server]
    train_idx = rng.choice(len(bundle.train), min(256, len(bundle.train)), replace=False)
    _, calib = parity.split_batches([{"input_ids": bundle.train[int(i)]["input_ids"]}
                                     for i in train_idx], collate, 4096, 32)
    calibration = [(b["input_ids"], b["seq_len"]) for b in calib]

    export_dir = os.path.join(args.work, "export")
    if not os.path.exists(os.path.join(export_dir, "manifest.json")):
        from ppvarlen.export.exporter import load_train_sample

        # unverified (agreement is measured here); int8's activation scales from train texts
        export_model(model, meta, encoder, cfg, export_dir, ["paddle", "onnx"],
                     ["fp32", "bf16", "fp16", "int8"], verify=False,
                     calibration_examples=lambda: load_train_sample(cfg, encoder, meta["task"]))
    variants = args.int8_variants
    only = set(args.only.split(",")) | {"onnx_fp32"} if args.only else None
    from ppvarlen.tasks import get_task

    outputs = get_task(meta["task"]).output_specs
    runners = build_runners(export_dir, model, outputs, args.threads, variants, calibration, only)
    agree = agreement(runners, batches, outputs)
    print(f"agreement pass done: {agree}", file=sys.stderr, flush=True)
    seconds, cpu_seconds = interleaved(runners, batches, args.repeats)
    examples = sum(len(sl) for _, sl in batches)
    tokens = sum(int(sl.sum()) for _, sl in batches)
    result = {"model_name": meta["model_name"], "examples": examples, "real_tokens": tokens,
              "batches": len(batches), "batch_shapes": [list(ids.shape) for ids, _ in batches],
              "max_batch_tokens": cfg.Deploy.max_batch_tokens,
              "max_batch_size": cfg.Deploy.max_batch_size, "threads": args.threads,
              "repeats": args.repeats, "cpu_count": os.cpu_count(),
              "load_average": list(os.getloadavg()), "runners": {}}
    for name, passes in seconds.items():
        med = statistics.median(passes)
        cpu_med = statistics.median(cpu_seconds[name])
        result["runners"][name] = {"examples_per_s": examples / med, "tokens_per_s": tokens / med,
                                   "examples_per_cpu_s": examples / cpu_med,
                                   "pass_seconds": passes, "pass_cpu_seconds": cpu_seconds[name],
                                   **(agree.get(name) or {})}
    eager = (result["runners"].get("eager") or {}).get("examples_per_s")
    ort32 = result["runners"]["onnx_fp32"]["examples_per_s"]
    pi32 = (result["runners"].get("paddle_fp32") or {}).get("examples_per_s")
    ort_cpu = result["runners"]["onnx_fp32"]["examples_per_cpu_s"]
    for r in result["runners"].values():
        r["vs_eager"] = r["examples_per_s"] / eager if eager else None
        r["vs_onnx_fp32"] = r["examples_per_s"] / ort32
        r["vs_paddle_fp32"] = r["examples_per_s"] / pi32 if pi32 else None
        r["cpu_vs_onnx_fp32"] = r["examples_per_cpu_s"] / ort_cpu
    out = args.out or args.work
    os.makedirs(out, exist_ok=True)
    atomic_write_json(os.path.join(out, "precision_throughput.json"), result)
    plot(result, os.path.join(out, "precision_throughput.png"))
    print(f"{'runner':<24}{'ex/s':>9}{'tok/s':>10}{'vs eager':>9}{'vs ORT32':>9}{'vs PI32':>8}"
          f"{'CPU vs ORT32':>13}{'agree':>9}{'max|dp|':>9}")
    for name, r in result["runners"].items():
        agree_s = "-" if r.get("agreement") is None else f"{r['agreement']:.2%}"
        dp = "-" if r.get("max_prob_diff") is None else f"{r['max_prob_diff']:.3g}"
        print(f"{name:<24}{r['examples_per_s']:>9.1f}{r['tokens_per_s']:>10.0f}"
              f"{_ratio(r['vs_eager']):>9}{_ratio(r['vs_onnx_fp32']):>9}"
              f"{_ratio(r['vs_paddle_fp32']):>8}"
              f"{r['cpu_vs_onnx_fp32']:>13.2f}{agree_s:>9}{dp:>9}")
    print(f"load average {result['load_average']}")


if __name__ == "__main__":
    main()
