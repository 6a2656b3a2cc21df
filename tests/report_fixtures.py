"""Shared helpers and fixtures for the workload-report tests: test GPU UUIDs, report bodies, an
injectable clock, the agent's HTTP server in a thread, and posting to it or to a unix report socket.

Used by tests/test_report_store.py, test_report_http.py, test_report_socket.py, test_report_rate_limit.py
and test_client.py; a test module imports the fixtures it uses (``http_server_factory``, ``short_dir``).
"""

from __future__ import annotations

import http.client
import json
import shutil
import socket
import tempfile
import threading
from pathlib import Path

import pytest

from agent.context.workload.report_http import REPORT_PATH
from agent.context.workload.report_store import ReportStore
from agent.model import CollectorHealth, NodeSnapshot
from exporters.http import AgentHTTPServer

UUID_A = "GPU-aaaaaaaa-1111-2222-3333-444444444444"
UUID_B = "GPU-bbbbbbbb-1111-2222-3333-444444444444"
UUID_C = "GPU-cccccccc-1111-2222-3333-444444444444"
JSON = "application/json"


def body(**fields) -> bytes:
    return json.dumps(fields).encode()


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def empty_snapshot() -> NodeSnapshot:
    """A node with no devices: all the HTTP server needs to serve beside the report endpoint."""
    return NodeSnapshot(ts=0.0, node="n1", devices=(), health=CollectorHealth(backend="test"), expected_devices=0)


@pytest.fixture
def http_server_factory():
    servers = []

    def make(reports: ReportStore | None) -> AgentHTTPServer:
        srv = AgentHTTPServer(("127.0.0.1", 0), empty_snapshot, stale_after_s=10.0, reports=reports)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return srv

    yield make
    for srv in servers:
        srv.shutdown()
        srv.server_close()


def http_post(port: int, payload: bytes, headers: dict[str, str], path: str = REPORT_PATH):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("POST", path, body=payload, headers=headers)
        response = conn.getresponse()
        return response.status, dict(response.headers), response.read()
    finally:
        conn.close()


def raw_exchange(connect, request: bytes) -> bytes:
    """Send raw bytes and read the answer until the server closes: for requests http.client will not write."""
    with connect() as sock:
        sock.settimeout(10)
        sock.sendall(request)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


@pytest.fixture
def short_dir():
    """Unix socket paths are limited to 107 bytes; pytest's tmp_path can be longer."""
    path = Path(tempfile.mkdtemp(prefix="rw-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


class UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=10)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(self.path)


def unix_post(path: Path, payload: bytes, headers: dict[str, str], url: str = REPORT_PATH, method: str = "POST"):
    conn = UnixConnection(str(path))
    try:
        conn.request(method, url, body=payload, headers=headers)
        response = conn.getresponse()
        return response.status, dict(response.headers), response.read()
    finally:
        conn.close()

