"""The gRPC front end is a process of its own (``deploy.grpc_front``): it stops with the server,
exits when the server's end of its socket pair closes (the server died), is started again on
the same port when it dies on its own, and a port it cannot bind is refused naming it."""
import os
import signal
import socket
import subprocess
import time

import grpc
import numpy as np
import pytest
import tritonclient.grpc as tgrpc
from export_helpers import cls_export  # noqa: F401
from test_server import RunningServer

from ppvarlen.serve.grpc.front import Relay
from ppvarlen.serve.grpc.service import front_end_command
from ppvarlen.serve.protocols.oip.grpc import METHOD_PATHS, METHODS, SERVICE
from ppvarlen.runtime.predictor import Predictor
from ppvarlen.serve.grpc.frames import CALL, HELLO, MAX_CALL_ID, FrameReader, call_frame
from ppvarlen.serve.server import create_app, deploy_settings


def _infer_one(port, name):
    client = tgrpc.InferenceServerClient(f"127.0.0.1:{port}")
    try:
        text = tgrpc.InferInput("text", [1], "BYTES")
        text.set_data_from_numpy(np.array(["一条评论".encode()], dtype=np.object_))
        return client.infer(name, [text]).as_numpy("label")
    finally:
        client.close()


def _serves(port, name):
    try:
        return _infer_one(port, name).shape == (1,)
    except Exception:  # noqa: BLE001 - not listening yet
        return False


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _wait(condition, what, timeout=60):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_the_front_end_is_restarted_when_killed_and_stops_with_the_server(cls_export):  # noqa: F811
    predictor = Predictor(cls_export[0], "onnx")
    app = create_app(predictor, deploy=deploy_settings(max_wait_ms=1), grpc_port=0)
    with RunningServer(app):
        grpc_server = app.state.grpc
        name = app.state.registry.names()[0]
        first, port = grpc_server.front_end_pid, grpc_server.port
        assert first != os.getpid() and _alive(first)
        assert _infer_one(port, name).shape == (1,)
        os.kill(first, signal.SIGKILL)
        _wait(lambda: grpc_server.front_end_pid != first, "a new front end")
        second = grpc_server.front_end_pid
        _wait(lambda: _serves(port, name), "the new front end to answer on the same port")
        assert grpc_server.port == port
    assert not _alive(second), "the front end outlived the server"


def _front_end(port, max_calls=4, cwd=None):
    ours, theirs = socket.socketpair()
    proc = subprocess.Popen(front_end_command(theirs.fileno(), "127.0.0.1", port, 8192, 8192,
                                              max_calls, METHOD_PATHS),
                            pass_fds=(theirs.fileno(),), cwd=cwd)
    theirs.close()
    hello = []
    reader = FrameReader(lambda kind, call_id, code, auth, body: hello.append(
        (kind, call_id, body.decode())))
    ours.settimeout(60)
    while not hello:
        data = ours.recv(65536)
        assert data, "the front end closed without a hello"
        reader.feed(data)
    assert hello[0][0] == HELLO
    return proc, ours, hello[0][1], hello[0][2]


def test_the_front_end_exits_when_the_server_end_closes():
    proc, ours, port, why = _front_end(0)
    try:
        assert port > 0 and why == ""
        ours.close()  # what the server's death does to its end
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_the_front_end_runs_this_ppvarlen_whatever_the_working_directory_holds(tmp_path):
    (tmp_path / "ppvarlen").mkdir()
    (tmp_path / "ppvarlen" / "__init__.py").write_text(
        "raise ImportError('the ppvarlen of the working directory was imported')\n")
    proc, ours, port, why = _front_end(0, cwd=tmp_path)
    try:
        assert port > 0 and why == ""
        ours.close()
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_port_the_front_end_cannot_bind_is_refused_naming_it():
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    busy = taken.getsockname()[1]
    try:
        proc, ours, port, why = _front_end(busy)
        assert port == 0 and f"cannot listen on 127.0.0.1:{busy} for gRPC" in why, why
        assert proc.wait(30) == 0
        ours.close()
    finally:
        taken.close()


@pytest.mark.parametrize("path", METHOD_PATHS)
def test_every_relayed_method_has_its_services_request_message(path):
    service, method = path.split("/")
    package = service.rpartition(".")[0]
    expected = "HealthCheckRequest" if service == "grpc.health.v1.Health" else f"{method}Request"
    assert METHODS[method].DESCRIPTOR.full_name == f"{package}.{expected}"


def test_call_ids_wrap_within_the_frames_32_bits():
    relay = Relay(stopped=None)
    relay.last_id = MAX_CALL_ID - 1
    ids = [relay.next_call_id() for _ in range(3)]
    assert ids == [MAX_CALL_ID, 1, 2]
    read = []  # every id fits the header and reads back as sent
    reader = FrameReader(lambda kind, call_id, code, auth, body: read.append(call_id))
    reader.feed(b"".join(call_frame(call_id, 0, "", b"x") for call_id in ids))
    assert read == ids


def test_calls_past_the_front_ends_bound_get_resource_exhausted():
    proc, ours, port, _ = _front_end(0, max_calls=1)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            live = channel.unary_unary(f"/{SERVICE}/ServerLive")  # raw bytes both ways
            first = live.future(b"", timeout=60)  # relayed, never answered by this test
            calls = []
            reader = FrameReader(lambda kind, *rest: calls.append(kind))
            while CALL not in calls:
                reader.feed(ours.recv(65536))
            with pytest.raises(grpc.RpcError) as err:
                live(b"", timeout=60)
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            ours.close()  # the server is gone: the call in flight ends, the front end exits
            assert proc.wait(30) == 0
            with pytest.raises(grpc.RpcError):
                first.result()
    finally:
        if proc.poll() is None:
            proc.kill()
