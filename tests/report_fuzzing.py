"""Shared by the tests/test_fuzz_report_*.py files, which fuzz the workload-report endpoint over real
sockets: the agent's HTTP port (``POST /api/v1/report``) and the unix report socket, both fed what a
buggy or hostile client could send.

For every input: an answer with a 2xx/4xx status (the only 5xx are HTTP's own answers to an unknown
method, 501, and an HTTP major version above 1, 505), no exception in a handler thread, the server
still serving the next report, and nothing in the store that breaks the documented limits.

What limits exist (agent/context/workload/report_*.py, exporters/http/): body size (MAX_BODY_BYTES), the body read
timeout, string lengths and number ranges, reporters kept (max_reporters, oldest evicted), and
concurrent connections / in-flight requests (503 past the cap), and a per-client rate (429). The rate
limit is switched off here (``rate_per_s=None``): these tests send thousands of inputs a second from one
client, and what they check is the parsing; tests/test_report_rate_limit.py checks the limit.

Here: the schema written out independently (``valid_report``), raw HTTP requests and replies, and the
servers under test (the ``target`` fixture: one per transport per test module). A test module imports
the fixtures it uses, and always ``fresh_errors`` (autouse).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import re
import shutil
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from hypothesis import HealthCheck, settings, strategies as st

from agent.context.workload.report_http import REPORT_PATH
from agent.context.workload.report_schema import MAX_HINT_LEN, MAX_STR_LEN
from exporters.http.report_socket import ReportSocketServer
from agent.context.workload.report_store import ReportStore
from agent.model import DTYPES, CollectorHealth, NodeSnapshot
from exporters.http import AgentHTTPServer
from tests.report_fixtures import JSON

FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture])
"""function_scoped_fixture: the only one is the autouse one clearing handler errors once per test, by design."""
HINT_NAMES = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")
FLOAT_LIMITS = {"step_time_s": 1e6, "tokens": 1e18, "tokens_per_s": 1e18, "flops_per_token": 1e18, "model_bytes": 1e18}
INT_LIMITS = {"rank": (0, 1_000_000), "world_size": (1, 1_000_000), "step": (0, 10**15), "pid": (1, 2**22)}
MEANINGFUL = ("step_time_s", "tokens", "tokens_per_s", "flops_per_token", "model_bytes", "dtype", "step", "serving")
SERVING_LIMITS = {"running": 1e18, "waiting": 1e18, "max_running": 1e18, "kv_usage": 1.0, "kv_cache_bytes": 1e18,
                  "preemptions_per_s": 1e18, "tpot_s": 1e6, "ttft_s": 1e6, "prefill_share": 1.0,
                  "generated_tokens_per_s": 1e18}


def valid_report(obj: Any) -> bool:
    """The documented schema (docs/attribution.md, ReportRequest), written out independently: what may be stored."""
    if not isinstance(obj, dict) or not set(obj) <= {*FLOAT_LIMITS, *INT_LIMITS, "dtype", "job", "gpu", "hints", "serving"}:
        return False
    for key, value in obj.items():
        if value is None:
            continue
        if key in FLOAT_LIMITS:  # an integer counts as its float value (1e18 + 1 == 1e18); NaN fails the test
            ok = type(value) in (int, float) and _as_float(value) is not None and 0 <= _as_float(value) <= FLOAT_LIMITS[key]
        elif key in INT_LIMITS:
            ok = type(value) is int and INT_LIMITS[key][0] <= value <= INT_LIMITS[key][1]
        elif key == "dtype":
            ok = value in DTYPES
        elif key in ("job", "gpu"):
            ok = type(value) is str and 1 <= len(value) <= MAX_STR_LEN
        elif key == "serving":
            ok = type(value) is dict and set(value) <= set(SERVING_LIMITS) and all(
                v is None or (type(v) in (int, float) and _as_float(v) is not None and 0 <= _as_float(v) <= SERVING_LIMITS[k])
                for k, v in value.items())
        else:
            ok = type(value) is dict and set(value) <= {*HINT_NAMES, "LOCAL_RANK"} and all(
                v is None or (type(v) is str and len(v) <= (16 if k == "LOCAL_RANK" else MAX_HINT_LEN))
                for k, v in value.items())
        if not ok:
            return False
    if all(obj.get(name) is None for name in MEANINGFUL):
        return False
    rank, world = obj.get("rank"), obj.get("world_size")
    return rank is None or world is None or rank < world


def _as_float(value: int | float) -> float | None:
    """What pydantic compares for a float field: the float value, None when an integer is too big for one."""
    try:
        return float(value)
    except OverflowError:
        return None


# -- talking raw HTTP -----------------------------------------------------------------------------


@dataclasses.dataclass
class Reply:
    status: int | None
    """From the status line; for an HTTP/0.9-style answer (no status line) the stdlib error page's code, or None."""
    headers: dict[str, str]
    body: bytes


def parse_replies(data: bytes) -> list[Reply]:
    """Split what a server sent on one connection into answers (1xx interim answers dropped)."""
    replies = []
    while data:
        if not re.match(rb"HTTP/1\.[01] \d{3}", data):
            code = re.search(rb"Error code: (\d{3})", data)  # http.server's error page, sent bare to HTTP/0.9
            replies.append(Reply(int(code.group(1)) if code else None, {}, data))
            break
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        length = 0 if status in (204, 304) or 100 <= status < 200 else int(headers.get("content-length", len(rest)))
        if status >= 200:
            replies.append(Reply(status, headers, rest[:length]))
        data = rest[length:]
    return replies


def exchange(connect: Callable[[], socket.socket], request: bytes) -> list[Reply]:
    """Send ``request``, half-close, read every answer until the server closes."""
    with connect() as sock:
        sock.settimeout(10)
        try:
            sock.sendall(request)
            sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered early and closed (413, 431): its answer is still there to read
        chunks = []
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        except ConnectionResetError:
            pass
    return parse_replies(b"".join(chunks))


def post(body: bytes, *, content_type: str | None = JSON, length: str | None = "auto",
         extra: bytes = b"", path: str = REPORT_PATH) -> bytes:
    """A raw report request; ``length`` is the Content-Length header text ("auto": the right one, None: none)."""
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\n".encode()
    if content_type is not None:
        head += f"Content-Type: {content_type}\r\n".encode()
    if length == "auto":
        length = str(len(body))
    if length is not None:
        head += b"Content-Length: " + length.encode("latin-1") + b"\r\n"
    return head + extra + b"\r\n" + body


# -- the servers under test ----------------------------------------------------------------------


@dataclasses.dataclass
class Target:
    """One real server with its store, and what the checks after each input need."""

    name: str
    store: ReportStore
    connect: Callable[[], socket.socket]
    thread: threading.Thread
    handler: type
    errors: list[BaseException]
    steps: Iterator[int] = dataclasses.field(default_factory=lambda: itertools.count(1))
    server: Any = None
    """The agent's HTTP server (None for the unix socket): a test may tighten its listener limits."""

    def canary_request(self) -> tuple[bytes, int]:
        step = next(self.steps)
        # The collection loop's lookup makes the canary's GPU one the store knows is here (a report
        # naming a GPU the store has not seen gets 422 once it knows any: report_store._absent_gpu).
        self.store.report_for(gpu=f"canary-{self.name}", uuid=None, pids=[], now=time.time())
        return post(json.dumps({"step": step, "gpu": f"canary-{self.name}"}).encode()), step

    def names_a_gpu_here(self, obj: Any) -> bool:
        """Whether a report may be stored as far as the GPU it names goes: none named, the store knows
        no GPU yet, or it names one the store knows by index or UUID (any case)."""
        named = obj.get("gpu") if isinstance(obj, dict) else None
        present = self.store.gpus_present()
        if not isinstance(named, str) or not present:
            return True
        return named.lower() in {name.lower() for pair in present.items() for name in pair if name}

    def assert_canary(self, step: int) -> None:
        report = self.store.report_for(gpu=f"canary-{self.name}", uuid=None, pids=[], now=time.time())
        assert report is not None and report.step == step, f"{self.name}: the valid report after the input was not kept"

    def assert_healthy(self) -> None:
        """The server thread lives, no handler raised, and a valid report on a new connection is kept."""
        assert self.thread.is_alive()
        raised, self.errors[:] = list(self.errors), []  # reported once: the next test starts clean
        assert not raised, f"{self.name}: a handler raised {raised[0]!r}"
        request, step = self.canary_request()
        replies = exchange(self.connect, request)
        assert [r.status for r in replies] == [204], replies
        self.assert_canary(step)
        self.assert_store_sane()

    def assert_store_sane(self) -> None:
        """Nothing stored breaks the documented schema (the store keeps validated requests only)."""
        with self.store._lock:  # no public way to list what the store holds
            kept = [entry.request.model_dump() for entry in self.store._entries.values()]
        for request in kept:
            assert valid_report(request), request


def _healthy_snapshot() -> NodeSnapshot:
    return NodeSnapshot(ts=time.time(), node="n1", devices=(), expected_devices=0,
                        health=CollectorHealth(backend="test", last_cycle_ts=time.time()))


def _record_errors(server: Any) -> list[BaseException]:
    """socketserver hands a handler's exception to handle_error and closes the connection: record it."""
    errors: list[BaseException] = []
    server.handle_error = lambda request, address: errors.append(sys.exc_info()[1])
    return errors


@pytest.fixture(scope="module")
def socket_dir() -> Iterator[Path]:
    """Unix socket paths are limited to 107 bytes, so not pytest's tmp_path (as in tests/report_fixtures.py)."""
    path = Path(tempfile.mkdtemp(prefix="rw-fuzz-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def http_target(store: ReportStore, **kwargs: Any) -> tuple[Target, Callable[[], None]]:
    """The agent's HTTP server with reports on, serving in a thread, and its stop function."""
    srv = AgentHTTPServer(("127.0.0.1", 0), _healthy_snapshot, stale_after_s=1e9, reports=store, **kwargs)
    errors = _record_errors(srv)
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    port = srv.server_address[1]

    def stop() -> None:
        srv.shutdown()
        srv.server_close()

    return Target("http", store, lambda: socket.create_connection(("127.0.0.1", port)), thread,
                  object, errors, server=srv), stop  # no do_* methods: the agent's port answers any method itself


def unix_target(path: Path, store: ReportStore, **kwargs: Any) -> tuple[Target, Callable[[], None]]:
    """The unix report socket server, started, and its close function."""
    srv = ReportSocketServer(path, store, **kwargs)
    errors = _record_errors(srv)
    srv.start()

    def connect() -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(str(path))  # blocking: waits while the listen backlog is full
        return sock

    assert srv._thread is not None
    return Target("unix", store, connect, srv._thread, object, errors, server=srv), srv.close  # the port's listener


@pytest.fixture(scope="module", params=["http", "unix"])
def target(request: pytest.FixtureRequest, socket_dir: Path) -> Iterator[Target]:
    """One server per transport for the whole module (hypothesis runs many inputs against it)."""
    store = ReportStore(rate_per_s=None)
    made, stop = (http_target(store) if request.param == "http"
                  else unix_target(socket_dir / f"r-{os.getpid()}.sock", store))
    yield made
    stop()


@pytest.fixture(autouse=True)
def fresh_errors(request: pytest.FixtureRequest) -> None:
    """A test that failed before its health check must not fail the next one with its handler error."""
    for name in ("target", "token_target"):
        if name in request.fixturenames:
            request.getfixturevalue(name).errors.clear()


def run_input(target: Target, request: bytes) -> tuple[list[Reply], int]:
    """Send one input on a fresh connection; the replies and how many reports the store accepted meanwhile."""
    before = target.store.stats()["accepted"]
    replies = exchange(target.connect, request)
    return replies, target.store.stats()["accepted"] - before


latin1_text = st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF), max_size=24)
"""Latin-1 from the space up (no CR, LF or other C0 control): header values, request-line words."""
