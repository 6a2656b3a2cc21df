"""``roofwatch doctor`` on the OTLP push: is it on, where does it go, and does the collector accept it.

One empty export (a request with no metrics, which a collector accepts and stores nothing from) through
the same SDK exporter the agent builds, with the same endpoint, headers, TLS files and compression, so a
wrong port, a refused certificate or a missing API key (401, 403) shows here before any data is lost.
Nothing is said when the push is off.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from agent.diagnostics.findings import Finding

DOCTOR_TIMEOUT_S = 5.0
IMPACT = ("every metric pushed over OTLP is dropped (counted in roofwatch_otlp_dropped_batches_total); "
          "/metrics is unaffected")


def otlp_findings(settings: Any, environ: Mapping[str, str] | None = None) -> list[Finding]:
    """One finding when the push is configured (or configured wrongly), none when it is off."""
    from opentelemetry.sdk.metrics.export import MetricExportResult, MetricsData

    from exporters.otlp.endpoint import OtlpConfigError, resolve
    from exporters.otlp.sdk_exporter import SDK_LOG, make_exporter

    try:
        config = resolve(settings, environ)
    except OtlpConfigError as exc:
        return [Finding("otlp", "fail", str(exc), IMPACT, "correct the value (docs/otlp.md); the agent refuses to start with it")]
    if config is None:
        return []
    config = dataclasses.replace(config, timeout_s=min(config.timeout_s, DOCTOR_TIMEOUT_S))
    exporter = make_exporter(config)
    SDK_LOG.last = None
    try:
        result = exporter.export(MetricsData(resource_metrics=[]), timeout_millis=config.timeout_s * 1000)
        reason = SDK_LOG.last
    except Exception as exc:  # noqa: BLE001 - doctor reports, never crashes
        result, reason = MetricExportResult.FAILURE, SDK_LOG.scrub(f"{type(exc).__name__}: {exc}")
    finally:
        exporter.shutdown()
    redirected_to, partial = getattr(exporter, "redirected_to", None), getattr(exporter, "partial", None)
    if result is MetricExportResult.SUCCESS:
        said = f"; it said: {partial.message}" if partial is not None and partial.message else ""
        return [Finding("otlp", "ok", f"{config.describe()}: the collector accepted an empty export{said}")]
    if redirected_to is not None:
        return [Finding("otlp", "warn", f"{config.describe()}: redirected to {redirected_to}", IMPACT,
                        f"set {config.source} to the collector's own URL (the one it redirects to, if that is the "
                        "collector): a redirect is never followed, so that the headers' credentials go only where "
                        "they were meant to")]
    return [Finding("otlp", "warn", f"{config.describe()}: {reason or 'no answer within the deadline'}", IMPACT,
                    "check the collector is listening on that address and protocol (4318 http/protobuf, 4317 grpc), "
                    "its certificate (OTEL_EXPORTER_OTLP_CERTIFICATE) and the credentials in "
                    "OTEL_EXPORTER_OTLP_HEADERS or otlp_headers")]
