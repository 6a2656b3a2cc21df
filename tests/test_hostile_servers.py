"""``roofwatch snapshot --url`` and ``roofwatch top`` against a server that means harm.

The URL is whatever the user typed, and the server behind it may answer JSON nested 200 000 deep
(RecursionError), an endless body (MemoryError), or one byte at a time so that no single read ever
times out (a hang: there was only a per-read timeout). Each now ends within a deadline, within a
size cap, and as one line on stderr. The server here is a raw socket server, so it can send what
no well-behaved HTTP library would.
"""

from __future__ import annotations

import resource
import socketserver
import subprocess
import threading
import time

import pytest

from agent.views.snapshot_text import FETCH_DEADLINE_S, MAX_SNAPSHOT_BYTES, SnapshotFetchError, fetch_snapshot_json
from agent.views.top_source import TopSourceError, fetch_view
from tests.agent_process import clean_env, roofwatch_cmd

TRICKLE_S = 0.1


def _head(length: int | None = None, extra: str = "") -> bytes:
    size = f"Content-Length: {length}\r\n" if length is not None else "Connection: close\r\n"
    return f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n{size}{extra}\r\n".encode()


class Hostile(socketserver.BaseRequestHandler):
    """One bad answer per path; every loop stops when the client goes away."""

    def handle(self) -> None:
        sock = self.request
        request = b""
        while b"\r\n\r\n" not in request:
            chunk = sock.recv(4096)
            if not chunk:
                return
            request += chunk
        path = request.split(b" ", 2)[1].decode()
        try:
            self.answer(sock, path.split("/")[1])
        except OSError:  # the client gave up: that is the point
            pass

    def answer(self, sock, kind: str) -> None:
        if kind == "deep":
            body = b"[" * 200_000 + b"]" * 200_000
            sock.sendall(_head(len(body)) + body)
        elif kind == "endless":
            sock.sendall(_head(None))
            block = b" " * 2**20
            while True:
                sock.sendall(block)
        elif kind == "trickle-body":
            sock.sendall(_head(10**6) + b"{")
            while True:
                time.sleep(TRICKLE_S)
                sock.sendall(b" ")
        elif kind == "trickle-headers":
            sock.sendall(b"HTTP/1.1 200 OK\r\nX-Slow: ")
            while True:
                time.sleep(TRICKLE_S)
                sock.sendall(b"a")
        elif kind == "empty-object":
            sock.sendall(_head(2) + b"{}")
        elif kind == "wrong-types":
            body = (b'{"node": "n", "visible_devices": 1, "expected_devices": 1, "health": {"backend": "x", '
                    b'"cycles_total": 1}, "devices": [{"info": {"gpu": 0, "model": "m"}, "up": true}]}')
            sock.sendall(_head(len(body)) + body)
        elif kind == "huge-number":
            body = b'{"node": ' + b"9" * 5000 + b"}"
            sock.sendall(_head(len(body)) + body)
        elif kind == "to-file":
            sock.sendall(b"HTTP/1.1 302 Found\r\nLocation: file:///etc/passwd\r\nContent-Length: 0\r\n\r\n")


@pytest.fixture(scope="module")
def hostile():
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Hostile)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def within(seconds: float, call):
    """Run ``call`` in a thread; fail (rather than hang the suite) when it is still running after ``seconds``."""
    outcome: list = []

    def target():
        try:
            outcome.append(("ok", call()))
        except Exception as exc:  # noqa: BLE001 - handed to the test
            outcome.append(("error", exc))

    worker = threading.Thread(target=target, daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"still running after {seconds} s"
    return outcome[0]


# -- the snapshot client ------------------------------------------------------------------------


SNAPSHOT = ("snapshot", lambda url, deadline=1.5: fetch_snapshot_json(url, timeout=1.0, deadline=deadline),
            SnapshotFetchError, "")
TOP = ("top", lambda url, deadline=1.5: fetch_view(url, timeout=1.0, deadline=deadline), TopSourceError, "/metrics")
SLOW = pytest.mark.slow  # a trickling server is cut by the deadline: the test waits it out


@pytest.mark.parametrize("client, kind, message", [
    (SNAPSHOT, "deep", "nested"),  # messages are matched in lower case
    (SNAPSHOT, "endless", f"more than {MAX_SNAPSHOT_BYTES // 2**20} mib"),
    pytest.param(SNAPSHOT, "trickle-body", "did not finish answering within 1.5 s", marks=SLOW),
    pytest.param(SNAPSHOT, "trickle-headers", "did not finish answering within 1.5 s", marks=SLOW),
    (SNAPSHOT, "empty-object", "with a roofwatch snapshot (node: missing"),
    (SNAPSHOT, "wrong-types", "devices[0].info"),
    (SNAPSHOT, "huge-number", "did not answer with json"),
    (SNAPSHOT, "to-file", "redirect"),
    (TOP, "endless", "more than 16 mib"),
    pytest.param(TOP, "trickle-body", "did not finish answering within 1.5 s", marks=SLOW),
    pytest.param(TOP, "trickle-headers", "did not finish answering within 1.5 s", marks=SLOW),
    (TOP, "to-file", "redirect"),
], ids=lambda v: v[0] if isinstance(v, tuple) else None)
def test_a_remote_fetch_ends_in_one_line_naming_why(hostile, client, kind, message):
    """The snapshot client (snapshot --url) and top's /metrics fetch: the error names the deadline or the cap
    that ended it (a trickling server is cut by the deadline, whose message says so), in one line."""
    _, fetch, error_type, suffix = client
    # an endless body must be ended by the size cap: a deadline it cannot reach first, even on a
    # loaded machine where reading 16 MiB takes longer than 1.5 s (it did once in CI's suite)
    deadline = 20.0 if kind == "endless" else 1.5
    status, result = within(30, lambda: fetch(f"{hostile}/{kind}{suffix}", deadline))
    assert status == "error" and isinstance(result, error_type), result
    text = str(result)
    assert "\n" not in text and message in text.lower() and f"/{kind}" in text, text


def _limit_memory() -> None:
    limit = 1536 * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["deep", "endless", "trickle-body", "empty-object"])
def test_snapshot_url_command_exits_1_with_one_line(hostile, kind):
    result = subprocess.run(roofwatch_cmd("snapshot", "--url", f"{hostile}/{kind}"), capture_output=True, text=True,
                            timeout=FETCH_DEADLINE_S + 30, env=clean_env(), preexec_fn=_limit_memory)
    assert result.returncode == 1 and result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("roofwatch snapshot: ") and f"/{kind}" in lines[0], lines


