"""Ray on one machine vs one process: batch rows/s, serving QPS / P99 (one run; a note, not a test).

    PYTHONPATH=$PWD python benchmarks/ray_inference.py --model-dir output/export \\
        [--backend paddle] [--repeat 4] [--actors 2] [--concurrency 16] [--requests 1500] \\
        [--out output/bench/ray_inference]

Batch: the sentiment test split (x ``--repeat``) as JSONL, predicted by
``ppvarlen.runtime.infer.run_file`` (what deploy/python/infer.py runs) in this process, then
by ``run_batch`` with ``--actors`` predictor actors on a local Ray cluster (wall time,
actor start-up included).  Serving: the same closed-loop clients as bench_client.py
(``ppvarlen.serve.bench.drive``, one text per request) against serve.py and against the
Ray Serve deployment of deploy/ray/serve.yaml (2 replicas).  Writes JSON + PNG.
"""
import argparse
import asyncio
import json
import os
import tempfile
import time


def batch_numbers(model_dir, backend, texts, actors, window):
    import ray

    from ppvarlen.runtime.infer import run_file
    from ppvarlen.runtime.predictor import Predictor
    from ppvarlen.integrations.ray_batch import run_batch

    work = tempfile.mkdtemp(prefix="ray_bench_")
    src = os.path.join(work, "texts.jsonl")
    with open(src, "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"id": k, "text": t}, ensure_ascii=False) + "\n"
                     for k, t in enumerate(texts))
    single = run_file(Predictor(model_dir, backend), src, os.path.join(work, "single.jsonl"),
                      progress=False)
    ray_run = run_batch(model_dir, src, os.path.join(work, "ray_out"), backend, actors=actors,
                        window=window, unit_bytes=256 << 10)
    assert ray_run["rows_out"] == single["predicted"] == len(texts)
    ray_cpus = ray.cluster_resources().get("CPU")
    return {"rows": len(texts), "single_process": {
        "rows_per_s": single["texts_per_s"], "padding_efficiency": single["padding_efficiency"],
        "seconds": single["seconds"]},
        "ray": {"actors": actors, "cluster_cpus": ray_cpus, "window": window,
                "rows_per_s": ray_run["rows_per_s"], "seconds": ray_run["seconds"],
                "first_answers_after_s": ray_run["first_answers_after_s"],
                "rows_per_s_after_first": ray_run["rows_per_s_after_first"],
                "padding_efficiency": ray_run["padding_efficiency"]}}


def serving_numbers(model_dir, backend, texts, concurrency, requests):
    import httpx
    from ray import serve

    from ppvarlen.serve import bench
    from ppvarlen.integrations.ray_serve import load_serve_config, run_config

    def measure(url):
        asyncio.run(bench.drive(url, texts, concurrency, 50, 60, seed=1))  # warm-up
        lat, statuses, wall = asyncio.run(bench.drive(url, texts, concurrency, requests, 120))
        out = bench.summarize(lat, statuses, wall)
        out["server_padding_efficiency"] = httpx.get(url + "/metrics.json").json()["padding_efficiency"]
        return out

    results = {"concurrency": concurrency}
    proc, url = bench.start_server(model_dir, backend, {}, bench.free_port())
    try:
        results["serve_py"] = measure(url)
    finally:
        bench.stop_server(proc)
    config = load_serve_config("deploy/ray/serve.yaml", model_dir)
    config.http_options.port = bench.free_port()
    config.applications[0].args["backend"] = backend
    try:
        results["ray_serve"] = measure(run_config(config))
        results["ray_serve"]["replicas"] = config.applications[0].deployments[0].num_replicas
    finally:
        serve.shutdown()
    return results


def plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    b, s = results["batch"], results["serving"]
    fig, axes = plt.subplots(1, 3, figsize=(12, 4))
    axes[0].bar(["one process", f"Ray, {b['ray']['actors']} actors", "Ray, once\nactors were up"],
                [b["single_process"]["rows_per_s"], b["ray"]["rows_per_s"],
                 b["ray"]["rows_per_s_after_first"] or 0], color=["C0", "C1", "C2"])
    axes[0].set_title(f"batch inference, {b['rows']} rows")
    axes[0].set_ylabel("rows / s")
    names = ["serve.py", f"Ray Serve, {s['ray_serve']['replicas']} replicas"]
    axes[1].bar(names, [s["serve_py"]["qps"], s["ray_serve"]["qps"]], color=["C0", "C1"])
    axes[1].set_title(f"QPS ({s['concurrency']} clients)")
    axes[2].bar(names, [s["serve_py"]["latency_ms"]["p99"], s["ray_serve"]["latency_ms"]["p99"]],
                color=["C0", "C1"])
    axes[2].set_title("P99 latency (ms)")
    fig.suptitle("2 shared CPU cores, other jobs running: contended numbers")
    fig.tight_layout()
    from ppvarlen.utils.io import atomic_save_png

    atomic_save_png(fig, path, dpi=100)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--backend", choices=["paddle", "onnx"], default="paddle")
    parser.add_argument("--repeat", type=int, default=4, help="copies of the test split")
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--window", type=int, default=1024)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--requests", type=int, default=1500)
    parser.add_argument("--out", default="output/bench/ray_inference")
    args = parser.parse_args()

    import ray

    from ppvarlen.serve.bench import split_texts
    from ppvarlen.utils.io import atomic_write_json

    texts = split_texts(args.model_dir)
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    start = time.time()
    try:
        results = {"model_dir": os.path.abspath(args.model_dir), "backend": args.backend,
                   "cpu_count": os.cpu_count(), "load_average_at_start": os.getloadavg(),
                   "note": "2 cores shared with other jobs: contended, one run",
                   "batch": batch_numbers(args.model_dir, args.backend, texts * args.repeat,
                                          args.actors, args.window),
                   "serving": serving_numbers(args.model_dir, args.backend, texts,
                                              args.concurrency, args.requests)}
    finally:
        ray.shutdown()
    results["load_average_at_end"] = os.getloadavg()
    results["wall_s"] = round(time.time() - start, 1)
    os.makedirs(args.out, exist_ok=True)
    atomic_write_json(os.path.join(args.out, "ray_inference.json"), results)
    plot(results, os.path.join(args.out, "ray_inference.png"))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
