"""Greedy seq2seq decoding with finished rows leaving the batch, against the full-batch loop.

    python benchmarks/seq2seq_decode.py --model-dir output/export/g2p \
        --out output/bench/seq2seq_decode [--checkpoint output/g2p/best] [--batch-size 64]

The g2p test split (``Data.corpus: g2p`` rebuilt at the export's source limit, as
``benchmarks/g2p_punctuation.py`` does) is decoded in batches of ``--batch-size`` sources, in
two orders: arrival (the corpus order, what a server's batcher takes from its queue) and
length-sorted (by source length, what ``ppvarlen-infer`` and a full batcher queue form).  Each
batch runs through both loops back to back, the first one alternating (one interleaved run):

``onnx``    the ONNX export's encoder + decoder-step sessions with the numpy loop
            (``ppvarlen.utils.search.greedy_search``, ``shrink=True`` as served, ``shrink=False``
            the full-batch loop); row-steps are counted at the decoder-step session.
``paddle``  with ``--checkpoint``: ``GreedyProgram(shrink=True|False)`` of that checkpoint saved
            to a temporary directory and run by Paddle Inference (oneDNN, the served cache
            capacity); row-steps come from the program's own counter.

A row-step is one row of one decoder step.  Recorded per backend and order: row-steps, wall and
process-CPU seconds of each loop, their ratios (full / shrinking), and the number of sources
whose outputs differ between the two loops (with their batch and row: a near-tie argmax
can flip between two Paddle programs whose kernels oneDNN fuses differently).  Writes ``OUT/seq2seq_decode.json``
and ``OUT/seq2seq_decode.png``; prints the ratios and the CPU's SIMD flags.
"""
import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

from machine import machine


def load_sources(model_dir, max_target_len, examples):
    """The g2p test split's sources as id lists (corpus order), with the export's vocabulary."""
    from ppvarlen.data.sources import load_corpus
    from ppvarlen.data.vocab import TextEncoder
    from ppvarlen.runtime.manifest import load_manifest
    from ppvarlen.tasks import get_task

    manifest = load_manifest(model_dir)
    if not get_task(manifest["task"]).generates:
        raise SystemExit(f"error: {model_dir} is a {manifest['task']} export; give a g2p "
                         f"export")
    encoder = TextEncoder.load(model_dir)
    max_len = int(manifest["max_len"])
    corpus = load_corpus({"corpus": "g2p", "max_source_len": max_len,
                          "max_target_len": max_target_len})
    tests = corpus.splits["test"][:examples] if examples else corpus.splits["test"]
    return manifest, [encoder.encode(encoder.tokenize(ex["source"]))[:max_len] for ex in tests]


def batches_of(sources, size):
    by_length = sorted(sources, key=len)
    return {"arrival": [sources[i:i + size] for i in range(0, len(sources), size)],
            "length_sorted": [by_length[i:i + size] for i in range(0, len(by_length), size)]}


def pad(sources, pad_id):
    lens = np.array([len(s) for s in sources], np.int64)
    ids = np.full((len(sources), int(lens.max())), pad_id, np.int64)
    for i, s in enumerate(sources):
        ids[i, :len(s)] = s
    return ids, lens


def onnx_loops(model_dir, decoding, threads):
    """{"full"|"shrink": run(ids, lens) -> (outputs, row_steps)} over one pair of sessions."""
    from ppvarlen.export import parity
    from ppvarlen.utils.search import greedy_search, length_limits

    run_encoder, run_step = parity.onnx_step_sessions(model_dir, threads)

    def loop(shrink):
        def run(ids, lens):
            rows = 0

            def counted_step(*arrays):
                nonlocal rows
                rows += len(arrays[0])
                return run_step(*arrays)
            limits = length_limits(lens, decoding["max_len_a"], decoding["max_len_b"],
                                   decoding["max_position"])
            out = greedy_search(run_encoder, counted_step, ids, lens, decoding["bos_id"],
                                decoding["eos_id"], limits, shrink=shrink)
            return out, rows
        return run
    return {"full": loop(False), "shrink": loop(True)}


def paddle_loops(checkpoint, decoding, threads, workdir):
    """Both GreedyPrograms of the checkpoint under Paddle Inference, as the server builds it."""
    import paddle.inference as pi

    from ppvarlen.engine.checkpoint import load_for_inference
    from ppvarlen.export.exporter import save_view
    from ppvarlen.models.seq2seq import GreedyProgram
    from ppvarlen.runtime.backends import onednn_cache_capacity
    from ppvarlen.utils.search import strip_eos

    class CountingProgram(GreedyProgram):
        def forward(self, src_ids, src_len):
            return self.decode(src_ids, src_len)

    model = load_for_inference(checkpoint)[0]
    loops = {}
    for name, shrink in (("full", False), ("shrink", True)):
        prefix = os.path.join(workdir, name, "model")
        save_view(CountingProgram(model, shrink=shrink), prefix)
        config = pi.Config(prefix + ".json", prefix + ".pdiparams")
        config.disable_gpu()
        config.enable_onednn()
        config.set_onednn_cache_capacity(
            onednn_cache_capacity(os.path.getsize(prefix + ".pdiparams"), "fp32"))
        config.set_cpu_math_library_num_threads(threads)
        config.disable_glog_info()
        predictor = pi.create_predictor(config)

        def run(ids, lens, predictor=predictor):
            predictor.get_input_handle("src_ids").copy_from_cpu(ids)
            predictor.get_input_handle("src_len").copy_from_cpu(lens)
            predictor.run()
            tokens, row_steps = (predictor.get_output_handle(n).copy_to_cpu()
                                 for n in predictor.get_output_names())
            return strip_eos(tokens, decoding["eos_id"]), int(row_steps)
        loops[name] = run
    return loops


def interleaved(loops, batches, pad_id):
    """Each batch through both loops, alternating which goes first -> per-loop totals."""
    totals = {name: {"row_steps": 0, "wall_s": 0.0, "cpu_s": 0.0} for name in loops}
    differing = []  # (batch, row) whose outputs differ between the loops
    order = list(loops)
    for b, sources in enumerate(batches):
        ids, lens = pad(sources, pad_id)
        outputs = {}
        for name in (order if b % 2 == 0 else order[::-1]):
            wall, cpu = time.perf_counter(), time.process_time()
            outputs[name], row_steps = loops[name](ids, lens)
            totals[name]["wall_s"] += time.perf_counter() - wall
            totals[name]["cpu_s"] += time.process_time() - cpu
            totals[name]["row_steps"] += row_steps
        differing += [[b, i] for i, (x, y) in enumerate(zip(outputs["full"], outputs["shrink"]))
                      if x != y]
    full, shrink = totals["full"], totals["shrink"]
    return {"batches": len(batches), "sources": sum(map(len, batches)), **totals,
            "row_steps_ratio": full["row_steps"] / shrink["row_steps"],
            "wall_ratio": full["wall_s"] / shrink["wall_s"],
            "cpu_ratio": full["cpu_s"] / shrink["cpu_s"],
            "outputs_differing": len(differing), "differing_batch_row": differing}


def plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{backend}\n{order}" for backend, orders in results.items() for order in orders]
    runs = [r for orders in results.values() for r in orders.values()]
    x = np.arange(len(runs))
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for k, (key, name) in enumerate((("row_steps_ratio", "decoder row-steps"),
                                     ("wall_ratio", "wall time"), ("cpu_ratio", "process CPU"))):
        ax.bar(x + (k - 1) * 0.27, [r[key] for r in runs], 0.27, label=name)
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xticks(x, labels)
    ax.set_ylabel("full-batch loop / shrinking loop")
    ax.set_title("greedy decoding, finished rows leaving the batch (higher = shrinking saves)")
    ax.legend()
    fig.tight_layout()
    from ppvarlen.utils.io import atomic_save_png

    atomic_save_png(fig, path, dpi=120)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", required=True, help="a g2p export directory (ONNX format)")
    ap.add_argument("--out", required=True, help="output folder (JSON + PNG), e.g. under output/")
    ap.add_argument("--checkpoint", help="the export's checkpoint: also measure the Paddle "
                                         "program (both loops saved from it)")
    ap.add_argument("--batch-size", type=int, default=64, help="sources per batch "
                                                               "(Deploy.max_batch_size)")
    ap.add_argument("--examples", type=int, default=0, help="first N test sources; 0 = all")
    ap.add_argument("--threads", type=int, default=1, help="math threads per session")
    ap.add_argument("--max-target-len", type=int, default=96,
                    help="Data.max_target_len of the run (the corpus drops longer targets)")
    args = ap.parse_args()
    if args.batch_size < 1:
        ap.error("--batch-size must be >= 1")
    manifest, sources = load_sources(args.model_dir, args.max_target_len, args.examples)
    decoding, pad_id = manifest["decoding"], int(manifest["decoding"]["pad_id"])
    orders = batches_of(sources, args.batch_size)
    backends = {"onnx": onnx_loops(args.model_dir, decoding, args.threads)}
    with tempfile.TemporaryDirectory(prefix="seq2seq_decode-") as workdir:
        if args.checkpoint:
            backends["paddle"] = paddle_loops(args.checkpoint, decoding, args.threads, workdir)
        results = {}
        for backend, loops in backends.items():
            warm = orders["arrival"][0]
            for run in loops.values():  # first-run costs (session set-up, kernel creation)
                run(*pad(warm, pad_id))
            results[backend] = {}
            for order, batches in orders.items():
                r = interleaved(loops, batches, pad_id)
                results[backend][order] = r
                print(f"{backend:6s} {order:13s} {r['sources']} sources: row-steps "
                      f"{r['row_steps_ratio']:.3f}x fewer, wall {r['wall_ratio']:.3f}x, "
                      f"process CPU {r['cpu_ratio']:.3f}x; outputs differing: "
                      f"{r['outputs_differing']}", flush=True)
    host = machine()
    print(f"machine: {host['cpu_model']}, {host['cpu_count']} cores, flags "
          f"{' '.join(host['cpu_simd_flags'])}, load average {host['loadavg']}")
    os.makedirs(args.out, exist_ok=True)
    record = {"command": " ".join([os.path.basename(sys.executable)] + sys.argv),
              "date": time.strftime("%Y-%m-%d", time.gmtime()), "machine": host,
              "model_dir": args.model_dir, "checkpoint": args.checkpoint,
              "batch_size": args.batch_size, "threads": args.threads, "results": results}
    with open(os.path.join(args.out, "seq2seq_decode.json"), "w", encoding="utf-8") as f:
        json.dump(record, f, indent=2)
    plot(results, os.path.join(args.out, "seq2seq_decode.png"))
    print(f"wrote {args.out}/seq2seq_decode.json and .png")


if __name__ == "__main__":
    main()
