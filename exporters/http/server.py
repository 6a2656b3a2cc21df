"""The agent's HTTP endpoint: ``/metrics``, ``/healthz``, ``/readyz``, ``/api/v1/snapshot``, the ``/`` page the app
registers, and
``POST /api/v1/report`` for workload reports (when a :class:`~agent.context.workload.report_store.ReportStore` is given).

Every GET reads the last published snapshot and nothing else, so a request can never wait on a GPU;
a report only touches the in-memory store. The listener (exporters.http.listener,
exporters.http.connection) is an asyncio server over the h11 parser with deadlines and caps for
hostile clients (exporters.http.limits); docs/architecture.md says why it replaced http.server.
This module holds what every request reads: the caches, the health verdict, the web config, and the
in-flight slots that a stopping agent drains.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Callable, Sequence

from agent import __version__
from agent.context.workload.report_store import ReportStore
from agent.model import NodeSnapshot
from exporters.http.limits import ListenerLimits
from exporters.http.listener import Listener, bind
from exporters.http.page import HtmlPage
from exporters.http.routes import fill_page, page_template, snapshot_json
from exporters.prometheus import ExpositionCache
from exporters.render_cache import PerSnapshotCache
from exporters.web_config import WebConfig

log = logging.getLogger("roofwatch.http")


class AgentHTTPServer:
    server_version = f"roofwatch/{__version__}"

    def __init__(
        self,
        address: tuple[str, int],
        get_snapshot: Callable[[], NodeSnapshot],
        *,
        stale_after_s: float,
        max_processes_per_gpu: int = 16,
        max_concurrent: int | None = None,
        max_connections: int | None = None,
        clock: Callable[[], float] = time.time,
        reports: ReportStore | None = None,
        gpu_labels: Sequence[str] = (),
        optional_metrics: Sequence[str] = (),
        web: WebConfig | None = None,
        limits: ListenerLimits | None = None,
        page: HtmlPage | None = None,
    ) -> None:
        """``page``: the ``/`` page, registered by the app (agent.app.assemble.status_page); without one
        ``/`` is not found. This layer renders no view itself (docs/architecture.md, layers)."""
        limits = limits or ListenerLimits()
        overrides = {"max_in_flight": max_concurrent, "max_connections": max_connections}
        limits = dataclasses.replace(limits, **{k: v for k, v in overrides.items() if v is not None})
        self.limits = limits
        self.get_snapshot = get_snapshot
        self.reports = reports
        self.exposition = ExpositionCache(get_snapshot, max_processes_per_gpu=max_processes_per_gpu,
                                          gpu_labels=gpu_labels, optional_metrics=optional_metrics)
        self.stale_after_s = stale_after_s
        self.clock = clock
        self.max_concurrent = limits.max_in_flight
        self.slots = threading.BoundedSemaphore(limits.max_in_flight)
        """One per request being answered, from the whole request to its answer handed to the socket."""
        self.draining = threading.Event()
        """Set by :meth:`drain`: a request that finds no free slot is told the agent is stopping."""
        self.pages = PerSnapshotCache()
        self.page = page
        self.web = web or WebConfig.none()
        self.socket = bind(address)
        self.server_address = self.socket.getsockname()
        self._listener = Listener(self, self.socket, limits)

    # -- running (the socketserver-like surface the CLI and tests use) -------------------------------

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        """Serve in this thread until :meth:`server_close`; ``poll_interval`` is accepted and unused."""
        self._listener.serve_forever()

    def shutdown(self) -> None:
        """Stop accepting connections; the open ones keep being answered until :meth:`server_close`."""
        self._listener.shutdown()

    def server_close(self) -> None:
        self._listener.close()

    @property
    def open_connections(self) -> int:
        return self._listener.open_connections

    def drain(self, timeout_s: float) -> bool:
        """Wait until no request is being answered (after :meth:`shutdown` stopped new connections), so
        a stopping agent never cuts an answer short; False if some were still running at the deadline.
        A slot is given back once its answer is handed to the socket, which :meth:`server_close` flushes."""
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
        """A handler raised (called inside the ``except``): a bug, logged with its traceback."""
        log.error("request failed", exc_info=True)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        shown = "127.0.0.1" if host in ("0.0.0.0", "") else ("[::1]" if host == "::" else host)
        if ":" in shown and not shown.startswith("["):
            shown = f"[{shown}]"
        return f"{'https' if self.web.tls is not None else 'http'}://{shown}:{port}/"

    # -- what requests read ------------------------------------------------------------------------

    def snapshot_json(self) -> bytes:
        return self.pages.get(self.get_snapshot(), "json", snapshot_json)

    def status_page(self, refresh_s: float) -> bytes:
        """The ``/`` page: rendered once per snapshot (one with the refresh script, one without), the
        period filled in per request. A stale snapshot is rendered afresh so its banner shows the age."""
        page = self.page
        if page is None:
            raise LookupError("no / page was registered with this server")
        ok, reason = self.health()
        snapshot = self.get_snapshot()
        refreshing = refresh_s > 0
        if not ok:
            return fill_page(page_template(page, snapshot, refreshing=refreshing, stale=reason), refresh_s)
        template = self.pages.get(snapshot, ("page", refreshing),
                                  lambda s: page_template(page, s, refreshing=refreshing, stale=None))
        return fill_page(template, refresh_s)

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

    def readiness(self) -> tuple[bool, str]:
        """Ready (the chart's readiness probe) while the agent collects from its GPU source and the collector keeps
        publishing; not while it waits for its driver or exporter, nor while the exporter that serves its GPUs
        (``--backend dcgm-exporter``: the source named as the backend) is down or stale. Alive all the same:
        ``/healthz`` stays 200. Either way the text names every source the agent waits for and why: its GPU
        source first, then the neighbours down or stale beside the driver (an exporter joined to NVML, inference
        endpoints), whose figures are unknown meanwhile while the GPUs' own readings stay good."""
        snapshot = self.get_snapshot()
        backend = snapshot.health.backend
        down = [(s.name, f"{s.name}: {s.state}" + (f" ({s.detail})" if s.detail else ""))
                for s in snapshot.sources if s.state != "up"]
        own = [said for name, said in down if name == backend]
        others = [said for name, said in down if name != backend]
        if snapshot.health.waiting_for:
            return False, "; ".join([f"not ready: waiting for {snapshot.health.waiting_for}", *others])
        ok, reason = self.health()
        if not ok:
            return False, f"not ready: {reason}"
        if own:
            return False, "; ".join([f"not ready: waiting for {own[0]}", *others])
        head = f"ready: {snapshot.visible_devices}/{snapshot.expected_devices} GPUs up"
        return True, "; ".join([head, *(f"waiting for {w}" for w in others)])
