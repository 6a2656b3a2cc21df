"""Reports over the real unix report socket: the kernel's peer PID, the socket's mode and cleanup,
every 4xx, a stale socket file replaced but a live one or another file left alone, and the cap on
concurrent connections."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from agent.context.workload.report_schema import MAX_BODY_BYTES
from agent.context.workload.report_store import ReportStore
from exporters.http.limits import ListenerLimits
from exporters.http.report_socket import SOCKET_LIMITS, ReportSocketServer
from tests.agent_process import poll
from tests.report_fixtures import JSON, body, raw_exchange, short_dir, unix_post  # noqa: F401 (fixtures)


def unix_connect(path: Path):
    def connect() -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(str(path))
        return sock
    return connect


def test_socket_server_peer_pid_mode_parent_dir_and_cleanup(short_dir):
    path = short_dir / "sub" / "report.sock"
    store = ReportStore()
    server = ReportSocketServer(path, store, mode=0o660)
    server.start()
    try:
        assert stat.S_ISSOCK(os.lstat(path).st_mode) and stat.S_IMODE(os.lstat(path).st_mode) == 0o660
        status, _, _ = unix_post(path, body(step=3, pid=1), {"Content-Type": JSON})
        assert status == 204
        # The kernel's word (our own pid) counts, not the claimed pid 1.
        report = store.report_for(gpu="0", uuid=None, pids=[os.getpid()], now=store._clock())
        assert report is not None and report.step == 3
        assert store.report_for(gpu="0", uuid=None, pids=[1], now=store._clock()) is None
    finally:
        server.close()
    assert not path.exists()
    server.close()  # idempotent


def test_socket_server_4xx(short_dir):
    path = short_dir / "r.sock"
    store = ReportStore(token="tok")
    server = ReportSocketServer(path, store)
    server.start()
    try:
        auth = {"Content-Type": JSON, "Authorization": "Bearer tok"}
        assert unix_post(path, body(step=1), {"Content-Type": JSON})[0] == 401
        assert unix_post(path, body(step=1), auth)[0] == 204
        assert unix_post(path, body(step=1), {**auth, "Content-Type": "text/csv"})[0] == 415
        assert unix_post(path, b"]", auth)[0] == 400
        assert unix_post(path, body(dtype="int8"), auth)[0] == 422
        assert unix_post(path, b"x" * (MAX_BODY_BYTES + 1), auth)[0] == 413
        status, headers, _ = unix_post(path, b"", {}, method="GET")
        assert status == 405 and headers["Allow"] == "POST"
        assert unix_post(path, body(step=1), auth, url="/elsewhere")[0] == 404
        reply = raw_exchange(unix_connect(path), b"POST /api/v1/report HTTP/1.1\r\nHost: x\r\n\r\n")
        assert reply.startswith(b"HTTP/1.1 411 ")
        reply = raw_exchange(unix_connect(path), b"POST /api/v1/report HTTP/1.1\r\nHost: x\r\n"
                                                 b"Content-Length: 1000000000000\r\n\r\n")
        assert reply.startswith(b"HTTP/1.1 413 ")
    finally:
        server.close()


def test_socket_server_replaces_stale_socket_but_not_live_one_or_other_files(short_dir):
    path = short_dir / "r.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))
    stale.close()  # the file stays, nobody listens: what a killed agent leaves behind
    assert path.exists()
    server = ReportSocketServer(path, ReportStore())
    server.start()
    try:
        assert unix_post(path, body(step=1), {"Content-Type": JSON})[0] == 204
        with pytest.raises(OSError, match="listening"):
            ReportSocketServer(path, ReportStore())
        assert path.exists()  # the failed second server left the live socket alone
        assert unix_post(path, body(step=2), {"Content-Type": JSON})[0] == 204
    finally:
        server.close()
    regular = short_dir / "not-a-socket"
    regular.write_text("precious")
    with pytest.raises(OSError, match="not a socket"):
        ReportSocketServer(regular, ReportStore())
    assert regular.read_text() == "precious"


def test_socket_server_bounds_connections_and_makes_room_for_a_report(short_dir):
    """At the cap, the oldest connection that never sent a whole request is closed for a newcomer:
    idle connections cannot keep a report out (they once held every slot of a thread-per-connection server)."""
    path = short_dir / "r.sock"
    store = ReportStore()
    # A process may hold more than the socket holds in all here: the cap in all is what is tested.
    limits = ListenerLimits(**{**vars(SOCKET_LIMITS), "max_connections": 2, "max_connections_per_client": 3})
    server = ReportSocketServer(path, store, limits=limits)
    server.start()
    idle = []
    try:
        for _ in range(2):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(str(path))
            idle.append(sock)
        poll(lambda: server.open_connections == 2, 5.0, what="two connections accepted")
        assert unix_post(path, body(step=1), {"Content-Type": JSON})[0] == 204
        idle[0].settimeout(5.0)
        assert idle[0].recv(4096).startswith(b"HTTP/1.1 503 "), "the oldest idle connection made room, and was told"
    finally:
        for sock in idle:
            sock.close()
        server.close()
    assert store.stats()["accepted"] == 1


@pytest.mark.slow
def test_a_process_past_its_share_is_told_503_and_another_process_still_reports(short_dir):
    """A client is a process here (the kernel's peer PID): one process holding its 16 connections does not
    keep another out, and its 17th connection is answered 503 rather than dropped."""
    path = short_dir / "r.sock"
    store = ReportStore()
    server = ReportSocketServer(path, store)
    server.start()
    held = []
    try:
        for _ in range(SOCKET_LIMITS.max_connections_per_client):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(str(path))
            held.append(sock)
        poll(lambda: server.open_connections == len(held), 5.0, what="this process's connections accepted")
        reply = raw_exchange(unix_connect(path), b"POST /api/v1/report HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
        assert reply.startswith(b"HTTP/1.1 503 ") and b"Retry-After: 1" in reply
        code = ("import http.client, socket, sys\n"
                "class C(http.client.HTTPConnection):\n"
                "    def connect(self):\n"
                "        self.sock = socket.socket(socket.AF_UNIX); self.sock.connect(sys.argv[1])\n"
                "c = C('localhost', timeout=10)\n"
                "c.request('POST', '/api/v1/report', body=sys.argv[2], headers={'Content-Type': 'application/json'})\n"
                "print(c.getresponse().status)\n")
        other = subprocess.run([sys.executable, "-c", code, str(path), body(step=7).decode()], capture_output=True,
                               text=True, timeout=30)
        assert other.stdout.strip() == "204", other.stderr
    finally:
        for sock in held:
            sock.close()
        server.close()
    assert store.stats()["accepted"] == 1
