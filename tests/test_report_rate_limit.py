"""Report rate limits: per client, before the body is read, over both real transports."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import textwrap

import pytest

from agent.context.workload.rate_limit import RateLimiter
from exporters.http.report_socket import ReportSocketServer
from agent.context.workload.report_store import ReportStore
from tests.report_fixtures import JSON, Clock, body, http_post, http_server_factory, short_dir, unix_post  # noqa: F401 (fixtures)


def test_a_client_gets_its_burst_then_one_request_per_refill():
    clock = Clock(0.0)
    limiter = RateLimiter(rate_per_s=4.0, burst=3.0, clock=clock)
    assert [limiter.check("a") for _ in range(3)] == [None, None, None]
    assert limiter.check("a") == pytest.approx(0.25)  # one token takes 1/4 s
    clock.t += 0.1
    assert limiter.check("a") == pytest.approx(0.15)
    clock.t += 0.15
    assert limiter.check("a") is None
    assert limiter.check("b") is None, "another client has its own bucket"
    clock.t += 100.0
    assert [limiter.check("a") for _ in range(4)][:3] == [None, None, None], "refill stops at the burst"


def test_the_limiter_forgets_the_least_recently_seen_client_past_its_cap():
    limiter = RateLimiter(rate_per_s=1.0, burst=1.0, max_clients=2, clock=Clock())
    for client in ("a", "b", "c"):
        assert limiter.check(client) is None
    assert len(limiter) == 2
    assert limiter.check("a") is None, "a was forgotten, so it starts with a full bucket"
    assert limiter.check("c") is not None, "c is still tracked and empty"


def test_the_rate_must_be_positive():
    with pytest.raises(ValueError):
        RateLimiter(0.0)


def test_http_client_past_its_rate_gets_429_with_retry_after_and_its_body_is_not_parsed(http_server_factory):
    clock = Clock()
    store = ReportStore(rate_per_s=5.0, rate_clock=clock)  # bursts of 10
    port = http_server_factory(store).server_address[1]
    statuses = [http_post(port, body(step=i, pid=99), {"Content-Type": JSON})[0] for i in range(10)]
    assert statuses == [204] * 10
    status, headers, reply = http_post(port, b"{not json", {"Content-Type": JSON})
    assert status == 429 and headers["Retry-After"] == "1" and headers.get("Connection") != "close"
    assert b"over 5 reports a second" in reply
    stats = store.stats()
    assert stats["rejected"]["rate_limited"] == 1 and stats["rejected"]["bad_json"] == 0, "the body was never parsed"
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)  # keep-alive survives a 429
    for _ in range(2):
        conn.request("POST", "/api/v1/report", body=body(step=1), headers={"Content-Type": JSON})
        response = conn.getresponse()
        assert response.status == 429 and response.read().startswith(b"over 5")
    conn.close()
    clock.t += 0.2  # one token back
    assert http_post(port, body(step=11, pid=99), {"Content-Type": JSON})[0] == 204
    assert http_post(port, body(step=12, pid=99), {"Content-Type": JSON})[0] == 429


@pytest.mark.slow
def test_on_the_socket_each_process_has_its_own_rate(short_dir):
    clock = Clock()
    store = ReportStore(rate_per_s=1.0, rate_clock=clock)  # bursts of 2
    path = short_dir / "r.sock"
    server = ReportSocketServer(path, store)
    server.start()
    try:
        assert [unix_post(path, body(step=i), {"Content-Type": JSON})[0] for i in range(3)] == [204, 204, 429]
        child = textwrap.dedent(f"""
            import http.client, socket, sys
            class C(http.client.HTTPConnection):
                def connect(self):
                    self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    self.sock.connect({str(path)!r})
            c = C("localhost", timeout=10)
            c.request("POST", "/api/v1/report", body={json.dumps({"step": 1}).encode()!r},
                      headers={{"Content-Type": "application/json"}})
            print(c.getresponse().status)
        """)
        result = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=30)
        assert result.stdout.strip() == "204", result.stderr
    finally:
        server.close()
    assert store.stats()["rejected"]["rate_limited"] == 1
