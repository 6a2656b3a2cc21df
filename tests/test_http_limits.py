"""The HTTP server's bounds: open connections, the listen backlog, and the drain."""

from __future__ import annotations

import http.client
import socket
import threading

import pytest

from agent.app.assemble import make_collector, open_backend_or_fail
from agent.app.config import Settings
from exporters.http import AgentHTTPServer
from tests.agent_process import SLOW_MACHINE_SAMPLE_TIMEOUT_S, poll, serving


def _served(port: int) -> http.client.HTTPConnection:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.request("GET", "/healthz")
    response = connection.getresponse()
    response.read()
    assert response.status == 200
    return connection


def _free_slots(server: AgentHTTPServer) -> int:
    """How many request slots nobody holds right now (taken and given straight back)."""
    taken = 0
    while taken < server.max_concurrent and server.slots.acquire(blocking=False):
        taken += 1
    for _ in range(taken):
        server.slots.release()
    return taken


def test_at_the_connection_cap_the_oldest_idle_one_makes_room_and_threads_stay_fixed():
    """Past max_connections the oldest connection with no request in progress is closed for the newcomer
    (a connection costs no thread, so the thread count does not move); when every one is busy, the
    newcomer is closed on arrival instead."""
    settings = Settings(backend="virtual", sample_timeout_s=SLOW_MACHINE_SAMPLE_TIMEOUT_S)
    collector = make_collector(settings, open_backend_or_fail(settings))
    collector.collect_once()
    server = AgentHTTPServer(("127.0.0.1", 0), lambda: collector.snapshot, stale_after_s=60.0,
                             max_concurrent=2, max_connections=4)
    port = server.server_address[1]
    try:
        with serving(server):
            held = [_served(port) for _ in range(4)]  # idle keep-alive connections, the cap
            threads = set(threading.enumerate())  # objects, not a count: another test's thread may end meanwhile
            newest = _served(port)  # room is made: the oldest idle one is closed
            assert server.open_connections == 4 and set(threading.enumerate()) - threads == set()
            held[0].request("GET", "/healthz")
            with pytest.raises((http.client.RemoteDisconnected, ConnectionError)):
                held[0].getresponse()
            for connection in held[1:]:
                connection.request("GET", "/healthz")
                assert connection.getresponse().read().startswith(b"ok: ")
            for connection in held[1:] + [newest]:
                connection.close()
            poll(lambda: server.open_connections == 0, 10, what="every connection to be forgotten")
    finally:
        collector.stop()


def test_a_burst_of_connections_waits_in_the_backlog_while_the_agent_is_busy():
    """50 scrapers arriving while the accept loop is not running (a pause, a busy moment) are all
    queued by the kernel and answered once it runs: none waits out SYN retries, as with 5."""
    settings = Settings(backend="virtual", sample_timeout_s=SLOW_MACHINE_SAMPLE_TIMEOUT_S)
    collector = make_collector(settings, open_backend_or_fail(settings))
    collector.collect_once()
    server = AgentHTTPServer(("127.0.0.1", 0), lambda: collector.snapshot, stale_after_s=60.0)
    port = server.server_address[1]
    try:
        clients = [socket.create_connection(("127.0.0.1", port), timeout=2) for _ in range(50)]  # accept loop not running
        for client in clients:
            client.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        with serving(server):
            for client in clients:
                client.settimeout(10)
                assert client.recv(12) == b"HTTP/1.1 200"
                client.close()
    finally:
        collector.stop()
        server.server_close()


def test_a_request_arriving_while_the_agent_drains_is_told_it_is_stopping():
    """Stopping, the agent holds every request slot until the answers in flight finish. A request
    that arrives on an open keep-alive connection meanwhile gets a whole 503 saying so, and the
    connection closes: not "too many concurrent requests", and never half an answer."""
    settings = Settings(backend="virtual", sample_timeout_s=SLOW_MACHINE_SAMPLE_TIMEOUT_S)
    collector = make_collector(settings, open_backend_or_fail(settings))
    collector.collect_once()
    server = AgentHTTPServer(("127.0.0.1", 0), lambda: collector.snapshot, stale_after_s=60.0, max_concurrent=2)
    port = server.server_address[1]
    try:
        with serving(server):
            keep_alive = _served(port)
            # The handler gives its slot back just after answering: wait for that, so that below
            # every slot is held either by this test or by the drain, never by a late handler.
            poll(lambda: _free_slots(server) == 2, 10, what="the first answer's slot to come back")
            assert server.slots.acquire(timeout=5)  # an answer still in flight
            drained: list[bool] = []
            drainer = threading.Thread(target=lambda: drained.append(server.drain(timeout_s=30.0)))
            drainer.start()
            poll(lambda: server.draining.is_set(), 10, what="the drain to start")
            poll(lambda: _free_slots(server) == 0, 10, what="the drain to hold the free slot")
            keep_alive.request("GET", "/metrics")
            response = keep_alive.getresponse()
            body = response.read()
            assert (response.status, body) == (503, b"shutting down\n")
            assert response.headers["Connection"] == "close" and response.headers["Retry-After"] == "1"
            assert drained == [], "the drain waits for the answer in flight"
            server.slots.release()
            drainer.join(timeout=10)
            assert drained == [True]
            keep_alive.close()
    finally:
        collector.stop()
