"""The agent's port against hostile clients, one promise per test, over real sockets (issue 27, the listener).

The server runs in this process with tight limits (1-2 s deadlines, small caps) so each promise is
checked in seconds; the same code with the default limits faces 500 attackers at once in
tests/test_load_hostile.py. Every test here failed against the http.server listener it replaced.
"""

from __future__ import annotations

import base64
import dataclasses
import gzip
import http.client
import socket
import threading
import time
from typing import Iterator

import bcrypt
import pytest

from agent.app.assemble import status_page
from agent.context.workload.report_store import ReportStore
from agent.model import CollectorHealth, NodeSnapshot
from exporters.http import routes as http_routes
from exporters.http import AgentHTTPServer
from exporters.http.limits import ListenerLimits
from exporters.web_config import BasicAuth, WebConfig
from tests.agent_process import poll, serving
from tests.report_fuzzing import parse_replies

LIMITS = ListenerLimits(header_timeout_s=1.0, idle_timeout_s=1.0, body_timeout_s=1.0, write_timeout_s=1.0,
                        max_connections=200, max_connections_per_client=150, max_header_bytes=4096,
                        max_discard_bytes=1024)
HEADERS = {"X-Frame-Options": "deny"}


def _snapshot() -> NodeSnapshot:
    return NodeSnapshot(ts=time.time(), node="n1", devices=(), expected_devices=0,
                        health=CollectorHealth(backend="test", last_cycle_ts=time.time()))


@pytest.fixture
def server() -> Iterator[AgentHTTPServer]:
    snapshot = _snapshot()
    web = WebConfig(None, BasicAuth({}), dict(HEADERS))
    with serving(AgentHTTPServer(("127.0.0.1", 0), lambda: snapshot, stale_after_s=1e9, web=web, limits=LIMITS,
                                 reports=ReportStore(rate_per_s=None))) as srv:
        yield srv


def _connect(server: AgentHTTPServer, source: str = "127.0.0.1") -> socket.socket:
    sock = socket.create_connection(server.server_address[:2], timeout=10, source_address=(source, 0))
    return sock


def _read_all(sock: socket.socket, limit_s: float = 10.0) -> bytes:
    """Everything until the server closes (a socket timeout, raised, guards a hang)."""
    sock.settimeout(limit_s)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    return data


def _healthz(server: AgentHTTPServer, source: str = "127.0.0.1") -> None:
    """One honest GET /healthz on a new connection, answered 200 (the client's 5 s timeout guards a hang)."""
    conn = http.client.HTTPConnection(*server.server_address[:2], timeout=5, source_address=(source, 0))
    conn.request("GET", "/healthz")
    response = conn.getresponse()
    assert response.status == 200 and response.read().startswith(b"ok: ")
    conn.close()


# -- 1. idle and slow clients ---------------------------------------------------------------------


@pytest.mark.slow
def test_slow_and_idle_clients_cost_no_thread_and_are_cut_at_their_deadline(server):
    """140 idle connections and 40 slowloris ones (a request line, then a header byte now and then, never
    the blank line) are more than the old server's 128 threads: scrapes are still answered at once, the
    thread count does not move, and each is closed at the header deadline (408 when it had begun)."""
    _healthz(server)  # the listener's loop and worker threads are up
    threads = set(threading.enumerate())  # objects, not a count: another test's thread may end meanwhile
    idle = [_connect(server, "127.0.0.2") for _ in range(140)]
    slow = [_connect(server, "127.0.0.3") for _ in range(40)]
    for sock in slow:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
    poll(lambda: server.open_connections == 180, 10, what="180 hostile connections open")
    assert set(threading.enumerate()) - threads == set(), "a connection costs no thread"
    for _ in range(5):
        _healthz(server)  # honest clients are served while the hostile ones hold their connections
    for sock in slow[:5]:
        sock.sendall(b"X-Drip: 1\r\n")  # dribbling does not move the deadline
    answers = [_read_all(sock) for sock in slow]
    assert all(data.startswith(b"HTTP/1.1 408 ") for data in answers), answers[0]
    assert all(b"X-Frame-Options: deny" in data for data in answers), "the web config's headers on error pages too"
    assert [_read_all(sock) for sock in idle] == [b""] * len(idle), "a connection that sent nothing is closed silently"
    poll(lambda: server.open_connections == 0, 5, what="the hostile connections to be gone")
    for sock in idle + slow:
        sock.close()


@pytest.mark.slow
def test_an_idle_keep_alive_connection_is_closed_after_the_idle_timeout(server):
    conn = http.client.HTTPConnection(*server.server_address[:2], timeout=10)
    conn.request("GET", "/healthz")
    assert conn.getresponse().read().startswith(b"ok: ")
    assert server.open_connections == 1, "kept alive after the answer"
    assert _read_all(conn.sock) == b"", "then closed silently, with no request on it"
    poll(lambda: server.open_connections == 0, 5, what="the idle connection to be gone")
    conn.close()


def test_connections_past_the_per_address_cap_are_closed_and_others_are_served(server):
    hogs = [_connect(server, "127.0.0.4") for _ in range(LIMITS.max_connections_per_client)]
    poll(lambda: server.open_connections == len(hogs), 10, what="the hog's connections open")
    extra = _connect(server, "127.0.0.4")
    extra.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert _read_all(extra) == b"", "past its address's cap a connection is closed unanswered"
    _healthz(server, "127.0.0.5")  # another address is served
    for sock in hogs + [extra]:
        sock.close()


@pytest.mark.slow
def test_a_pipelining_client_that_never_reads_is_cut_off_while_others_are_served(server):
    """5000 pipelined requests for /metrics, never reading: the agent stops reading while the answers wait,
    closes the connection at the write deadline, and serves others meanwhile."""
    sock = _connect(server, "127.0.0.6")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    request = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
    sent = 0
    sock.settimeout(0.5)
    try:
        for _ in range(5000):
            sock.sendall(request)
            sent += 1
    except (TimeoutError, socket.timeout):
        pass  # the agent stopped reading: its input waits in the kernel, not in the agent
    _healthz(server)  # others are served meanwhile
    poll(lambda: server.open_connections == 0, 10, what="the non-reader to be cut off at the write deadline")
    sock.close()


# -- 2. memory ------------------------------------------------------------------------------------


def test_headers_past_the_byte_cap_get_431_without_being_buffered(server):
    sock = _connect(server)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20_000)  # never finished
    data = _read_all(sock)
    assert data.startswith(b"HTTP/1.1 431 ") and b"X-Frame-Options: deny" in data
    sock.close()
    many = b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"X-Many: 1\r\n" * 500 + b"\r\n"  # whole, 5.5 kB
    sock = _connect(server)
    sock.sendall(many)
    assert _read_all(sock).startswith(b"HTTP/1.1 431 ")
    sock.close()


# -- 3. request smuggling -------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["GET", "HEAD", "PUT", "BREW"])
def test_a_body_on_any_method_is_never_read_as_the_next_request(server, method):
    """A body carrying a second request is discarded (small) or the connection closed (large): exactly one answer."""
    smuggled = b"GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
    for body in (smuggled, smuggled + b"x" * 2000):
        sock = _connect(server)
        sock.sendall(f"{method} /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body
                     + b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = _read_all(sock)
        statuses = [r.status for r in parse_replies(data)] if method != "HEAD" else [int(data[9:12])]
        assert 404 not in statuses and b"/smuggled" not in data, data
        if len(body) <= LIMITS.max_discard_bytes:
            assert len(statuses) == 2 or method == "HEAD", "a small body is discarded and the connection goes on"
        else:
            assert len(statuses) == 1, "a large body is not read: answered, then closed"
        sock.close()


# -- 5. correct HTTP ------------------------------------------------------------------------------


@pytest.mark.parametrize(("accept", "gzipped"), [
    ("gzip", True), ("gzip;q=0", False), ("gzip; q=0.0, identity", False), ("*", True), ("*;q=0", False),
    ("identity, gzip;q=0.5", True), ("br", False), ("GZIP", True), ("gzip;q=nan", False), ("x-gzip", True),
])
def test_accept_encoding_q_values_are_honoured(server, accept, gzipped):
    conn = http.client.HTTPConnection(*server.server_address[:2], timeout=10)
    conn.request("GET", "/metrics", headers={"Accept-Encoding": accept})
    response = conn.getresponse()
    body = response.read()
    assert response.status == 200 and (response.getheader("Content-Encoding") == "gzip") is gzipped
    assert (gzip.decompress(body) if gzipped else body).startswith(b"# HELP")
    conn.close()


def test_refresh_values_reuse_one_rendering_per_snapshot(server, monkeypatch):
    renders = []
    real = status_page()  # the / page the agent registers with its server
    monkeypatch.setattr(server, "page", dataclasses.replace(
        real, render=lambda *a, **k: renders.append(1) or real.render(*a, **k)))
    for refresh in ("5", "6", "7.5", "30", "3600", "0.01"):
        page = server.status_page(http_routes.refresh_param(f"refresh={refresh}", real.default_refresh_s))
        assert f'data-refresh="{max(1.0, float(refresh)):g}"'.encode() in page and b"roofwatch-refresh" not in page
    assert len(renders) == 1, "one rendering with the refresh script, whatever the period"
    assert b'data-refresh="0"' in server.status_page(0.0) and len(renders) == 2


@pytest.mark.parametrize("hints", ['{"CUDA_VISIBLE_DEVICES": "\\u00b2"}', '{"CUDA_VISIBLE_DEVICES": "0,1", "LOCAL_RANK": "\\u00b2"}',
                                   '{"NVIDIA_VISIBLE_DEVICES": "0,1", "CUDA_VISIBLE_DEVICES": "\\u00b9"}'])
def test_a_report_with_unicode_digit_hints_is_not_a_server_error(server, hints):
    body = ('{"step": 1, "hints": ' + hints + "}").encode()
    sock = _connect(server)
    sock.sendall(b"POST /api/v1/report HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
                 + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    replies = parse_replies(_read_all(sock))
    assert [r.status for r in replies] in ([204], [422]), replies
    sock.close()


def test_no_garbage_gets_a_server_error(server):
    """Inputs that made http.server answer 5xx (unknown method 501, HTTP/2 505) or drop the connection; a
    HEAD refused for its version was dropped unanswered (h11 refused the error page's body), found by the
    report-framing fuzz test."""
    for raw in (b"BREW /metrics HTTP/1.1\r\nHost: x\r\n\r\n", b"GET / HTTP/2.0\r\nHost: x\r\n\r\n",
                b"HEAD /metrics HTTP/2.0\r\nHost: x\r\n\r\n",
                b"GET / HTTP/0.9\r\n\r\n", b"TRACE / HTTP/1.1\r\nHost: x\r\n\r\n",
                b"GET /healthz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n"):
        sock = _connect(server)
        sock.sendall(raw)
        sock.shutdown(socket.SHUT_WR)
        replies = parse_replies(_read_all(sock))
        assert replies and all(r.status is not None and r.status < 500 for r in replies), (raw, replies)
        assert replies[0].headers.get("x-frame-options") == "deny"
        sock.close()


# -- 4. basic auth --------------------------------------------------------------------------------


def test_long_and_non_ascii_passwords_get_401_not_a_dropped_connection():
    hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4)).decode()
    snapshot = _snapshot()
    web = WebConfig(None, BasicAuth({"prom": hashed}), {})
    with serving(AgentHTTPServer(("127.0.0.1", 0), lambda: snapshot, stale_after_s=1e9, web=web, limits=LIMITS)) as srv:
        for authorization in ("Basic " + base64.b64encode(b"prom:" + b"p" * 100).decode(), "Basic \u00fc\u00fc\u00fc\u00fc",
                              "Basic " + base64.b64encode(b"prom:pw").decode() + "\u00e9"):
            conn = http.client.HTTPConnection(*srv.server_address[:2], timeout=10)
            conn.putrequest("GET", "/metrics")
            conn.putheader("Authorization", authorization.encode("latin-1"))
            conn.endheaders()
            response = conn.getresponse()
            assert response.status == 401 and response.getheader("WWW-Authenticate").startswith("Basic"), authorization
            response.read()
            conn.close()
