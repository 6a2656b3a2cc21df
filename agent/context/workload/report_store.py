"""The agent's side of workload reports: validate, keep the latest per reporter, find it for a GPU.

Jobs report with :mod:`agent.client` over a unix socket (agent.context.workload.report_socket) or
the agent's HTTP port (``POST /api/v1/report``, agent.context.workload.report_http). Both hand the raw
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

import hmac
import json
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Callable, Hashable, Sequence

from pydantic import ValidationError

from agent.context.workload.rate_limit import RateLimiter
from agent.context.workload.report_devices import ReportDevices, resolve_devices
from agent.context.workload.report_schema import (
    MAX_BODY_BYTES,
    ReportRequest,
    describe_validation_error,
    to_workload_report,
)
from agent.model import WorkloadReport

log = logging.getLogger("roofwatch.reports")

REJECT_REASONS = ("unauthorized", "forbidden", "rate_limited", "too_large", "length_required", "bad_length",
                  "timeout", "unsupported_media_type", "bad_json", "invalid", "internal")


MAX_GPUS_KNOWN = 4096
"""GPUs the store remembers from the collection loop's lookups (a node has a few dozen at most)."""

GPUS_NAMED = 16
NO_PIDS = ("invalid report: this agent reads its GPUs from dcgm-exporter and sees no processes, so a report must "
           "name its GPU: gpu (index or UUID), or NVIDIA_VISIBLE_DEVICES / CUDA_VISIBLE_DEVICES in hints")
"""GPUs a refusal lists; the rest are counted."""

DEFAULT_RATE_PER_S = 200.0
"""Reports a second per client (peer PID on the socket, address over HTTP, so every local process
reporting over loopback HTTP shares one budget), in bursts of twice that."""


@dataclass(slots=True)
class _Entry:
    request: ReportRequest
    received: float
    peer_pid: int | None
    devices: ReportDevices
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
                 rate_clock: Callable[[], float] = time.monotonic, pids_visible: bool = True) -> None:
        """``pids_visible``: whether the backend lists each GPU's processes. Without (``--backend
        dcgm-exporter``) a report that names no GPU, by ``gpu`` or device hints, could only ever be
        matched by PID, so it is refused with 422 saying how to name one, never kept unused."""
        self.ttl_s = ttl_s
        self.pids_visible = pids_visible
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
        self._gpus: dict[str, str | None] = {}
        """index -> UUID of every GPU the collection loop asked about: the GPUs present."""

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
            return self._reject("invalid", HTTPStatus.UNPROCESSABLE_ENTITY, "invalid report: " + describe_validation_error(exc))
        if (absent := self._absent_gpu(request.gpu)) is not None:
            return self._reject("invalid", HTTPStatus.UNPROCESSABLE_ENTITY, absent)
        if not self.pids_visible and request.gpu is None:
            devices = resolve_devices(request.hints)
            if not devices.uuids and not devices.indices:
                return self._reject("invalid", HTTPStatus.UNPROCESSABLE_ENTITY, NO_PIDS)
        self._store(request, peer_pid)
        return HTTPStatus.NO_CONTENT, "ok"

    def _absent_gpu(self, named: str | None) -> str | None:
        """Why a report naming GPU ``named`` cannot be used (no such GPU here), or None when it can.

        The GPUs present are those the collection loop asks :meth:`report_for` about. Before its
        first cycle the store knows none and accepts: it cannot tell yet. A report for a GPU that is
        not there used to be answered 204 and then matched nothing, so the job never learnt why its
        MFU did not show."""
        if named is None:
            return None
        gpus = self.gpus_present()
        wanted = named.lower()
        if not gpus or any(wanted == gpu.lower() or (uuid and wanted == uuid.lower()) for gpu, uuid in gpus.items()):
            return None
        listed = [f"{gpu} ({uuid})" if uuid else gpu for gpu, uuid in list(gpus.items())[:GPUS_NAMED]]
        more = f" and {len(gpus) - GPUS_NAMED} more" if len(gpus) > GPUS_NAMED else ""
        return f"invalid report: gpu: no GPU {named[:64]!r} on this node; GPUs present: {', '.join(listed)}{more}"

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
           report has no peer PID (whose absence from ``pids`` says it is not on this GPU; where no
           backend lists processes, ``pids_visible`` false, that says nothing and is not asked), the
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
            if gpu in self._gpus or len(self._gpus) < MAX_GPUS_KNOWN:
                self._gpus[gpu] = uuid  # the loop asks for every GPU it has: these are the GPUs present
            self._expire(now)
            for entry in self._entries.values():
                rule = _rule(entry, gpu, uuid_l, pid_set, now, self.ttl_s, self.pids_visible)
                if rule is None:
                    continue
                if rule <= 4:
                    entry.strong_match = now
                if rule < best_rule or (rule == best_rule and best is not None and entry.received >= best.received):
                    best, best_rule = entry, rule
        return to_workload_report(best.request) if best is not None else None

    # -- introspection -------------------------------------------------------------------------

    def gpus_present(self) -> dict[str, str | None]:
        """index -> UUID of the GPUs the collection loop has asked about: those a report may name
        (empty before the first cycle, when any GPU name is accepted)."""
        with self._lock:
            return dict(self._gpus)

    def stats(self) -> dict[str, Any]:
        """Counters for the agent's own metrics: accepted, rejected by reason, reporters kept, evicted, expired."""
        with self._lock:
            return {"accepted": self._accepted, "rejected": dict(self._rejected), "reporters": len(self._entries),
                    "evicted": self._evicted, "expired": self._expired}

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)


def _rule(entry: _Entry, gpu: str, uuid_l: str | None, pids: set[int], now: float, ttl_s: float,
          pids_visible: bool = True) -> int | None:
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
    # a peer PID absent from the GPU's processes says the reporter is elsewhere, unless no process is ever listed
    unplaced = entry.peer_pid is None or not pids_visible
    if unplaced and not devices.uuids and devices.indices == (gpu,) and not recently_claimed:
        return 5
    return None


def _uuid_in(uuid_l: str, names: tuple[str, ...]) -> bool:
    """CUDA accepts a unique UUID prefix (``GPU-8932f937``) as well as the full UUID."""
    return any(uuid_l == name or (len(name) >= 8 and uuid_l.startswith(name)) for name in names)
