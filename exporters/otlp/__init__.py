"""OTLP push beside ``/metrics``: the same snapshot's families, named by OpenTelemetry's conventions.

Modules, one job each: :mod:`~exporters.otlp.names` (what each family and label is called),
:mod:`~exporters.otlp.convert` (families -> SDK metric data), :mod:`~exporters.otlp.endpoint` (settings
and ``OTEL_EXPORTER_OTLP_*`` -> a checked configuration; :mod:`~exporters.otlp.headers`, the rule for a
header), :mod:`~exporters.otlp.sdk_exporter` (the SDK's exporters, their answers read),
:mod:`~exporters.otlp.transport` (the bounded http/protobuf POST), :mod:`~agent.model.redact` (no
secret in any message), :mod:`~exporters.otlp.pusher` (threads, queue, deadline),
:mod:`~exporters.otlp.self_metrics` (``roofwatch_otlp_*``). docs/otlp.md describes them.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping

from agent.model import NodeSnapshot
from exporters.metrics import METRICS, MetricDef
from exporters.otlp.self_metrics import OTLP_METRICS

CATALOGUE: dict[str, MetricDef] = {d.name: d for d in (*METRICS, *OTLP_METRICS)}
"""Every family's definition by exposed name: units and help for the conversion."""


def open_pusher(config, get_snapshot: Callable[[], NodeSnapshot], *, family_options: Mapping[str, Any] | None = None,
                start_time: float | None = None, exporter=None):
    """A :class:`~exporters.otlp.pusher.OtlpPusher` for ``config`` (an :class:`~exporters.otlp.endpoint.OtlpConfig`),
    not started. Its families are :func:`exporters.prometheus.families_for` with ``family_options``, the
    options the HTTP server renders ``/metrics`` with, so both show one snapshot the same way."""
    from exporters.otlp.convert import Converter
    from exporters.otlp.sdk_exporter import make_exporter
    from exporters.otlp.pusher import OtlpPusher
    from exporters.prometheus import families_for

    options = dict(family_options or {})

    def families(snapshot: NodeSnapshot):
        return families_for(snapshot, **options)

    started = time.time() if start_time is None else start_time
    return OtlpPusher(get_snapshot, exporter if exporter is not None else make_exporter(config),
                      Converter(CATALOGUE, int(started * 1e9)), families, interval_s=config.interval_s,
                      timeout_s=config.timeout_s, queue_size=config.queue_size, describe=config.describe())
