"""One bounded HTTP GET for the commands that read a remote agent (``snapshot --url``, ``top``).

The server at the other end may be anything the user typed, so the answer is bounded in time and
size: a per-read timeout alone let a server that sends a byte a second (headers or body) hold the
command forever, and reading the whole body let a server fill memory. Here a watchdog shuts the
connection down at an overall deadline, the body is read in chunks up to a cap, redirects can
only lead to http(s), and every failure is :class:`FetchError` with a one-line reason.
"""

from __future__ import annotations

import socket
import threading
import time
import urllib.error
import urllib.request
from http.client import HTTPConnection, HTTPException, HTTPSConnection

from agent.views.safe_text import printable

CHUNK = 64 * 1024


class FetchError(Exception):
    """The GET failed; the message is one short printable line that names the URL, ``reason`` the
    same without it (for a caller that names the URL itself)."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


def one_line(text: object, limit: int = 160) -> str:
    """An exception's text as one short printable line: the caller shows it in a header or on stderr."""
    return printable(" ".join(str(text).split()), limit)


class _Sockets:
    """The sockets one GET opened (redirects open more), so the watchdog can shut them all down."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        self.expired = False

    def add(self, sock: socket.socket) -> None:
        with self._lock:
            self._open.append(sock)
            expired = self.expired
        if expired:
            self._shut(sock)

    def expire(self) -> None:
        """Shut every socket down: a read blocked in recv() returns at once (close() alone would not)."""
        with self._lock:
            self.expired = True
            opened = list(self._open)
        for sock in opened:
            self._shut(sock)

    @staticmethod
    def _shut(sock: socket.socket) -> None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def _opener(sockets: _Sockets) -> urllib.request.OpenerDirector:
    """urllib's opener with connections that report their sockets, and no ftp:, file: or data: handler:
    a redirect can only lead to another http(s) URL (urllib refuses file: itself; ftp: finds no handler)."""

    class Http(HTTPConnection):
        def connect(self) -> None:
            super().connect()
            sockets.add(self.sock)

    class Https(HTTPSConnection):
        def connect(self) -> None:
            super().connect()
            sockets.add(self.sock)

    class HttpHandler(urllib.request.HTTPHandler):
        def do_open(self, http_class, req, **kwargs):  # type: ignore[no-untyped-def, override]
            return super().do_open(Http, req, **kwargs)

    class HttpsHandler(urllib.request.HTTPSHandler):
        def do_open(self, http_class, req, **kwargs):  # type: ignore[no-untyped-def, override]
            return super().do_open(Https, req, **kwargs)

    opener = urllib.request.OpenerDirector()
    for handler in (urllib.request.ProxyHandler(), urllib.request.UnknownHandler(), HttpHandler(), HttpsHandler(),
                    urllib.request.HTTPDefaultErrorHandler(), urllib.request.HTTPRedirectHandler(),
                    urllib.request.HTTPErrorProcessor()):
        opener.add_handler(handler)
    return opener


def bounded_get(url: str, *, accept: str, timeout_s: float, deadline_s: float, max_bytes: int) -> bytes:
    """The body of ``GET url``: within ``timeout_s`` per read, ``deadline_s`` in all, at most ``max_bytes``."""
    sockets = _Sockets()
    watchdog = threading.Timer(deadline_s, sockets.expire)
    watchdog.daemon = True
    started = time.monotonic()
    watchdog.start()
    try:
        request = urllib.request.Request(url, headers={"Accept": accept})
        with _opener(sockets).open(request, timeout=timeout_s) as response:
            chunks: list[bytes] = []
            received = 0
            while received <= max_bytes:
                chunk = response.read(min(CHUNK, max_bytes + 1 - received))
                if not chunk:
                    break
                chunks.append(chunk)
                received += len(chunk)
                if sockets.expired:
                    break
        if sockets.expired:
            raise TimeoutError("deadline")
    except urllib.error.HTTPError as exc:
        why = f"HTTP {exc.code} {one_line(exc.reason, 80)}"
        raise FetchError(f"{url} answered {why}", f"it answered {why}") from None
    except (TimeoutError, socket.timeout):
        raise _late(url, sockets.expired or time.monotonic() - started >= deadline_s, timeout_s, deadline_s) from None
    except urllib.error.URLError as exc:
        if sockets.expired:
            raise _late(url, True, timeout_s, deadline_s) from None
        why = one_line(exc.reason)
        raise FetchError(f"cannot reach {url}: {why}", f"cannot reach it: {why}") from None
    except (OSError, ValueError, HTTPException) as exc:  # reset connection, malformed answer
        if sockets.expired:
            raise _late(url, True, timeout_s, deadline_s) from None
        why = one_line(exc) or type(exc).__name__
        raise FetchError(f"cannot read {url}: {why}", why) from None
    finally:
        watchdog.cancel()
    if received > max_bytes:
        why = f"more than {max_bytes // 2**20} MiB: not what was asked for"
        raise FetchError(f"{url} answered {why}", f"it answered {why}")
    return b"".join(chunks)


def _late(url: str, overall: bool, timeout_s: float, deadline_s: float) -> FetchError:
    why = f"did not finish answering within {deadline_s:g} s" if overall else f"did not answer within {timeout_s:g} s"
    return FetchError(f"{url} {why}", f"it {why}")
