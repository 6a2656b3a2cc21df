"""The OTLP push against collectors that mean harm (tests/hostile_collectors.py), real servers on loopback.

Before: a ``200`` with a huge body was read whole into memory and counted as delivered; a ``307``/``308``
counted as delivered while nothing arrived anywhere; a collector dripping its answer a byte at a time held
one push far past ``otlp_timeout_s`` (a per-read timeout); a partial success (rejected data points) was a
full success; a collector quoting the credentials back had them logged. Now the answer is read up to 16
KiB, only a 2xx is delivered, one deadline bounds a push from connect to the last byte, a partial success
is its own outcome with the rejected points counted, and no credential reaches a log line.
"""

from __future__ import annotations

import logging
import time

import pytest

from exporters.otlp import open_pusher
from exporters.otlp.endpoint import resolve
from tests.hostile_collectors import HostileCollector
from tests.otlp_receiver import GrpcReceiver, HttpReceiver
from tests.test_otlp_push import START, closed_port, no_otel_environment, scrape, settings, snapshot  # noqa: F401
from tests.test_tls_auth import pki  # noqa: F401 - the fixture: a CA, a server and a client certificate

pytestmark = pytest.mark.slow  # every test starts a collector (a server on loopback)

SECRET = "sk-live-SECRET-7f3a"
USER_SECRET = "pw-SECRET-91c2"
QUERY_SECRET = "q-SECRET-0b5e"


def pusher(url: str, snap, protocol: str = "http/protobuf", **extra):
    config = resolve(settings(url, protocol, **extra), {})
    return open_pusher(config, lambda: snap, start_time=START)


def pushed_warnings(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "roofwatch.otlp" and r.levelno >= logging.WARNING]


def everything_logged(caplog) -> str:
    """Every record of the agent's own loggers, fields included (what its log prints; pytest also captures the
    SDK's records, which the agent keeps to itself: exporters.otlp.sdk_exporter.quiet_sdk_logs)."""
    return "\n".join(f"{r.getMessage()} {r.__dict__}" for r in caplog.records if r.name.startswith("roofwatch"))


def test_a_huge_answer_is_read_no_further_than_a_few_kib(snapshot):
    """A 200 declaring 256 MiB: the push reads 16 KiB, closes the connection and is not the worse for it."""
    with HostileCollector("huge", body_bytes=256 << 20) as collector:
        push = pusher(collector.base_url, snapshot, otlp_timeout_s=5.0)
        started = time.monotonic()
        assert push.push(snapshot) is True  # a 2xx: the collector took the data; its answer is not our memory's
        took = time.monotonic() - started
        collector.stop.set()
        sent_mib = collector.sent / 2**20
    assert sent_mib < 32, f"the collector got {sent_mib:.0f} MiB of its answer taken (kernel buffers are a few MiB)"
    assert took < 5.0
    assert push.stats.exports["success"] == 1
    push.stop()


def test_a_huge_grpc_answer_is_refused_by_the_channel_cap(snapshot):
    receiver = GrpcReceiver()
    receiver.mode, receiver.huge_bytes = "huge", 1 << 20  # a 1 MiB ExportMetricsServiceResponse (gRPC allows 4 MiB)
    try:
        push = pusher(receiver.base_url, snapshot, "grpc", otlp_timeout_s=1.0)
        assert push.push(snapshot) is False
        assert push.stats.exports["failure"] == 1 and receiver.attempts >= 1
        push.stop()
    finally:
        receiver.close()


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirect_is_a_logged_failure_and_no_credential_follows_it(snapshot, status, caplog):
    caplog.set_level(logging.INFO, logger="roofwatch.otlp")
    target = HttpReceiver()
    location = f"http://user:{USER_SECRET}@127.0.0.1:{target.port}/v1/metrics?token={QUERY_SECRET}"
    with HostileCollector("redirect", status=status, location=location) as collector:
        push = pusher(collector.base_url, snapshot, otlp_headers={"authorization": f"Bearer {SECRET}"})
        assert push.push(snapshot) is False and push.push(snapshot) is False
        assert collector.requests[0]["authorization"] == f"Bearer {SECRET}"  # the host it was meant for
    target.close()
    assert target.attempts == 0, "nothing (and no Authorization header) reached the redirect's target"
    assert push.stats.exports == {"success": 0, "partial": 0, "failure": 2}
    assert push.stats.last_success_ts is None and push.stats.dropped["export_failed"] == 2
    (warning,) = pushed_warnings(caplog)  # logged once, not once per push
    shown = f"http://<hidden>@127.0.0.1:{target.port}/v1/metrics?token=<hidden>"
    assert f"redirected ({status}) to {shown}" in warning.error
    logged = everything_logged(caplog)
    assert SECRET not in logged and USER_SECRET not in logged and QUERY_SECRET not in logged
    push.stop()


@pytest.mark.parametrize("mode", ["drip-headers", "drip-body"])
def test_a_dripping_collector_is_cut_at_the_push_deadline(snapshot, mode, caplog):
    """A byte every 0.5 s never trips a 2 s read timeout (the answer would take 30 s): the push ends at 2 s."""
    caplog.set_level(logging.INFO, logger="roofwatch.otlp")
    with HostileCollector(mode, every_s=0.5, pad=60) as collector:
        push = pusher(collector.base_url, snapshot, otlp_timeout_s=2.0)
        started = time.monotonic()
        assert push.push(snapshot) is False
        took = time.monotonic() - started
        assert len(collector.requests) == 1, "a passed deadline is final: no retry past it"
    assert 1.9 <= took < 4.0, took
    assert push.stats.exports["failure"] == 1 and push.stats.dropped["export_failed"] == 1
    assert push.stats.last_duration_s < 4.0
    (warning,) = pushed_warnings(caplog)
    assert "deadline" in warning.error
    push.stop()


@pytest.mark.parametrize("receiver_class", [HttpReceiver, GrpcReceiver])
def test_a_partial_success_is_counted_and_its_message_logged_once(snapshot, receiver_class, caplog):
    caplog.set_level(logging.INFO, logger="roofwatch.otlp")
    receiver = receiver_class()
    protocol = "grpc" if receiver_class is GrpcReceiver else "http/protobuf"
    receiver.mode, receiver.partial = "partial", (7, "7 points rejected: \x1b[31mbad unit " + "x" * 5000)
    try:
        push = pusher(receiver.base_url, snapshot, protocol)
        assert push.push(snapshot) and push.push(snapshot)
        receiver.wait_for(lambda r: len(r.received) == 2, timeout=10)
        sent = sum(len(list(_points(r.request))) for r in receiver.received)
        assert push.stats.exports == {"success": 0, "partial": 2, "failure": 0}
        assert push.stats.rejected == 14 and push.stats.points == sent - 14
        assert push.stats.last_success_ts is not None  # the collector took most of it
        (warning,) = pushed_warnings(caplog)  # once, not once per push
        assert warning.rejected == 7 and "7 points rejected" in warning.error
        assert len(warning.error) <= 200 and "\x1b" not in warning.error
        text = scrape(snapshot, push)
        assert 'roofwatch_otlp_exports_total{node="node-a",outcome="partial"} 2.0' in text
        assert 'roofwatch_otlp_rejected_points_total{node="node-a"} 14.0' in text
        receiver.mode = "ok"
        assert push.push(snapshot) and push.stats.exports["success"] == 1
        receiver.mode, receiver.partial = "partial", (10**15, "more than was sent")
        assert push.push(snapshot)
        assert len(pushed_warnings(caplog)) == 2, "a new episode after a whole success is logged again"
        assert push.stats.rejected <= sent, "never more rejected than the push held"
        push.stop()
    finally:
        receiver.close()


def test_a_warning_in_a_whole_success_is_logged_once_and_counts_as_success(snapshot, caplog):
    caplog.set_level(logging.INFO, logger="roofwatch.otlp")
    receiver = HttpReceiver()
    receiver.mode, receiver.partial = "partial", (0, "unit 'Cel' is deprecated")
    try:
        push = pusher(receiver.base_url, snapshot)
        assert push.push(snapshot) and push.push(snapshot)
        assert push.stats.exports["success"] == 2 and push.stats.rejected == 0
        (warning,) = pushed_warnings(caplog)
        assert warning.warning == "unit 'Cel' is deprecated"
        push.stop()
    finally:
        receiver.close()


def test_a_collector_quoting_the_credentials_back_gets_them_hidden(snapshot, caplog):
    caplog.set_level(logging.INFO, logger="roofwatch.otlp")
    with HostileCollector("echo") as collector:
        push = pusher(collector.base_url, snapshot, otlp_headers={"authorization": f"Bearer {SECRET}",
                                                                  "x-api-key": SECRET + "-2"})
        assert push.push(snapshot) is False
        assert collector.requests[0]["authorization"] == f"Bearer {SECRET}"
    (warning,) = pushed_warnings(caplog)
    assert "401" in warning.error and "<hidden>" in warning.error
    assert SECRET not in everything_logged(caplog)
    push.stop()


def _points(request):
    for rm in request.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                yield from getattr(metric, metric.WhichOneof("data")).data_points


@pytest.mark.parametrize("signal", ["", "METRICS_"])
def test_tls_files_and_the_client_certificate_are_honoured(snapshot, pki, monkeypatch, signal):  # noqa: F811
    """What the SDK's own transport did: the CA file, and the client certificate for a collector asking one."""
    receiver = HttpReceiver(cert=str(pki / "server.crt"), key=str(pki / "server.key"), client_ca=str(pki / "ca.crt"))
    try:
        monkeypatch.setenv(f"OTEL_EXPORTER_OTLP_{signal}CERTIFICATE", str(pki / "ca.crt"))
        without = pusher(receiver.base_url, snapshot, otlp_timeout_s=2.0)
        assert without.push(snapshot) is False  # the collector wants a client certificate
        monkeypatch.setenv(f"OTEL_EXPORTER_OTLP_{signal}CLIENT_CERTIFICATE", str(pki / "client.crt"))
        monkeypatch.setenv(f"OTEL_EXPORTER_OTLP_{signal}CLIENT_KEY", str(pki / "client.key"))
        push = pusher(receiver.base_url, snapshot, otlp_timeout_s=2.0)
        assert push.push(snapshot) is True
        assert receiver.wait_for(lambda r: len(r.received) == 1, timeout=10)
        without.stop()
        push.stop()
    finally:
        receiver.close()


def test_the_proxy_variables_are_honoured_as_requests_did(snapshot, monkeypatch):
    """HTTP_PROXY takes an http:// push in absolute form (the receiver plays the proxy); NO_PROXY skips it."""
    proxy = HttpReceiver()
    nobody = f"127.0.0.1:{closed_port()}"
    try:
        for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy", "http_proxy"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("HTTP_PROXY", proxy.base_url)
        push = pusher(f"http://{nobody}", snapshot, otlp_timeout_s=2.0)
        assert push.push(snapshot) is True
        assert proxy.wait_for(lambda r: len(r.received) == 1, timeout=10)
        assert proxy.received[0].headers["host"] == nobody
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        direct = pusher(f"http://{nobody}", snapshot, otlp_timeout_s=2.0)
        assert direct.push(snapshot) is False and len(proxy.received) == 1  # refused there, not through the proxy
        push.stop()
        direct.stop()
    finally:
        proxy.close()
