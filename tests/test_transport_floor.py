"""benchmarks/transport_floor.py's empty servers answer the OIP clients perf_analyzer stands in
for (tritonclient over REST and gRPC), at once and after the held release; no perf_analyzer,
no timing asserted."""
import os
import subprocess
import sys

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from script_loader import REPO, load_script

from ppvarlen.serve.bench import free_port


@pytest.fixture(scope="module")
def floor():
    return load_script("benchmarks/transport_floor.py")


@pytest.mark.parametrize("transport", ["http", "grpc"])
@pytest.mark.parametrize("hold_ms", [0, 20])
def test_the_floor_servers_answer_tritonclient(floor, transport, hold_ms):
    port = free_port()
    proc = subprocess.Popen([sys.executable, os.path.join(REPO, "benchmarks", "transport_floor.py"),
                             "--serve", transport, "--port", str(port), "--hold-ms", str(hold_ms)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        floor.wait_listening(port, proc)
        client = (httpclient if transport == "http" else grpcclient)
        c = client.InferenceServerClient(f"127.0.0.1:{port}")
        meta = c.get_model_metadata(floor.MODEL)
        config = c.get_model_config(floor.MODEL)
        if transport == "http":
            assert meta["inputs"][0]["name"] == "text" and config["max_batch_size"] == 0
        else:
            assert meta.inputs[0].name == "text" and config.config.max_batch_size == 0
        text = client.InferInput("text", [1], "BYTES")
        text.set_data_from_numpy(np.array(["一条评论".encode()], dtype=object))
        answer = c.infer(floor.MODEL, [text]).as_numpy("probs")
        np.testing.assert_array_equal(answer, floor.ANSWER)
    finally:
        proc.kill()
        proc.wait(10)
