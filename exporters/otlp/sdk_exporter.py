"""The SDK's OTLP metric exporters (http/protobuf and gRPC), taught to send a request
:mod:`exporters.otlp.convert` built, to keep within one deadline per export, to read the collector's
answer (a partial success) and to say nothing secret.

What stays the SDK's: headers, compression, the retries of transient failures with back-off, gRPC's
channel and TLS. What is ours: the http/protobuf transport (:mod:`exporters.otlp.transport`: one
deadline, a capped answer, no redirects), gRPC's received-message cap, and the answer the SDK throws
away: a collector that took only part of a push says so in ``partial_success`` (rejected data points
and a message), which the SDK 1.45 counts as a full success. The SDK is pinned to one release in
``pyproject.toml`` because these subclasses use its internals.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import Any, Iterable
from urllib.parse import urlparse

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult

from exporters.otlp.endpoint import OtlpConfig
from agent.model.redact import scrub, url_secrets
from agent.model.text import one_line
from exporters.otlp.transport import MAX_ANSWER_BYTES, BoundedTransport, PushFailed

GAVE_UP = "due to timeout, max retries or shutdown"
"""The SDK's last word after retrying, which names no cause: the transient error before it does."""
MAX_MESSAGE_CHARS = 200
"""A collector's partial-success message as logged: its first 200 printable characters."""


@dataclasses.dataclass(frozen=True)
class Partial:
    """What a collector said in ``partial_success``: data points it rejected, and why (clipped, printable);
    or, with none rejected, a warning about an accepted push (its message, or an answer too long to read)."""

    rejected: int
    message: str


class LastError(logging.Handler):
    """Keeps the SDK exporters' last warning or error instead of letting each failed push log a line:
    the pusher logs once per change from working to failing (and back), with this as the reason. Every
    text it keeps or :meth:`scrub` returns has the push's credentials replaced (header values, URL
    userinfo and query values, bearer tokens)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.last: str | None = None
        self.secrets: set[str] = set()

    def scrub(self, text: object, limit: int = 300) -> str:
        return scrub(text, self.secrets, limit)

    def hide(self, secrets: Iterable[str]) -> None:
        self.secrets.update(s for s in secrets if s)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.scrub(record.getMessage())
            if GAVE_UP in text and self.last and self.last.startswith("Transient error"):  # keep the cause
                text = f"{self.last.partition(', retrying')[0]}; no time or retries left for another try"
            self.last = text
        except Exception:  # noqa: BLE001 - a log record must never break a push
            self.last = "unknown error"


SDK_LOG = LastError()


def quiet_sdk_logs() -> LastError:
    """Route the SDK exporters' log records to :data:`SDK_LOG` only (idempotent), and drop the header
    parser's (``opentelemetry.util.re`` quotes an entry it cannot parse, value included)."""
    logger = logging.getLogger("opentelemetry.exporter")
    if SDK_LOG not in logger.handlers:
        logger.addHandler(SDK_LOG)
    logger.propagate = False
    logger.setLevel(logging.WARNING)
    parser = logging.getLogger("opentelemetry.util.re")
    parser.propagate = False
    if not parser.handlers:
        parser.addHandler(logging.NullHandler())
    return SDK_LOG


def partial_of(answer: Any) -> Partial | None:
    """The partial success of an ``ExportMetricsServiceResponse`` (or of its serialised bytes), or None when
    there is none or it cannot be read (an empty or foreign body is a plain success)."""
    if isinstance(answer, (bytes, bytearray)):
        try:
            answer = ExportMetricsServiceResponse.FromString(bytes(answer))
        except (DecodeError, ValueError):
            return None
    if not isinstance(answer, ExportMetricsServiceResponse) or not answer.HasField("partial_success"):
        return None
    rejected, message = answer.partial_success.rejected_data_points, answer.partial_success.error_message
    if rejected <= 0 and not message:
        return None
    return Partial(max(0, rejected), SDK_LOG.scrub(one_line(message, MAX_MESSAGE_CHARS), MAX_MESSAGE_CHARS))


class Outcome:
    """What the last export learnt beyond success or failure, read by the pusher and doctor."""

    partial: Partial | None = None
    redirected_to: str | None = None


def make_exporter(config: OtlpConfig) -> MetricExporter:
    """The SDK's exporter for ``config``, with our transport (http/protobuf) or answer cap (gRPC)."""
    quiet_sdk_logs()
    SDK_LOG.hide([*config.headers.values(), *url_secrets(config.endpoint)])
    if config.protocol == "grpc":
        return _grpc(config)
    return _http(config)


def _http(config: OtlpConfig) -> MetricExporter:
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpExporter

    class Http(HttpExporter, Outcome):
        def __init__(self, transport: BoundedTransport) -> None:
            super().__init__(endpoint=config.endpoint, headers=dict(config.headers), timeout=config.timeout_s,
                             _transport=transport)
            self.transport = transport

        def export(self, metrics_data, timeout_millis: float = 10_000, **kwargs):
            self.partial = self.redirected_to = None
            deadline_s = min(config.timeout_s, timeout_millis / 1000)
            self._client._timeout = deadline_s  # the SDK's retries stop at this export's deadline, as the transport
            self.transport.deadline, self.transport.last = time.monotonic() + deadline_s, None
            try:
                if isinstance(metrics_data, ExportMetricsServiceRequest):  # a request built already goes as it is
                    result = self._export_batch(metrics_data)
                else:
                    result = super().export(metrics_data, timeout_millis, **kwargs)
            finally:
                self.transport.deadline = None
            last = self.transport.last
            if result is MetricExportResult.SUCCESS and last is not None and last.cut:
                self.partial = Partial(0, f"its answer was longer than {MAX_ANSWER_BYTES // 1024} KiB and was not read "
                                          "past that (an OTLP collector answers a few bytes: is this the collector?)")
            elif result is MetricExportResult.SUCCESS and last is not None:
                self.partial = partial_of(last.content())
            elif last is not None and isinstance(last.error, PushFailed) and last.error.kind == "redirect":
                self.redirected_to = last.error.location
            return result

    return Http(BoundedTransport(**tls_files(os.environ)))


def tls_files(environ: Any) -> dict[str, Any]:
    """``verify`` and ``cert`` as the SDK resolves them from ``OTEL_EXPORTER_OTLP_[METRICS_]CERTIFICATE``,
    ``_CLIENT_KEY`` and ``_CLIENT_CERTIFICATE`` (the signal's own first)."""
    def first(name: str) -> str | None:
        return environ.get(f"OTEL_EXPORTER_OTLP_METRICS_{name}") or environ.get(f"OTEL_EXPORTER_OTLP_{name}") or None

    key, certificate = first("CLIENT_KEY"), first("CLIENT_CERTIFICATE")
    return {"verify": first("CERTIFICATE") or True,
            "cert": (certificate, key) if certificate and key else certificate}


def _grpc(config: OtlpConfig) -> MetricExporter:
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcExporter

    class KeepsAnswer:
        """The stub, keeping the ``ExportMetricsServiceResponse`` the SDK discards."""

        def __init__(self, stub: Any, owner: Any) -> None:
            self.stub, self.owner = stub, owner

        def Export(self, *args: Any, **kwargs: Any) -> Any:  # noqa: N802 - the generated name
            self.owner.answer = answer = self.stub.Export(*args, **kwargs)
            return answer

    class Grpc(GrpcExporter, Outcome):
        answer: Any = None

        def _initialize_channel_and_stub(self) -> None:  # also on the SDK's reconnect after UNAVAILABLE
            super()._initialize_channel_and_stub()
            self._client = KeepsAnswer(self._client, self)

        def _translate_data(self, data):  # a request built already goes as it is
            return data if isinstance(data, ExportMetricsServiceRequest) else super()._translate_data(data)

        def _count_data(self, data):
            return 0 if isinstance(data, ExportMetricsServiceRequest) else super()._count_data(data)

        def export(self, metrics_data, timeout_millis: float = 10_000, **kwargs):
            self.partial, self.answer = None, None
            self._timeout = min(config.timeout_s, timeout_millis / 1000)  # gRPC's deadline spans the retries
            result = super().export(metrics_data, timeout_millis, **kwargs)
            if result is MetricExportResult.SUCCESS:
                self.partial = partial_of(self.answer)
            return result

    return Grpc(endpoint=config.endpoint, insecure=urlparse(config.endpoint).scheme == "http",
                headers=dict(config.headers), timeout=config.timeout_s,
                channel_options=(("grpc.max_receive_message_length", MAX_ANSWER_BYTES),))
