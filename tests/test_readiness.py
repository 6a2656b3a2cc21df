"""``/readyz``, the chart's readiness probe (issue 46 item 3): 503 while the agent waits for the source of its GPUs,
200 while it collects, and in both cases one line naming every source it waits for and why. Answered without
a password, as ``/healthz`` is: a kubelet probe carries none. The real processes waiting for late neighbours
are tests/test_late_neighbours.py; this holds each state the probe can be in."""

from __future__ import annotations

import threading

import bcrypt
import pytest

from agent.model import CollectorHealth, NodeSnapshot, SourceState
from exporters.http import AgentHTTPServer
from exporters.web_config import BasicAuth, WebConfig
from tests.agent_process import http_get

NOW = 1000.0


def snapshot(*sources: SourceState, backend: str = "nvml", waiting_for: str | None = None,
             last_cycle_ts: float | None = NOW) -> NodeSnapshot:
    health = CollectorHealth(backend=backend, last_cycle_success=True, last_cycle_ts=last_cycle_ts,
                             waiting_for=waiting_for)
    return NodeSnapshot(ts=NOW, node="n1", devices=(), health=health, expected_devices=0, sources=sources)


def readiness(snap: NodeSnapshot) -> tuple[bool, str]:
    server = AgentHTTPServer(("127.0.0.1", 0), lambda: snap, stale_after_s=10.0, clock=lambda: NOW)
    try:
        return server.readiness()
    finally:
        server.server_close()


REFUSED = "connection refused (server not running or wrong port)"


@pytest.mark.parametrize(("snap", "ready", "text"), [
    (snapshot(SourceState("dcgm-exporter", "down", REFUSED), backend="dcgm-exporter",
              waiting_for=f"dcgm-exporter at http://127.0.0.1:9400/metrics: {REFUSED}", last_cycle_ts=None),
     False, f"not ready: waiting for dcgm-exporter at http://127.0.0.1:9400/metrics: {REFUSED}"),
    (snapshot(SourceState("dcgm-exporter", "down", REFUSED), SourceState("inference http://h:8000/metrics", "down"),
              backend="dcgm-exporter"),
     False, f"not ready: waiting for dcgm-exporter: down ({REFUSED}); inference http://h:8000/metrics: down"),
    (snapshot(SourceState("dcgm-exporter", "stale", "last good read 130 s ago"), backend="nvml"),
     True, "ready: 0/0 GPUs up; waiting for dcgm-exporter: stale (last good read 130 s ago)"),
    (snapshot(SourceState("dcgm-exporter", "up"), SourceState("inference http://h:8000/metrics", "up")),
     True, "ready: 0/0 GPUs up"),
    (snapshot(last_cycle_ts=NOW - 60.0), False, "not ready: snapshot is 60.0s old (limit 10.0s): the collector is stuck"),
])
def test_readiness_names_what_the_agent_waits_for(snap, ready, text):
    assert readiness(snap) == (ready, text)


def test_readyz_and_healthz_need_no_password_where_everything_else_does():
    hashed = bcrypt.hashpw(b"secret", bcrypt.gensalt(rounds=4)).decode()
    snap = snapshot(SourceState("dcgm-exporter", "down", REFUSED), backend="dcgm-exporter",
                    waiting_for=f"dcgm-exporter at http://127.0.0.1:9400/metrics: {REFUSED}", last_cycle_ts=None)
    server = AgentHTTPServer(("127.0.0.1", 0), lambda: snap, stale_after_s=10.0, clock=lambda: NOW,
                             web=WebConfig(None, BasicAuth({"prom": hashed}), {}))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}/"
        assert http_get(base + "readyz") == (503, f"not ready: waiting for dcgm-exporter at "
                                                  f"http://127.0.0.1:9400/metrics: {REFUSED}\n".encode())
        assert http_get(base + "healthz")[0] == 200, "alive while it waits: liveness must not restart it"
        assert http_get(base + "metrics")[0] == 401
    finally:
        server.shutdown()
        server.server_close()
