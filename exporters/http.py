"""The agent's HTTP endpoint: ``/metrics``, ``/healthz``, ``/api/v1/snapshot``, the ``/`` status page, and
``POST /api/v1/report`` for workload reports (when a :class:`~agent.context.workload.report_store.ReportStore` is given).

Every GET handler reads the last published snapshot and nothing else, so a request can never wait
on a GPU; a report only touches the in-memory store. Two caps bound the threads: past
``max_concurrent`` requests in flight the server answers 503 at once, and past ``max_connections``
open connections (each holds a thread, idle keep-alive ones too) new ones are closed on arrival.
"""

from __future__ import annotations

import functools
import json
import logging
import socket
import ssl
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Sequence
from urllib.parse import parse_qs, urlsplit

from prometheus_client.exposition import choose_encoder

from agent import __version__
from agent.context.workload.report_http import REPORT_PATH, is_loopback, linger, serve_report
from agent.context.workload.report_store import ReportStore
from agent.model import NodeSnapshot
from agent.views.status_page import CONTENT_SECURITY_POLICY, DEFAULT_REFRESH_S, status_page
from exporters.prometheus import ExpositionCache
from exporters.render_cache import PerSnapshotCache
from exporters.snapshot_json import snapshot_to_dict
from exporters.web_config import REALM, UNAUTHENTICATED_PATHS, WebConfig

log = logging.getLogger("roofwatch.http")

HANDSHAKE_TIMEOUT_S = 10.0
"""A TLS client gets this long to finish its handshake; then its thread is released."""


class AgentHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128
    """The listen backlog. The standard library's 5 made a burst of scrapers (or clients returning
    after a pause) wait for SYN retries, seconds each."""

    def __init__(
        self,
        address: tuple[str, int],
        get_snapshot: Callable[[], NodeSnapshot],
        *,
        stale_after_s: float,
        max_processes_per_gpu: int = 16,
        max_concurrent: int = 64,
        max_connections: int | None = None,
        clock: Callable[[], float] = time.time,
        reports: ReportStore | None = None,
        gpu_labels: Sequence[str] = (),
        web: WebConfig | None = None,
    ) -> None:
        self.get_snapshot = get_snapshot
        self.reports = reports
        self.exposition = ExpositionCache(get_snapshot, max_processes_per_gpu=max_processes_per_gpu,
                                          gpu_labels=gpu_labels)
        self.stale_after_s = stale_after_s
        self.clock = clock
        self.slots = threading.BoundedSemaphore(max_concurrent)
        self.max_concurrent = max_concurrent
        self.draining = threading.Event()
        """Set by :meth:`drain`: a request that finds no free slot is told the agent is stopping."""
        self.max_connections = max_connections if max_connections is not None else 2 * max_concurrent
        self._connections = 0
        self._connections_lock = threading.Lock()
        self.pages = PerSnapshotCache()
        self.web = web or WebConfig.none()
        super().__init__(address, _Handler)

    def get_request(self) -> tuple[socket.socket, Any]:
        """Each connection is wrapped with the TLS context in force when it arrives (a SIGHUP may
        have rotated the certificate). The handshake runs later, in the request's own thread
        (:meth:`_Handler.setup`), never on the accept loop, so a client that stalls mid-handshake
        cannot block other scrapes."""
        connection, address = super().get_request()
        tls = self.web.tls
        if tls is not None:
            connection = tls.wrap_socket(connection, server_side=True, do_handshake_on_connect=False)
        return connection, address

    def process_request(self, request: Any, client_address: Any) -> None:
        """One thread per connection, but never more than ``max_connections`` of them: a client
        past the cap is closed on arrival (it reconnects, as Prometheus does on its next scrape)."""
        with self._connections_lock:
            if self._connections >= self.max_connections:
                refused = True
            else:
                self._connections += 1
                refused = False
        if refused:
            log.debug("connection from %s refused: %d open", client_address, self.max_connections)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._connection_closed()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._connection_closed()

    def _connection_closed(self) -> None:
        with self._connections_lock:
            self._connections -= 1

    @property
    def open_connections(self) -> int:
        return self._connections

    def drain(self, timeout_s: float) -> bool:
        """Wait until no request is being answered (after :meth:`shutdown` stopped new ones), so
        a stopping agent never cuts an answer short; False if some were still running at the
        deadline. Handler threads are daemons, so without this the exit could kill one mid-write."""
        deadline = time.monotonic() + timeout_s
        taken = 0
        self.draining.set()
        try:
            while taken < self.max_concurrent:
                if not self.slots.acquire(timeout=max(0.0, deadline - time.monotonic())):
                    return False
                taken += 1
            return True
        finally:
            for _ in range(taken):
                self.slots.release()

    def handle_error(self, request: object, client_address: object) -> None:
        """A client that vanished or spoke plain HTTP to the TLS port: not the agent's error."""
        log.debug("connection from %s failed", client_address, exc_info=True)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        shown = "127.0.0.1" if host in ("0.0.0.0", "") else ("[::1]" if host == "::" else host)
        if ":" in shown and not shown.startswith("["):
            shown = f"[{shown}]"
        return f"{'https' if self.web.tls is not None else 'http'}://{shown}:{port}/"

    def snapshot_json(self) -> bytes:
        return self.pages.get(self.get_snapshot(), "json", _snapshot_json)

    def status_page(self, refresh_s: float) -> bytes:
        """The ``/`` page; a stale snapshot is rendered afresh each time so its banner shows the age."""
        ok, reason = self.health()
        render = functools.partial(_status_page, refresh_s=refresh_s, stale=None if ok else reason)
        if not ok:
            return render(self.get_snapshot())
        return self.pages.get(self.get_snapshot(), ("page", refresh_s), render)

    def health(self) -> tuple[bool, str]:
        """Healthy while the collector keeps publishing; a stuck loop must fail liveness."""
        snapshot = self.get_snapshot()
        if snapshot.health.waiting_for:  # alive and doing what it was told: a probe must not restart it
            return True, f"waiting for {snapshot.health.waiting_for}"
        last = snapshot.health.last_cycle_ts
        if last is None:
            return False, "no collection cycle has completed yet"
        age = self.clock() - last
        if age > self.stale_after_s:
            return False, f"snapshot is {age:.1f}s old (limit {self.stale_after_s:.1f}s): the collector is stuck"
        return True, f"ok: {snapshot.visible_devices}/{snapshot.expected_devices} GPUs up, snapshot {age:.1f}s old"


class _Handler(BaseHTTPRequestHandler):
    server: AgentHTTPServer
    server_version = f"roofwatch/{__version__}"
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    """Headers and body go out in two writes; with Nagle's algorithm the body of a small answer
    (gzip /metrics, /healthz) waited for the client's delayed ACK, about 40 ms on Linux."""
    timeout = 300
    """Idle keep-alive connections are closed after this many seconds, so each cannot hold a thread
    for ever (Prometheus reconnects at its next scrape)."""

    def parse_request(self) -> bool:
        """The standard checks, then a target the URL parser accepts (``http://[x/`` is not): 400."""
        if not super().parse_request():
            return False
        try:
            urlsplit(self.path)
        except ValueError:
            self.send_error(HTTPStatus.BAD_REQUEST, "request target is not a valid URL")
            return False
        return True

    def setup(self) -> None:
        if isinstance(self.request, ssl.SSLSocket):
            self.request.settimeout(HANDSHAKE_TIMEOUT_S)
            self.request.do_handshake()  # raises for a plain-HTTP or failed client: handle_error logs it
            self.request.settimeout(None)
        super().setup()

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
        log.debug("http %s", format % args)

    def _no_slot(self) -> None:
        """Answer a request that finds every slot taken: too many in flight, or the agent stopping
        (:meth:`AgentHTTPServer.drain` holds the slots while the last answers finish). Stopping
        says so and closes, so the client retries elsewhere instead of waiting on this connection."""
        if self.server.draining.is_set():
            self._send(HTTPStatus.SERVICE_UNAVAILABLE, b"shutting down\n", "text/plain; charset=utf-8",
                       {"Connection": "close", "Retry-After": "1"})
        else:
            self._send(HTTPStatus.SERVICE_UNAVAILABLE, b"too many concurrent requests\n", "text/plain; charset=utf-8")

    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        if not self.server.slots.acquire(blocking=False):
            self._no_slot()
            return
        try:
            if not self._authorised():
                return
            self._route()
        finally:
            self.server.slots.release()

    def _authorised(self) -> bool:
        """Basic auth when the web config sets users; /healthz stays open for liveness probes."""
        auth = self.server.web.auth
        if not auth.enabled or urlsplit(self.path).path in UNAUTHENTICATED_PATHS:
            return True
        if auth.allows(self.headers.get("Authorization")):
            return True
        self._send(HTTPStatus.UNAUTHORIZED, b"unauthorized\n", "text/plain; charset=utf-8",
                   {"WWW-Authenticate": f'Basic realm="{REALM}", charset="UTF-8"'})
        return False

    def do_HEAD(self) -> None:  # noqa: N802
        self.do_GET()

    def _not_allowed(self) -> None:
        self._send(HTTPStatus.METHOD_NOT_ALLOWED, b"only GET and HEAD are supported\n", "text/plain; charset=utf-8", {"Allow": "GET, HEAD"})

    do_PUT = do_DELETE = do_PATCH = _not_allowed  # noqa: N815

    def do_POST(self) -> None:  # noqa: N802
        if urlsplit(self.path).path != REPORT_PATH:
            self._not_allowed()
            return
        if not self.server.slots.acquire(blocking=False):
            self._send(HTTPStatus.SERVICE_UNAVAILABLE, b"too many concurrent requests\n", "text/plain; charset=utf-8",
                       {"Connection": "close"})
            linger(self.connection)
            return
        try:
            store = self.server.reports
            if store is None:
                # The body stays unread, so the connection cannot carry another request.
                self._send(HTTPStatus.NOT_FOUND, b"workload reports are not enabled on this agent\n",
                           "text/plain; charset=utf-8", {"Connection": "close"})
                linger(self.connection)
                return
            host = str(self.client_address[0])
            serve_report(self, store, peer_pid=None, from_loopback=is_loopback(host), client=("ip", host))
        finally:
            self.server.slots.release()

    def _route(self) -> None:
        path = urlsplit(self.path).path
        if path == "/metrics":
            self._metrics()
        elif path == "/healthz":
            ok, reason = self.server.health()
            status = HTTPStatus.OK if ok else HTTPStatus.SERVICE_UNAVAILABLE
            self._send(status, (reason + "\n").encode(), "text/plain; charset=utf-8")
        elif path == "/api/v1/snapshot":
            self._send(HTTPStatus.OK, self.server.snapshot_json(), "application/json")
        elif path == "/":
            self._status_page()
        else:
            self._send(HTTPStatus.NOT_FOUND, b"not found; try /metrics, /healthz, /api/v1/snapshot or /\n", "text/plain; charset=utf-8")

    def _status_page(self) -> None:
        try:
            refresh_s = _refresh_param(urlsplit(self.path).query)
        except ValueError as exc:
            self._send(HTTPStatus.BAD_REQUEST, f"{exc}\n".encode(), "text/plain; charset=utf-8")
            return
        self._send(HTTPStatus.OK, self.server.status_page(refresh_s), "text/html; charset=utf-8",
                   {"Content-Security-Policy": CONTENT_SECURITY_POLICY, "Cache-Control": "no-store",
                    "X-Content-Type-Options": "nosniff"})

    def _metrics(self) -> None:
        encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
        gzipped = "gzip" in self.headers.get("Accept-Encoding", "")
        body = self.server.exposition.render(encoder, content_type, gzipped=gzipped)
        self._send(HTTPStatus.OK, body, content_type, {"Content-Encoding": "gzip"} if gzipped else {})

    def _send(self, status: HTTPStatus, body: bytes, content_type: str, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for key, value in self.server.web.headers.items():
            self.send_header(key, value)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


MAX_REFRESH_S = 3600.0


def _refresh_param(query: str) -> float:
    """``?refresh=SECONDS`` for the status page: 0 stops it, default 5 s; anything else is a 400."""
    values = parse_qs(query).get("refresh")
    if not values:
        return DEFAULT_REFRESH_S
    try:
        value = float(values[-1])
    except ValueError:
        value = float("nan")
    if not 0.0 <= value <= MAX_REFRESH_S:  # also rejects NaN
        raise ValueError(f"refresh: expected seconds between 0 and {MAX_REFRESH_S:g}, got {values[-1]!r}")
    if 0.0 < value < 1.0:
        value = 1.0  # a browser tab polling faster than the collector only burns the node's CPU
    return value


def _snapshot_json(snapshot: NodeSnapshot) -> bytes:
    return json.dumps(snapshot_to_dict(snapshot), separators=(",", ":")).encode()


def _status_page(snapshot: NodeSnapshot, *, refresh_s: float, stale: str | None) -> bytes:
    return status_page(snapshot_to_dict(snapshot), refresh_s=refresh_s, stale=stale).encode()
