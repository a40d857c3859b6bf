"""gRPC transport: the front end process (``front``) that speaks gRPC, relaying each call's
bytes over a socket pair (``frames``) to a protocol's service running here, on an event loop in
a thread of its own; requests reach the batchers through thread-safe futures.

The service (a protocol's: ``protocols.oip.grpc.InferenceService``) has a ``name``, its
``method_names`` and ``async call(method, request bytes, authorization) -> (grpc status code,
body)``; this module knows no protocol.  Bounds: at most ``Deploy.max_connections`` calls at
once (RESOURCE_EXHAUSTED beyond, by the front end); past twice ``Deploy.max_body_bytes`` a
message is refused by grpc core in the front end.  The front end exiting on its own is logged
and it is started again on the same port.
"""
import asyncio
import os
import socket
import subprocess
import sys
import threading

from ppvarlen.utils.log import get_logger
from ppvarlen.utils.parallel import child_environ

from ppvarlen.serve.grpc.frames import CALL, HELLO, FramedProtocol, answer_frame, stop_frame

try:  # uvicorn[standard]'s event loop where it installs (not on Windows), as uvicorn picks it
    import uvloop
except ImportError:  # pragma: no cover - platforms without uvloop
    uvloop = None

log = get_logger("serve.grpc")
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class _ServerEnd(FramedProtocol):
    """The server's end of the socket pair: each relayed call answered in a task of its own."""

    def __init__(self, service, hello, lost):
        super().__init__()
        self.service, self.hello, self.lost = service, hello, lost
        self.tasks = set()

    def connection_lost(self, exc):
        if not self.hello.done():
            self.hello.set_result((0, "the gRPC front end exited before it listened"))
        self.lost.set()

    def on_frame(self, kind, call_id, code, authorization, body):
        if kind == HELLO:
            if not self.hello.done():
                self.hello.set_result((call_id, body.decode("utf-8", "replace")))
        elif kind == CALL:
            task = asyncio.ensure_future(self._answer(call_id, self.service.method_names[code],
                                                      authorization.decode("utf-8", "replace"),
                                                      body))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _answer(self, call_id, method, authorization, body):
        code, out = await self.service.call(method, body, authorization)
        if not self.transport.is_closing():
            self.transport.write(answer_frame(call_id, code.value[0], out))


def front_end_command(fd, host, port, max_receive, max_send, max_calls, paths):
    """The command that starts the front end on its end ``fd`` of the socket pair, serving
    the methods ``paths`` ("service/method", in code order).  ``-P``: ``-m`` would put the
    working directory first on the path, where another ppvarlen may be."""
    return [sys.executable, "-P", "-m", "ppvarlen.serve.grpc.front", "--fd", str(fd),
            "--host", host, "--port", str(port), "--methods", ",".join(paths),
            "--max-receive", str(max_receive), "--max-send", str(max_send),
            "--max-calls", str(max_calls)]


def _front_end_env():
    """This process's environment, with the directory this ppvarlen was imported from first on
    the child's path: the front end runs the same ppvarlen whether it is installed or not."""
    env = child_environ()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
    return env


class GrpcServer:
    """The gRPC front end process (``front``) on ``host:port`` (0: a free port) relaying to
    ``service`` on an event loop in a thread of its own, with the ``deploy`` bounds; ``port`` is
    the bound one once ``start`` returns.  A front end that exits on its own (killed, crashed)
    is logged and started again on the same port, at most once a second."""

    def __init__(self, service, deploy, host, port):
        self.service, self.deploy, self.host, self.port = service, deploy, host, port
        self._loop = uvloop.new_event_loop() if uvloop is not None else asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="grpc",
                                        daemon=True)
        self._proc = self._end = self._watch = None
        self._stopping = False

    @property
    def front_end_pid(self):
        return self._proc.pid if self._proc is not None else None

    def start(self):
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._launch(), self._loop).result(90)
        self._watch = asyncio.run_coroutine_threadsafe(self._restart_when_lost(), self._loop)
        log.info("serving %s over gRPC on %s:%d (front end: process %d)", self.service.name,
                 self.host, self.port, self._proc.pid)
        return self

    async def _launch(self):
        loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair()
        deploy = self.deploy
        limit = deploy.max_body_bytes
        # grpc core refuses past its limit in its own words; up to twice the body limit the
        # message reaches ModelInfer, whose 413 names Deploy.max_body_bytes
        command = front_end_command(theirs.fileno(), self.host, self.port, 2 * limit,
                                    max(limit, 64 << 20), deploy.max_connections,
                                    self.service.method_paths)
        try:
            self._proc = subprocess.Popen(command, pass_fds=(theirs.fileno(),),
                                          stdin=subprocess.DEVNULL, env=_front_end_env())
        finally:
            theirs.close()
        hello, self._lost = loop.create_future(), asyncio.Event()
        _, self._end = await loop.connect_accepted_socket(
            lambda: _ServerEnd(self.service, hello, self._lost), ours)
        try:
            port, why = await asyncio.wait_for(hello, 60)
        except asyncio.TimeoutError:
            port, why = 0, "the gRPC front end did not answer within 60 s"
        if not port:
            self._end.transport.close()
            self._reap(5)
            raise OSError(why)
        self.port = port

    async def _restart_when_lost(self):
        while True:
            await self._lost.wait()
            if self._stopping:
                return
            code = await asyncio.get_running_loop().run_in_executor(None, self._reap, 5)
            log.error("the gRPC front end (process %d) exited with %s; starting it again on "
                      "port %d", self._proc.pid, code, self.port)
            await asyncio.sleep(1.0)
            try:
                await self._launch()
            except OSError as e:
                log.error("gRPC is not served: %s", e)
                return

    def _reap(self, timeout):
        try:
            return self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            return self._proc.wait()

    def _send_stop(self, grace_s):
        if not self._end.transport.is_closing():
            self._end.transport.write(stop_frame(grace_s))

    def stop(self, grace_s=5.0):
        """Stop taking calls; the calls in flight get ``grace_s`` to finish."""
        self._stopping = True
        if self._proc is not None:
            self._loop.call_soon_threadsafe(self._send_stop, grace_s)
            self._reap(grace_s + 30)
        if self._watch is not None:
            self._loop.call_soon_threadsafe(self._watch.cancel)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)

