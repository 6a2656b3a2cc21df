"""Reports over the agent's real HTTP port (``POST /api/v1/report``): accepted and matched, keep-alive,
every 4xx, the endpoint switched off, and a refused or dribbling client never holding a slot."""

from __future__ import annotations

import http.client
import socket
import threading

import pytest

from agent.context.workload.report_http import REPORT_PATH
from agent.context.workload.report_schema import MAX_BODY_BYTES
from agent.context.workload.report_store import ReportStore
from tests.report_fixtures import JSON, body, http_post, http_server_factory, raw_exchange  # noqa: F401 (fixtures)


def test_http_report_accepted_and_matched(http_server_factory):
    store = ReportStore()
    srv = http_server_factory(store)
    port = srv.server_address[1]
    status, _, reply = http_post(port, body(step=5, tokens_per_s=1e4, pid=4321), {"Content-Type": JSON})
    assert status == 204 and reply == b""
    report = store.report_for(gpu="0", uuid=None, pids=[4321], now=store._clock())
    assert report is not None and report.step == 5 and report.tokens_per_s == 1e4


def test_http_keep_alive_carries_several_reports(http_server_factory):
    store = ReportStore()
    srv = http_server_factory(store)
    conn = http.client.HTTPConnection("127.0.0.1", srv.server_address[1], timeout=10)
    try:
        for step in range(3):
            conn.request("POST", REPORT_PATH, body=body(step=step), headers={"Content-Type": JSON})
            response = conn.getresponse()
            response.read()
            assert response.status == 204
        sock_before = conn.sock
        conn.request("GET", "/healthz")
        conn.getresponse().read()
        assert conn.sock is sock_before  # one connection throughout
    finally:
        conn.close()
    assert store.stats()["accepted"] == 3


def test_http_4xx(http_server_factory):
    store = ReportStore(token="tok")
    srv = http_server_factory(store)
    port = srv.server_address[1]
    auth = {"Content-Type": JSON, "Authorization": "Bearer tok"}
    status, headers, _ = http_post(port, body(step=1), {"Content-Type": JSON})
    assert status == 401 and headers["WWW-Authenticate"].startswith("Bearer")
    assert http_post(port, body(step=1), {**auth, "Authorization": "Bearer nope"})[0] == 401
    assert http_post(port, body(step=1), {**auth, "Content-Type": "text/plain"})[0] == 415
    assert http_post(port, b"{not json", auth)[0] == 400
    status, _, reply = http_post(port, body(step_time_s="slow"), auth)
    assert status == 422 and b"step_time_s" in reply
    assert http_post(port, b"x" * (MAX_BODY_BYTES + 1), auth)[0] == 413
    assert http_post(port, body(step=1), auth)[0] == 204

    connect = lambda: socket.create_connection(("127.0.0.1", port))  # noqa: E731
    # No Content-Length: 411.
    reply = raw_exchange(connect, b"POST /api/v1/report HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                  b"Authorization: Bearer tok\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 411 ")
    # A huge Content-Length with no body gets 413 at once: the server never waits for (or allocates) it.
    reply = raw_exchange(connect, b"POST /api/v1/report HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                  b"Authorization: Bearer tok\r\nContent-Length: 1000000000000\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 413 ") and b"Connection: close" in reply
    reply = raw_exchange(connect, b"POST /api/v1/report HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999999"
                                  b"\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 400 ")  # over 20 digits: a framing error to the parser, before the store
    reply = raw_exchange(connect, b"POST /api/v1/report HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 400 ")
    rejected = store.stats()["rejected"]
    assert rejected["length_required"] == 1 and rejected["too_large"] == 2 and rejected["unauthorized"] == 2


def test_http_reports_off_gives_404_and_other_methods_keep_405(http_server_factory):
    srv = http_server_factory(None)
    port = srv.server_address[1]
    status, _, reply = http_post(port, body(step=1), {"Content-Type": JSON})
    assert status == 404 and b"not enabled" in reply
    status, headers, _ = http_post(port, body(step=1), {"Content-Type": JSON}, path="/metrics")
    assert status == 405 and headers["Allow"] == "GET, HEAD"
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", REPORT_PATH)
    assert conn.getresponse().status == 404  # GET behaviour unchanged: an unknown GET path
    conn.close()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("PUT", REPORT_PATH, body=b"{}")
    response = conn.getresponse()
    assert response.status == 405 and response.headers["Allow"] == "GET, HEAD"
    conn.close()


def test_http_with_store_still_405_for_post_elsewhere(http_server_factory):
    srv = http_server_factory(ReportStore())
    status, headers, _ = http_post(srv.server_address[1], body(step=1), {"Content-Type": JSON}, path="/healthz")
    assert status == 405 and headers["Allow"] == "GET, HEAD"


def test_a_refused_client_is_answered_before_it_sends_its_body(http_server_factory):
    """No token, no answer slot: a wrong token is refused from the headers, while the announced
    body never arrives (were the body read first, this would wait for the read timeout)."""
    srv = http_server_factory(ReportStore(token="right"))
    with socket.create_connection(("127.0.0.1", srv.server_address[1]), timeout=10) as sock:
        sock.sendall(f"POST {REPORT_PATH} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     "Authorization: Bearer wrong\r\nContent-Length: 1000\r\n\r\n".encode())
        answer = sock.recv(4096)
    assert answer.startswith(b"HTTP/1.1 401") and b"Connection: close" in answer


@pytest.mark.slow
def test_a_dribbled_body_gets_408_within_the_total_limit(http_server_factory):
    """The body read has one deadline in all (the listener's body_timeout_s, 5 s), not one per byte, so a
    slow client releases its slot."""
    srv = http_server_factory(ReportStore())
    payload = body(step_time_s=1.0) + b" " * 100  # JSON allows the trailing blanks: 10 s at this pace
    with socket.create_connection(("127.0.0.1", srv.server_address[1]), timeout=10) as sock:
        sock.sendall(f"POST {REPORT_PATH} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(payload)}\r\n\r\n".encode())
        sock.setblocking(False)
        answer = b""
        for byte in payload:  # one byte every 0.1 s: each read arrives well within a per-read timeout
            try:
                sock.send(bytes([byte]))
            except OSError:
                break  # the agent answered and closed
            try:
                answer += sock.recv(4096)
            except BlockingIOError:
                pass
            if answer:
                break
            threading.Event().wait(0.1)  # the client's own pace, not a synchronisation
        sock.setblocking(True)
        answer += sock.recv(4096) if not answer else b""
    assert answer.startswith(b"HTTP/1.1 408"), answer[:80]
