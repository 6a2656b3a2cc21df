"""Load, end to end: requests past the HTTP server's in-flight cap get 503 at once, and the agent recovers.

The real agent process with basic auth whose bcrypt hash costs about 0.3 s a check. A wrong password is
never remembered, so 80 of them at once keep the listener's workers busy: 64 requests are in flight
(answered or queued for a worker), the other 16, and a scrape meanwhile, get 503 at once. Once the
checks are done the agent serves again. /healthz, answered by the event loop itself, stays 200 all along,
and idle connections beside them cost no thread.
"""

from __future__ import annotations

import base64
import http.client
import json
import threading
import time
from collections import Counter
from pathlib import Path

import bcrypt
import psutil
import pytest

from tests.agent_process import AgentProcess, poll

pytestmark = pytest.mark.slow

MAX_IN_FLIGHT = 64
"""The listener's default in-flight cap (exporters.http.limits); the demo does not change it."""
CHECKERS = 80
IDLE = 60


def _basic(password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"prom:{password}".encode()).decode()}


@pytest.fixture
def agent(tmp_path: Path):
    web = tmp_path / "web.yml"
    web.write_text(json.dumps({"basic_auth_users": {"prom": bcrypt.hashpw(b"right", bcrypt.gensalt(12)).decode()}}))
    agent = AgentProcess("demo", "--listen", "127.0.0.1:0", "--web-config-file", str(web))
    try:
        agent.wait_healthy()
        yield agent
    finally:
        agent.kill()


def _get(host: str, port: int, path: str, headers: dict[str, str], source: str) -> tuple[int, bytes, float]:
    started = time.perf_counter()
    conn = http.client.HTTPConnection(host, port, timeout=60, source_address=(source, 0))
    try:
        conn.request("GET", path, headers=headers)
        response = conn.getresponse()
        return response.status, response.read(), time.perf_counter() - started
    finally:
        conn.close()


def test_requests_past_the_in_flight_cap_get_503_at_once_and_the_agent_recovers(agent: AgentProcess) -> None:
    host, port = agent.url.removeprefix("http://").rstrip("/").rsplit(":", 1)
    address = (host, int(port))
    process = psutil.Process(agent.proc.pid)
    _get(*address, "/metrics", _basic("right"), "127.0.0.1")  # the right password, remembered from now on
    threads = process.num_threads()

    idle = [http.client.HTTPConnection(*address, timeout=30, source_address=("127.0.0.2", 0)) for _ in range(IDLE)]
    for conn in idle:
        conn.request("GET", "/healthz")
        assert conn.getresponse().read().startswith(b"ok: ")
    assert process.num_threads() == threads, "idle keep-alive connections cost no thread"

    answers: list[tuple[int, bytes, float]] = []
    lock = threading.Lock()
    barrier = threading.Barrier(CHECKERS)

    def wrong(i: int) -> None:
        barrier.wait()
        answer = _get(*address, "/metrics", _basic(f"wrong-{i}"), f"127.0.1.{1 + i % 8}")
        with lock:
            answers.append(answer)

    clients = [threading.Thread(target=wrong, args=(i,), daemon=True) for i in range(CHECKERS)]
    for client in clients:
        client.start()
    poll(lambda: len(answers) >= CHECKERS - MAX_IN_FLIGHT, 30, what="the requests past the cap to be answered")
    with lock:
        early = list(answers)
    status, body, seconds = _get(*address, "/metrics", _basic("another-wrong"), "127.0.0.3")
    print(f"\n  a request needing a worker with every slot taken: {status} in {seconds * 1e3:.1f} ms")
    assert (status, body) == (503, b"too many concurrent requests\n")
    healthz = _get(*address, "/healthz", {}, "127.0.0.3")
    assert healthz[0] == 200, "what the event loop answers itself (here /healthz) needs no slot: probes pass"
    assert all(a[0] == 503 and a[1] == b"too many concurrent requests\n" for a in early), early[:3]
    for client in clients:
        client.join(120)
    statuses = Counter(a[0] for a in answers)
    assert statuses == {401: MAX_IN_FLIGHT, 503: CHECKERS - MAX_IN_FLIGHT}, statuses
    refused = sorted(a[2] for a in answers if a[0] == 503)
    print(f"  {CHECKERS - MAX_IN_FLIGHT} past the cap: 503 within {refused[0] * 1e3:.1f}-{refused[-1] * 1e3:.1f} ms; "
          f"threads {threads} before, {process.num_threads()} after")

    assert poll(lambda: _get(*address, "/metrics", _basic("right"), "127.0.0.1")[0] == 200, 30,
                what="/metrics served again")
    for conn in idle:  # the idle ones were kept through it all (idle timeout 120 s)
        conn.request("GET", "/healthz")
        assert conn.getresponse().read().startswith(b"ok: ")
        conn.close()
    assert process.num_threads() == threads
