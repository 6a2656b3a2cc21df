"""One client connection on the agent's port: an asyncio protocol over the h11 parser.

Why not a thread per connection (http.server): an idle or half-sent connection held a thread and
a 300 s socket timeout, so about 130 of them starved every scrape (docs/architecture.md, "The
HTTP listener"). Here a connection is a small object on the event loop: it costs no thread, at
most ``max_header_bytes`` of buffered input and one answer of output, and it lives only as long as
its current deadline (:class:`~exporters.http.limits.ListenerLimits`). h11 does the parsing (strict
framing, no request smuggling); this module owns the deadlines, the buffers and the replies.

A connection moves through these states, each with its own deadline:

- ``HANDSHAKE``: TLS, under the header deadline from the moment of accepting;
- ``WAIT``: no request in progress (the first one under the header deadline, later ones under
  the idle timeout);
- ``HEAD``: a request began, its headers are due by the header deadline;
- ``BODY``: its body is due by the body deadline (kept for a report, else read and discarded);
- ``WORK``: a worker thread is answering; reading is paused, so pipelined requests wait in the
  kernel, not in memory;
- ``WRITE``: the answer waits for the client to take it, by the write deadline;
- ``LINGER``: answered and closing, discarding what the client still sends for a moment, so the
  answer is not destroyed by a reset.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from http import HTTPStatus
from typing import Any
from urllib.parse import urlsplit

import h11

from agent.context.workload.report_http import REPORT_PATH, Answer, is_loopback, judge_headers, peer_pid
from exporters.http.framing import (BUSY, answer_headers, buffered as _buffered, closing, from_answer, phrase,
                                    protocol_error, raw_response)
from exporters.http.tls import start_tls
from exporters.http.dispatch import quick_answer, worker_answer
from exporters.http.routes import Headers, Request, Response, text

log = logging.getLogger("roofwatch.http")

LINGER_S = 0.5
LINGER_BYTES = 256 * 1024
WRITE_HIGH_WATER = 64 * 1024
"""Past this many bytes not yet taken by the client, the next request waits (WRITE state)."""
TLS_READ_HIGH_WATER = 32 * 1024
"""Encrypted bytes TLS may hold for a connection whose reading is paused (asyncio's default: 256 KiB)."""


class Connection(asyncio.BufferedProtocol):
    def __init__(self, listener: Any) -> None:
        """``listener`` is the :class:`exporters.http.listener.Listener` that accepted it (typed
        loosely: the listener imports this module)."""
        self.listener = listener
        self.server = listener.server
        self.limits = listener.limits
        self.loop = listener.loop
        self.transport: asyncio.Transport | None = None
        self.client = "?"
        self.local = False
        """Loopback or the unix socket: may report without a token (the store decides)."""
        self.peer_pid: int | None = None
        """The connecting process, on the unix socket (SO_PEERCRED); None on TCP."""
        self.state = "NEW"
        self.first = True
        """No request completed on this connection yet (it goes first when room must be made)."""
        self.requests = 0
        self.received = False
        """Some byte of the current request arrived (a timeout then gets a 408, not a silent close)."""
        self.request: Request | None = None
        self.method: str | None = None  # as h11 parsed it: a HEAD refused before it is a Request gets no body
        self.keep_body = False
        self.body_limit = 0
        self.body = bytearray()
        self.discarded = 0
        self.fed = 0
        """Bytes given to the parser since the current request began (its head's size, once parsed)."""
        self.holding_slot = False
        self.scheduled = False
        """A turn of :meth:`_advance` is queued on the loop: never more than one per connection, or a
        pipelining client's callbacks would multiply with every request."""
        self.eof = False
        self.timer: asyncio.TimerHandle | None = None
        self.h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=self.limits.max_header_bytes)

    # -- asyncio callbacks -------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.pause_reading()  # nothing is read before the connection is admitted (and, with TLS, wrapped)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family == socket.AF_UNIX:
            # The report socket: the kernel says which process connected; that process is the client
            # (its per-client cap, its report's PID), and the file mode said it may connect at all.
            self.local, self.peer_pid = True, peer_pid(sock)
            self.client = f"pid {self.peer_pid}" if self.peer_pid is not None else "unix"
        else:
            peer = transport.get_extra_info("peername")
            self.client = str(peer[0]) if peer else "?"
            self.local = is_loopback(self.client)
        if not self.listener.admit(self):
            self.state = "CLOSED"
            if self.peer_pid is not None or self.client == "unix":
                self.listener.turn_away(transport, BUSY)  # a job on this node is told to come back
            else:
                transport.close()  # closed on arrival, unanswered: it costs nothing more
            return
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # no 40 ms wait for a delayed ACK
        self._deadline(self.limits.header_timeout_s)
        tls = self.server.web.tls  # the context in force now: a SIGHUP may have rotated the certificate
        if tls is None:
            self._wait()
        else:
            self.state = "HANDSHAKE"
            self.loop.create_task(self._handshake(tls))

    async def _handshake(self, context: ssl.SSLContext) -> None:
        raw = self.transport
        assert raw is not None
        try:
            wrapped = await start_tls(self.loop, raw, self, context, handshake_timeout_s=self.limits.header_timeout_s)
        except (OSError, ssl.SSLError, asyncio.TimeoutError, ConnectionError, RuntimeError) as exc:
            log.debug("TLS handshake with %s failed: %s", self.client, exc)
            raw.abort()
            self._lost()
            return
        if self.state == "CLOSED" or wrapped is None:
            raw.abort()
            self._lost()
            return
        self.transport = wrapped
        wrapped.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        wrapped.set_read_buffer_limits(high=TLS_READ_HIGH_WATER)  # asyncio's default lets each buffer 256 KiB
        self._wait()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.listener.read_buffer  # shared: buffer_updated copies out at once, on the one loop thread

    def buffer_updated(self, nbytes: int) -> None:
        data = bytes(self.listener.read_buffer[:nbytes])
        if self.state in ("NEW", "CLOSED"):
            return
        if self.state == "LINGER":
            self.discarded += nbytes
            if self.discarded > LINGER_BYTES:
                self._abort()
            return
        self.h11.receive_data(data)
        self.fed += nbytes
        if self.state in ("WORK", "WRITE", "HANDSHAKE"):
            # Reading is paused, or TLS delivers the request before start_tls returns: kept for later.
            if _buffered(self.h11) > 2 * self.limits.max_header_bytes:
                self._abort()
            return
        if self.state == "WAIT":
            self.state = "HEAD"
            self.received = True
            if not self.first:  # the first request's deadline runs from the accept
                self._deadline(self.limits.header_timeout_s)
        if not self.scheduled:  # else the turn already scheduled reads it
            self._advance()

    def eof_received(self) -> bool:
        """Keep the connection open: a client may half-close after its request and still read the answer."""
        self.eof = True
        if self.state == "LINGER":
            self._close()
        elif self.state in ("WAIT", "HEAD", "BODY"):
            self.h11.receive_data(b"")
            self._advance()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost()

    def resume_writing(self) -> None:
        if self.state == "WRITE":
            self._wait()

    # -- reading a request -------------------------------------------------------------------------

    def _turn(self) -> None:
        self.scheduled = False
        self._advance()

    def _advance(self) -> None:
        while self.state in ("WAIT", "HEAD", "BODY"):
            try:
                event = self.h11.next_event()
            except h11.RemoteProtocolError as exc:
                self._protocol_error(exc)
                return
            if event is h11.NEED_DATA:
                if self.eof:
                    self._close()
                    return
                break
            if isinstance(event, h11.Request):
                self._on_request(event)
            elif isinstance(event, h11.Data):
                self._on_data(event.data)
            elif isinstance(event, h11.EndOfMessage):
                self._dispatch()  # one request per turn of the loop: a pipelining client waits its turn
                return
            elif isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
                self._close()
                return
        if self.transport is not None and self.state in ("WAIT", "HEAD", "BODY"):
            self.transport.resume_reading()

    def _on_request(self, event: h11.Request) -> None:
        self.requests += 1
        if self.fed - _buffered(self.h11) > self.limits.max_header_bytes:
            # h11 bounds a head still incomplete; one that arrived whole in a few reads is measured here
            self._reply(text(431, f"request line and headers over {self.limits.max_header_bytes} bytes", close=True),
                        raw=True)
            return
        self.state = "BODY"
        self._deadline(self.limits.body_timeout_s)
        method = self.method = event.method.decode("ascii", "replace")
        target = event.target.decode("latin-1")
        headers = Headers(event.headers)
        if event.http_version not in (b"1.0", b"1.1"):
            self._reply(text(HTTPStatus.BAD_REQUEST, "only HTTP/1.0 and HTTP/1.1 are spoken here", close=True))
            return
        try:
            path, query = (target.partition("?")[::2] if target.startswith("/") else
                           (urlsplit(target).path or "/", urlsplit(target).query))
        except ValueError:
            self._reply(text(HTTPStatus.BAD_REQUEST, "request target is not a valid URL", close=True))
            return
        self.request = Request(method, path, query, headers, self.client)
        self.keep_body = method == "POST" and path == REPORT_PATH and self.server.reports is not None
        if self.keep_body:
            verdict = judge_headers(headers, self.server.reports, from_loopback=self.local)
            if isinstance(verdict, Answer):
                self._reply(from_answer(verdict))
                return
            self.body_limit = verdict
        else:
            self.body_limit = self.limits.max_discard_bytes
            length = (headers.get("Content-Length") or "0").strip()
            if not length.isdigit() or len(length) > 18 or int(length) > self.body_limit:
                self._dispatch(close=True)  # too much to discard: answer, then close instead of reading it
                return
        if self.h11.they_are_waiting_for_100_continue:
            if not self.keep_body:
                self._dispatch(close=True)
                return
            self._write(self.h11.send(h11.InformationalResponse(status_code=100, headers=[])))

    def _on_data(self, data: bytes) -> None:
        if self.keep_body:
            self.body += data  # h11 holds the client to its Content-Length, at most MAX_BODY_BYTES
        else:
            self.discarded += len(data)
            if self.discarded > self.body_limit:
                self._dispatch(close=True)

    def _protocol_error(self, exc: h11.RemoteProtocolError) -> None:
        if self.eof and not self.received:
            self._close()
            return
        self._reply(protocol_error(exc, self.limits.max_header_bytes), raw=True)

    # -- answering ---------------------------------------------------------------------------------

    def _dispatch(self, close: bool = False) -> None:
        """The request is whole (or its body is not worth reading): answer it in a worker thread."""
        self._cancel_deadline()
        self.state = "WORK"
        if self.transport is not None:
            self.transport.pause_reading()
        request = self.request
        assert request is not None
        request.body = bytes(self.body)
        self.body = bytearray()
        if self.server.draining.is_set():  # stopping: say so, and close, so the client goes elsewhere
            self._reply(text(503, "shutting down", headers={"Retry-After": "1"}, close=True))
            return
        quick = quick_answer(self.server, request)  # on the loop when it costs no bcrypt and no render
        if quick is not None:
            quick.close = quick.close or close
            self._reply(quick)
            return
        if not self.server.slots.acquire(blocking=False):
            self._reply(text(503, "too many concurrent requests", close=close))
            return
        self.holding_slot = True
        pid = self.peer_pid
        client = ("pid", pid) if pid is not None else ("socket",) if self.client == "unix" else ("ip", self.client)
        job = worker_answer(self.server, request, local=self.local, peer_pid=pid, client=client)
        if close:
            job = closing(job)
        self.listener.run(job, self._answered)

    def _answered(self, response: Response) -> None:
        """Back on the loop thread with the worker's answer."""
        self._reply(response)

    def _reply(self, response: Response, raw: bool = False) -> None:
        if self.state == "CLOSED" or self.transport is None:
            self._release()
            return
        request = self.request
        head = (request.method if request is not None else self.method) == "HEAD"
        if log.isEnabledFor(logging.DEBUG):
            log.debug("http %s %s %s %d", self.client, request.method if request else "-",
                      request.path[:200] if request else "-", response.status)
        close = response.close or self.eof or self.requests >= self.limits.max_requests_per_connection
        headers = answer_headers(self.server.web.headers, response, close, self.listener.date(), self.server.server_version)
        if raw or self.h11.our_state is not h11.SEND_RESPONSE:
            self._write(raw_response(response.status, headers, b"" if head else response.body))
            self._release()
            self._linger()
            return
        # One write (two made the client wait on a second packet), joined once: the body is copied once.
        parts = self.h11.send_with_data_passthrough(h11.Response(status_code=response.status, headers=headers,
                                                                 reason=phrase(response.status).encode()))
        if not head and response.body:
            parts += self.h11.send_with_data_passthrough(h11.Data(data=response.body))
        parts += self.h11.send_with_data_passthrough(h11.EndOfMessage())
        self._write(b"".join(parts))
        self._release()
        if self.h11.our_state is h11.MUST_CLOSE or self.h11.their_state is not h11.DONE:
            self._linger()
            return
        self.h11.start_next_cycle()
        self.first = False
        self.request = None
        self.method = None
        self.keep_body, self.discarded = False, 0
        if self.transport.get_write_buffer_size() > WRITE_HIGH_WATER:
            self.state = "WRITE"  # the client is slow to read: no next request until it takes this answer
            self._deadline(self.limits.write_timeout_s)
        else:
            self._wait()

    def _release(self) -> None:
        if self.holding_slot:
            self.holding_slot = False
            self.server.slots.release()

    def _write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    # -- waiting, deadlines and closing ------------------------------------------------------------

    def _wait(self) -> None:
        """Ready for the next request: pipelined bytes already here start its header deadline."""
        self.received = False
        self.fed = _buffered(self.h11)
        if _buffered(self.h11) > 0:  # pipelined: the next request waits for the next turn of the loop
            self.state = "HEAD"
            self.received = True
            self._deadline(self.limits.header_timeout_s)
            if not self.scheduled:
                self.scheduled = True
                self.loop.call_soon(self._turn)
            return  # reading stays paused while there is a request to work on
        else:
            self.state = "WAIT"
            if not self.first:
                self._deadline(self.limits.idle_timeout_s)
            if self.eof:
                self._close()
                return
        if self.transport is not None:
            self.transport.resume_reading()

    def _deadline(self, seconds: float) -> None:
        self._cancel_deadline()
        self.timer = self.loop.call_later(seconds, self._expired)

    def _cancel_deadline(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _expired(self) -> None:
        self.timer = None
        state = self.state
        if state in ("HEAD", "BODY") or (state == "WAIT" and self.received):
            if state == "BODY" and self.keep_body and self.server.reports is not None:
                self.server.reports.note_rejected("timeout")
            what = "body" if state == "BODY" else "request headers"
            self._reply(text(408, f"{what} not received in time", close=True), raw=True)
        elif state == "LINGER" and self.transport is not None and self.transport.get_write_buffer_size() == 0:
            self._close()
        else:  # idle, mid-handshake, or a client that does not take its answer
            self._abort()

    def _linger(self) -> None:
        """Closing after an answer: stop sending, discard what the client still sends for a moment."""
        self.state = "LINGER"
        transport = self.transport
        if transport is None:
            return
        if self.eof:
            self._close()
            return
        if transport.can_write_eof():
            try:
                transport.write_eof()
            except OSError:  # the client is already gone
                self._abort()
                return
        transport.resume_reading()
        self._deadline(LINGER_S if transport.get_write_buffer_size() == 0 else self.limits.write_timeout_s)

    def _close(self) -> None:
        self._cancel_deadline()
        if self.transport is not None:
            self.transport.close()  # sends what is buffered first; the write deadline guards a stalled client
            if self.transport.get_write_buffer_size():
                self.state = "LINGER"
                self._deadline(self.limits.write_timeout_s)

    def _abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()
        self._lost()

    def evict(self) -> None:
        """Closed to make room for a newcomer at the connection cap (a job on the report socket is told)."""
        if self.transport is not None and (self.peer_pid is not None or self.client == "unix"):
            transport = self.transport
            self._lost()
            self.listener.turn_away(transport, BUSY)
            return
        self._abort()

    @property
    def evictable(self) -> bool:
        return self.state in ("WAIT", "HEAD", "HANDSHAKE")

    def _lost(self) -> None:
        """Gone, however it went (idempotent): no deadline, no slot, no place in the listener's books."""
        self.state = "CLOSED"
        self._cancel_deadline()
        self._release()
        self.listener.forget(self)

