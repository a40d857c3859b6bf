"""What the Python transports cost alone: an empty OIP server over REST and over gRPC under perf_analyzer.

    PERF_ANALYZER=.perf_analyzer/perf_analyzer python benchmarks/transport_floor.py \
        [--concurrency 8] [--hold-ms 4] [--window-ms 3000] [--out output/bench/transport_floor]

The floor under ``ppvarlen-serve``'s CPU per request: the same stack (uvicorn with httptools
on uvloop for REST; ``grpc.aio`` on uvloop, the protocol's messages from ``tritonclient``, for
gRPC) serving a model that does nothing: every infer request gets one canned FP32 tensor.
Two ways to answer, on each transport:

* ``now``: the handler answers at once;
* ``held``: the handler waits, as ppvarlen's requests wait for their batch: answers are held
  ``--hold-ms`` by a second thread and released together, one ``call_soon_threadsafe`` per
  batch (what the batcher does).

perf_analyzer drives each of the four at the same concurrency, interleaved, over the same
texts as ``serve_vs_triton.py`` (the quickstart export's test split); the server's CPU seconds
(``psutil``) over the run divided by the requests answered give its CPU ms per request.
Writes ``transport_floor.json`` and ``.png`` under ``--out``.  A note, not a test: the
numbers depend on the machine (recorded with them).
"""
import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

import grpc
import numpy as np
import uvicorn
import uvloop  # uvicorn[standard]'s event loop, the one ppvarlen-serve runs on
from google.protobuf import json_format
from matplotlib.figure import Figure
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc

from ppvarlen.serve.bench import free_port
from ppvarlen.utils.io import atomic_write_json

from machine import machine
from serve_vs_triton import (WINDOWS, find_perf_analyzer, parse_perf_csv, perf_analyzer_command,
                             perf_analyzer_env, perf_analyzer_howto, process_tree_cpu_s,
                             save_figure, texts_for_run)

MODEL = "floor"
ANSWER = np.array([[0.25, 0.75]], dtype=np.float32)
METADATA = {"name": MODEL, "versions": ["1"], "platform": "floor",
            "inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1]}],
            "outputs": [{"name": "probs", "datatype": "FP32", "shape": [-1, 2]}]}
CONFIG = {"name": MODEL, "platform": "floor", "max_batch_size": 0,
          "input": [{"name": "text", "data_type": "TYPE_STRING", "dims": [-1]}],
          "output": [{"name": "probs", "data_type": "TYPE_FP32", "dims": [-1, 2]}]}
VARIANTS = [(t, w) for w in ("now", "held") for t in ("http", "grpc")]


class Holder:
    """Answers released together every ``hold_s`` by a thread of its own (the batcher's
    hand-off: one callback on the loop per batch)."""

    def __init__(self, hold_s):
        self.hold_s, self.loop = hold_s, None
        self._pending, self._lock, self._wake = [], threading.Lock(), threading.Event()

    def start(self, loop):
        self.loop = loop
        threading.Thread(target=self._run, daemon=True).start()

    async def wait(self):
        future = self.loop.create_future()
        with self._lock:
            self._pending.append(future)
        self._wake.set()
        await future

    def _run(self):
        while True:
            self._wake.wait()
            time.sleep(self.hold_s)
            with self._lock:
                batch, self._pending = self._pending, []
                self._wake.clear()
            self.loop.call_soon_threadsafe(_release, batch)


def _release(futures):
    for f in futures:
        if not f.done():
            f.set_result(None)


def rest_app(holder):
    """A bare ASGI app: the OIP routes perf_analyzer reads, and infer."""
    answer = json.dumps({"model_name": MODEL, "model_version": "1", "outputs": [
        {"name": "probs", "datatype": "FP32", "shape": [1, 2],
         "data": ANSWER.ravel().tolist()}]}).encode()
    routes = {"/v2": json.dumps({"name": "floor", "version": "0", "extensions": []}).encode(),
              f"/v2/models/{MODEL}": json.dumps(METADATA).encode(),
              f"/v2/models/{MODEL}/config": json.dumps(CONFIG).encode(),
              f"/v2/models/{MODEL}/ready": b"", "/v2/health/ready": b"", "/v2/health/live": b""}

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        more = True
        while more:  # the body is read whole, as a real handler would
            message = await receive()
            more = message.get("more_body", False)
        path = scope["path"]
        if path == f"/v2/models/{MODEL}/infer":
            if holder is not None:
                await holder.wait()
            body = answer
        else:
            body = routes.get(path)
        status = 404 if body is None else 200
        body = body or b""
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", b"%d" % len(body))]})
        await send({"type": "http.response.body", "body": body})

    return app


class FloorService(service_pb2_grpc.GRPCInferenceServiceServicer):
    def __init__(self, holder):
        self.holder = holder

    async def ServerLive(self, request, context):
        return service_pb2.ServerLiveResponse(live=True)

    async def ServerReady(self, request, context):
        return service_pb2.ServerReadyResponse(ready=True)

    async def ModelReady(self, request, context):
        return service_pb2.ModelReadyResponse(ready=True)

    async def ServerMetadata(self, request, context):
        return service_pb2.ServerMetadataResponse(name="floor", version="0")

    async def ModelMetadata(self, request, context):
        return json_format.ParseDict(METADATA, service_pb2.ModelMetadataResponse())

    async def ModelConfig(self, request, context):
        config = json_format.ParseDict(CONFIG, model_config_pb2.ModelConfig())
        return service_pb2.ModelConfigResponse(config=config)

    async def ModelInfer(self, request, context):
        if self.holder is not None:
            await self.holder.wait()
        return service_pb2.ModelInferResponse(
            model_name=MODEL, model_version="1", id=request.id,
            outputs=[service_pb2.ModelInferResponse.InferOutputTensor(
                name="probs", datatype="FP32", shape=[1, 2])],
            raw_output_contents=[ANSWER.tobytes()])


def serve(transport, port, hold_ms):
    """Run one floor server until killed (``--serve``: a process of its own)."""
    holder = Holder(hold_ms / 1000.0) if hold_ms > 0 else None
    if transport == "http":
        config = uvicorn.Config(rest_app(holder), host="127.0.0.1", port=port, loop="uvloop",
                                http="httptools", log_level="warning", access_log=False)
        server = uvicorn.Server(config)

        async def main():
            if holder is not None:
                holder.start(asyncio.get_running_loop())
            await server.serve()
        uvloop.run(main())
        return

    async def main():
        if holder is not None:
            holder.start(asyncio.get_running_loop())
        server = grpc.aio.server()
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(FloorService(holder), server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        await server.wait_for_termination()
    uvloop.run(main())


def wait_listening(port, proc, timeout_s=30):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the floor server exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"the floor server did not listen on {port} in {timeout_s} s")


def measure(binary, env, variant, hold_ms, concurrency, input_file, window_ms, work):
    transport, how = variant
    port = free_port()
    cmd = [sys.executable, os.path.abspath(__file__), "--serve", transport, "--port", str(port),
           "--hold-ms", str(hold_ms if how == "held" else 0)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_listening(port, proc)
        csv_path = os.path.join(work, f"{transport}_{how}.csv")
        pa = perf_analyzer_command(binary, MODEL, f"127.0.0.1:{port}", transport, concurrency,
                                   input_file, window_ms, csv_path)
        cpu0, start = process_tree_cpu_s(proc.pid), time.perf_counter()
        r = subprocess.run(pa, capture_output=True, text=True, env=env,
                           timeout=WINDOWS * window_ms / 1000 * 4 + 120)
        wall, cpu1 = time.perf_counter() - start, process_tree_cpu_s(proc.pid)
        if r.returncode != 0:
            raise RuntimeError(f"perf_analyzer failed on the {transport} floor:\n"
                               f"{(r.stdout + r.stderr)[-1500:]}")
        with open(csv_path, encoding="utf-8") as f:
            row = parse_perf_csv(f.read())[-1]
        qps = row["Inferences/Second"]
        # perf_analyzer's windows are most of the wall time: requests ~ QPS x wall (an upper
        # bound on the requests, so the CPU per request is if anything low: a floor)
        return {"transport": transport, "answer": how, "concurrency": concurrency,
                "qps": qps, "p99_ms": round(row["p99 latency"] / 1000, 2),
                "server_cpu_cores_busy": round((cpu1 - cpu0) / wall, 2),
                "server_cpu_ms_per_request": round((cpu1 - cpu0) / (qps * wall) * 1000, 3),
                "loadavg_1m_before": round(os.getloadavg()[0], 2), "command": " ".join(pa)}
    finally:
        proc.kill()
        proc.wait(10)


def plot(results, path):
    rows = results["measurements"]
    labels = [f"{r['transport']} {r['answer']}" for r in rows]
    fig = Figure(figsize=(10, 4))
    a, b = fig.subplots(1, 2)
    a.bar(labels, [r["server_cpu_ms_per_request"] for r in rows])
    a.set_ylabel("server CPU ms per request")
    b.bar(labels, [r["qps"] for r in rows])
    b.set_ylabel("requests/s (perf_analyzer)")
    for ax in (a, b):
        ax.tick_params(axis="x", rotation=20)
    save_figure(fig, path, f"empty OIP server, c={rows[0]['concurrency']}: the transport alone")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", choices=["http", "grpc"], help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", default="output/quickstart/export",
                        help="the export whose test texts are sent (only their bytes matter)")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--hold-ms", type=float, default=4.0,
                        help="how long 'held' answers wait for their batch")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--window-ms", type=int, default=3000)
    parser.add_argument("--out", default="output/bench/transport_floor")
    args = parser.parse_args(argv)
    if args.serve:
        return serve(args.serve, args.port, args.hold_ms)
    binary, looked = find_perf_analyzer()
    if binary is None:
        raise SystemExit(perf_analyzer_howto(looked))
    env = perf_analyzer_env(binary)
    results = {"benchmark": "transport_floor", "machine": machine(),
               "settings": {k: getattr(args, k) for k in
                            ("concurrency", "hold_ms", "rounds", "window_ms", "model_dir")},
               "measurements": []}
    with tempfile.TemporaryDirectory(prefix="transport_floor_") as work:
        input_file = os.path.join(work, "input.json")
        with open(input_file, "w", encoding="utf-8") as f:
            json.dump({"data": [{"text": [t]} for t in texts_for_run(args.model_dir, 0)]}, f,
                      ensure_ascii=False)
        for r in range(args.rounds):
            for variant in (VARIANTS if r % 2 == 0 else VARIANTS[::-1]):
                m = measure(binary, env, variant, args.hold_ms, args.concurrency, input_file,
                            args.window_ms, work)
                m["round"] = r
                results["measurements"].append(m)
                print(f"round {r} {m['transport']:4s} {m['answer']:4s}: {m['qps']} requests/s, "
                      f"{m['server_cpu_ms_per_request']} CPU ms/request, "
                      f"{m['server_cpu_cores_busy']} cores, load {m['loadavg_1m_before']}",
                      flush=True)
    summary = {}
    for transport, how in VARIANTS:
        rows = [m for m in results["measurements"]
                if (m["transport"], m["answer"]) == (transport, how)]
        summary[f"{transport}_{how}"] = {
            "qps": round(float(np.mean([m["qps"] for m in rows])), 1),
            "server_cpu_ms_per_request": round(float(np.mean(
                [m["server_cpu_ms_per_request"] for m in rows])), 3)}
    results["summary"] = summary
    os.makedirs(args.out, exist_ok=True)
    atomic_write_json(os.path.join(args.out, "transport_floor.json"), results)
    plot({"measurements": [m for m in results["measurements"] if m["round"] == 0]},
         os.path.join(args.out, "transport_floor.png"))
    for name, s in summary.items():
        print(f"{name:10s} {s['qps']:8.1f} requests/s  {s['server_cpu_ms_per_request']:.3f} "
              f"server CPU ms/request")
    return results


if __name__ == "__main__":
    main()
