"""A loopback OTLP metrics receiver for the tests: http/protobuf on a small HTTP server, gRPC on grpcio's
server with opentelemetry-proto's MetricsService, both decoding with opentelemetry-proto.

Neither Debian's Prometheus (2.42) nor its VictoriaMetrics (1.79.5) ingests OTLP, so the tests push into
this instead and read back what arrived. A receiver can be told to answer ``ok``, ``error`` (HTTP 500,
gRPC UNAVAILABLE), ``hang`` (hold the request until the test ends it), ``partial`` (accept, with the
``partial_success`` of :attr:`_Common.partial`: rejected points and a message) or, over gRPC, ``huge``
(an answer of :attr:`_Common.huge_bytes`). The HTTP receiver speaks TLS when given a server certificate,
and asks for a client certificate when given a CA for clients. Collectors that mean harm (an endless
body, redirects, dripping answers) are in tests/hostile_collectors.py.
"""

from __future__ import annotations

import dataclasses
import gzip
import socket
import ssl
import threading
import zlib
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc


@dataclasses.dataclass
class Received:
    """One request as it arrived: its headers (lower-cased names) and the decoded request."""

    headers: dict[str, str]
    request: Any
    compressed: str | None = None


class _Common:
    def __init__(self) -> None:
        self.mode = "ok"
        self.received: list[Received] = []
        self.attempts = 0
        self.release = threading.Event()
        self.cond = threading.Condition()
        self.partial: tuple[int, str] = (0, "")
        self.huge_bytes = 1 << 20

    def response(self) -> Any:
        """The ``ExportMetricsServiceResponse`` this receiver answers an accepted push with."""
        answer = metrics_service_pb2.ExportMetricsServiceResponse()
        if self.mode == "partial":
            answer.partial_success.rejected_data_points, answer.partial_success.error_message = self.partial
        elif self.mode == "huge":
            answer.partial_success.error_message = "x" * self.huge_bytes
        return answer

    def record(self, received: Received) -> None:
        with self.cond:
            self.received.append(received)
            self.cond.notify_all()

    def attempted(self) -> None:
        with self.cond:
            self.attempts += 1
            self.cond.notify_all()

    def wait_for(self, predicate, timeout: float = 30.0) -> bool:
        """Poll-free wait until ``predicate(self)`` holds (or ``timeout`` passes); True when it holds."""
        with self.cond:
            return self.cond.wait_for(lambda: predicate(self), timeout)


class HttpReceiver(_Common):
    """``POST /v1/metrics`` on 127.0.0.1, any free port; over TLS with ``cert``/``key`` (and mTLS with
    ``client_ca``)."""

    def __init__(self, cert: str | None = None, key: str | None = None, client_ca: str | None = None) -> None:
        super().__init__()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                receiver.attempted()
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if receiver.mode == "hang":
                    receiver.release.wait(60)
                    return
                if receiver.mode == "error":
                    self.send_response(500)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                encoding = self.headers.get("Content-Encoding")
                if encoding == "gzip":
                    body = gzip.decompress(body)
                elif encoding == "deflate":
                    body = zlib.decompress(body)
                request = metrics_service_pb2.ExportMetricsServiceRequest()
                request.ParseFromString(body)
                receiver.record(Received({k.lower(): v for k, v in self.headers.items()}, request, encoding))
                answer = receiver.response().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.base_url = f"http://127.0.0.1:{self.port}"
        if cert is not None:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(cert, key)
            if client_ca is not None:
                context.verify_mode = ssl.CERT_REQUIRED
                context.load_verify_locations(client_ca)
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
            self.base_url = f"https://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


class GrpcReceiver(_Common):
    """``opentelemetry.proto.collector.metrics.v1.MetricsService/Export`` on 127.0.0.1, any free port."""

    def __init__(self) -> None:
        super().__init__()
        receiver = self

        class Service(metrics_service_pb2_grpc.MetricsServiceServicer):
            def Export(self, request, context):  # noqa: N802 - the generated name
                receiver.attempted()
                if receiver.mode == "hang":
                    receiver.release.wait(60)
                    context.abort(grpc.StatusCode.UNAVAILABLE, "released")
                if receiver.mode == "error":
                    context.abort(grpc.StatusCode.UNAVAILABLE, "told to fail")
                metadata = {k.lower(): v for k, v in context.invocation_metadata()}
                receiver.record(Received(metadata, request, metadata.get("grpc-encoding")))
                return receiver.response()

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Service(), self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.server.start()

    def close(self) -> None:
        self.release.set()
        self.server.stop(grace=None)


class GrpcSniffer:
    """A TCP relay in front of a gRPC receiver that reads the client's HTTP/2 frames as they pass, to see
    what gRPC hides from the servicer: whether the message was sent compressed (the first byte of a
    DATA frame's gRPC prefix is 1 when it was)."""

    PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.compressed_flags: list[int] = []
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(4)
        self.base_url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, inspect: bool) -> None:
        buffer = b""
        try:
            while chunk := source.recv(65536):
                sink.sendall(chunk)
                if inspect:
                    buffer = self._frames(buffer + chunk)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _frames(self, buffer: bytes) -> bytes:
        buffer = buffer.removeprefix(self.PREFACE)
        while len(buffer) >= 9:
            length = int.from_bytes(buffer[:3], "big")
            if len(buffer) < 9 + length:
                break
            kind, payload = buffer[3], buffer[9:9 + length]
            if kind == 0 and payload:  # DATA: the gRPC length-prefixed message starts here
                self.compressed_flags.append(payload[0])
            buffer = buffer[9 + length:]
        return buffer

    def close(self) -> None:
        self.listener.close()


def points(request: Any) -> dict[tuple[str, frozenset], tuple[float, Any]]:
    """Every data point of a request: (metric name, attributes) -> (value, the metric), values as floats."""
    out: dict[tuple[str, frozenset], tuple[float, Any]] = {}
    for rm in request.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                kind = metric.WhichOneof("data")
                for dp in getattr(metric, kind).data_points:
                    attributes = frozenset((a.key, any_value(a.value)) for a in dp.attributes)
                    value = dp.as_double if dp.WhichOneof("value") == "as_double" else float(dp.as_int)
                    key = (metric.name, attributes)
                    assert key not in out, f"two points for {key}"
                    out[key] = (value, metric)
    return out


def any_value(value: Any) -> Any:
    """An OTLP AnyValue as a Python value."""
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


def resource(request: Any) -> dict[str, Any]:
    """The first resource's attributes."""
    return {a.key: any_value(a.value) for a in request.resource_metrics[0].resource.attributes}


def expected_points(text: str) -> dict[tuple[str, frozenset], float]:
    """What a push must carry for this exposition, by the documented naming rules: (OTLP name, attributes) -> value."""
    from prometheus_client.parser import text_string_to_metric_families

    from exporters.otlp import CATALOGUE
    from exporters.otlp import names as n
    from exporters.otlp.convert import catalogue_key, point_attributes

    families = list(text_string_to_metric_families(text))
    identity = {s.labels["uuid"]: {a: s.labels[label] for label, a in n.GPU_IDENTITY.items() if s.labels.get(label)}
                for f in families for s in f.samples if s.name == "roofwatch_gpu_info"}
    out = {}
    for family in families:
        key = catalogue_key(family)
        semconv = n.SEMCONV.get(key)
        defn = CATALOGUE.get(key)
        unit = semconv.unit if semconv else n.ucum(defn.unit if defn else "")
        name = semconv.name if semconv else n.roofwatch_name(key, family.type, unit)
        for sample in family.samples:
            attributes = frozenset(point_attributes(sample.labels, semconv, identity).items())
            assert (name, attributes) not in out
            out[(name, attributes)] = sample.value
    return out
