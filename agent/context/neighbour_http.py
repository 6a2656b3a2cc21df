"""One bounded HTTP request to a neighbour: the agent's only way to read another process over HTTP.

Every server the agent or a command reads (a node's dcgm-exporter, inference servers, a Prometheus
answering ``fleet-report``, a remote agent for ``snapshot --url`` and ``top``) may be slow, broken or
hostile. A per-read socket timeout does not bound a request: a server that sends one byte a second
never trips it, in the headers or in the body. So each request here has one deadline from connect to
the last byte. One shared watchdog thread shuts a request's sockets down when its deadline passes (a
read blocked in ``recv()`` returns at once; closing alone would not wake it), so the bound costs no
thread per request. The body is read in chunks up to a cap (decompressed size included), proxies
are ignored unless asked for (an agent-wide ``HTTP_PROXY`` is meant for the outside world, not a
server on this node), and a redirect can only lead to another http(s) URL.

Name resolution is the one step no deadline here can interrupt (``getaddrinfo`` takes no timeout):
neighbours on this node are addressed by IP or ``localhost``, which need none.
"""

from __future__ import annotations

import heapq
import itertools
import socket
import threading
import time
import urllib.error
import urllib.request
import zlib
from dataclasses import dataclass
from email.message import Message
from http.client import HTTPConnection, HTTPException, HTTPSConnection

from agent.model.text import one_line

CHUNK = 64 * 1024


class FetchFailed(Exception):
    """The request got no usable answer. ``kind`` says why: ``deadline`` (not finished within the
    overall deadline), ``timeout`` (no byte within the per-read timeout), ``too_large``, ``refused``,
    ``unreachable`` or ``broken`` (reset, malformed); the message is one line without the URL."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class Reply:
    """A whole answer, whatever its status: the caller decides what a 404 or a 500 means."""

    status: int
    reason: str
    headers: Message
    body: bytes


class DeadlineSockets:
    """The sockets one request opened (a redirect opens another), shut down together at the deadline.
    Other transports with one deadline per request (the OTLP push's) use it through :func:`watched`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self.expired = False

    def add(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)
            expired = self.expired
        if expired:
            _shut(sock)

    def expire(self) -> None:
        with self._lock:
            self.expired = True
            sockets = list(self._sockets)
        for sock in sockets:
            _shut(sock)


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


class _Watchdog:
    """One daemon thread for every request's deadline: a heap of (deadline, request), woken when an
    earlier deadline arrives. Started on first use; idle (waiting on a condition) when nothing is due."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, DeadlineSockets]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None

    def watch(self, request: DeadlineSockets, deadline: float) -> None:
        with self._cond:
            heapq.heappush(self._heap, (deadline, next(self._order), request))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="roofwatch-http-deadlines", daemon=True)
                self._thread.start()
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._heap:
                    self._cond.wait()
                deadline, _, request = self._heap[0]
                wait = deadline - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                heapq.heappop(self._heap)
            request.expire()  # a finished request ignores it: its sockets are closed already

    def pending(self) -> int:
        with self._cond:
            return len(self._heap)


_WATCHDOG = _Watchdog()


def watched(deadline: float) -> DeadlineSockets:
    """A fresh set of sockets the shared watchdog shuts down at ``deadline`` (a ``time.monotonic()`` value):
    register each socket with :meth:`DeadlineSockets.add`, and call :meth:`DeadlineSockets.expire` when done."""
    sockets = DeadlineSockets()
    _WATCHDOG.watch(sockets, deadline)
    return sockets


def _opener(request: DeadlineSockets, use_proxy: bool) -> urllib.request.OpenerDirector:
    """urllib's opener with connections that report their sockets to ``request``, and no ftp:, file:
    or data: handler: a redirect can only lead to another http(s) URL."""

    class Http(HTTPConnection):
        def connect(self) -> None:
            super().connect()
            request.add(self.sock)

    class Https(HTTPSConnection):
        def connect(self) -> None:
            super().connect()
            request.add(self.sock)

    class HttpHandler(urllib.request.HTTPHandler):
        def do_open(self, http_class, req, **kwargs):  # type: ignore[no-untyped-def, override]
            return super().do_open(Http, req, **kwargs)

    class HttpsHandler(urllib.request.HTTPSHandler):
        def do_open(self, http_class, req, **kwargs):  # type: ignore[no-untyped-def, override]
            return super().do_open(Https, req, **kwargs)

    opener = urllib.request.OpenerDirector()
    for handler in (urllib.request.ProxyHandler(None if use_proxy else {}), urllib.request.UnknownHandler(),
                    HttpHandler(), HttpsHandler(), urllib.request.HTTPDefaultErrorHandler(),
                    urllib.request.HTTPRedirectHandler(), urllib.request.HTTPErrorProcessor()):
        opener.add_handler(handler)
    return opener


def fetch(url: str, *, timeout_s: float, deadline_s: float | None = None, max_bytes: int,
          method: str = "GET", data: bytes | None = None, headers: dict[str, str] | None = None,
          gzip: bool = False, use_proxy: bool = False) -> Reply:
    """``method url``: done within ``deadline_s`` (default ``timeout_s``) from connecting to the last
    byte, no read waiting more than ``timeout_s``, at most ``max_bytes`` of body (after gzip, which is
    asked for when ``gzip``). Any status is a :class:`Reply`; no usable answer is :class:`FetchFailed`."""
    deadline_s = timeout_s if deadline_s is None else deadline_s
    started = time.monotonic()
    request = watched(started + deadline_s)
    wanted = dict(headers or {})
    if gzip:
        wanted.setdefault("Accept-Encoding", "gzip")
    try:
        outgoing = urllib.request.Request(url, data=data, method=method, headers=wanted)
        try:
            response = _opener(request, use_proxy).open(outgoing, timeout=min(timeout_s, deadline_s))
        except urllib.error.HTTPError as exc:  # any status after redirects is an answer (a refused redirect: 3xx)
            response = exc
        with response:
            status = response.status if response.status is not None else getattr(response, "code", 0)
            return Reply(status, str(response.reason), response.headers, _body(response, request, max_bytes))
    except FetchFailed:
        raise
    except (TimeoutError, socket.timeout):
        overall = request.expired or time.monotonic() - started >= deadline_s
        raise _late(overall, timeout_s, deadline_s) from None
    except urllib.error.URLError as exc:
        if request.expired:
            raise _late(True, timeout_s, deadline_s) from None
        reason = exc.reason
        if isinstance(reason, (TimeoutError, socket.timeout)):
            raise _late(False, timeout_s, deadline_s) from None
        if isinstance(reason, ConnectionRefusedError):
            raise FetchFailed("refused", "connection refused") from None
        raise FetchFailed("unreachable", one_line(reason)) from None
    except (OSError, ValueError, HTTPException, zlib.error) as exc:  # reset, malformed answer, bad gzip
        if request.expired:
            raise _late(True, timeout_s, deadline_s) from None
        raise FetchFailed("broken", one_line(exc) or type(exc).__name__) from None
    finally:
        request.expire()  # closes nothing still in use: the response is closed; frees the watchdog's hold


def _body(response, request: DeadlineSockets, max_bytes: int) -> bytes:  # type: ignore[no-untyped-def]
    """The body in chunks up to ``max_bytes`` (gzip undone within the same cap); an expired request is late."""
    headers = response.headers
    declared = headers.get("Content-Length", "") if headers is not None else ""
    if declared.isdigit() and int(declared) > max_bytes:
        raise FetchFailed("too_large", f"answer larger than {max_bytes} bytes (Content-Length {declared})")
    chunks: list[bytes] = []
    size = 0
    read = getattr(response, "read1", None) or response.read
    while size <= max_bytes:
        chunk = read(min(CHUNK, max_bytes + 1 - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    if request.expired:
        raise TimeoutError("deadline")
    if size > max_bytes:
        raise FetchFailed("too_large", f"answer larger than {max_bytes} bytes")
    body = b"".join(chunks)
    if headers is not None and headers.get("Content-Encoding", "").strip().lower() == "gzip":
        body = _gunzip(body, max_bytes)
    return body


def _gunzip(body: bytes, max_bytes: int) -> bytes:
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    out = inflater.decompress(body, max_bytes + 1)
    if len(out) > max_bytes or inflater.unconsumed_tail:
        raise FetchFailed("too_large", f"decompressed answer larger than {max_bytes} bytes")
    return out


def _late(overall: bool, timeout_s: float, deadline_s: float) -> FetchFailed:
    if overall:
        return FetchFailed("deadline", f"did not finish answering within {deadline_s:g} s")
    return FetchFailed("timeout", f"did not answer within {timeout_s:g} s")
