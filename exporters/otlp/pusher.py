"""Pushing the latest snapshot over OTLP on threads of its own, never in the way of collection or a scrape.

Why two threads and a bounded queue: a collector that is down, slow or hanging must cost the agent
nothing but counted drops. The ticker only takes the published snapshot every ``interval_s`` and
queues it (at most ``queue_size`` waiting; a full queue drops its oldest, counted as ``queue_full``),
so its schedule never depends on the network. The sender converts and exports one snapshot at a time
within one deadline (``timeout_s``, from connecting to the answer's last byte, the SDK's retries
included: :mod:`exporters.otlp.transport`, gRPC's own deadline); a push that fails is
counted as ``export_failed`` and not retried later, since a newer snapshot is already on its way.
Stopping pushes the latest snapshot once more (as the SDK's own reader does on shutdown) when the
collector is answering and no push is in flight, within the stop's deadline.
Collection and scrapes share nothing with these threads but the immutable snapshot and the counters
in :class:`~exporters.otlp.self_metrics.PushStats`.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Callable

from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult
from prometheus_client.core import Metric as PromFamily

from agent.model import NodeSnapshot
from exporters.otlp.convert import Converter
from exporters.otlp.sdk_exporter import SDK_LOG
from exporters.otlp.self_metrics import PushStats

log = logging.getLogger("roofwatch.otlp")


class OtlpPusher:
    """Pushes ``families(snapshot)`` of the snapshot ``get_snapshot()`` returns, every ``interval_s``."""

    def __init__(self, get_snapshot: Callable[[], NodeSnapshot], exporter: MetricExporter, converter: Converter,
                 families: Callable[[NodeSnapshot], list[PromFamily]], *, interval_s: float, timeout_s: float,
                 queue_size: int, describe: str = "", clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        if queue_size < 1 or interval_s <= 0 or timeout_s <= 0:
            raise ValueError("queue_size >= 1, interval_s > 0 and timeout_s > 0")
        self.get_snapshot = get_snapshot
        self.exporter = exporter
        self.converter = converter
        self.families = families
        self.interval_s, self.timeout_s, self.queue_size = interval_s, timeout_s, queue_size
        self.describe = describe
        self.stats = PushStats()
        self._clock, self._monotonic = clock, monotonic
        self._queue: collections.deque[NodeSnapshot] = collections.deque()
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._failing = False
        self._partial = False  # the last accepted push was partial (or carried a warning): logged already
        self._sending = False  # a push is in flight on the sender thread
        self._last_pushed: int | None = None  # the sequence of the snapshot last pushed, whatever the outcome

    # -- what /metrics adds while OTLP is on ----------------------------------------------------------

    def scrape_families(self, snapshot: NodeSnapshot) -> list[PromFamily]:
        """The push's own families for ``/metrics``: the same counters its OTLP twins carry."""
        return self.stats.families(snapshot.node)

    # -- threads --------------------------------------------------------------------------------------

    def start(self) -> None:
        self._threads = [threading.Thread(target=self._tick_loop, name="roofwatch-otlp-tick", daemon=True),
                         threading.Thread(target=self._send_loop, name="roofwatch-otlp-send", daemon=True)]
        for thread in self._threads:
            thread.start()
        log.info("pushing OTLP", extra={"otlp": self.describe})

    def stop(self, timeout: float = 1.0) -> None:
        """Stop both threads, pushing the latest snapshot once more first when the collector is answering.

        The final push is what the OpenTelemetry SDK's own reader does on shutdown: without it the last
        interval before a SIGTERM (up to ``interval_s`` of counters) never reaches the collector. It is
        made only when no push is in flight and the last one succeeded, and within ``timeout`` (its
        retries included): a collector that is down or hanging costs stopping nothing. An export in
        flight is abandoned (its connection closed), never waited out."""
        with self._cond:
            self._stop.set()
            flush = self._threads and not self._sending and not self._failing
            self._cond.notify_all()
        if flush:
            try:
                snapshot = self.get_snapshot()
                if snapshot is not None and snapshot.sequence != self._last_pushed:
                    self.push(snapshot, timeout_s=min(timeout, self.timeout_s))
            except Exception as exc:  # noqa: BLE001 - stopping must not fail on a last read
                log.debug("OTLP final push", extra={"error": str(exc)})
        try:
            self.exporter.shutdown(timeout_millis=timeout * 1000)
        except Exception as exc:  # noqa: BLE001 - stopping must not fail on the exporter's account
            log.debug("OTLP exporter shutdown", extra={"error": str(exc)})
        deadline = self._monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - self._monotonic()))

    def offer(self, snapshot: NodeSnapshot) -> None:
        """Queue ``snapshot`` for the sender; a full queue drops its oldest (counted)."""
        with self._cond:
            if len(self._queue) >= self.queue_size:
                self._queue.popleft()
                self.stats.drop("queue_full")
            self._queue.append(snapshot)
            self.stats.set_queued(len(self._queue))
            self._cond.notify()

    def _tick_loop(self) -> None:
        next_at = self._monotonic()
        while True:
            next_at += self.interval_s
            delay = next_at - self._monotonic()
            if delay < 0:  # the process was stopped or starved for longer than an interval: keep the rhythm
                next_at, delay = self._monotonic(), 0.0
            if self._stop.wait(delay):
                return
            try:
                self.offer(self.get_snapshot())
            except Exception as exc:  # noqa: BLE001 - the ticker outlives any one bad read
                log.warning("OTLP: could not take the snapshot", extra={"error": str(exc)})

    def _send_loop(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stop.is_set():
                    self._cond.wait()
                if self._stop.is_set():
                    return
                snapshot = self._queue.popleft()
                self.stats.set_queued(len(self._queue))
                self._sending = True
            try:
                self.push(snapshot)
            finally:
                with self._cond:
                    self._sending = False

    # -- one push -------------------------------------------------------------------------------------

    def build(self, snapshot: NodeSnapshot):
        """The OTLP data for ``snapshot``: its families stamped with its time, the push's own figures with now."""
        now_ns = int(self._clock() * 1e9)
        return self.converter.request(snapshot.node, [
            (self.families(snapshot), int(snapshot.ts * 1e9)),
            (self.stats.families(snapshot.node), now_ns),
        ])

    def push(self, snapshot: NodeSnapshot, timeout_s: float | None = None) -> bool:
        """Convert and export one snapshot within the deadline (``timeout_s``, else the configured one), from
        connecting to the answer's last byte, retries included; True when the collector accepted it (all of
        it, or part of it: outcome ``partial``, its rejected points counted and its message logged once)."""
        started = self._monotonic()
        points, error, partial = 0, None, None
        self._last_pushed = snapshot.sequence
        try:
            data, points = self.build(snapshot)
            SDK_LOG.last = None
            deadline_s = self.timeout_s if timeout_s is None else timeout_s
            ok = self.exporter.export(data, timeout_millis=deadline_s * 1000) is MetricExportResult.SUCCESS
            if not ok:
                error = SDK_LOG.last or "the exporter gave up"
            partial = getattr(self.exporter, "partial", None) if ok else None
        except Exception as exc:  # noqa: BLE001 - an exporter or conversion bug is a failed push, not a dead thread
            ok, error = False, SDK_LOG.scrub(f"{type(exc).__name__}: {exc}")
        rejected = min(partial.rejected, points) if partial is not None else 0
        outcome = "failure" if not ok else "partial" if rejected else "success"
        self.stats.exported(outcome, points, self._monotonic() - started, self._clock(), rejected)
        if ok and self._failing:
            log.info("OTLP push works again", extra={"otlp": self.describe})
        elif not ok and not self._failing:
            log.warning("OTLP push failed; dropping snapshots until the collector answers (counted in "
                        "roofwatch_otlp_dropped_batches_total)", extra={"error": error, "otlp": self.describe})
        if partial is not None and not self._partial:
            if rejected:
                log.warning("OTLP collector rejected part of a push; counted in roofwatch_otlp_rejected_points_total "
                            "(logged once until a push is wholly accepted)",
                            extra={"rejected": rejected, "error": partial.message, "otlp": self.describe})
            else:
                log.warning("OTLP collector accepted the push with a warning (logged once)",
                            extra={"warning": partial.message, "otlp": self.describe})
        if ok:
            self._partial = partial is not None
        self._failing = not ok
        return ok
