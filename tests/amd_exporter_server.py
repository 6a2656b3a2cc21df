"""A stand-in AMD Device Metrics Exporter for tests: its two paths, ``/metrics`` and ``/gpumetrics``, over real HTTP
from a thread, each body swappable while it runs (a value changes, the exporter turns hostile), with a count of the
requests each path got. tests/dcgm_exporter_server.py's ``FakeExporter`` serves ``/metrics`` alone; the join's
fallback also reads ``/gpumetrics`` from the same host and port, so this one serves both."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.agent_process import serving

TYPES = {"/metrics": "text/plain; version=0.0.4; charset=utf-8", "/gpumetrics": "application/json"}


class FakeDme:
    """``with FakeDme(metrics, gpumetrics) as dme:`` serves them until the block ends; :meth:`set` swaps a body
    (None: that path answers 404, as ``/gpumetrics`` before DME 1.4.0)."""

    def __init__(self, metrics: str, gpumetrics: bytes | None = None) -> None:
        self._bodies: dict[str, bytes | None] = {"/metrics": metrics.encode(), "/gpumetrics": gpumetrics}
        self.requests = {path: 0 for path in TYPES}
        self._lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                with owner._lock:
                    body = owner._bodies.get(self.path)
                    owner.requests[self.path] = owner.requests.get(self.path, 0) + 1
                if body is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", TYPES[self.path])
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # a reader that stops at its size cap closes the connection mid-body, as it should

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/metrics"
        self._serving = serving(self._server)

    def set(self, path: str, body: str | bytes | None) -> None:
        with self._lock:
            self._bodies[path] = body.encode() if isinstance(body, str) else body

    def asked(self, path: str) -> int:
        with self._lock:
            return self.requests[path]

    def __enter__(self) -> "FakeDme":
        self._serving.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._serving.__exit__(*exc)
