"""Where and how to push: roofwatch's ``otlp_*`` settings over the standard ``OTEL_EXPORTER_OTLP_*`` variables.

Why resolve here instead of leaving every variable to the SDK: the agent must say (in its log and in
``roofwatch doctor``) which endpoint it pushes to, and both SDK exporters must get the same answer.
Explicit settings win over the environment, the environment over the defaults, exactly as for the
agent's other settings. Compression and the TLS files (``OTEL_EXPORTER_OTLP_[METRICS_]COMPRESSION``,
``_CERTIFICATE``, ``_CLIENT_KEY``, ``_CLIENT_CERTIFICATE``) are read where the SDK reads them (and, for
http/protobuf, by :func:`exporters.otlp.sdk_exporter.tls_files` the same way).
Headers from every source follow one rule (:mod:`exporters.otlp.headers`), checked here at start: a value
that could never be sent stops the agent naming the header, never showing the value, instead of failing
every push with the value quoted in the error. :mod:`exporters.otlp.sdk_exporter` builds the exporter.

One deliberate difference from the Python SDK: ``OTEL_EXPORTER_OTLP_[METRICS_]TIMEOUT`` is read in
milliseconds, as the OpenTelemetry specification defines it (the SDK 1.45 reads seconds, so the
specification's ``10000`` would wait almost three hours); the exporter is then given seconds explicitly.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping
from urllib.parse import urlparse

from exporters.otlp.headers import HeaderError, check, parse_variable
from agent.model.redact import safe_url

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
        """One line without header values, URL userinfo or query values (they are credentials)."""
        names = ", ".join(sorted(self.headers)) or "none"
        return (f"{self.protocol} to {safe_url(self.endpoint)} (from {self.source}) every {self.interval_s:g} s, "
                f"deadline {self.timeout_s:g} s, queue {self.queue_size}, headers: {names}")


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
    _check_url(endpoint, source, protocol, environ)
    headers: dict[str, str] = {}
    env_headers = _env(environ, "HEADERS")
    if env_headers:
        try:
            headers.update(parse_variable(env_headers))
        except HeaderError as exc:
            raise OtlpConfigError(f"{_env_name(environ, 'HEADERS')}: {exc}") from None
    own = dict(getattr(settings, "otlp_headers", None) or {})
    try:
        check(own)  # the settings loader checked them already; a caller's settings object too
    except HeaderError as exc:
        raise OtlpConfigError(f"otlp_headers: {exc}") from None
    headers.update({k.lower(): v for k, v in own.items()})
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


CREDENTIAL_PROVIDERS = ("OTEL_PYTHON_EXPORTER_OTLP_HTTP_CREDENTIAL_PROVIDER",
                        "OTEL_PYTHON_EXPORTER_OTLP_HTTP_METRICS_CREDENTIAL_PROVIDER")
"""The SDK's hook for a requests session of a plugin's: the bounded transport sends no requests session."""


def _check_url(endpoint: str, source: str, protocol: str, environ: Mapping[str, str]) -> None:
    """:class:`OtlpConfigError` for an endpoint the push cannot use, shown without its credentials."""
    try:
        parsed = urlparse(endpoint)
        parsed.port  # noqa: B018 - raises for a port that is no number
    except ValueError:
        raise OtlpConfigError(f"{source}: {safe_url(endpoint)} is not a URL with a valid host and port") from None
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise OtlpConfigError(f"{source}: {safe_url(endpoint)} is not an http:// or https:// URL")
    if protocol == "grpc" and "@" in parsed.netloc:
        raise OtlpConfigError(f"{source}: a gRPC endpoint cannot carry user:password@ (gRPC has no such "
                              "credentials): put them in otlp_headers or OTEL_EXPORTER_OTLP_HEADERS")
    provider = next((name for name in CREDENTIAL_PROVIDERS if environ.get(name, "").strip()), None)
    if protocol == "http/protobuf" and provider:
        raise OtlpConfigError(f"{provider}: roofwatch's http/protobuf push has its own bounded transport and "
                              "cannot use a requests session; put the credentials in otlp_headers")
