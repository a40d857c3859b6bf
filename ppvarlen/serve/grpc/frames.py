"""The frames between the gRPC front end (``front``) and the server (``service``) on
their socket pair: a 12-byte header (kind, call id, code, authorization length, body length),
then the authorization, then the body.

* ``HELLO`` (front end -> server, once): call id = the bound port, or 0 with the reason in the
  body.
* ``CALL`` (front end -> server): code = the method's index, the client's ``authorization``
  metadata, the serialised request.
* ``ANSWER`` (server -> front end): code = the gRPC status code's number (0: OK, the body is the
  serialised response; else the body is the error text).
* ``STOP`` (server -> front end): the body is the grace in seconds.

Hand-written: a fixed header over a local socket pair; a general framing library (or pickle,
refused here for anything read from a socket) would be more than this.
"""
import asyncio
import struct

HELLO, CALL, ANSWER, STOP = range(4)
HEADER = struct.Struct("<BIBHI")
MAX_CALL_ID = 2 ** 32 - 1  # the header's call id field


def _frame(kind, call_id, code, authorization, body):
    return HEADER.pack(kind, call_id, code, len(authorization), len(body)) + authorization + body


def hello_frame(port, error):
    return _frame(HELLO, port, 0, b"", error.encode("utf-8"))


def call_frame(call_id, method_index, authorization, request):
    return _frame(CALL, call_id, method_index, authorization.encode("utf-8"), request)


def answer_frame(call_id, code, body):
    return _frame(ANSWER, call_id, code, b"", body)


def stop_frame(grace_s):
    return _frame(STOP, 0, 0, b"", repr(float(grace_s)).encode("ascii"))


class FrameReader:
    """Bytes in, ``on_frame(kind, call_id, code, authorization, body)`` out, per whole frame."""

    def __init__(self, on_frame):
        self.on_frame = on_frame
        self.buffer = bytearray()

    def feed(self, data):
        buffer = self.buffer
        buffer += data
        start, size, header = 0, len(buffer), HEADER.size
        while size - start >= header:
            kind, call_id, code, auth_len, body_len = HEADER.unpack_from(buffer, start)
            end = start + header + auth_len + body_len
            if end > size:
                break
            auth_end = start + header + auth_len
            self.on_frame(kind, call_id, code, bytes(buffer[start + header:auth_end]),
                          bytes(buffer[auth_end:end]))
            start = end
        if start:
            del buffer[:start]


class FramedProtocol(asyncio.Protocol):
    """One end of the socket pair: bytes in, ``self.on_frame(...)`` per whole frame;
    ``self.transport`` writes frames out."""

    def __init__(self):
        self.transport = None
        self.frames = FrameReader(self.on_frame)

    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        self.frames.feed(data)

    def on_frame(self, kind, call_id, code, authorization, body):
        raise NotImplementedError
