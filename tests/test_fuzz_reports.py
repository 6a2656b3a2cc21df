"""Fuzzing the workload-report endpoint over real sockets: the agent's HTTP port (``POST /api/v1/report``)
and the unix report socket, both fed what a buggy or hostile client could send.

For every input: an answer with a 2xx/4xx status (the only 5xx are HTTP's own answers to an unknown
method, 501, and an HTTP major version above 1, 505), no exception in a handler thread, the server
still serving the next report, and nothing in the store that breaks the documented limits.

What limits exist (agent/context/workload/reports.py, exporters/http.py): body size (MAX_BODY_BYTES), the body read
timeout, string lengths and number ranges, reporters kept (max_reporters, oldest evicted), and
concurrent connections / in-flight requests (503 past the cap), and a per-client rate (429). The rate
limit is switched off here (``rate_per_s=None``): these tests send thousands of inputs a second from one
client, and what they check is the parsing; tests/test_report_rate_limit.py checks the limit.
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
from hypothesis import HealthCheck, given, settings, strategies as st

import agent.context.workload.report_http
from agent.context.workload.report_http import REPORT_PATH
from agent.context.workload.report_schema import MAX_BODY_BYTES, MAX_HINT_LEN, MAX_STR_LEN
from agent.context.workload.report_socket import ReportSocketServer
from agent.context.workload.report_store import ReportStore
from agent.model import DTYPES, CollectorHealth, NodeSnapshot
from exporters.http import AgentHTTPServer
from tests.agent_process import poll
from tests.test_reports import JSON

FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture])
"""function_scoped_fixture: the only one is the autouse one clearing handler errors once per test, by design."""
HINT_NAMES = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")
FLOAT_LIMITS = {"step_time_s": 1e6, "tokens": 1e18, "tokens_per_s": 1e18, "flops_per_token": 1e18, "model_bytes": 1e18}
INT_LIMITS = {"rank": (0, 1_000_000), "world_size": (1, 1_000_000), "step": (0, 10**15), "pid": (1, 2**22)}
MEANINGFUL = ("step_time_s", "tokens", "tokens_per_s", "flops_per_token", "model_bytes", "dtype", "step")


def valid_report(obj: Any) -> bool:
    """The documented schema (docs/attribution.md, ReportRequest), written out independently: what may be stored."""
    if not isinstance(obj, dict) or not set(obj) <= {*FLOAT_LIMITS, *INT_LIMITS, "dtype", "job", "gpu", "hints"}:
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

    def canary_request(self) -> tuple[bytes, int]:
        step = next(self.steps)
        return post(json.dumps({"step": step, "gpu": f"canary-{self.name}"}).encode()), step

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
    """Unix socket paths are limited to 107 bytes, so not pytest's tmp_path (as in tests/test_reports.py)."""
    path = Path(tempfile.mkdtemp(prefix="rw-fuzz-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _http_target(store: ReportStore, **kwargs: Any) -> tuple[Target, Callable[[], None]]:
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
                  srv.RequestHandlerClass, errors), stop


def _unix_target(path: Path, store: ReportStore, **kwargs: Any) -> tuple[Target, Callable[[], None]]:
    """The unix report socket server, started, and its close function."""
    srv = ReportSocketServer(path, store, **kwargs)
    errors = _record_errors(srv)
    srv.start()

    def connect() -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(str(path))  # blocking: waits while the listen backlog is full
        return sock

    assert srv._thread is not None
    return Target("unix", store, connect, srv._thread, srv.RequestHandlerClass, errors), srv.close


@pytest.fixture(scope="module", params=["http", "unix"])
def target(request: pytest.FixtureRequest, socket_dir: Path) -> Iterator[Target]:
    """One server per transport for the whole module (hypothesis runs many inputs against it)."""
    store = ReportStore(rate_per_s=None)
    made, stop = (_http_target(store) if request.param == "http"
                  else _unix_target(socket_dir / f"r-{os.getpid()}.sock", store))
    yield made
    stop()


@pytest.fixture(autouse=True)
def _fresh_errors(request: pytest.FixtureRequest) -> None:
    """A test that failed before its health check must not fail the next one with its handler error."""
    for name in ("target", "token_target"):
        if name in request.fixturenames:
            request.getfixturevalue(name).errors.clear()


def run_input(target: Target, request: bytes) -> tuple[list[Reply], int]:
    """Send one input on a fresh connection; the replies and how many reports the store accepted meanwhile."""
    before = target.store.stats()["accepted"]
    replies = exchange(target.connect, request)
    return replies, target.store.stats()["accepted"] - before


# -- bodies ----------------------------------------------------------------------------------------

json_scalars = (st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
                | st.sampled_from([10**18, 10**18 + 1, 2**63, 2**64, 10**400, 1e18, 1e6, 1e6 + 1e-9, -0.0, 1e-400]))
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=10)
FIELD_VALUES: dict[str, st.SearchStrategy[Any]] = {
    **{name: st.floats(-1.0, 2 * limit) | st.integers(-2, int(2 * limit)) | st.sampled_from([0, limit, -0.0])
       for name, limit in FLOAT_LIMITS.items()},
    **{name: st.integers(low - 2, high + 2) | st.sampled_from([low, high, low - 1, high + 1, float(low), True])
       for name, (low, high) in INT_LIMITS.items()},
    "dtype": st.sampled_from([*DTYPES, "int4", "FP8", "", "bf16 "]),
    "job": st.text(max_size=MAX_STR_LEN + 3) | st.just("j" * MAX_STR_LEN) | st.just("\U0001f525" * MAX_STR_LEN),
    "gpu": st.text(max_size=MAX_STR_LEN + 3) | st.just("GPU-" + "a" * (MAX_STR_LEN - 4)),
    "hints": st.fixed_dictionaries({}, optional={
        **{name: st.none() | st.text(max_size=30) | st.just("0" * MAX_HINT_LEN) | st.just("0" * (MAX_HINT_LEN + 1))
           for name in HINT_NAMES},
        "LOCAL_RANK": st.none() | st.text(max_size=20) | st.just(" 1 "),
    }) | st.dictionaries(st.text(max_size=10), json_scalars, max_size=3),
}
report_like = st.fixed_dictionaries({}, optional={name: values | json_values for name, values in FIELD_VALUES.items()})
reports = (report_like
           | st.tuples(report_like, st.text(min_size=1, max_size=10), json_values).map(lambda t: {**t[0], t[1]: t[2]})
           | json_values)


@FUZZ
@given(obj=reports, ascii_only=st.booleans())
def test_any_json_value_is_stored_only_when_valid(target: Target, obj: Any, ascii_only: bool) -> None:
    """Arbitrary JSON and report-shaped objects (wrong types per field, bounds +-1, huge numbers, NaN and
    Infinity tokens, unicode): 204 exactly when the schema allows it, else 422; the same connection then
    carries the next valid report (4xx answers to a complete body keep the connection)."""
    body = json.dumps(obj, ensure_ascii=ascii_only, allow_nan=True).encode()
    canary, step = target.canary_request()
    replies, accepted = run_input(target, post(body) + canary)
    if len(body) > MAX_BODY_BYTES:
        assert [r.status for r in replies] == [413] and replies[0].headers["connection"] == "close"
        assert accepted == 0
    else:
        expected = 204 if valid_report(obj) else 422
        assert [r.status for r in replies] == [expected, 204], (obj, replies)
        assert accepted == (2 if expected == 204 else 1)
        target.assert_canary(step)
    target.assert_healthy()


content_types = st.sampled_from([JSON, "application/json; charset=utf-8", "text/plain", "application/jsonx",
                                 "", "application/json\x00", None])


@FUZZ
@given(body=st.binary(max_size=2048) | st.text(max_size=200).map(str.encode)
       | reports.map(lambda o: json.dumps(o, allow_nan=True).encode()[:-1]),
       content_type=content_types)
def test_arbitrary_bytes_with_the_right_length(target: Target, body: bytes, content_type: str | None) -> None:
    """Random bytes, invalid UTF-8 and JSON cut short: a 4xx (or 204 when it happens to be a valid report)."""
    replies, accepted = run_input(target, post(body, content_type=content_type))
    assert len(replies) == 1
    status = replies[0].status
    media = (content_type or "").split(";")[0].strip().lower()
    if media != "application/json":
        assert status == 415
    else:
        try:
            obj = json.loads(body)
        except (ValueError, RecursionError):
            assert status == 400
        else:
            assert status in ((204, 422) if valid_report(obj) else (422,))
    assert accepted == (1 if status == 204 else 0)
    target.assert_healthy()


@pytest.mark.parametrize("body, expected", [
    (b"[" * 8000 + b"]" * 8000, (400, 422)),
    (b"[" * 900 + b"]" * 900, (400, 422)),
    (b'{"step": ' + b"[" * 5000 + b"]" * 5000 + b"}", (400, 422)),
    (b'{"step": 1' + b"0" * 5000 + b"}", (400,)),  # beyond Python's int digit limit: json.loads refuses
    (b'{"tokens": 1' + b"0" * 400 + b"}", (422,)),
    (b'{"tokens": 1e400}', (422,)),
    (b'{"step_time_s": NaN}', (422,)),
    (b'{"tokens": -Infinity}', (422,)),
    (b'{"step": 1, "job": "\\udcff"}', (422,)),  # a lone surrogate escape
    (b"\xef\xbb\xbf" + b'{"step": 1}', (400, 422)),  # UTF-8 BOM
    ('{"step": 1}'.encode("utf-16"), (400, 422)),
    (b'{"step": 1, "step": "x"}', (422,)),  # duplicate key: the last one counts, as everywhere in JSON
    (b"", (400,)),
], ids=["deep-8000", "deep-900", "deep-field", "huge-int", "huge-float-int", "1e400", "nan", "infinity",
        "surrogate", "bom", "utf16", "duplicate-key", "empty"])
def test_pathological_json(target: Target, body: bytes, expected: tuple[int, ...]) -> None:
    """Deep nesting, huge numbers, non-finite tokens, other encodings: a 4xx, nothing stored."""
    replies, accepted = run_input(target, post(body))
    assert len(replies) == 1 and replies[0].status in expected, replies
    assert accepted == 0
    target.assert_healthy()


@settings(FUZZ, max_examples=10)
@given(size=st.integers(MAX_BODY_BYTES + 1, 3 * MAX_BODY_BYTES))
def test_oversized_bodies_get_413_and_close(target: Target, size: int) -> None:
    """Past MAX_BODY_BYTES: 413 before the body is read, the connection closed, nothing stored."""
    body = b'{"step": 1}'.ljust(size)
    replies, accepted = run_input(target, post(body))
    assert [r.status for r in replies] == [413] and replies[0].headers["connection"] == "close"
    assert accepted == 0
    target.assert_healthy()


def test_body_of_exactly_the_limit_is_accepted(target: Target) -> None:
    """The limit is inclusive: a valid report padded to MAX_BODY_BYTES is kept."""
    replies, accepted = run_input(target, post(b'{"step": 1}'.ljust(MAX_BODY_BYTES)))
    assert [r.status for r in replies] == [204] and accepted == 1
    target.assert_healthy()


# -- framing: Content-Length, chunked, request lines, headers -----------------------------------------

latin1_text = st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF), max_size=24)
lengths = st.one_of(
    st.none(), latin1_text, st.integers(-10**6, 3 * MAX_BODY_BYTES).map(str),
    st.integers(0, 10**40).map(lambda n: str(n).rjust(19, "0")), st.sampled_from(
        ["\u00b2", "1\u00b2", "\u00b9\u00b2", "+5", "5.0", "1e3", "0x10", " 11 ", "11\x85", "\u00a011", "-0", "", "11, 11"]))


@FUZZ
@given(length=lengths, body=st.sampled_from([b'{"step": 1}', b"", b"x" * 100, b'{"step": 1}{"step": 2}']))
def test_missing_garbage_negative_or_huge_content_length(target: Target, length: str | None, body: bytes) -> None:
    """411 without a length, 400 for one that is not a plain number (superscript digits included), 413 past
    the limit, 400 when the body is shorter; a length shorter than the body leaves the rest as the next request."""
    replies, accepted = run_input(target, post(body, length=length))
    assert replies, "no answer"
    first = replies[0].status
    text = (length or "").strip()
    if length is None:
        assert first == 411
    elif not (text.isascii() and text.isdigit()):
        assert first == 400
    elif len(text) > 18 or int(text) > MAX_BODY_BYTES:
        assert first == 413
    elif int(text) > len(body):
        assert first == 400
    else:
        assert first in (204, 400, 422)
    for reply in replies:
        assert reply.status is None or reply.status // 100 in (2, 4), replies
    assert accepted == sum(1 for r in replies if r.status == 204)
    target.assert_healthy()


@pytest.mark.parametrize("encoding", ["chunked", "Chunked", "gzip, chunked", "identity", "x"])
@pytest.mark.parametrize("with_length", [False, True])
def test_transfer_encoding_is_refused_with_411(target: Target, encoding: str, with_length: bool) -> None:
    """Chunked (or any Transfer-Encoding) is refused before reading, also beside a Content-Length
    (the request-smuggling combination), and the chunks left unread do not become a second request."""
    chunked = b'b\r\n{"step": 1}\r\n0\r\n\r\n'
    request = (f"POST {REPORT_PATH} HTTP/1.1\r\nHost: x\r\nContent-Type: {JSON}\r\nTransfer-Encoding: {encoding}\r\n"
               + (f"Content-Length: {len(chunked)}\r\n" if with_length else "") + "\r\n").encode() + chunked
    replies, accepted = run_input(target, request)
    assert [r.status for r in replies] == [411] and replies[0].headers["connection"] == "close"
    assert accepted == 0
    target.assert_healthy()


METHODS = ["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "CONNECT", "BREW", "post", "G\x00T"]
VERSIONS = ["HTTP/1.1", "HTTP/1.0", "HTTP/0.9", "HTTP/2.0", "HTTP/3", "HTTP/1.1.1", "HTTP/1.x", "http/1.1",
            "HTTP/\u00b9.1", "HTTP/01.1", "HTTP/1.12345678901", "HTTPS/1.1", ""]
request_lines = st.one_of(
    st.binary(max_size=120).map(lambda b: b.replace(b"\n", b"")),
    st.tuples(st.sampled_from(METHODS) | latin1_text,
              st.sampled_from([REPORT_PATH, REPORT_PATH + "?x=1", "/", "*", "//evil", "/metrics", "/healthz",
                               "http://h/api/v1/report", "/%00", "/\u00ff"]) | latin1_text,
              st.sampled_from(VERSIONS)).map(lambda t: " ".join(part for part in t if part).encode("latin-1")),
    st.just(b"POST /" + b"a" * 70_000 + b" HTTP/1.1"),
)


def _version(word: str) -> tuple[int, int] | None:
    """``HTTP/x.y`` as http.server accepts it (ASCII digits), else None."""
    match = re.fullmatch(r"HTTP/([0-9]{1,10})\.([0-9]{1,10})", word)
    return (int(match.group(1)), int(match.group(2))) if match else None


@FUZZ
@given(line=request_lines, tail=st.sampled_from([b"\r\n\r\n", b"\r\nContent-Length: 0\r\n\r\n", b"\n\n", b""]))
def test_garbage_request_lines(target: Target, line: bytes, tail: bytes) -> None:
    """Arbitrary request lines: unknown methods get 501, HTTP/2+ gets 505, everything else a 2xx/4xx; an
    unparseable line gets http.server's error page sent bare (HTTP/0.9 style); a blank line is closed."""
    replies, _ = run_input(target, line + tail)
    words = line.decode("latin-1").split()
    if not words:  # http.server closes on a blank request line instead of skipping it (RFC 9112 2.2 says skip)
        assert replies == []
        return
    version = _version(words[-1]) if len(words) >= 3 else None
    parsed = len(line) <= 65_536 and len(words) == 3 and version is not None and version[0] < 2
    if not (parsed and version is not None and version[0] == 0 and words[0] == "HEAD"):
        assert replies, f"no answer to {line[:80]!r}"  # (an HTTP/0.x HEAD answer has neither headers nor body)
    if parsed and version is not None and version[0] == 1:
        assert replies[0].status is not None
    unknown_method = parsed and not hasattr(target.handler, "do_" + words[0])
    for reply in replies:
        status = reply.status
        if status is None:
            continue
        assert (status // 100 in (2, 4) or (status == 501 and unknown_method)
                or (status == 505 and version is not None and version[0] >= 2)), (line[:80], replies)
    target.assert_healthy()


header_names = st.sampled_from(["Content-Type", "Content-Length", "Transfer-Encoding", "Authorization", "Expect",
                                "Connection", "Host", "X-A"]) | latin1_text.filter(lambda t: ":" not in t)
header_lines = st.one_of(
    st.tuples(header_names, latin1_text).map(lambda t: f"{t[0]}: {t[1]}".encode("latin-1")),
    st.binary(min_size=1, max_size=60).map(lambda b: b.replace(b"\n", b"").replace(b"\r", b"")).filter(bool),
    latin1_text.map(lambda t: b" " + t.encode("latin-1")),  # folded continuation line
)


@FUZZ
@given(headers=st.lists(header_lines, max_size=8), huge=st.sampled_from([None, "long-line", "many"]))
def test_garbage_headers(target: Target, headers: list[bytes], huge: str | None) -> None:
    """Arbitrary header lines before a valid report: a 2xx/4xx answer (431 for a 64 kB line or 100+ headers)."""
    extra = b"".join(h + b"\r\n" for h in headers)
    if huge == "long-line":
        extra += b"X-Long: " + b"a" * 70_000 + b"\r\n"
    elif huge == "many":
        extra += b"X-Many: 1\r\n" * 120
    replies, accepted = run_input(target, post(b'{"step": 7}', extra=extra))
    assert replies, "no answer"
    for reply in replies:
        assert reply.status is None or reply.status // 100 in (2, 4), replies
    if huge is not None:
        assert replies[0].status == 431
    assert accepted == sum(1 for r in replies if r.status == 204)
    target.assert_healthy()


def test_http_absolute_form_target_with_bad_host() -> None:
    """``POST http://[x/api/v1/report`` must get a 4xx like any other bad target (the unix socket answers 404)."""
    made, stop = _http_target(ReportStore(rate_per_s=None))
    try:
        replies, _ = run_input(made, f"POST http://[x{REPORT_PATH} HTTP/1.1\r\nContent-Length: 0\r\n\r\n".encode())
        assert replies and replies[0].status is not None and replies[0].status // 100 == 4
        made.assert_healthy()
    finally:
        stop()


# -- time, concurrency and volume limits ------------------------------------------------------------


def test_body_that_never_arrives_gets_408(target: Target, monkeypatch: pytest.MonkeyPatch) -> None:
    """A client that announces a body and stalls holds a thread only for BODY_READ_TIMEOUT_S, then gets 408."""
    monkeypatch.setattr(agent.context.workload.report_http, "BODY_READ_TIMEOUT_S", 0.3)
    before = target.store.stats()["rejected"]["timeout"]
    with target.connect() as sock:
        sock.settimeout(10)
        sock.sendall(post(b'{"step"', length="100"))  # 7 of 100 bytes, and the connection stays open
        started = time.monotonic()
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
        assert time.monotonic() - started < 5.0
    assert [r.status for r in parse_replies(data)] == [408]
    assert target.store.stats()["rejected"]["timeout"] == before + 1
    target.assert_healthy()


def test_http_in_flight_cap_answers_503_and_recovers() -> None:
    """The HTTP port caps requests in flight (max_concurrent): past it a report gets 503 at once, never a
    dropped connection, and once the slow ones finish the next report is kept."""
    store = ReportStore(rate_per_s=None)
    made, stop = _http_target(store, max_concurrent=2)
    slow: list[socket.socket] = []
    try:
        body = b'{"step": 1}'
        for _ in range(2):  # two reports whose bodies are late hold both slots
            sock = made.connect()
            sock.settimeout(10)
            sock.sendall(post(body, extra=b"Connection: close\r\n")[:-len(body)] + body[:3])
            slow.append(sock)
        poll(lambda: store.stats()["accepted"] == 0 and _in_flight_full(made), 5.0, what="both slots taken")
        replies = exchange(made.connect, post(body))
        assert [r.status for r in replies] == [503] and replies[0].headers["connection"] == "close"
        for sock in slow:
            sock.sendall(body[3:])
            assert [r.status for r in parse_replies(_read_to_end(sock))] == [204]
        assert store.stats()["accepted"] == 2
        made.assert_healthy()
    finally:
        for sock in slow:
            sock.close()
        stop()


def _in_flight_full(made: Target) -> bool:
    """True while the HTTP server has no free request slot: a probe GET gets 503."""
    probe = exchange(made.connect, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    return bool(probe) and probe[0].status == 503


def _read_to_end(sock: socket.socket) -> bytes:
    """Everything until the server closes (a ``Connection: close`` request)."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def test_unix_connection_burst_gets_204_or_503_never_silence(socket_dir: Path) -> None:
    """Many jobs reporting at once past max_connections: each one gets an answer, 204 or 503."""
    store = ReportStore(rate_per_s=None)
    made, stop = _unix_target(socket_dir / "burst.sock", store, max_connections=3)
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
    made, stop = _http_target(store)
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
    made, stop = _unix_target(socket_dir / "tok.sock", ReportStore(token="s3cr\u00e9t", rate_per_s=None))
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
