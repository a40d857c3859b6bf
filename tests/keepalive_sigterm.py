"""SIGTERM while clients hold idle keep-alive connections (tests/serve/test_faults_versions.py and a
command-line measurement: ``python tests/keepalive_sigterm.py EXPORT_DIR RUNS [CLIENTS
[SPREAD_S]]``).

Each client sends a request on its connection and reads the answer (the connection is now an
idle keep-alive one), then the server gets SIGTERM and every client sends another request
at once, spread over the first ~100 ms.  What each gets: "503" (with Retry-After),
"closed" (end of file: the server closed the connection), "reset" (ECONNRESET), or
"other: ..."."""
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BODY = json.dumps({"texts": ["这部电影真好看"]}).encode()
REQUEST = (b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           b"Content-Length: %d\r\n\r\n" % len(BODY)) + BODY


def read_response(sock):
    """-> (status, headers dict) of one response, or "closed" at end of file."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return "closed", {}
        data += chunk
    head, rest = data.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    headers = {k.lower(): v for k, v in headers.items()}
    length = int(headers.get("content-length", 0))
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        rest += chunk
    return int(lines[0].split()[1]), headers


def start_server(export_dir, port_file, log_path):
    proc = subprocess.Popen(
        [sys.executable, os.path.join(REPO, "deploy/python/serve.py"), "--model-dir", export_dir,
         "--backend", "onnx", "--port", "0", "--port-file", str(port_file)],
        stdout=open(log_path, "w"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 180
    while not (os.path.exists(port_file) and open(port_file).read().strip()):
        assert proc.poll() is None, open(log_path).read()[-2000:]
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.1)
    return proc, int(open(port_file).read())


def one_run(export_dir, workdir, clients=8, spread_s=0.1):
    """-> list of outcomes, one per client, and the server's exit code."""
    port_file, log_path = os.path.join(workdir, "port"), os.path.join(workdir, "server.log")
    if os.path.exists(port_file):
        os.remove(port_file)
    proc, port = start_server(export_dir, port_file, log_path)
    socks = []
    try:
        deadline = time.monotonic() + 180
        while True:  # listening before the app is up: the first answer may take a while
            try:
                s = socket.create_connection(("127.0.0.1", port), timeout=60)
                s.sendall(REQUEST)
                if read_response(s)[0] == 200:
                    socks.append(s)
                    break
                s.close()
            except OSError:
                pass
            assert time.monotonic() < deadline, "no 200 from the server"
            time.sleep(0.1)
        for _ in range(clients - 1):
            s = socket.create_connection(("127.0.0.1", port), timeout=60)
            s.sendall(REQUEST)
            assert read_response(s)[0] == 200
            socks.append(s)
        outcomes = [None] * clients
        start = threading.Event()

        def ask(k):
            start.wait()
            time.sleep(spread_s * k / clients)
            s = socks[k]
            try:
                s.sendall(REQUEST)
                status, headers = read_response(s)
                outcomes[k] = ("503" if status == 503 and "retry-after" in headers
                               else str(status))
            except ConnectionResetError:
                outcomes[k] = "reset"
            except OSError as e:
                outcomes[k] = f"other: {e!r}"

        threads = [threading.Thread(target=ask, args=(k,)) for k in range(clients)]
        for t in threads:
            t.start()
        proc.send_signal(signal.SIGTERM)
        start.set()
        for t in threads:
            t.join(120)
        code = proc.wait(120)
    finally:
        for s in socks:
            s.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait(60)
    return outcomes, code


if __name__ == "__main__":
    import collections
    import tempfile

    export, runs = sys.argv[1], int(sys.argv[2])
    clients = int(sys.argv[3]) if len(sys.argv) > 3 else 8
    spread = float(sys.argv[4]) if len(sys.argv) > 4 else 0.1
    total = collections.Counter()
    with tempfile.TemporaryDirectory() as work:
        for run in range(runs):
            outcomes, code = one_run(export, work, clients, spread)
            total.update(outcomes)
            print(f"run {run}: exit {code}, {collections.Counter(outcomes)}", flush=True)
    print("total:", dict(total))
