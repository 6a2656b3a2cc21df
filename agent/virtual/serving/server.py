"""Fake inference servers: a real HTTP ``/metrics`` endpoint per serving job, answering from the virtual clock.

Each :class:`FakeInferenceServer` listens on 127.0.0.1 on a port the kernel picks, in a daemon
thread, and renders its job's page at the virtual time of the request (``clock() - start_time``,
the same mapping the virtual backend samples the GPUs with), so the agent's inference scraper reads
counters that move with the GPUs. Anything but ``GET /metrics`` is a 404, as on the real servers'
metrics routes.
"""

from __future__ import annotations

import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

from agent.virtual.serving.exposition import sglang_metrics, vllm_metrics
from agent.virtual.serving.job import ServingJob
from agent.virtual.serving.tgi import tgi_metrics

RENDERERS: dict[str, Callable[[ServingJob, float, float], bytes]] = {
    "vllm": vllm_metrics, "sglang": sglang_metrics, "tgi": tgi_metrics,
}
CONTENT_TYPE = {
    "vllm": "text/plain; version=0.0.4; charset=utf-8",  # prometheus_client's CONTENT_TYPE_LATEST
    "sglang": "text/plain; version=0.0.4; charset=utf-8",
    "tgi": "text/plain; charset=utf-8",
}


class _Handler(BaseHTTPRequestHandler):
    server: "_Listener"
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802 (the http.server name)
        owner = self.server.owner
        if self.path.split("?", 1)[0] != "/metrics":
            self._answer(HTTPStatus.NOT_FOUND, b"Not Found\n", "text/plain; charset=utf-8")
            return
        body = owner.render()
        self._answer(HTTPStatus.OK, body, CONTENT_TYPE[owner.job.server])

    def _answer(self, status: HTTPStatus, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (the http.server signature)
        return  # the agent's log is not the place for a fake server's access log


class _Listener(ThreadingHTTPServer):
    daemon_threads = True
    owner: "FakeInferenceServer"


class FakeInferenceServer:
    """One serving job's ``/metrics``, in the dialect of its server kind, over real HTTP."""

    def __init__(self, job: ServingJob, *, clock: Callable[[], float], start_time: float,
                 host: str = "127.0.0.1", port: int = 0) -> None:
        self.job = job
        self.clock = clock
        self.start_time = start_time
        """Wall time of virtual time 0: the server's start (its ``process_start_time_seconds``)."""
        self._listener = _Listener((host, port), _Handler)
        self._listener.owner = self
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._listener.server_address[:2]
        return f"http://{host}:{port}/metrics"

    def render(self, t: float | None = None) -> bytes:
        """The page at virtual time ``t`` (default: now on the clock)."""
        now = self.clock() - self.start_time if t is None else t
        return RENDERERS[self.job.server](self.job, now, self.start_time)

    def start(self) -> "FakeInferenceServer":
        if self._thread is None:
            self._thread = threading.Thread(target=self._listener.serve_forever, kwargs={"poll_interval": 0.2},
                                            name=f"fake-{self.job.server}-{self.job.name}", daemon=True)
            self._thread.start()
        return self

    def close(self) -> None:
        if self._thread is not None:
            self._listener.shutdown()
            self._thread.join(timeout=2.0)
            self._thread = None
        self._listener.server_close()

    def __enter__(self) -> "FakeInferenceServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
