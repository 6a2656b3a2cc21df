"""The agent's side of workload reports: validate, keep the latest per reporter, find it for a GPU.

Jobs report with :mod:`agent.client` over a unix socket (:class:`ReportSocketServer`) or
the agent's HTTP port (``POST /api/v1/report`` in :mod:`exporters.http`). Both hand the raw
body to :meth:`ReportStore.accept`, so validation and the security policy live in one place:

* a configured token is required on every report, socket or HTTP (constant-time compare);
* without a token, HTTP reports are accepted only from loopback clients (anything on the
  node's network could otherwise feed MFU figures), and socket reports from whoever can open
  the socket (its file mode is the access control).

The collection loop asks :meth:`ReportStore.report_for` from memory, so a cycle never waits
on a job. Everything is bounded: body size, string lengths, number ranges, reporters kept,
rejection reasons counted, concurrent connections.
"""

from __future__ import annotations

import errno
import hmac
import ipaddress
import json
import logging
import math
import os
import socket
import socketserver
import stat
import struct
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Annotated, Any, Callable, Hashable, Literal, Sequence

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from agent.model import WorkloadReport
from agent.context.workload.rate_limit import RateLimiter

log = logging.getLogger("roofwatch.reports")

REPORT_PATH = "/api/v1/report"
MAX_BODY_BYTES = 16 * 1024
MAX_STR_LEN = 128
MAX_HINT_LEN = 1024
"""Visible-device lists hold up to a few dozen UUIDs (40 characters each), hence longer than other strings."""
BODY_READ_TIMEOUT_S = 5.0
DEFAULT_RATE_PER_S = 200.0
"""Reports a second per client (peer PID on the socket, address over HTTP, so every local process
reporting over loopback HTTP shares one budget), in bursts of twice that."""
"""A client that announces a body and does not send it must not hold a server thread forever."""

REJECT_REASONS = ("unauthorized", "forbidden", "rate_limited", "too_large", "length_required", "bad_length",
                  "timeout", "unsupported_media_type", "bad_json", "invalid", "internal")

Str = Annotated[str, Field(min_length=1, max_length=MAX_STR_LEN)]
Hint = Annotated[str, Field(max_length=MAX_HINT_LEN)]
Seconds = Annotated[float, Field(ge=0.0, le=1e6)]
Count = Annotated[float, Field(ge=0.0, le=1e18)]


class ReportHints(BaseModel):
    """The reporter's environment, for finding its GPU when its PID means nothing to us."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    CUDA_VISIBLE_DEVICES: Hint | None = None
    NVIDIA_VISIBLE_DEVICES: Hint | None = None
    ROCR_VISIBLE_DEVICES: Hint | None = None
    HIP_VISIBLE_DEVICES: Hint | None = None
    LOCAL_RANK: Annotated[str, Field(max_length=16)] | None = None


class ReportRequest(BaseModel):
    """One ``POST /api/v1/report`` body. Strict: a string where a number belongs is an error, not a guess."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True)

    step_time_s: Seconds | None = None
    tokens: Count | None = None
    """Tokens the whole job processed in this step."""
    tokens_per_s: Count | None = None
    """Whole-job throughput; derived from tokens / step_time_s when absent."""
    flops_per_token: Count | None = None
    model_bytes: Count | None = None
    dtype: Literal["fp8", "bf16", "fp16", "tf32", "fp32", "fp64"] | None = None
    rank: Annotated[int, Field(ge=0, le=1_000_000)] | None = None
    world_size: Annotated[int, Field(ge=1, le=1_000_000)] | None = None
    step: Annotated[int, Field(ge=0, le=10**15)] | None = None
    job: Str | None = None
    gpu: Str | None = None
    """GPU UUID or host index the reporter says it drives; trumps every other way of matching."""
    pid: Annotated[int, Field(ge=1, le=2**22)] | None = None
    """The reporter's PID in its own namespace (may be a container's)."""
    hints: ReportHints | None = None

    @model_validator(mode="after")
    def _consistent(self) -> "ReportRequest":
        if all(getattr(self, name) is None for name in _MEANINGFUL):
            raise ValueError("a report needs at least one of " + ", ".join(_MEANINGFUL))
        if self.rank is not None and self.world_size is not None and self.rank >= self.world_size:
            raise ValueError(f"rank ({self.rank}) must be less than world_size ({self.world_size})")
        return self


_MEANINGFUL = ("step_time_s", "tokens", "tokens_per_s", "flops_per_token", "model_bytes", "dtype", "step")


@dataclass(frozen=True, slots=True)
class _Devices:
    """Where the reporter's environment says it runs, resolved once at receipt."""

    uuids: tuple[str, ...] = ()
    """Lower-cased UUIDs (or UUID prefixes, as CUDA accepts) the process can see."""
    indices: tuple[str, ...] = ()
    """Host indices, when the hints name devices by index only."""


@dataclass(slots=True)
class _Entry:
    request: ReportRequest
    received: float
    peer_pid: int | None
    devices: _Devices
    strong_match: float | None = None
    """Last time a GPU claimed this report by gpu hint, PID or UUID (index hints then stay unused)."""


class ReportStore:
    """The latest report of each reporter, bounded in number and age. Thread safe.

    A reporter is its socket peer PID when known (one process, whatever it claims), else the
    PID it claims together with job, rank and device hints (two containers both claiming PID 1
    stay apart). Past ``max_reporters`` the least recently updated one is evicted.
    """

    def __init__(self, *, ttl_s: float = 30.0, max_reporters: int = 1024, clock: Callable[[], float] = time.time,
                 token: str | None = None, rate_per_s: float | None = DEFAULT_RATE_PER_S,
                 rate_clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.rate_per_s = rate_per_s
        self._limiter = RateLimiter(rate_per_s, clock=rate_clock) if rate_per_s else None
        self.max_reporters = max(1, max_reporters)
        self._clock = clock
        self._token = token.encode() if token else None
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[Any, ...], _Entry] = OrderedDict()
        self._accepted = 0
        self._rejected = dict.fromkeys(REJECT_REASONS, 0)
        self._evicted = 0
        self._expired = 0

    @property
    def token_required(self) -> bool:
        return self._token is not None

    # -- receiving -----------------------------------------------------------------------------

    def accept(self, body: bytes, *, content_type: str | None, peer_pid: int | None, authorization: str | None,
               from_loopback: bool) -> tuple[int, str]:
        """Validate and keep one report; returns (HTTP status, message for the client). Never raises.

        ``from_loopback``: the request came from this node (loopback TCP, or the unix socket).
        """
        try:
            return self._accept(body, content_type, peer_pid, authorization, from_loopback)
        except Exception:  # a bug here must cost one report, not the server thread
            log.exception("accepting a workload report failed")
            return self._reject("internal", HTTPStatus.INTERNAL_SERVER_ERROR, "internal error")

    def refusal(self, *, authorization: str | None, from_loopback: bool) -> tuple[int, str] | None:
        """Whether this client may report at all, from its headers alone: checked before the body
        is read, so a client that may not report cannot hold a request slot while it dribbles one."""
        if self._token is not None:
            if not self._token_ok(authorization):
                return self._reject("unauthorized", HTTPStatus.UNAUTHORIZED, "missing or wrong bearer token")
        elif not from_loopback:
            return self._reject("forbidden", HTTPStatus.FORBIDDEN,
                                "reports over the network are accepted only from this node (loopback) "
                                "unless the agent is configured with a report token")
        return None

    def throttle(self, client: Hashable) -> float | None:
        """Seconds ``client`` must wait before its next report, or None when it may send this one.
        Asked before the body is parsed, so a flood costs no JSON or validation work."""
        wait = self._limiter.check(client) if self._limiter is not None else None
        if wait is not None:
            self.note_rejected("rate_limited")
        return wait

    def _accept(self, body: bytes, content_type: str | None, peer_pid: int | None, authorization: str | None,
                from_loopback: bool) -> tuple[int, str]:
        refused = self.refusal(authorization=authorization, from_loopback=from_loopback)
        if refused is not None:
            return refused
        if len(body) > MAX_BODY_BYTES:
            return self._reject("too_large", HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                                f"report body over {MAX_BODY_BYTES} bytes")
        media = (content_type or "").split(";", 1)[0].strip().lower()
        if media != "application/json":
            return self._reject("unsupported_media_type", HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
                                "Content-Type must be application/json")
        try:
            json.loads(body)
        except (ValueError, UnicodeDecodeError, RecursionError):
            return self._reject("bad_json", HTTPStatus.BAD_REQUEST, "body is not valid JSON")
        try:
            request = ReportRequest.model_validate_json(body)
        except ValidationError as exc:
            return self._reject("invalid", HTTPStatus.UNPROCESSABLE_ENTITY, "invalid report: " + _describe(exc))
        self._store(request, peer_pid)
        return HTTPStatus.NO_CONTENT, "ok"

    def _token_ok(self, authorization: str | None) -> bool:
        scheme, _, given = (authorization or "").strip().partition(" ")
        candidate = given.strip().encode("utf-8", "replace") if scheme.lower() == "bearer" else b""
        return hmac.compare_digest(candidate, self._token or b"")

    def _reject(self, reason: str, status: int, message: str) -> tuple[int, str]:
        self.note_rejected(reason)
        return int(status), message

    def note_rejected(self, reason: str) -> None:
        """Count a rejection decided before :meth:`accept` (by the HTTP layer: length, timeout)."""
        with self._lock:
            key = reason if reason in self._rejected else "internal"
            self._rejected[key] += 1

    def _store(self, request: ReportRequest, peer_pid: int | None) -> None:
        now = self._clock()
        hints = request.hints
        if peer_pid is not None:
            key: tuple[Any, ...] = ("peer", peer_pid)
        else:
            key = ("claimed", request.pid, request.job, request.rank,
                   hints.model_dump_json() if hints is not None else None)
        entry = _Entry(request=request, received=now, peer_pid=peer_pid, devices=resolve_devices(hints))
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                entry.strong_match = old.strong_match
            self._entries[key] = entry  # at the end: the order is least recently updated first
            self._accepted += 1
            self._expire(now)
            while len(self._entries) > self.max_reporters:
                self._entries.popitem(last=False)
                self._evicted += 1

    def _expire(self, now: float) -> None:
        """Drop reports older than the TTL (oldest first; the dict is in update order). Lock held."""
        while self._entries:
            key, entry = next(iter(self._entries.items()))
            if now - entry.received <= self.ttl_s:
                break
            del self._entries[key]
            self._expired += 1

    # -- answering the collection loop ---------------------------------------------------------

    def report_for(self, *, gpu: str, uuid: str | None, pids: Sequence[int], now: float) -> WorkloadReport | None:
        """The latest fresh report for GPU ``gpu`` (``uuid``) whose processes are ``pids``; never raises.

        Matching, strongest first; within a rule the most recently received report wins:

        1. the report's explicit ``gpu`` equals this GPU's UUID or index. A report naming
           another GPU is never matched to this one by any rule below;
        2. its socket peer PID (SO_PEERCRED: a PID in our namespace) is in ``pids``;
        3. without a peer PID, the PID it claims is in ``pids`` unless its UUID hints exclude this
           GPU (a container's PID can collide with an unrelated host PID; the hints overrule it);
        4. its visible devices (``NVIDIA_VISIBLE_DEVICES``, then ``CUDA_VISIBLE_DEVICES`` /
           ``ROCR_VISIBLE_DEVICES`` / ``HIP_VISIBLE_DEVICES`` indexing into it) name this UUID;
           with several devices ``LOCAL_RANK`` picks one, and without it the report applies to all;
        5. index-only hints, the weak rule: an index means something else inside a container that
           sees a subset of the GPUs, so it is used only when nothing above matched this GPU, the
           report has no peer PID (whose absence from ``pids`` says it is not on this GPU), the
           hints resolve to exactly one index (after ``LOCAL_RANK``) equal to ``gpu``, and no GPU
           claimed the report by rules 1-4 within the TTL.
        """
        try:
            return self._report_for(gpu, uuid, pids, now)
        except Exception:
            log.exception("looking up a workload report failed")
            return None

    def _report_for(self, gpu: str, uuid: str | None, pids: Sequence[int], now: float) -> WorkloadReport | None:
        pid_set = {int(p) for p in pids or ()}
        uuid_l = uuid.lower() if uuid else None
        best: _Entry | None = None
        best_rule = 99
        with self._lock:
            self._expire(now)
            for entry in self._entries.values():
                rule = _rule(entry, gpu, uuid_l, pid_set, now, self.ttl_s)
                if rule is None:
                    continue
                if rule <= 4:
                    entry.strong_match = now
                if rule < best_rule or (rule == best_rule and best is not None and entry.received >= best.received):
                    best, best_rule = entry, rule
        return _workload(best.request) if best is not None else None

    # -- introspection -------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Counters for the agent's own metrics: accepted, rejected by reason, reporters kept, evicted, expired."""
        with self._lock:
            return {"accepted": self._accepted, "rejected": dict(self._rejected), "reporters": len(self._entries),
                    "evicted": self._evicted, "expired": self._expired}

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)


def _rule(entry: _Entry, gpu: str, uuid_l: str | None, pids: set[int], now: float, ttl_s: float) -> int | None:
    request = entry.request
    if request.gpu is not None:
        named = request.gpu.lower()
        return 1 if named == gpu.lower() or (uuid_l is not None and named == uuid_l) else None
    if entry.peer_pid is not None and entry.peer_pid in pids:
        return 2
    devices = entry.devices
    if entry.peer_pid is None and request.pid is not None and request.pid in pids:
        if not devices.uuids or (uuid_l is not None and _uuid_in(uuid_l, devices.uuids)):
            return 3
    if uuid_l is not None and devices.uuids and _uuid_in(uuid_l, devices.uuids):
        return 4
    recently_claimed = entry.strong_match is not None and now - entry.strong_match <= ttl_s
    if entry.peer_pid is None and not devices.uuids and devices.indices == (gpu,) and not recently_claimed:
        return 5
    return None


def _uuid_in(uuid_l: str, names: tuple[str, ...]) -> bool:
    """CUDA accepts a unique UUID prefix (``GPU-8932f937``) as well as the full UUID."""
    return any(uuid_l == name or (len(name) >= 8 and uuid_l.startswith(name)) for name in names)


def resolve_devices(hints: ReportHints | None) -> _Devices:
    """The devices a reporter's environment lets it see, as host UUIDs or host indices.

    ``NVIDIA_VISIBLE_DEVICES`` is set by the container runtime in host terms; the CUDA/ROCm
    variables index into whatever is visible (so ``CUDA_VISIBLE_DEVICES=1`` under
    ``NVIDIA_VISIBLE_DEVICES=GPU-a,GPU-b`` is ``GPU-b``). ``LOCAL_RANK`` then picks one of
    several, the torchrun convention (``torch.cuda.set_device(local_rank)``).
    """
    if hints is None:
        return _Devices()
    visible: list[str] | None = None
    for value in (hints.NVIDIA_VISIBLE_DEVICES, hints.CUDA_VISIBLE_DEVICES, hints.ROCR_VISIBLE_DEVICES,
                  hints.HIP_VISIBLE_DEVICES):
        visible = _compose(visible, _parse_visible(value))
    if visible is None:
        return _Devices()
    local_rank = hints.LOCAL_RANK.strip() if hints.LOCAL_RANK else ""
    if len(visible) > 1 and local_rank.isdigit() and int(local_rank) < len(visible):
        visible = [visible[int(local_rank)]]
    uuids = tuple(v.lower() for v in visible if not v.isdigit())
    indices = tuple(v for v in visible if v.isdigit())
    return _Devices(uuids=uuids, indices=indices)


def _parse_visible(value: str | None) -> list[str] | None:
    """None: no restriction (unset, ``all``); a list (maybe empty) otherwise. Like CUDA, stop at a bad index."""
    if value is None:
        return None
    text = value.strip()
    if text.lower() in ("all", ""):
        return None if text else []
    if text.lower() in ("none", "void"):
        return []
    out: list[str] = []
    for token in (t.strip() for t in text.split(",")):
        if not token:
            continue
        if token.lstrip("-").isdigit():
            if token.startswith("-"):
                break
            out.append(str(int(token)))
        else:
            out.append(token)
    return out[:64]


def _compose(outer: list[str] | None, inner: list[str] | None) -> list[str] | None:
    if inner is None:
        return outer
    if outer is None:
        return inner
    out = []
    for token in inner:
        if token.isdigit():
            if int(token) >= len(outer):
                break
            out.append(outer[int(token)])
        else:
            out.append(token)
    return out


def _workload(request: ReportRequest) -> WorkloadReport:
    tokens_per_s = request.tokens_per_s
    if tokens_per_s is None and request.tokens is not None and request.step_time_s:
        tokens_per_s = request.tokens / request.step_time_s
    return WorkloadReport(job=request.job, rank=request.rank, world_size=request.world_size, step=request.step,
                          step_time_s=request.step_time_s, tokens_per_s=tokens_per_s,
                          flops_per_token=request.flops_per_token, model_bytes=request.model_bytes,
                          dtype=request.dtype, source="client")


def _describe(exc: ValidationError) -> str:
    """Name the fields and what is wrong, without echoing the (untrusted) values."""
    parts = []
    for error in exc.errors(include_url=False, include_input=False)[:5]:
        loc = ".".join(str(part)[:64] for part in error["loc"]) or "body"
        parts.append(f"{loc}: {error['msg']}")
    more = exc.error_count() - len(parts)
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and IPv4-mapped loopback (a dual-stack socket's view of 127.0.0.1)."""
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return bool(address.is_loopback or (mapped is not None and mapped.is_loopback))


# -- HTTP plumbing shared by the unix socket server and exporters.http ------------------------------


def serve_report(handler: BaseHTTPRequestHandler, store: ReportStore, *, peer_pid: int | None,
                 from_loopback: bool, client: Hashable) -> int:
    """Answer one ``POST /api/v1/report`` on ``handler``: read the body within limits, hand it to the store.

    The length is checked before anything is read or allocated, so a huge Content-Length costs
    nothing; responses that leave a body unread close the connection. Returns the status sent.
    """
    headers = handler.headers
    if headers.get("Transfer-Encoding"):
        store.note_rejected("length_required")
        return _respond(handler, HTTPStatus.LENGTH_REQUIRED, "chunked bodies are not accepted; send Content-Length", close=True)
    length_text = headers.get("Content-Length")
    if length_text is None:
        store.note_rejected("length_required")
        return _respond(handler, HTTPStatus.LENGTH_REQUIRED, "Content-Length is required", close=True)
    length_text = length_text.strip()
    digits = length_text.isascii() and length_text.isdigit()  # str.isdigit() alone accepts "²", which int() refuses
    if not digits or len(length_text) > 18:
        if digits:  # absurdly long digits: certainly over the limit
            store.note_rejected("too_large")
            return _respond(handler, HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"report body over {MAX_BODY_BYTES} bytes", close=True)
        store.note_rejected("bad_length")
        return _respond(handler, HTTPStatus.BAD_REQUEST, "Content-Length is not a number", close=True)
    length = int(length_text)
    if length > MAX_BODY_BYTES:
        store.note_rejected("too_large")
        return _respond(handler, HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"report body over {MAX_BODY_BYTES} bytes", close=True)
    refused = store.refusal(authorization=headers.get("Authorization"), from_loopback=from_loopback)
    if refused is not None:  # the body stays unread: answer and close
        return _respond(handler, *refused, close=True)
    connection = handler.connection
    previous = connection.gettimeout()
    try:
        body = _read_within(handler, length, BODY_READ_TIMEOUT_S if previous is None else min(previous, BODY_READ_TIMEOUT_S))
    except (TimeoutError, socket.timeout):
        store.note_rejected("timeout")
        return _respond(handler, HTTPStatus.REQUEST_TIMEOUT, "body not received in time", close=True)
    finally:
        try:
            connection.settimeout(previous)
        except OSError:
            pass
    if len(body) < length:
        store.note_rejected("bad_length")
        return _respond(handler, HTTPStatus.BAD_REQUEST, "body shorter than Content-Length", close=True)
    wait = store.throttle(client)
    if wait is not None:  # the body was read (keep-alive stays usable) but is never parsed
        return _respond(handler, HTTPStatus.TOO_MANY_REQUESTS, f"over {store.rate_per_s:g} reports a second",
                        headers={"Retry-After": str(max(1, math.ceil(wait)))})
    status, message = store.accept(body, content_type=headers.get("Content-Type"), peer_pid=peer_pid,
                                   authorization=headers.get("Authorization"), from_loopback=from_loopback)
    return _respond(handler, status, message)


def _read_within(handler: BaseHTTPRequestHandler, length: int, limit_s: float) -> bytes:
    """``length`` body bytes within ``limit_s`` in all: a socket timeout alone restarts with every
    byte, so a client sending one byte a second could hold the request (and its slot) for hours."""
    deadline = time.monotonic() + limit_s
    chunks: list[bytes] = []
    received = 0
    while received < length:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("report body not received in time")
        handler.connection.settimeout(remaining)
        chunk = handler.rfile.read1(length - received)  # type: ignore[attr-defined] - a BufferedReader
        if not chunk:
            break
        chunks.append(chunk)
        received += len(chunk)
    return b"".join(chunks)


def _respond(handler: BaseHTTPRequestHandler, status: int, message: str, *, close: bool = False,
             headers: dict[str, str] | None = None) -> int:
    handler.send_response(status)
    if status == HTTPStatus.UNAUTHORIZED:  # every 401 says which scheme would do
        headers = {"WWW-Authenticate": 'Bearer realm="roofwatch"', **(headers or {})}
    for key, value in (headers or {}).items():
        handler.send_header(key, value)
    if close:
        handler.send_header("Connection", "close")  # also sets handler.close_connection
    if status == HTTPStatus.NO_CONTENT:
        handler.end_headers()
        return status
    body = (message + "\n").encode()
    handler.send_header("Content-Type", "text/plain; charset=utf-8")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)
    if close:
        linger(handler.connection)
    return status


LINGER_BYTES = 256 * 1024
LINGER_S = 0.5


def linger(sock: socket.socket, *, max_bytes: int = LINGER_BYTES, max_s: float = LINGER_S) -> None:
    """Half-close after an answer that left a request body unread, and discard a bounded amount of it.

    Closing a socket with unread data makes the kernel reset the connection, and the reset can
    destroy our answer (413, 503) before the client reads it. Nothing is stored: at most
    ``max_bytes`` over ``max_s`` seconds are read into a small buffer and thrown away.
    """
    try:
        sock.shutdown(socket.SHUT_WR)
        deadline = time.monotonic() + max_s
        left = max_bytes
        while left > 0:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            sock.settimeout(remaining)
            chunk = sock.recv(min(65536, left))
            if not chunk:
                break
            left -= len(chunk)
    except OSError:
        pass


# -- the unix socket server -------------------------------------------------------------------------


def peer_pid(sock: socket.socket) -> int | None:
    """The connecting process's PID as the kernel knows it (translated into our PID namespace).

    0 means the peer lives in a namespace we cannot see; that is unknown, not PID 0.
    """
    try:
        data = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        pid, _uid, _gid = struct.unpack("3i", data)
    except (OSError, AttributeError, struct.error):
        return None
    return pid if pid > 0 else None


class _SocketHandler(BaseHTTPRequestHandler):
    server: "ReportSocketServer"
    protocol_version = "HTTP/1.1"
    server_version = "roofwatch-reports"
    timeout = 30.0
    """Idle keep-alive connections close after this long, so each connected job holds a thread only while it reports."""

    def setup(self) -> None:
        super().setup()
        self.peer_pid = peer_pid(self.request)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
        log.debug("report socket %s", format % args)

    def do_POST(self) -> None:  # noqa: N802 - stdlib naming
        if self.path.split("?", 1)[0] != REPORT_PATH:
            _respond(self, HTTPStatus.NOT_FOUND, f"not found; reports go to POST {REPORT_PATH}", close=True)
            return
        # The socket is local by construction; its file mode decides who may connect.
        serve_report(self, self.server.store, peer_pid=self.peer_pid, from_loopback=True,
                     client=("pid", self.peer_pid) if self.peer_pid is not None else ("socket",))

    def _not_allowed(self) -> None:
        _respond(self, HTTPStatus.METHOD_NOT_ALLOWED, f"only POST {REPORT_PATH} is supported", close=True,
                 headers={"Allow": "POST"})

    do_GET = do_HEAD = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _not_allowed  # noqa: N815


class ReportSocketServer(socketserver.ThreadingUnixStreamServer):
    """HTTP on a unix socket, for jobs on this node (containers mount the socket's directory).

    A socket rather than TCP because the kernel tells us who connected (SO_PEERCRED), which
    ties a report to its GPU process without trusting anything the client says, and because
    file permissions are the access control. Past ``max_connections`` connections a new one
    gets 503 and is closed instead of another thread.
    """

    daemon_threads = True

    def __init__(self, path: str | os.PathLike[str], store: ReportStore, *, mode: int = 0o666,
                 max_connections: int = 64) -> None:
        self.path = Path(path)
        self.store = store
        self._slots = threading.BoundedSemaphore(max_connections)
        self._thread: threading.Thread | None = None
        _prepare_socket_path(self.path)
        super().__init__(str(self.path), _SocketHandler)
        try:
            os.chmod(self.path, mode)
            self._inode: int | None = os.stat(self.path).st_ino
        except OSError:
            self.server_close()
            raise

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            try:
                request.settimeout(0.1)
                body = b"too many concurrent report connections\n"
                request.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
                                b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
                linger(request, max_bytes=MAX_BODY_BYTES + 8192, max_s=0.1)  # on the accept thread: keep it short
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def start(self) -> None:
        """Serve in a daemon thread."""
        if self._thread is None:
            self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.2},
                                            name="roofwatch-reports", daemon=True)
            self._thread.start()
            log.info("workload reports on unix socket %s", self.path)

    def close(self) -> None:
        """Stop serving and remove the socket file (only if it is still ours). Idempotent."""
        if self._thread is not None:
            self.shutdown()
            self._thread.join(5.0)
            self._thread = None
        self.server_close()
        if self._inode is not None:
            try:
                if os.stat(self.path).st_ino == self._inode:
                    os.unlink(self.path)
            except OSError:
                pass
            self._inode = None


def _prepare_socket_path(path: Path) -> None:
    """Create the directory; remove a socket left by a dead agent; refuse to touch anything else."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise OSError(errno.EEXIST, f"{path} exists and is not a socket; refusing to replace it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(0.5)
    try:
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        log.info("removing stale report socket %s", path)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        return
    except OSError as exc:
        raise OSError(errno.EADDRINUSE, f"{path} exists and cannot be probed ({exc}); is another agent running?") from None
    finally:
        probe.close()
    raise OSError(errno.EADDRINUSE, f"another process is listening on {path}")
