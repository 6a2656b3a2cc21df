"""The agent's HTTP endpoint: ``/metrics``, ``/healthz``, ``/api/v1/snapshot``, a landing page, and
``POST /api/v1/report`` for workload reports (when a :class:`~agent.reports.ReportStore` is given).

Every GET handler reads the last published snapshot and nothing else, so a request can never wait
on a GPU; a report only touches the in-memory store. Concurrency is capped: past ``max_concurrent``
in-flight requests the server answers 503 at once instead of spawning threads without bound.
"""

from __future__ import annotations

import gzip
import html
import json
import logging
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Sequence
from urllib.parse import urlsplit

from prometheus_client.exposition import choose_encoder

from agent import __version__
from agent.model import NodeSnapshot
from agent.reports import REPORT_PATH, ReportStore, is_loopback, linger, serve_report
from agent.snapshot_json import snapshot_to_dict
from exporters.prometheus import ExpositionCache

log = logging.getLogger("roofwatch.http")


class AgentHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(
        self,
        address: tuple[str, int],
        get_snapshot: Callable[[], NodeSnapshot],
        *,
        stale_after_s: float,
        max_processes_per_gpu: int = 16,
        max_concurrent: int = 64,
        clock: Callable[[], float] = time.time,
        reports: ReportStore | None = None,
        gpu_labels: Sequence[str] = (),
    ) -> None:
        self.get_snapshot = get_snapshot
        self.reports = reports
        self.exposition = ExpositionCache(get_snapshot, max_processes_per_gpu=max_processes_per_gpu,
                                          gpu_labels=gpu_labels)
        self.stale_after_s = stale_after_s
        self.clock = clock
        self.slots = threading.BoundedSemaphore(max_concurrent)
        super().__init__(address, _Handler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        shown = "127.0.0.1" if host in ("0.0.0.0", "") else ("[::1]" if host == "::" else host)
        if ":" in shown and not shown.startswith("["):
            shown = f"[{shown}]"
        return f"http://{shown}:{port}/"

    def health(self) -> tuple[bool, str]:
        """Healthy while the collector keeps publishing; a stuck loop must fail liveness."""
        snapshot = self.get_snapshot()
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
    timeout = 300
    """Idle keep-alive connections are closed after this many seconds, so each cannot hold a thread
    for ever (Prometheus reconnects at its next scrape)."""

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
        log.debug("http %s", format % args)

    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        if not self.server.slots.acquire(blocking=False):
            self._send(HTTPStatus.SERVICE_UNAVAILABLE, b"too many concurrent requests\n", "text/plain; charset=utf-8")
            return
        try:
            self._route()
        finally:
            self.server.slots.release()

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
            serve_report(self, store, peer_pid=None, from_loopback=is_loopback(str(self.client_address[0])))
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
            body = json.dumps(snapshot_to_dict(self.server.get_snapshot()), separators=(",", ":")).encode()
            self._send(HTTPStatus.OK, body, "application/json")
        elif path == "/":
            self._send(HTTPStatus.OK, landing_page(self.server.get_snapshot()).encode(), "text/html; charset=utf-8")
        else:
            self._send(HTTPStatus.NOT_FOUND, b"not found; try /metrics, /healthz, /api/v1/snapshot or /\n", "text/plain; charset=utf-8")

    def _metrics(self) -> None:
        encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
        body = self.server.exposition.render(encoder, content_type)
        headers = {}
        if "gzip" in self.headers.get("Accept-Encoding", ""):
            body = gzip.compress(body, compresslevel=1)
            headers["Content-Encoding"] = "gzip"
        self._send(HTTPStatus.OK, body, content_type, headers)

    def _send(self, status: HTTPStatus, body: bytes, content_type: str, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


def _fmt(value: float | None, scale: float = 1.0, digits: int = 0, suffix: str = "") -> str:
    return "—" if value is None else f"{value * scale:.{digits}f}{suffix}"


def landing_page(snapshot: NodeSnapshot) -> str:
    """A plain page a person can open on the node: which GPUs are up and what they are doing."""
    rows = []
    for device in snapshot.devices:
        s = device.sample if device.up else None
        rows.append(
            "<tr>"
            f"<td>{html.escape(device.info.gpu)}</td><td>{html.escape(device.info.model)}</td>"
            f"<td>{'up' if device.up else 'DOWN: ' + html.escape(device.error or '')}</td>"
            f"<td>{_fmt(s.gr_active if s else None, 100, 0, '%')}</td>"
            f"<td>{_fmt(s.sm_active if s else None, 100, 0, '%')}</td>"
            f"<td>{_fmt(s.tensor_active if s else None, 100, 0, '%')}</td>"
            f"<td>{_fmt(s.dram_active if s else None, 100, 0, '%')}</td>"
            f"<td>{_fmt(s.power_w if s else None, 1, 0, ' W')}</td>"
            f"<td>{_fmt(s.sm_clock_mhz if s else None, 1, 0, ' MHz')}</td>"
            "</tr>"
        )
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>roofwatch</title>"
        "<meta http-equiv='refresh' content='5'>"
        "<style>body{font-family:sans-serif;margin:2em}td,th{padding:4px 10px;text-align:right}"
        "th{border-bottom:1px solid #999}</style></head><body>"
        f"<h1>roofwatch {html.escape(__version__)} on {html.escape(snapshot.node)}</h1>"
        f"<p>{snapshot.visible_devices}/{snapshot.expected_devices} GPUs up · backend "
        f"{html.escape(snapshot.health.backend)} · cycle {snapshot.health.cycles_total}</p>"
        "<table><tr><th>GPU</th><th>model</th><th>state</th><th>engine</th><th>SM</th><th>tensor</th>"
        "<th>DRAM</th><th>power</th><th>SM clock</th></tr>"
        + "".join(rows)
        + "</table><p><a href='/metrics'>/metrics</a> · <a href='/healthz'>/healthz</a> · "
        "<a href='/api/v1/snapshot'>/api/v1/snapshot</a></p></body></html>"
    )
