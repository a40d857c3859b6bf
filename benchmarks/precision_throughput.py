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
batches), extra int8 variants are quantized next to it (quint8 weights,
per-channel, static QDQ calibrated on train-split batches, and 8-bit
weights without ``reduce_range``).  Every runner is
warmed up, then ``--repeats`` passes run interleaved (so load from the other
processes on the machine falls on all alike); the median pass is reported.
Paddle Inference int8 is absent: see docs/PRECISION.md.
Writes ``{work}/precision_throughput.json`` and ``.png``.
"""
import argparse
import logging
import os
import statistics
import sys
import time

from ppvarlen.config import add_config_args, load_config
from ppvarlen.export.precision_speed import one_pass

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
    variants = {"int8_full_range": dict(reduce_range=False),
                "int8_quint8": dict(weight_type="quint8"),
                "int8_per_channel": dict(per_channel=True),
                "int8_static_qdq": dict(method="static", calibration_batches=calibration)}

    def variant(name):
        path = os.path.join(export_dir, "bench", f"{name}.onnx")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if not os.path.exists(path):
            quantize_onnx(os.path.join(onnx_dir, "model.onnx"), path, **variants[name])
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
    fig.savefig(path, dpi=110)


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
    parser.add_argument("--int8-variants",
                        default="int8_full_range,int8_quint8,int8_per_channel,int8_static_qdq",
                        help="extra int8 copies to time ('' for none)")
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
        export_model(model, meta, encoder, cfg, export_dir, ["paddle", "onnx"],
                     ["fp32", "bf16", "fp16", "int8"], verify=False)
    variants = [v for v in args.int8_variants.split(",") if v]
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
    os.makedirs(args.work, exist_ok=True)
    atomic_write_json(os.path.join(args.work, "precision_throughput.json"), result)
    plot(result, os.path.join(args.work, "precision_throughput.png"))
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
