"""The real agent process pushing over OTLP into the loopback receiver (tests/otlp_receiver.py).

Debian's Prometheus (2.42) and VictoriaMetrics (1.79.5) do not ingest OTLP (docs/otlp.md), so the
receiver stands in for the engine: a push is matched to a scrape of the same snapshot by the snapshot
timestamp both carry, and every value must be the same. A collector that is not there costs the
running agent nothing but counted drops.
"""

from __future__ import annotations

import math
import socket

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.agent_process import AgentProcess, clean_env, poll
from tests.otlp_receiver import GrpcReceiver, HttpReceiver, expected_points, points

pytestmark = pytest.mark.slow

SNAPSHOT_TS = "roofwatch.snapshot.timestamp"


def environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in clean_env().items() if not k.startswith("OTEL_")}
    env.update({"ROOFWATCH_OTLP_INTERVAL_S": "1", **extra})
    return env


def otlp_counter(text: str, name: str, **labels: str) -> float:
    """``roofwatch_otlp_<name>_total`` with ``labels`` in an exposition (0 while absent)."""
    for family in text_string_to_metric_families(text):
        if family.name == f"roofwatch_otlp_{name}":
            return sum(s.value for s in family.samples
                       if s.name.endswith("_total") and all(s.labels.get(k) == v for k, v in labels.items()))
    return 0.0


def pushed_snapshot(request) -> float | None:
    for (name, _), (value, _) in points(request).items():
        if name == SNAPSHOT_TS:
            return value
    return None


def matching_push(agent: AgentProcess, receiver) -> tuple[str, object]:
    """A scrape and a push of the same snapshot (collection every 5 s, a push every second)."""
    def attempt():
        text = agent.metrics()
        ts = next(float(line.split()[-1]) for line in text.splitlines()
                  if line.startswith("roofwatch_snapshot_timestamp_seconds{"))
        found = receiver.wait_for(lambda r: any(pushed_snapshot(x.request) == ts for x in r.received), timeout=4)
        if not found:
            return None
        return text, next(x for x in receiver.received if pushed_snapshot(x.request) == ts)
    return poll(attempt, timeout=60, interval=0.1, what="a push of the snapshot /metrics served")


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_the_agent_pushes_what_metrics_shows(protocol):
    receiver = HttpReceiver() if protocol == "http/protobuf" else GrpcReceiver()
    env = environment(ROOFWATCH_OTLP_PROTOCOL=protocol, OTEL_EXPORTER_OTLP_HEADERS="x-scope-orgid=tenant-7",
                      OTEL_EXPORTER_OTLP_COMPRESSION="gzip", OTEL_RESOURCE_ATTRIBUTES="deployment.environment.name=ci")
    agent = AgentProcess("demo", "--listen", "127.0.0.1:0", "--interval", "5", "--otlp-endpoint", receiver.base_url, env=env)
    try:
        agent.wait_healthy()
        text, push = matching_push(agent, receiver)
        want = expected_points(text)
        got = points(push.request)
        own = lambda key: key[0].startswith("roofwatch.otlp.") or key[0] == "hw.gpu.memory.utilization"  # noqa: E731
        assert {k for k in want if not own(k)} == {k for k in got if not own(k)}
        for key, value in want.items():
            if not own(key):
                assert got[key][0] == value or (math.isnan(value) and math.isnan(got[key][0])), key
        assert {k[0] for k in want if own(k)} <= {k[0] for k in got}  # the push's own counters have twins
        assert push.headers["x-scope-orgid"] == "tenant-7"
        if protocol == "http/protobuf":
            assert push.compressed == "gzip"
        resource = {a.key: a.value.string_value for a in push.request.resource_metrics[0].resource.attributes}
        assert resource["service.name"] == "roofwatch" and resource["deployment.environment.name"] == "ci"
        assert any(name == "hw.gpu.utilization" for name, _ in got)
        exit_code, _, _ = agent.stop()
        assert exit_code == 0
    finally:
        agent.kill()
        receiver.close()


def test_a_missing_collector_costs_the_agent_only_counted_drops():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there
    env = environment(ROOFWATCH_OTLP_TIMEOUT_S="0.5")
    agent = AgentProcess("demo", "--listen", "127.0.0.1:0", "--otlp-endpoint", f"http://127.0.0.1:{port}", env=env)
    try:
        agent.wait_healthy()
        poll(lambda: otlp_counter(agent.metrics(), "dropped_batches", reason="export_failed") >= 3, timeout=60,
             what="three counted failed pushes")
        text = agent.metrics()
        assert "roofwatch_gpu_up{" in text and 'outcome="success"} 0.0' in text
        assert agent.get("healthz")[0] == 200
        exit_code, _, err = agent.stop()
        assert exit_code == 0
        assert err.count("OTLP push failed") == 1, "logged once when pushes start failing, not once per push"
    finally:
        agent.kill()


def test_an_unusable_standard_variable_stops_the_agent_naming_it():
    import subprocess

    from tests.agent_process import roofwatch_cmd

    env = environment(OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:4318", OTEL_EXPORTER_OTLP_PROTOCOL="http/json")
    result = subprocess.run(roofwatch_cmd("demo", "--listen", "127.0.0.1:0"), env=env, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 2 and "OTEL_EXPORTER_OTLP_PROTOCOL" in result.stderr


def test_sigterm_pushes_the_last_snapshot_before_the_agent_exits():
    """With a push every minute, the interval before a SIGTERM still reaches the collector: one final push
    of the snapshot /metrics served last."""
    receiver = HttpReceiver()
    env = environment(ROOFWATCH_OTLP_INTERVAL_S="60")
    agent = AgentProcess("demo", "--listen", "127.0.0.1:0", "--interval", "60", "--otlp-endpoint", receiver.base_url,
                         env=env)
    try:
        agent.wait_healthy()
        text = agent.metrics()
        served = next(float(line.split()[-1]) for line in text.splitlines()
                      if line.startswith("roofwatch_snapshot_timestamp_seconds{"))
        assert receiver.received == [], "the ticker's first push is a minute away"
        exit_code, _, _ = agent.stop()
        assert exit_code == 0
        assert receiver.wait_for(lambda r: len(r.received) == 1, timeout=10)
        assert pushed_snapshot(receiver.received[0].request) == served
    finally:
        agent.kill()
        receiver.close()
