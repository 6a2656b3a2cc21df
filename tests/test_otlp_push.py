"""The OTLP push against a real receiver on loopback (tests/otlp_receiver.py), over http/protobuf and gRPC.

Every value the receiver decodes must equal what ``/metrics`` shows for the same snapshot: the expected
points are derived from the exposition text of that snapshot, never from a list of families, so the
test holds whatever families ``/metrics`` has. A receiver that errors or hangs must cost nothing but
counted drops: collection and scrapes go on, the queue stays bounded, stopping does not wait it out.
"""

from __future__ import annotations

import math
import socket
from types import SimpleNamespace

import pytest
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agent.classifier.live import LiveClassifier
from agent.collector import Collector
from exporters.otlp import names as n
from exporters.otlp import open_pusher
from exporters.otlp.endpoint import resolve
from exporters.prometheus import ExpositionCache
from tests.otlp_receiver import GrpcReceiver, GrpcSniffer, HttpReceiver, expected_points, points, resource
from tests.test_exporter import FullBackend

pytestmark = pytest.mark.slow  # every test starts a receiver (an HTTP or gRPC server on loopback)

START = 1_800_000_000.0
PROTOCOLS = {"http/protobuf": HttpReceiver, "grpc": GrpcReceiver}


@pytest.fixture(scope="module")
def snapshot():
    clock = {"t": START}
    collector = Collector(FullBackend(), node="node-a", clock=lambda: clock["t"], monotonic=lambda: clock["t"],
                          analyzer=LiveClassifier())
    for _ in range(25):  # a full window: verdicts, MFU and the roofline figures are in the snapshot too
        collector.collect_once()
        clock["t"] += 1.0
    yield collector.snapshot
    collector.stop()


@pytest.fixture(params=sorted(PROTOCOLS))
def receiver(request):
    rx = PROTOCOLS[request.param]()
    rx.protocol = request.param
    yield rx
    rx.close()


@pytest.fixture(autouse=True)
def no_otel_environment(monkeypatch):
    import os

    for key in [k for k in os.environ if k.startswith("OTEL_")]:
        monkeypatch.delenv(key)


def settings(endpoint: str, protocol: str, **extra) -> SimpleNamespace:
    values = {"otlp_endpoint": endpoint, "otlp_protocol": protocol, "otlp_headers": {}, "otlp_timeout_s": 5.0,
              "otlp_interval_s": 1.0, "otlp_queue_size": 3}
    values.update(extra)
    return SimpleNamespace(**values)


def pusher_for(receiver, snapshot, gpu_labels=(), **extra):
    config = resolve(settings(receiver.base_url, receiver.protocol, **extra), {})
    return open_pusher(config, lambda: snapshot, family_options={"gpu_labels": list(gpu_labels)}, start_time=START - 60)


def scrape(snapshot, pusher, gpu_labels=()) -> str:
    """``/metrics`` of ``snapshot`` as the HTTP server renders it with OTLP on."""
    cache = ExpositionCache(lambda: snapshot, gpu_labels=list(gpu_labels))
    cache.extra_families = pusher.scrape_families
    return cache.render(generate_latest, "text/plain").decode()


def same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


@pytest.mark.parametrize("gpu_labels", [(), ("job_id", "namespace", "pod", "container")])
def test_every_point_equals_what_metrics_says_for_the_same_snapshot(receiver, snapshot, gpu_labels):
    pusher = pusher_for(receiver, snapshot, gpu_labels)
    text = scrape(snapshot, pusher, gpu_labels)  # before the push: the push carries the same self-metric values
    assert pusher.push(snapshot)
    assert receiver.wait_for(lambda r: r.received, timeout=10)
    request = receiver.received[0].request
    got = points(request)
    want = expected_points(text)
    assert len(want) > 150, "the snapshot should exercise most families"
    derived = {k: v for k, v in got.items() if k[0] == n.MEMORY_UTILIZATION.name}
    missing, extra = set(want) - set(got), set(got) - set(derived) - set(want)
    assert not missing and not extra, (sorted(map(str, missing))[:5], sorted(map(str, extra))[:5])
    for key, value in want.items():
        assert same(got[key][0], value), (key, got[key][0], value)
    # hw.gpu.memory.utilization: usage / limit of the same GPU in the same exposition
    assert derived
    for (_, attributes), (value, _) in derived.items():
        usage = want[("hw.gpu.memory.usage", attributes)]
        limit = want[("hw.gpu.memory.limit", attributes)]
        assert value == usage / limit
    # node is the resource's host, and the node a pod runs on
    assert resource(request)["host.name"] == "node-a" and resource(request)["service.name"] == "roofwatch"
    for (_, attributes) in got:
        attrs = dict(attributes)
        assert "roofwatch.node" not in attrs
        if "k8s.pod.name" in attrs:
            assert attrs["k8s.node.name"] == "node-a"
    if gpu_labels:
        assert any(dict(a).get("k8s.namespace.name") and k == "hw.gpu.utilization" for k, a in got)
    pusher.stop()


def test_instruments_units_and_timestamps(receiver, snapshot):
    pusher = pusher_for(receiver, snapshot)
    assert pusher.push(snapshot)
    receiver.wait_for(lambda r: r.received, timeout=10)
    request = receiver.received[0].request
    metrics = {m.name: m for rm in request.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    scope = request.resource_metrics[0].scope_metrics[0]
    assert scope.scope.name == "roofwatch" and scope.schema_url.endswith(n.SEMCONV_RELEASE)
    util = metrics["hw.gpu.utilization"]
    assert util.WhichOneof("data") == "gauge" and util.unit == "1"
    point = util.gauge.data_points[0]
    assert point.time_unix_nano == int(snapshot.ts * 1e9)
    assert {a.key for a in point.attributes} == {"hw.type", "hw.id", "hw.name", "hw.vendor", "hw.model", "hw.gpu.task"}
    energy = metrics["hw.energy"]
    assert energy.WhichOneof("data") == "sum" and energy.sum.is_monotonic and energy.unit == "J"
    assert energy.sum.aggregation_temporality == 2  # CUMULATIVE
    assert energy.sum.data_points[0].start_time_unix_nano == int((START - 60) * 1e9)
    usage = metrics["hw.gpu.memory.usage"]
    assert usage.WhichOneof("data") == "sum" and not usage.sum.is_monotonic and usage.unit == "By"
    assert usage.sum.data_points[0].WhichOneof("value") == "as_int"
    io = metrics["hw.gpu.io"]
    assert {a.value.string_value for p in io.sum.data_points for a in p.attributes
            if a.key == "network.io.direction"} == {"transmit", "receive"}
    assert metrics["roofwatch.gpu.mfu"].unit == "1" and metrics["roofwatch.gpu.power_limit"].unit == "W"
    pusher.stop()


def test_headers_and_gzip_arrive(receiver, snapshot, monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-scope-orgid=tenant-7,authorization=Bearer%20abc")
    sniffer = GrpcSniffer(receiver.port) if receiver.protocol == "grpc" else None
    url = sniffer.base_url if sniffer else receiver.base_url
    config = resolve(settings(url, receiver.protocol, otlp_headers={"X-Extra": "yes"}))
    pusher = open_pusher(config, lambda: snapshot, start_time=START)
    assert pusher.push(snapshot)
    assert receiver.wait_for(lambda r: r.received, timeout=10)
    arrived = receiver.received[0]
    assert arrived.headers["x-scope-orgid"] == "tenant-7"
    assert arrived.headers["authorization"] == "Bearer abc"
    assert arrived.headers["x-extra"] == "yes"
    if receiver.protocol == "http/protobuf":
        assert arrived.compressed == "gzip"  # the receiver gunzipped it to decode
    else:
        assert sniffer.compressed_flags and set(sniffer.compressed_flags) == {1}  # every message went compressed
        sniffer.close()
    assert len(points(arrived.request)) > 100
    pusher.stop()


def closed_port() -> int:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return port


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_a_refusing_collector_is_a_counted_drop(protocol, snapshot):
    config = resolve(settings(f"http://127.0.0.1:{closed_port()}", protocol, otlp_timeout_s=0.5), {})
    pusher = open_pusher(config, lambda: snapshot, start_time=START)
    assert pusher.push(snapshot) is False
    stats = pusher.stats
    assert stats.exports == {"success": 0, "partial": 0, "failure": 1} and stats.dropped["export_failed"] == 1
    assert stats.last_success_ts is None
    pusher.stop()


@pytest.mark.parametrize("mode", ["error", "hang"])
def test_an_erroring_or_hanging_collector_costs_only_counted_drops(receiver, snapshot, mode):
    receiver.mode = mode
    pusher = pusher_for(receiver, snapshot, otlp_timeout_s=0.4, otlp_queue_size=2)
    assert pusher.push(snapshot) is False  # within its own deadline, retries included
    assert receiver.attempts >= 1
    text = scrape(snapshot, pusher)
    families = {f.name: f for f in text_string_to_metric_families(text)}
    exports = {s.labels["outcome"]: s.value for s in families["roofwatch_otlp_exports"].samples}
    dropped = {s.labels["reason"]: s.value for s in families["roofwatch_otlp_dropped_batches"].samples}
    assert exports == {"success": 0.0, "partial": 0.0, "failure": 1.0} and dropped["export_failed"] == 1.0
    assert "roofwatch_otlp_last_success_timestamp_seconds" in families
    assert families["roofwatch_otlp_last_success_timestamp_seconds"].samples == []  # never: absent, not 0
    pusher.stop()


def test_a_hung_push_never_blocks_collection_scrapes_or_stopping(snapshot):
    receiver = HttpReceiver()
    receiver.protocol = "http/protobuf"
    receiver.mode = "hang"
    collector = Collector(FullBackend(), node="node-b")
    collector.collect_once()
    config = resolve(settings(receiver.base_url, "http/protobuf", otlp_timeout_s=30.0, otlp_queue_size=2), {})
    pusher = open_pusher(config, lambda: collector.snapshot, start_time=START)
    pusher.interval_s = 0.02  # the ticker queues far faster than the hung collector takes them
    pusher.start()
    try:
        assert receiver.wait_for(lambda r: r.attempts >= 1, timeout=10)  # the sender is stuck in its export
        before = collector.snapshot.sequence
        for _ in range(3):
            collector.collect_once()  # collection goes on
        assert collector.snapshot.sequence == before + 3
        import time

        deadline = time.monotonic() + 10
        while pusher.stats.dropped["queue_full"] < 3 and time.monotonic() < deadline:
            collector.collect_once()
        assert pusher.stats.dropped["queue_full"] >= 3  # the oldest waiting snapshots go, counted
        assert pusher.stats.queued <= 2
        text = scrape(collector.snapshot, pusher)  # a scrape is answered while the push hangs
        assert "roofwatch_otlp_dropped_batches_total" in text and "roofwatch_gpu_up" in text
    finally:
        pusher.stop(timeout=0.3)  # returns although the export is still hung
        receiver.close()
        collector.stop()
    assert not pusher._threads[0].is_alive()  # the ticker has stopped; the sender was abandoned mid-export


def test_success_is_counted_with_the_points_the_collector_accepted(receiver, snapshot):
    pusher = pusher_for(receiver, snapshot)
    assert pusher.push(snapshot) and pusher.push(snapshot)
    receiver.wait_for(lambda r: len(r.received) == 2, timeout=10)
    first, second = (points(r.request) for r in receiver.received)
    assert pusher.stats.exports["success"] == 2 and pusher.stats.points == len(first) + len(second)
    # the second push's twin of the counter shows the first push
    assert second[("roofwatch.otlp.exports", frozenset({("roofwatch.outcome", "success")}))][0] == 1.0
    pusher.stop()


def _newer(snapshot):
    """``snapshot`` as the collector's next one (a sequence the pusher has not pushed)."""
    import dataclasses

    return dataclasses.replace(snapshot, sequence=snapshot.sequence + 1)


def test_stopping_pushes_the_latest_snapshot_once_more(receiver, snapshot):
    """The last interval before a SIGTERM reaches the collector: one push on stop, none from the ticker."""
    config = resolve(settings(receiver.base_url, receiver.protocol, otlp_interval_s=3600.0), {})
    pusher = open_pusher(config, lambda: snapshot, start_time=START - 60)
    pusher.start()
    assert receiver.received == []  # the ticker's first push is an hour away
    pusher.stop(timeout=5.0)
    assert receiver.wait_for(lambda r: len(r.received) == 1, timeout=10)
    assert pusher.stats.exports["success"] == 1
    pushed = points(receiver.received[0].request)
    assert [value for (name, _), (value, _) in pushed.items() if name == "roofwatch.snapshot.timestamp"] == [snapshot.ts]


def test_stopping_after_a_failed_push_does_not_try_again(receiver, snapshot):
    """A collector that failed the last push is not waited on once more while the agent stops."""
    receiver.mode = "error"
    latest = {"snapshot": snapshot}
    config = resolve(settings(receiver.base_url, receiver.protocol, otlp_interval_s=3600.0, otlp_timeout_s=0.4), {})
    pusher = open_pusher(config, lambda: latest["snapshot"], start_time=START - 60)
    assert pusher.push(snapshot) is False
    attempts = receiver.attempts
    latest["snapshot"] = _newer(snapshot)
    pusher.start()
    pusher.stop(timeout=5.0)
    assert receiver.attempts == attempts and pusher.stats.exports["failure"] == 1


def test_stopping_does_not_push_a_snapshot_already_pushed(receiver, snapshot):
    config = resolve(settings(receiver.base_url, receiver.protocol, otlp_interval_s=3600.0), {})
    pusher = open_pusher(config, lambda: snapshot, start_time=START - 60)
    assert pusher.push(snapshot)
    pusher.start()
    pusher.stop(timeout=5.0)
    assert pusher.stats.exports["success"] == 1 and len(receiver.received) == 1
