"""Connection bounds of ``ppvarlen-serve``: what a client may hold before its request is in.

The app bounds what a parsed request carries (the Deploy section's ``max_body_bytes``,
checked by ``http.edge.read_body``; ``max_texts_per_request``, checked by each protocol's
parse; ``queue_size``, by the batcher).  uvicorn with httptools bounds nothing around it: a request head of any
size is buffered, a head or a body may trickle in for ever, and every idle connection is kept,
so a few hundred slow clients or a burst of silent sockets hold the server's memory and file
descriptors.  ``uvicorn_config`` builds the ``uvicorn.Config`` that ``serve()`` runs, with
these bounds from the Deploy section:

* uvicorn's own setting where it has one: ``timeout_keep_alive`` (Deploy.keep_alive_timeout_s);
* ``BoundedHttpToolsProtocol``, a subclass of uvicorn's httptools protocol, for the rest:
  Deploy.max_header_bytes and max_headers (431), header_timeout_s and body_timeout_s (408),
  idle_timeout_s (closed unanswered) and max_connections (503 at accept).

At shutdown (SIGTERM), uvicorn closes every idle keep-alive connection at once; a request a
client had already sent on one then meets a closed socket and the kernel answers it with a
reset.  ``BoundedHttpToolsProtocol.shutdown`` keeps an idle connection open DRAIN_GRACE_S
instead: a request in that time is answered (503 + Retry-After from the draining app) and the
connection closed after it; then the connection is half-closed (the client reads end of file)
and what still arrives is read and dropped until the client closes, so nothing is reset.

Answers are the app's error form ``{"error": message, "field": name}``, the message naming
the key.  ``ConnectionEvents`` counts every refusal and logs at most a line a minute per kind,
so a flood of bad connections writes a line a minute, never a line or a traceback each.

The subclass relies on uvicorn internals (its parser callbacks, ``RequestResponseCycle``'s
flags); it was written against uvicorn ``UVICORN_READ``, and tests/serve/test_connection_limits.py
fails when the installed uvicorn's parts it relies on differ from what was read.
"""
import collections
import dataclasses
import http
import json
import logging
import resource
import time

import httptools
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from ppvarlen.config import ConfigError
from ppvarlen.utils.log import get_logger

log = get_logger("serve.http.connections")

UVICORN_READ = "0.55.0"  # the uvicorn whose httptools protocol BoundedHttpToolsProtocol extends
# A client answered while it may still be sending (an oversized head, a slow body) is read and
# dropped this long after a half close: closing with unread bytes resets the connection, and a
# reset can discard the answer before the client reads it.
LINGER_S = 2.0
REPORT_EVERY_S = 60.0
# At shutdown, how long an idle keep-alive connection still takes a request (answered 503 by
# the draining app, then closed) before it is half-closed: a request sent just before the
# client could know of the shutdown gets an answer rather than a reset.
DRAIN_GRACE_S = 1.0
# descriptors the process needs besides client connections: listening socket, model files,
# event loop, worker threads, logs; max_connections is fitted under the open-file limit minus this
FD_RESERVE = 128

# Where a connection's current request is: no byte of it yet, its head arriving, its body
# arriving.  One deadline per connection follows it; KEEP_ALIVE, LINGER and DRAIN (the
# shutdown's grace) are deadlines only.
IDLE, HEAD, BODY, KEEP_ALIVE, LINGER, DRAIN = ("idle", "head", "body", "keep-alive", "linger",
                                               "drain")


@dataclasses.dataclass(frozen=True)
class ConnectionLimits:
    """The connection bounds: the Deploy keys of the same names (None = no bound)."""

    max_header_bytes: int
    max_headers: int
    header_timeout_s: float
    body_timeout_s: float
    idle_timeout_s: float
    max_connections: int
    keep_alive_timeout_s: float

    @classmethod
    def from_deploy(cls, deploy_cfg):
        values = {f.name: deploy_cfg[f.name] for f in dataclasses.fields(cls)}
        for key, value in values.items():
            if key == "keep_alive_timeout_s":
                if value is None or value < 0:
                    raise ConfigError(f"Deploy.{key} must be >= 0 seconds (0 = close after "
                                      f"every answer), got {value!r}")
            elif value is not None and value <= 0:
                raise ConfigError(f"Deploy.{key} must be positive, or null for no bound; got "
                                  f"{value!r}")
        return cls(**values)


# kind -> (log level, what the report counts, the Deploy key bounding it)
EVENTS = {
    "max_connections": (logging.WARNING, "connections refused at accept with 503, the server "
                        "at its maximum", "max_connections"),
    "max_header_bytes": (logging.WARNING, "requests refused with 431, the head too large",
                         "max_header_bytes"),
    "max_headers": (logging.WARNING, "requests refused with 431, too many header fields",
                    "max_headers"),
    "header_timeout_s": (logging.WARNING, "connections answered 408 and closed, the request "
                         "head not complete in time", "header_timeout_s"),
    "body_timeout_s": (logging.WARNING, "connections answered 408 and closed, the request body "
                       "not complete in time", "body_timeout_s"),
    # preconnects and idle pooled sockets end this way too: not worth a warning
    "idle_timeout_s": (logging.INFO, "new connections closed unanswered, silent too long",
                       "idle_timeout_s"),
    "invalid_request": (logging.WARNING, "malformed requests answered 400", None),
}


class ConnectionEvents:
    """What the connection bounds refused: ``counts[kind]`` since start, and a report line per
    kind at most every REPORT_EVERY_S (the first at once); each event is a debug line."""

    def __init__(self, limits):
        self.limits = limits
        self.counts = collections.Counter()
        self._unreported = collections.Counter()
        self._reported_at = {}

    def note(self, kind, client=None):
        level, what, key = EVENTS[kind]
        self.counts[kind] += 1
        self._unreported[kind] += 1
        log.debug("%s: one of the %s", "%s:%d" % client if client else "client", what)
        now = time.monotonic()
        if now - self._reported_at.get(kind, -REPORT_EVERY_S) < REPORT_EVERY_S:
            return
        bound = f"Deploy.{key} = {getattr(self.limits, key)}; " if key else ""
        log.log(level, "%s: %d since the last report, %d since start (%sreported at most every "
                "%.0f s)", what, self._unreported[kind], self.counts[kind], bound, REPORT_EVERY_S)
        self._unreported[kind] = 0
        self._reported_at[kind] = now


class _Refused(Exception):
    """Raised in a parser callback to stop parsing a request the bounds refuse (the answer is
    in ``_refusal``); httptools hands it back from ``feed_data`` as HttpParserCallbackError."""


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol within ``limits`` (a ConnectionLimits), counting refusals
    in ``events``; ``bounded_protocol`` makes the class uvicorn is given.

    One deadline per connection follows its current request: IDLE from accept to the first
    byte, HEAD from the first byte to the end of the head, BODY from there to the end of the
    body; none while the app works (after the answer, uvicorn's keep-alive timer runs)."""

    limits = None
    events = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._phase = IDLE
        self._messages_begun = self._messages_completed = 0
        self._head_bytes = 0  # bytes of the current head received while it is incomplete
        self._header_count = 0
        self._refusal = None  # (status, message, field) a parser callback refused with
        self._answered = False  # refused or timed out: what the client still sends is dropped
        self._deadline = None
        self._deadline_kind = None
        self._draining = False  # shutdown has begun: no request after the current one

    # ------------------------------------------------------------ asyncio.Protocol

    def connection_made(self, transport):
        super().connection_made(transport)
        most = self.limits.max_connections
        # refused at accept, not when a request comes as with uvicorn's limit_concurrency: an
        # idle connection would hold its descriptor until then
        if most is not None and len(self.connections) > most:
            self.events.note("max_connections", self.client)
            self._answered = True
            self._write_error(503, f"the server holds its maximum of {most} connections "
                              f"(Deploy.max_connections); retry later", None,
                              [(b"retry-after", b"1")])
            transport.close()  # at once, no linger: the descriptor is what is short
            return
        self._set_deadline(IDLE)

    def connection_lost(self, exc):
        self._set_deadline(None)
        super().connection_lost(exc)

    def shutdown(self):
        """uvicorn's graceful shutdown of this connection: the request being answered is the
        last; an idle connection is kept DRAIN_GRACE_S for a request already on its way, then
        half-closed (uvicorn would close it at once, resetting such a request)."""
        self._draining = True
        if self._answering():
            self.cycle.keep_alive = False
        elif not self._answered and not self.transport.is_closing():
            self._set_deadline(DRAIN)

    def data_received(self, data):
        # uvicorn's data_received with the bounds' refusals: uvicorn would answer an exception
        # from a parser callback with a 400 and a warning
        if self._answered:
            return
        self._unset_keepalive_if_required()
        phase_before, begun_before = self._phase, self._messages_begun
        completed_before = self._messages_completed
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self._set_deadline(None)  # the websocket protocol takes the connection over
                self.handle_websocket_upgrade()
                return
            self._unsupported_upgrade_warning()
        except httptools.HttpParserError:
            if self._refusal is not None:
                self._answer(*self._refusal)
            else:  # uvicorn logs a warning per malformed request; counted and reported here
                self.events.note("invalid_request", self.client)
                self._answered = True
                self.send_400_response("Invalid HTTP request received.")
            return
        most = self.limits.max_header_bytes
        if self._phase == HEAD and most is not None:
            begun = self._messages_begun - begun_before
            # the whole chunk is head when the head began before it or at its start; a head
            # that begins mid-chunk after an earlier request counts from its next chunk
            if begun == 0 or (begun == 1 and phase_before == IDLE):
                self._head_bytes += len(data)
            if self._head_bytes > most:
                self.events.note("max_header_bytes", self.client)
                self._answer(*self._head_too_large())
                return
        if self._phase in (HEAD, BODY):
            self._set_deadline(self._phase)
        elif self._answering():
            self._set_deadline(None)  # the app has the request
        elif self._messages_completed > completed_before:
            # the request ended after its answer had gone (the app answered before reading it
            # all): idle as after any answer; uvicorn's keep-alive timer was armed and cancelled
            self._set_deadline(KEEP_ALIVE)
        else:
            self._set_deadline(HEAD)  # bytes that begin no request (CRLFs) count as head

    # ------------------------------------------------------------ httptools callbacks

    def on_message_begin(self):
        super().on_message_begin()
        self._messages_begun += 1
        self._phase = HEAD
        self._head_bytes = self._header_count = 0

    def on_header(self, name, value):
        # httptools calls this once a field is whole; the bytes of one still arriving are
        # bounded in data_received
        self._header_count += 1
        most = self.limits.max_headers
        if most is not None and self._header_count > most:
            self.events.note("max_headers", self.client)
            self._refusal = (431, f"more than {most} header fields (Deploy.max_headers)",
                             "headers")
            raise _Refused()
        super().on_header(name, value)

    def on_headers_complete(self):
        most = self.limits.max_header_bytes
        if most is not None and self._parsed_head_bytes() > most:  # a head read in one chunk
            self.events.note("max_header_bytes", self.client)
            self._refusal = self._head_too_large()
            raise _Refused()
        self._phase = BODY
        super().on_headers_complete()
        if self._draining:  # answered (503 while the app drains), then closed
            self.cycle.keep_alive = False

    def on_message_complete(self):
        self._phase = IDLE
        self._messages_completed += 1
        super().on_message_complete()

    # ------------------------------------------------------------ bounds

    def _parsed_head_bytes(self):
        """The head as sent without extra whitespace: request line, header lines, blank line."""
        request_line = len(self.parser.get_method()) + len(self.url) + len(" HTTP/1.1\r\n") + 1
        return request_line + sum(len(n) + len(v) + 4 for n, v in self.headers) + 2

    def _head_too_large(self):
        return (431, f"request head over {self.limits.max_header_bytes} bytes "
                f"(Deploy.max_header_bytes): send less in the URL and headers", "headers")

    def _answering(self):
        """Whether a request on this connection is with the app or being answered."""
        return self.cycle is not None and not self.cycle.response_complete

    def _set_deadline(self, kind):
        if kind == self._deadline_kind:
            return
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = self._deadline_kind = None
        seconds = {IDLE: self.limits.idle_timeout_s, HEAD: self.limits.header_timeout_s,
                   BODY: self.limits.body_timeout_s, KEEP_ALIVE: self.limits.keep_alive_timeout_s,
                   LINGER: LINGER_S, DRAIN: DRAIN_GRACE_S}.get(kind)
        if seconds is not None:
            self._deadline = self.loop.call_later(seconds, self._deadline_passed, kind)
            self._deadline_kind = kind

    def _deadline_passed(self, kind):
        self._deadline = self._deadline_kind = None
        if self.transport.is_closing():
            return
        if kind == DRAIN:
            if not self._answering():  # else the answer under way closes the connection
                self._answered = True  # what arrives from now on is dropped, not parsed
                self._linger()
        elif kind in (KEEP_ALIVE, LINGER):
            self.transport.close()
        elif kind == IDLE:
            self.events.note("idle_timeout_s", self.client)
            self._answered = True
            self.transport.close()  # nothing was asked, nothing to answer
        elif kind == HEAD:
            self.events.note("header_timeout_s", self.client)
            self._answer(408, f"request head not complete within "
                         f"{self.limits.header_timeout_s:g} s (Deploy.header_timeout_s)",
                         "headers")
        else:
            self.events.note("body_timeout_s", self.client)
            self._body_late()

    def _answer(self, status, message, field, headers=()):
        """Answer a refusal in the app's error form and close (after LINGER_S of draining)."""
        self._answered = True
        self._set_deadline(None)
        if self._answering():
            # the fault is in a pipelined request while an earlier one is being answered: no
            # answer can go in between, so the connection ends after that one
            self.cycle.keep_alive = False
            return
        self._write_error(status, message, field, headers)
        self._linger()

    def _body_late(self):
        cycle = self.cycle
        self._answered = True
        if cycle is None or cycle.response_started or self.pipeline:
            # answered already, or queued behind an answer in progress: nothing can be added
            self.transport.close()
            return
        # the app waits in receive(): it now hears http.disconnect, and what it sends is dropped
        cycle.disconnected = True
        cycle.message_event.set()
        self._write_error(408, f"request body not complete within "
                          f"{self.limits.body_timeout_s:g} s of its head "
                          f"(Deploy.body_timeout_s)", "body")
        self._linger()

    def _linger(self):
        self.flow.resume_reading()
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self._set_deadline(LINGER)  # or sooner: the client's end of file closes the connection

    def _write_error(self, status, message, field, headers=()):
        if self.transport.is_closing():
            return
        body = json.dumps({"error": message, "field": field}).encode()
        lines = [b"HTTP/1.1 %d %s" % (status, http.HTTPStatus(status).phrase.encode())]
        for name, value in [*self.server_state.default_headers,
                            (b"content-type", b"application/json"),
                            (b"content-length", b"%d" % len(body)), (b"connection", b"close"),
                            *headers]:
            lines.append(name + b": " + value)
        self.transport.write(b"\r\n".join(lines) + b"\r\n\r\n" + body)


def bounded_protocol(limits, events=None):
    """The protocol class for ``uvicorn.Config(http=...)`` (uvicorn makes one per connection)
    holding ``limits`` and ``events`` (a new ConnectionEvents when None)."""
    return type("BoundedHttpToolsProtocol", (BoundedHttpToolsProtocol,),
                {"limits": limits, "events": events or ConnectionEvents(limits)})


def fit_open_file_limit(limits):
    """``limits`` with max_connections under the process's open-file limit: a short soft limit
    is raised toward the hard one (as Go's runtime does at start); when even the hard limit
    is short, max_connections is lowered to fit, with a warning."""
    most = limits.max_connections
    if most is None:
        return limits
    need = most + FD_RESERVE
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return limits
    raised = need if hard == resource.RLIM_INFINITY else min(hard, need)
    if raised > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
    if raised >= need:
        return limits
    fitted = max(1, raised - FD_RESERVE)
    log.warning("Deploy.max_connections = %d does not fit the open-file limit (ulimit -Hn: %d, "
                "%d kept for the server itself): serving at most %d connections; raise the hard "
                "limit or lower Deploy.max_connections", most, hard, FD_RESERVE, fitted)
    return dataclasses.replace(limits, max_connections=fitted)


def uvicorn_config(app, deploy_cfg, host, port):
    """The ``uvicorn.Config`` ``serve()`` runs ``app`` with: the connection bounds of the Deploy
    section ``deploy_cfg`` (``config.http.events`` counts their refusals), graceful shutdown
    within Deploy.drain_timeout_s, uvicorn's own log lines from warnings up."""
    if uvicorn.__version__.split(".")[:2] != UVICORN_READ.split(".")[:2]:
        log.warning("uvicorn %s: the connection bounds (ppvarlen/serve/http/connections.py) extend "
                    "uvicorn %s's httptools protocol; run tests/serve/test_connection_limits.py "
                    "against this uvicorn", uvicorn.__version__, UVICORN_READ)
    limits = fit_open_file_limit(ConnectionLimits.from_deploy(deploy_cfg))
    # no limit_concurrency: uvicorn checks it only once a request's head is in (idle
    # connections are never refused), and the connection that reaches it is refused too
    # access_log off: its lines are info (never shown from warnings up), yet uvicorn formats
    # the client address and path for each answer before the logger drops them
    return uvicorn.Config(app, host=host, port=port, http=bounded_protocol(limits),
                          timeout_keep_alive=limits.keep_alive_timeout_s, log_level="warning",
                          access_log=False,
                          timeout_graceful_shutdown=int(deploy_cfg.drain_timeout_s))
