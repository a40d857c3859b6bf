"""The gRPC front end: a process of its own that speaks gRPC and relays every call, as bytes, to
the server process (``service.GrpcServer``), which parses, answers and serialises it.

Why a process: grpc's Python transport costs about as much CPU per call as the rest of a
request, and in the server's process it would hold the same interpreter lock as the batcher,
the REST loop and the model; here it runs on another core.  Nothing here knows a message: the
methods are registered without (de)serialisers, so the request bytes reach the server
untouched and the response bytes leave as the server wrote them.

Run by the server only: ``python -m ppvarlen.serve.grpc.front --fd N ...`` where ``N`` is its
end of a socket pair.  Frames on it (``relay_frames``): the server's ``hello`` answer carries
the bound port or why binding failed; a call goes out as (call id, method, authorization,
request) and comes back as (call id, status code, response or error text); ``STOP`` (with the
grace in seconds) stops taking calls, lets those in flight finish, then exits.  The server's
end closing (it exited or crashed) stops this process the same way.
"""
import argparse
import asyncio
import signal
import socket

import grpc

from ppvarlen.serve.grpc.frames import MAX_CALL_ID, STOP, FramedProtocol, call_frame, hello_frame

try:  # uvicorn[standard]'s event loop where it installs (not on Windows), as uvicorn picks it
    import uvloop
except ImportError:  # pragma: no cover - platforms without uvloop
    uvloop = None

CODES = {code.value[0]: code for code in grpc.StatusCode}


class Relay(FramedProtocol):
    """This process's end of the socket pair: calls out, answers back to their waiting RPC."""

    def __init__(self, stopped):
        super().__init__()
        self.pending, self.last_id = {}, 0
        self.stopped = stopped

    def connection_lost(self, exc):
        if not self.stopped.done():
            self.stopped.set_result(0.0)  # the server is gone: no call can be answered

    def on_frame(self, kind, call_id, code, authorization, body):
        if kind == STOP:
            if not self.stopped.done():
                self.stopped.set_result(float(body.decode("ascii")))
            return
        waiting = self.pending.pop(call_id, None)
        if waiting is not None and not waiting.done():  # done: the client cancelled
            waiting.set_result((code, body))

    def next_call_id(self):
        """1, 2, ... 2**32 - 1, then 1 again: the frame's call id is 32 bits, and a server up
        for weeks answers more calls than that; only the calls in flight need distinct ids."""
        self.last_id = self.last_id % MAX_CALL_ID + 1
        return self.last_id

    async def call(self, method_index, request, context):
        call_id = self.next_call_id()
        answer = asyncio.get_running_loop().create_future()
        self.pending[call_id] = answer
        authorization = ""
        for key, value in context.invocation_metadata() or ():
            if key == "authorization":
                authorization = value
        self.transport.write(call_frame(call_id, method_index, authorization, request))
        try:
            code, body = await answer
        finally:
            self.pending.pop(call_id, None)
        if code:
            await context.abort(CODES.get(code, grpc.StatusCode.INTERNAL),
                                body.decode("utf-8", "replace"))
        return body


def _handlers(relay, paths):
    """One generic handler per service of ``paths`` ("service/method", in frame order)."""
    def handler(index):
        async def relayed(request, context):
            return await relay.call(index, request, context)
        return grpc.unary_unary_rpc_method_handler(relayed)  # no serialisers: bytes both ways
    services = {}
    for index, path in enumerate(paths):
        service, method = path.split("/")
        services.setdefault(service, {})[method] = handler(index)
    return tuple(grpc.method_handlers_generic_handler(service, methods)
                 for service, methods in services.items())


async def serve(args):
    loop = asyncio.get_running_loop()
    stopped = loop.create_future()
    sock = socket.socket(fileno=args.fd)
    _, relay = await loop.connect_accepted_socket(lambda: Relay(stopped), sock)
    options = [("grpc.max_receive_message_length", args.max_receive),
               ("grpc.max_send_message_length", args.max_send),
               ("grpc.so_reuseport", 0)]
    server = grpc.aio.server(options=options, maximum_concurrent_rpcs=args.max_calls)
    server.add_generic_rpc_handlers(_handlers(relay, args.methods.split(",")))
    address = f"[{args.host}]:{args.port}" if ":" in args.host else f"{args.host}:{args.port}"
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError as e:  # grpc raises this, not OSError, when the address is taken
        bound, why = 0, str(e)
    else:
        why = "grpc could not bind it"
    if not bound:
        relay.transport.write(hello_frame(0, f"cannot listen on {address} for gRPC: {why}"))
        return
    await server.start()
    relay.transport.write(hello_frame(bound, ""))
    grace = await stopped
    await server.stop(grace)
    relay.transport.close()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--methods", required=True,
                        help="comma-separated service/method names, in frame order")
    parser.add_argument("--max-receive", type=int, required=True)
    parser.add_argument("--max-send", type=int, required=True)
    parser.add_argument("--max-calls", type=int, required=True)
    args = parser.parse_args(argv)
    # Ctrl-C reaches the whole process group: the server drains and then stops this process
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # a repository's server holds SIGTERM blocked (serve.signals.sigterm_held) and a process
    # inherits its parent's mask: SIGTERM stops this one as it stops any
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    if uvloop is not None:
        uvloop.run(serve(args))
    else:  # pragma: no cover - platforms without uvloop
        asyncio.run(serve(args))


if __name__ == "__main__":
    main()
