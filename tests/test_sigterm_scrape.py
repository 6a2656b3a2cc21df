"""SIGTERM while scrapes are in flight: every answer that started is whole, and the agent exits 0."""

from __future__ import annotations

import http.client
import signal
import threading
import urllib.parse

import pytest

from tests.agent_process import AgentProcess, poll

pytestmark = pytest.mark.e2e


def test_sigterm_during_scrapes_leaves_no_half_answer():
    agent = AgentProcess("demo", "--listen", "127.0.0.1:0")
    agent.wait_healthy()
    target = urllib.parse.urlsplit(agent.url)
    whole, broken, refused = [], [], []
    started = threading.Event()
    stop = threading.Event()

    def scrape() -> None:
        while not stop.is_set():
            connection = http.client.HTTPConnection(target.hostname, target.port, timeout=10)
            try:
                connection.request("GET", "/metrics")
                response = connection.getresponse()
                body = response.read()  # IncompleteRead if the agent died mid-answer
                started.set()
                if response.status == 200 and body.endswith(b"\n") and len(body) == int(response.headers["Content-Length"]):
                    whole.append(len(body))
                else:
                    broken.append((response.status, len(body)))
            except (ConnectionRefusedError, ConnectionResetError, http.client.RemoteDisconnected):
                refused.append(1)  # not accepted, or closed before an answer began: the client retries
            except http.client.IncompleteRead as exc:
                broken.append(("incomplete", len(exc.partial)))
            finally:
                connection.close()

    threads = [threading.Thread(target=scrape, daemon=True) for _ in range(16)]
    for t in threads:
        t.start()
    try:
        poll(lambda: len(whole) >= 50, 30, what="scrapes under way")
        code, _elapsed, err = agent.stop(signal.SIGTERM, timeout=10)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=15)
        agent.kill()
    assert code == 0 and "Traceback" not in err
    assert not broken, f"answers cut short by the shutdown: {broken[:5]}"
    assert whole


def test_drain_waits_for_the_requests_being_answered():
    from exporters.http import AgentHTTPServer

    server = AgentHTTPServer(("127.0.0.1", 0), lambda: None, stale_after_s=10.0, max_concurrent=4)
    try:
        server.slots.acquire()  # one request being answered
        assert server.drain(timeout_s=0.05) is False
        assert server.slots.acquire(blocking=False), "a failed drain gives back what it took"
        server.slots.release()
        threading.Timer(0.05, server.slots.release).start()  # the request finishes
        assert server.drain(timeout_s=5.0) is True
    finally:
        server.server_close()
