"""Fuzzing the report endpoint's time, concurrency and volume limits over real sockets: a stalled
body gets 408, the HTTP in-flight cap and the unix connection cap answer 503 (never silence), a
flood of reporters is bounded by max_reporters, and with a token only ``Bearer <token>`` is kept."""

from __future__ import annotations

import dataclasses
import json
import socket
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest
from hypothesis import given, strategies as st

from agent.context.workload.report_store import ReportStore
from tests.agent_process import poll
from tests.report_fuzzing import (FUZZ, Target, exchange, fresh_errors, http_target, latin1_text,  # noqa: F401 (fixtures)
                                  parse_replies, post, run_input, socket_dir, target, unix_target)


def test_body_that_never_arrives_gets_408(target: Target, monkeypatch: pytest.MonkeyPatch) -> None:
    """A client that announces a body and stalls is given the body deadline, then gets 408 (both transports:
    the listener's body_timeout_s, no thread held)."""
    listener = target.server._listener
    monkeypatch.setattr(listener, "limits", dataclasses.replace(listener.limits, body_timeout_s=0.3))
    before = target.store.stats()["rejected"]["timeout"]
    with target.connect() as sock:
        sock.settimeout(10)
        sock.sendall(post(b'{"step"', length="100"))  # 7 of 100 bytes, and the connection stays open
        data = b""
        while chunk := sock.recv(65536):  # the socket's 10 s timeout guards a hang; the 408 says which deadline ended it
            data += chunk
    assert [r.status for r in parse_replies(data)] == [408]
    assert target.store.stats()["rejected"]["timeout"] == before + 1
    target.assert_healthy()


def test_http_in_flight_cap_answers_503_and_recovers() -> None:
    """The HTTP port caps requests in flight (max_concurrent): past it a report gets 503 at once, never a
    dropped connection, and once the slow ones finish the next report is kept. A request is in flight
    from its whole arrival to its answer; here the store itself is slow, so two reports hold both slots."""
    store = _SlowStore(rate_per_s=None)
    made, stop = http_target(store, max_concurrent=2)
    slow: list[socket.socket] = []
    try:
        body = b'{"step": 1}'
        for _ in range(2):  # two whole reports, held by the store: both slots taken
            sock = made.connect()
            sock.settimeout(10)
            sock.sendall(post(body, extra=b"Connection: close\r\n"))
            slow.append(sock)
        poll(lambda: store.waiting == 2, 5.0, what="both slots taken")
        replies = exchange(made.connect, post(body))
        assert [r.status for r in replies] == [503] and replies[0].body == b"too many concurrent requests\n"
        store.release.set()
        for sock in slow:
            assert [r.status for r in parse_replies(_read_to_end(sock))] == [204]
        assert store.stats()["accepted"] == 2
        made.assert_healthy()
    finally:
        store.release.set()
        for sock in slow:
            sock.close()
        stop()


class _SlowStore(ReportStore):
    """A store whose accept waits for the test: the request stays in flight meanwhile."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.release = threading.Event()
        self.waiting = 0

    def accept(self, *args, **kwargs):
        if not self.release.is_set():
            self.waiting += 1
            self.release.wait(10)
        return super().accept(*args, **kwargs)


def _read_to_end(sock: socket.socket) -> bytes:
    """Everything until the server closes (a ``Connection: close`` request)."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def test_unix_connection_burst_gets_204_or_503_never_silence(socket_dir: Path) -> None:
    """Many jobs reporting at once past max_connections: each one gets an answer, 204 or 503."""
    store = ReportStore(rate_per_s=None)
    made, stop = unix_target(socket_dir / "burst.sock", store, max_connections=3)
    statuses: list[int | None] = []
    lock = threading.Lock()
    barrier = threading.Barrier(24)

    def client(i: int) -> None:
        request = post(json.dumps({"step": i, "pid": i + 1}).encode())
        barrier.wait()
        replies = exchange(made.connect, request)
        with lock:
            statuses.extend(r.status for r in replies) if replies else statuses.append(None)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(24)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert len(statuses) == 24 and set(statuses) <= {204, 503}, statuses
        assert store.stats()["accepted"] == statuses.count(204) >= 1
        made.assert_healthy()
    finally:
        stop()


def test_a_flood_of_reporters_is_bounded() -> None:
    """No rate limit exists, so a flood of reporters is bounded by max_reporters: the least recently
    updated are evicted, the latest are kept, over a real connection."""
    store = ReportStore(max_reporters=8, rate_per_s=None)
    made, stop = http_target(store)
    try:
        request = b"".join(post(json.dumps({"step": i, "pid": i + 1, "job": "flood"}).encode()) for i in range(40))
        replies, accepted = run_input(made, request)
        assert [r.status for r in replies] == [204] * 40 and accepted == 40
        stats = store.stats()
        assert (len(store), stats["evicted"]) == (8, 32)
        now = time.time()
        assert store.report_for(gpu="0", uuid=None, pids=[40], now=now).step == 39
        assert store.report_for(gpu="0", uuid=None, pids=[1], now=now) is None
        made.assert_healthy()
        assert len(store) == 8
    finally:
        stop()


@pytest.fixture(scope="module")
def token_target(socket_dir: Path) -> Iterator[Target]:
    """A report socket whose store requires a (non-ASCII) bearer token."""
    made, stop = unix_target(socket_dir / "tok.sock", ReportStore(token="s3cr\u00e9t", rate_per_s=None))
    yield made
    stop()


@FUZZ
@given(value=st.one_of(latin1_text, latin1_text.map(lambda t: "Bearer " + t),
                       st.sampled_from(["Bearer s3cr\u00e9t", "bearer  s3cr\u00e9t ", "Bearer s3cr\u00e9", "Bearer s3cr\u00e9tt",
                                        "Basic s3cr\u00e9t", "Bearer", "Bearer\ts3cr\u00e9t", ""])))
def test_any_authorization_value_is_401_unless_it_is_the_token(token_target: Target, value: str) -> None:
    """With a token configured, only ``Bearer <token>`` (scheme case-insensitive) stores a report."""
    scheme, _, given = value.strip().partition(" ")
    right = scheme.lower() == "bearer" and given.strip() == "s3cr\u00e9t"
    replies, accepted = run_input(token_target, post(b'{"step": 1}', extra=b"Authorization: " + value.encode("latin-1")
                                                      + b"\r\n"))
    assert [r.status for r in replies] == [204 if right else 401]
    assert accepted == (1 if right else 0)
    assert not token_target.errors and token_target.thread.is_alive()
