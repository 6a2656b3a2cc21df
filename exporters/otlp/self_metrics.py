"""The push's own figures: what was sent, what was dropped and why, on ``/metrics`` and in the push.

A collector that is down, slow or refusing must show up somewhere other than in the collector: these
families are served on ``/metrics`` beside the snapshot's (only while OTLP is on) and pushed as their
OTLP twins (``roofwatch.otlp.*`` by the naming rule). They are not in
:data:`exporters.metrics.METRICS`, whose families are all exported whenever the agent runs;
``docs/metrics.md`` lists them from :data:`OTLP_METRICS`.
"""

from __future__ import annotations

import threading

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from exporters.metrics import MetricDef
from exporters.metrics.labels import NODE_LABELS

_AGENT = {"nvidia": "agent", "amd": "agent", "virtual": "agent"}

EXPORTS = MetricDef(
    "roofwatch_otlp_exports_total", "counter", "exports",
    "OTLP pushes by outcome: success; partial (accepted, but the collector rejected some data points: "
    "roofwatch_otlp_rejected_points_total); or failure (refused, an error status, a redirect, or no complete answer "
    "within the export deadline otlp_timeout_s, retries included).", NODE_LABELS + ("outcome",), **_AGENT)
DROPPED = MetricDef(
    "roofwatch_otlp_dropped_batches_total", "counter", "batches",
    "Snapshots that never reached the collector, by reason: queue_full (the oldest waiting one, dropped for a newer "
    "one while a push was slow) or export_failed.", NODE_LABELS + ("reason",), **_AGENT)
POINTS = MetricDef(
    "roofwatch_otlp_exported_points_total", "counter", "points",
    "Data points the OTLP collector accepted (those it rejected in a partial success not counted).", NODE_LABELS,
    **_AGENT)
REJECTED = MetricDef(
    "roofwatch_otlp_rejected_points_total", "counter", "points",
    "Data points the OTLP collector rejected in partial successes (its partial_success.rejected_data_points, at "
    "most the points of that push); the message is logged once.", NODE_LABELS, **_AGENT)
QUEUE = MetricDef(
    "roofwatch_otlp_queue_batches", "gauge", "batches",
    "Snapshots waiting to be pushed (at most otlp_queue_size; then the oldest is dropped).", NODE_LABELS, **_AGENT)
LAST_DURATION = MetricDef(
    "roofwatch_otlp_last_export_duration_seconds", "gauge", "seconds",
    "Wall time of the last push, conversion and retries included, until the collector answered or the deadline "
    "passed.", NODE_LABELS, **_AGENT)
LAST_SUCCESS = MetricDef(
    "roofwatch_otlp_last_success_timestamp_seconds", "gauge", "seconds",
    "Unix time the collector last accepted a push (absent until it has).", NODE_LABELS, **_AGENT)

OTLP_METRICS: tuple[MetricDef, ...] = (EXPORTS, DROPPED, POINTS, REJECTED, QUEUE, LAST_DURATION, LAST_SUCCESS)
"""Exported only while OTLP is on, in this order."""

OUTCOMES = ("success", "partial", "failure")
DROP_REASONS = ("queue_full", "export_failed")


class PushStats:
    """Counters the push thread writes and every reader (a scrape, the next push) copies under one lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.exports = dict.fromkeys(OUTCOMES, 0)
        self.dropped = dict.fromkeys(DROP_REASONS, 0)
        self.points = 0
        self.rejected = 0
        self.queued = 0
        self.last_duration_s: float | None = None
        self.last_success_ts: float | None = None

    def drop(self, reason: str) -> None:
        with self._lock:
            self.dropped[reason] += 1

    def set_queued(self, length: int) -> None:
        with self._lock:
            self.queued = length

    def exported(self, outcome: str, points: int, duration_s: float, now: float, rejected: int = 0) -> None:
        """One push: ``outcome`` one of :data:`OUTCOMES`; ``rejected`` of its ``points`` refused in a partial."""
        with self._lock:
            self.exports[outcome] += 1
            self.last_duration_s = duration_s
            if outcome != "failure":
                self.points += points - rejected
                self.rejected += rejected
                self.last_success_ts = now
            else:
                self.dropped["export_failed"] += 1

    def families(self, node: str) -> list[Metric]:
        """The :data:`OTLP_METRICS` families as of now, labelled with ``node``."""
        with self._lock:
            exports, dropped, points, queued = dict(self.exports), dict(self.dropped), self.points, self.queued
            rejected = self.rejected
            duration, success = self.last_duration_s, self.last_success_ts
        out: list[Metric] = []
        family = CounterMetricFamily(EXPORTS.family_name, EXPORTS.help, labels=EXPORTS.labels)
        for outcome in OUTCOMES:
            family.add_metric([node, outcome], exports[outcome])
        out.append(family)
        family = CounterMetricFamily(DROPPED.family_name, DROPPED.help, labels=DROPPED.labels)
        for reason in DROP_REASONS:
            family.add_metric([node, reason], dropped[reason])
        out.append(family)
        for defn, count in ((POINTS, points), (REJECTED, rejected)):
            family = CounterMetricFamily(defn.family_name, defn.help, labels=defn.labels)
            family.add_metric([node], count)
            out.append(family)
        for defn, value in ((QUEUE, queued), (LAST_DURATION, duration), (LAST_SUCCESS, success)):
            gauge = GaugeMetricFamily(defn.name, defn.help, labels=defn.labels)
            if value is not None:
                gauge.add_metric([node], value)
            out.append(gauge)
        return out
