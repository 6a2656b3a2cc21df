"""Where and how to push: roofwatch's ``otlp_*`` settings over the standard ``OTEL_EXPORTER_OTLP_*`` variables.

Why resolve here instead of leaving every variable to the SDK: the agent must say (in its log and in
``roofwatch doctor``) which endpoint it pushes to, and both SDK exporters must get the same answer.
Explicit settings win over the environment, the environment over the defaults, exactly as for the
agent's other settings. What the SDK reads well on its own is left to it: compression and the TLS files
(``OTEL_EXPORTER_OTLP_[METRICS_]COMPRESSION``, ``_CERTIFICATE``, ``_CLIENT_KEY``, ``_CLIENT_CERTIFICATE``).

One deliberate difference from the Python SDK: ``OTEL_EXPORTER_OTLP_[METRICS_]TIMEOUT`` is read in
milliseconds, as the OpenTelemetry specification defines it (the SDK 1.45 reads seconds, so the
specification's ``10000`` would wait almost three hours); the exporter is then given seconds explicitly.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any, Mapping
from urllib.parse import urlparse

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.sdk.metrics.export import MetricExporter
from opentelemetry.util.re import parse_env_headers

PROTOCOLS = ("http/protobuf", "grpc")
DEFAULT_HTTP, DEFAULT_GRPC = "http://localhost:4318", "http://localhost:4317"
METRICS_PATH = "v1/metrics"
DEFAULT_TIMEOUT_S = 10.0


class OtlpConfigError(ValueError):
    """A value that makes pushing impossible, naming the setting or variable it came from."""


@dataclasses.dataclass(frozen=True)
class OtlpConfig:
    """Everything the pusher and doctor need, resolved once."""

    protocol: str
    endpoint: str
    """The URL as the exporter is given it: http/protobuf the full ``.../v1/metrics``, gRPC ``scheme://host:port``."""
    headers: Mapping[str, str]
    timeout_s: float
    interval_s: float
    queue_size: int
    source: str
    """Which setting or variable named the endpoint (for the log and doctor)."""

    def describe(self) -> str:
        """One line without header values (they are credentials)."""
        names = ", ".join(sorted(self.headers)) or "none"
        return (f"{self.protocol} to {self.endpoint} (from {self.source}) every {self.interval_s:g} s, deadline "
                f"{self.timeout_s:g} s, queue {self.queue_size}, headers: {names}")


def _env(environ: Mapping[str, str], name: str) -> str | None:
    """``OTEL_EXPORTER_OTLP_METRICS_<name>``, else ``OTEL_EXPORTER_OTLP_<name>`` (the signal's own wins)."""
    for key in (f"OTEL_EXPORTER_OTLP_METRICS_{name}", f"OTEL_EXPORTER_OTLP_{name}"):
        value = environ.get(key, "").strip()
        if value:
            return value
    return None


def _env_name(environ: Mapping[str, str], name: str) -> str:
    signal = f"OTEL_EXPORTER_OTLP_METRICS_{name}"
    return signal if environ.get(signal, "").strip() else f"OTEL_EXPORTER_OTLP_{name}"


def http_metrics_url(base: str) -> str:
    """A base URL as ``OTEL_EXPORTER_OTLP_ENDPOINT`` means it, with the metrics path appended (a URL that
    already ends in ``/v1/metrics`` is kept): ``http://collector:4318`` -> ``http://collector:4318/v1/metrics``."""
    if base.rstrip("/").endswith("/" + METRICS_PATH):
        return base.rstrip("/")
    return f"{base.rstrip('/')}/{METRICS_PATH}"


def enabled(settings: Any, environ: Mapping[str, str] | None = None) -> bool:
    """On when ``otlp_endpoint`` is set, or the standard endpoint variable is and the environment does not
    switch metrics export off (``OTEL_SDK_DISABLED=true``, ``OTEL_METRICS_EXPORTER`` without ``otlp``)."""
    environ = os.environ if environ is None else environ
    if getattr(settings, "otlp_endpoint", None):
        return True
    if _env(environ, "ENDPOINT") is None or environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = {part.strip().lower() for part in environ.get("OTEL_METRICS_EXPORTER", "otlp").split(",")}
    return "otlp" in exporters


def resolve(settings: Any, environ: Mapping[str, str] | None = None) -> OtlpConfig | None:
    """The push configuration, or None when OTLP is off; :class:`OtlpConfigError` for a value it cannot use."""
    environ = os.environ if environ is None else environ
    if not enabled(settings, environ):
        return None
    protocol = getattr(settings, "otlp_protocol", None)
    if protocol is None:
        protocol = (_env(environ, "PROTOCOL") or "http/protobuf").lower()
        if protocol not in PROTOCOLS:
            raise OtlpConfigError(f"{_env_name(environ, 'PROTOCOL')}: {protocol!r} is not supported "
                                  f"(roofwatch speaks {' or '.join(PROTOCOLS)}; http/json is not in the Python SDK)")
    explicit = getattr(settings, "otlp_endpoint", None)
    if explicit:
        source = "otlp_endpoint"
        endpoint = http_metrics_url(explicit) if protocol == "http/protobuf" else explicit
    elif protocol == "http/protobuf":
        signal = environ.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "").strip()
        source = "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT" if signal else "OTEL_EXPORTER_OTLP_ENDPOINT"
        endpoint = signal or http_metrics_url(environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip() or DEFAULT_HTTP)
    else:
        source = _env_name(environ, "ENDPOINT")
        endpoint = _env(environ, "ENDPOINT") or DEFAULT_GRPC
    if urlparse(endpoint).scheme not in ("http", "https") or not urlparse(endpoint).netloc:
        raise OtlpConfigError(f"{source}: {endpoint[:200]!r} is not an http:// or https:// URL")
    headers: dict[str, str] = {}
    env_headers = _env(environ, "HEADERS")
    if env_headers:
        headers.update({k.lower(): v for k, v in parse_env_headers(env_headers, liberal=True).items()})
    headers.update({k.lower(): v for k, v in (getattr(settings, "otlp_headers", None) or {}).items()})
    timeout = getattr(settings, "otlp_timeout_s", None)
    if timeout is None:
        raw = _env(environ, "TIMEOUT")
        try:
            timeout = float(raw) / 1000.0 if raw is not None else DEFAULT_TIMEOUT_S
        except ValueError:
            raise OtlpConfigError(f"{_env_name(environ, 'TIMEOUT')}: {raw[:40]!r} is not a number of "
                                  "milliseconds") from None
        if not 0.0 < timeout <= 300.0:
            raise OtlpConfigError(f"{_env_name(environ, 'TIMEOUT')}: {raw} ms is outside 1 ms to 300000 ms")
    return OtlpConfig(protocol=protocol, endpoint=endpoint, headers=headers, timeout_s=float(timeout),
                      interval_s=float(getattr(settings, "otlp_interval_s", 10.0)),
                      queue_size=int(getattr(settings, "otlp_queue_size", 6)), source=source)


def make_exporter(config: OtlpConfig) -> MetricExporter:
    """The SDK's OTLP metric exporter for ``config`` (http/protobuf over requests, or gRPC over grpcio), taught
    to send a request :mod:`exporters.otlp.convert` already built: transport, deadline, retries, headers,
    TLS and compression stay the SDK's. It still exports the SDK's ``MetricsData`` as well (doctor does)."""
    quiet_sdk_logs()
    if config.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcExporter

        class Grpc(GrpcExporter):
            def _translate_data(self, data):  # a request built already goes as it is
                return data if isinstance(data, ExportMetricsServiceRequest) else super()._translate_data(data)

            def _count_data(self, data):
                return 0 if isinstance(data, ExportMetricsServiceRequest) else super()._count_data(data)

        return Grpc(endpoint=config.endpoint, insecure=urlparse(config.endpoint).scheme == "http",
                    headers=dict(config.headers), timeout=config.timeout_s)
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpExporter

    class Http(HttpExporter):
        def export(self, metrics_data, timeout_millis=10_000, **kwargs):
            if isinstance(metrics_data, ExportMetricsServiceRequest):  # one request, the SDK's own retries and deadline
                return self._export_batch(metrics_data)
            return super().export(metrics_data, timeout_millis, **kwargs)

    return Http(endpoint=config.endpoint, headers=dict(config.headers), timeout=config.timeout_s)


class LastError(logging.Handler):
    """Keeps the SDK exporters' last warning or error instead of letting each failed push log a line:
    the pusher logs once per change from working to failing (and back), with this as the reason."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.last: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.last = " ".join(record.getMessage().split())[:300]
        except Exception:  # noqa: BLE001 - a log record must never break a push
            self.last = record.msg if isinstance(record.msg, str) else "unknown error"


SDK_LOG = LastError()


def quiet_sdk_logs() -> LastError:
    """Route the SDK exporters' log records to :data:`SDK_LOG` only (idempotent)."""
    logger = logging.getLogger("opentelemetry.exporter")
    if SDK_LOG not in logger.handlers:
        logger.addHandler(SDK_LOG)
    logger.propagate = False
    logger.setLevel(logging.WARNING)
    return SDK_LOG
