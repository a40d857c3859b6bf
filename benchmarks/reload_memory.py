"""Memory of a model-repository server across hot reloads: does unloading give memory back?

    python benchmarks/reload_memory.py --export output/export/sentiment [--backend paddle]
        [--reloads 5] [--requests 200] [--json output/bench/reload_memory.json]

Copies ``--export`` into a temporary repository as version 1, starts
``deploy/python/serve.py --model-repository`` (a subprocess), sends ``--requests`` requests,
and reads the server's ``RssAnon`` and ``VmRSS`` (/proc/PID/status).  Then ``--reloads``
times: the next version (a copy of the same export) is renamed in, loaded through
``POST /v2/repository/models/NAME/load`` (the previous version drains and is unloaded), the
same requests are sent, and memory is read again.  Each reading is taken with exactly one
version loaded, so a growth from reading to reading is memory an unload did not give back.
RssAnon (anonymous memory) is the number that matters: RSS also counts file-backed pages
of the mapped model files, which the kernel may drop or keep.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import httpx

from ppvarlen.utils.io import atomic_write_text

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEXTS = ["这部电影真好看", "服务很差，再也不来了", "今天天气不错", "质量一般般",
         "房间干净，早餐丰富，推荐！这家酒店的位置也很方便，离地铁站只有五分钟"]


def memory_kib(pid):
    """{"RssAnon": KiB, "VmRSS": KiB} of process ``pid``."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("RssAnon", "VmRSS"):
                out[key] = int(rest.split()[0])
    return out


def wait_ready(url, proc, port_file, timeout=300):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode}")
        try:
            if os.path.exists(port_file) and url is None:
                url = f"http://127.0.0.1:{int(open(port_file).read())}"
            if url and httpx.get(url + "/v2/health/ready", timeout=30).status_code == 200:
                return url
        except (httpx.TransportError, ValueError):
            pass
        time.sleep(0.2)
    raise SystemExit("the server did not become ready")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--export", required=True, help="an export directory (tools/export.py)")
    ap.add_argument("--backend", choices=["paddle", "onnx"], default="paddle")
    ap.add_argument("--reloads", type=int, default=5)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--json", default=None, help="write the readings here too")
    args = ap.parse_args()

    work = tempfile.mkdtemp(prefix="reload_memory_")
    root, name = os.path.join(work, "models"), "model"
    shutil.copytree(args.export, os.path.join(root, name, "1"))
    port_file = os.path.join(work, "port")
    proc = subprocess.Popen([sys.executable, os.path.join(REPO, "deploy/python/serve.py"),
                             "--model-repository", root, "--backend", args.backend, "--port",
                             "0", "--port-file", port_file, "-o", "Deploy.repository_poll_s=0"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    readings = []
    try:
        url = wait_ready(None, proc, port_file)
        with httpx.Client(timeout=120) as client:
            for version in range(1, args.reloads + 2):
                if version > 1:
                    staging = os.path.join(work, f".staging-{version}")
                    shutil.copytree(args.export, staging)
                    os.rename(staging, os.path.join(root, name, str(version)))
                    r = client.post(f"{url}/v2/repository/models/{name}/load")
                    if r.status_code != 200:
                        raise SystemExit(f"version {version} refused: {r.text}")
                for i in range(args.requests):
                    r = client.post(url + "/predict", json={"texts": [TEXTS[i % len(TEXTS)]]})
                    assert r.json()["model_version"] == str(version), r.text
                readings.append({"version": version, **memory_kib(proc.pid)})
                print(f"version {version} serving (the previous one unloaded): RssAnon "
                      f"{readings[-1]['RssAnon'] / 1024:.1f} MiB, VmRSS "
                      f"{readings[-1]['VmRSS'] / 1024:.1f} MiB", flush=True)
    finally:
        proc.terminate()
        proc.wait(120)
        shutil.rmtree(work, ignore_errors=True)
    first, last = readings[0], readings[-1]
    summary = {"export": args.export, "backend": args.backend, "requests": args.requests,
               "readings": readings,
               "rss_anon_last_over_first": last["RssAnon"] / first["RssAnon"],
               "vm_rss_last_over_first": last["VmRSS"] / first["VmRSS"]}
    print(f"after {args.reloads} reloads: RssAnon {summary['rss_anon_last_over_first'] - 1:+.1%},"
          f" VmRSS {summary['vm_rss_last_over_first'] - 1:+.1%} of the first version's")
    if args.json:
        atomic_write_text(args.json, json.dumps(summary, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
