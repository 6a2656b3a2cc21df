"""The http/protobuf push's transport: one bounded POST, handed to the SDK exporter in place of requests.

Why not the SDK's requests transport: it reads a collector's whole answer into memory (a 200 with a
1.5 GiB body took the agent to 1.8 GiB), its timeout is per read (a collector dripping a byte a second
held one push for minutes), and the SDK counts any status below 400 as delivered (a 307 lost every
push while ``last_success`` advanced). Here, as for every other outgoing read of the agent (the rule of
:mod:`agent.context.neighbour_http`, whose shared watchdog this uses): one deadline from connect to the
last byte, the socket shut down when it passes; at most :data:`MAX_ANSWER_BYTES` of an answer read, the
connection then closed; a redirect never followed (credentials stay with the host they were meant for)
and reported as a failure naming where it pointed, without its secrets. The SDK keeps what it does
well: the request's body, compression and headers, and its retries of 429/502/503/504 with back-off.

TLS is what the SDK's transport did: ``OTEL_EXPORTER_OTLP_[METRICS_]CERTIFICATE`` (else requests'
bundle: ``REQUESTS_CA_BUNDLE``, ``CURL_CA_BUNDLE``, certifi), the client certificate and key;
``HTTPS_PROXY``/``HTTP_PROXY``/``NO_PROXY`` as requests read them (an http:// proxy; CONNECT for https).
A URL's ``user:password@`` becomes basic auth, unless an ``authorization`` header is set.
"""

from __future__ import annotations

import base64
import dataclasses
import os
import socket
import ssl
import threading
import time
import urllib.request
from email.message import Message
from http.client import HTTPConnection, HTTPException, HTTPSConnection
from typing import Any, Mapping
from urllib.parse import unquote, urlsplit

from opentelemetry.exporter.http.transport._base import BaseHTTPResult, BaseHTTPTransport

from agent.context.neighbour_http import DeadlineSockets
from agent.context.neighbour_http import watched as sockets_shut_at
from agent.model.redact import safe_url
from agent.model.text import one_line

MAX_ANSWER_BYTES = 16 * 1024
"""A collector's answer is an ``ExportMetricsServiceResponse``: empty, or a partial success and its message."""


class PushFailed(Exception):
    """No usable answer: ``kind`` is ``deadline``, ``redirect``, ``refused``, ``unreachable``, ``tls`` or
    ``broken``; the message is one printable line without a secret. ``location`` is a redirect's target,
    made safe to show."""

    def __init__(self, kind: str, message: str, location: str | None = None) -> None:
        super().__init__(message)
        self.kind, self.location = kind, location


RETRIED_AT_ONCE = ("refused", "unreachable", "broken")
"""Failures the SDK may retry (a stale or refused connection); a passed deadline or a redirect is final."""


@dataclasses.dataclass(frozen=True, slots=True)
class Answer(BaseHTTPResult):
    """A status and at most :data:`MAX_ANSWER_BYTES` of the body; ``cut`` when there was more."""

    body: bytes = b""
    header_map: Message | None = dataclasses.field(default=None, compare=False)
    cut: bool = False

    def content(self) -> bytes:
        return self.body

    def headers(self) -> Mapping[str, str]:
        return self.header_map if self.header_map is not None else {}  # type: ignore[return-value]


class BoundedTransport(BaseHTTPTransport):
    """One connection per request, closed after it; at most one request at a time (the pusher's sender).

    ``deadline`` (a ``time.monotonic()`` value), when set by the exporter for an export, bounds every
    request of it, the SDK's retries included; each request is also bounded by the ``timeout`` the SDK
    passes (what is left of its own deadline)."""

    def __init__(self, *, verify: bool | str = True, cert: str | tuple[str, str] | None = None,
                 max_answer_bytes: int = MAX_ANSWER_BYTES) -> None:
        self.verify, self.cert, self.max_answer_bytes = verify, cert, max_answer_bytes
        self.deadline: float | None = None
        self.last: Answer | None = None
        self._context: ssl.SSLContext | None = None
        self._lock = threading.Lock()
        self._current: DeadlineSockets | None = None

    # -- the SDK's interface ----------------------------------------------------------------------------

    def request(self, method: str, url: str, *, headers: dict[str, str] | None = None, timeout: float | None = None,
                data: bytes | None = None) -> BaseHTTPResult:
        now = time.monotonic()
        ends = [now + timeout] if timeout is not None else []
        if self.deadline is not None:
            ends.append(self.deadline)
        deadline = min(ends) if ends else now + 10.0
        with self._lock:
            try:
                answer = self._post(method, url, dict(headers or {}), data, deadline)
            except PushFailed as exc:
                answer = Answer(error=exc)
            self.last = answer
        return answer

    def is_connection_error(self, exception: Exception | None) -> bool:
        return isinstance(exception, PushFailed) and exception.kind in RETRIED_AT_ONCE

    def close(self) -> None:
        """End the request in flight, if any (nothing else is kept open): stopping never waits for it."""
        current = self._current
        if current is not None:
            current.expire()

    # -- one request ------------------------------------------------------------------------------------

    def _post(self, method: str, url: str, headers: dict[str, str], data: bytes | None, deadline: float) -> Answer:
        if deadline - time.monotonic() <= 0:
            raise PushFailed("deadline", "no time left within the push deadline")
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise PushFailed("broken", "the endpoint is not an http:// or https:// URL")
        if parts.username is not None and not any(k.lower() == "authorization" for k in headers):
            headers["Authorization"] = _basic(parts.username, parts.password)
        host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
        netloc = host if parts.port is None else f"{host}:{parts.port}"
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        proxy = _proxy_for(parts)
        if proxy is not None and parts.scheme == "http":  # absolute form through the proxy, its credentials here
            target = f"http://{netloc}{target}"
            headers.update(proxy[2])
        watch = sockets_shut_at(deadline)
        self._current = watch
        conn: HTTPConnection | None = None
        watched: list[socket.socket] = []
        try:
            conn = self._connection(parts, proxy, watch, watched, deadline)
            conn.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
            conn.putheader("Host", netloc)
            for name, value in headers.items():
                conn.putheader(name, value)
            conn.putheader("Content-Length", str(len(data or b"")))
            conn.endheaders(data)
            response = conn.getresponse()
            body = response.read(self.max_answer_bytes + 1)  # the rest is never read: the connection is closed
            if watch.expired:
                raise TimeoutError
            status = response.status
            if 300 <= status < 400:
                location = safe_url(response.headers.get("Location", "") or "(no Location)")
                raise PushFailed("redirect", f"the collector redirected ({status}) to {location}: redirects are not "
                                 "followed; set the endpoint to the collector's own URL", location)
            if status < 200:
                raise PushFailed("broken", f"the collector answered {status}, which is no answer to a push")
            return Answer(status_code=status, reason=one_line(response.reason, 80), body=body[: self.max_answer_bytes],
                          header_map=response.headers, cut=len(body) > self.max_answer_bytes)
        except PushFailed:
            raise
        except ssl.SSLError as exc:
            if watch.expired:
                raise _late() from None
            raise PushFailed("tls", f"TLS: {one_line(exc.reason or exc, 160)}") from None
        except (OSError, HTTPException, ValueError) as exc:  # TimeoutError is an OSError
            if watch.expired or time.monotonic() >= deadline or isinstance(exc, TimeoutError):
                raise _late() from None
            kind = "refused" if isinstance(exc, ConnectionRefusedError) else "broken"
            raise PushFailed(kind, one_line(f"{type(exc).__name__}: {exc}", 160)) from None
        finally:
            watch.expire()  # the answer is read (or given up): shut the watched sockets down
            for sock in watched:
                sock.close()
            if conn is not None:
                conn.close()
            self._current = None

    def _connection(self, parts: Any, proxy: tuple[str, int, dict[str, str]] | None, watch: DeadlineSockets,
                    watched: list[socket.socket], deadline: float) -> HTTPConnection:
        """An unconnected connection to the collector (or the proxy), whose socket the watchdog shuts at the
        deadline: every socket it opens is duplicated for the watchdog, so the TLS wrap (which takes the
        original over) and a proxy's CONNECT are covered from the first byte; the caller closes ``watched``."""
        timeout = max(0.001, deadline - time.monotonic())
        port = parts.port or (443 if parts.scheme == "https" else 80)
        host, to = (proxy[0], proxy[1]) if proxy is not None else (parts.hostname, port)
        if parts.scheme == "https":
            conn: HTTPConnection = HTTPSConnection(host, to, timeout=timeout, context=self._tls())
            if proxy is not None:
                conn.set_tunnel(parts.hostname, port, headers=proxy[2])
        else:
            conn = HTTPConnection(host, to, timeout=timeout)
        create = conn._create_connection  # type: ignore[attr-defined]

        def create_watched(*args: Any, **kwargs: Any) -> socket.socket:
            sock = create(*args, **kwargs)
            watched.append(sock.dup())  # shutdown acts on the socket, whichever descriptor: the TLS reads end too
            watch.add(watched[-1])
            return sock

        conn._create_connection = create_watched  # type: ignore[attr-defined]
        return conn

    def _tls(self) -> ssl.SSLContext:
        if self._context is None:
            try:
                self._context = tls_context(self.verify, self.cert)
            except (OSError, ssl.SSLError, ValueError) as exc:
                raise PushFailed("tls", f"TLS files: {one_line(exc, 160)}") from None
        return self._context


def tls_context(verify: bool | str, cert: str | tuple[str, str] | None) -> ssl.SSLContext:
    """The client context the SDK's requests transport would have used for ``verify`` and ``cert``."""
    if verify is False:
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    else:
        bundle = verify if isinstance(verify, str) else (
            os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE") or _certifi())
        if bundle and os.path.isdir(bundle):
            context = ssl.create_default_context(capath=bundle)
        else:
            context = ssl.create_default_context(cafile=bundle or None)
    if isinstance(cert, tuple):
        context.load_cert_chain(cert[0], cert[1])
    elif cert:
        context.load_cert_chain(cert)
    return context


def _certifi() -> str | None:
    try:
        import certifi
    except ImportError:  # the system's store then
        return None
    return certifi.where()


def _proxy_for(parts: Any) -> tuple[str, int, dict[str, str]] | None:
    """The proxy requests would have used for this URL (from the environment), or None."""
    proxies = urllib.request.getproxies_environment()
    url = proxies.get(parts.scheme) or proxies.get("all")
    if not url or urllib.request.proxy_bypass_environment(parts.hostname, proxies):
        return None
    if "://" not in url:
        url = "http://" + url
    proxy = urlsplit(url)
    if proxy.scheme != "http" or not proxy.hostname:
        raise PushFailed("unreachable", f"proxy {safe_url(url)}: only an http:// proxy is supported")
    auth = {"Proxy-Authorization": _basic(proxy.username, proxy.password)} if proxy.username is not None else {}
    return proxy.hostname, proxy.port or 80, auth


def _basic(user: str, password: str | None) -> str:
    pair = f"{unquote(user)}:{unquote(password or '')}".encode()
    return "Basic " + base64.b64encode(pair).decode("ascii")


def _late() -> PushFailed:
    return PushFailed("deadline", "no complete answer within the push deadline (otlp_timeout_s, retries included)")
