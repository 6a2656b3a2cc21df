"""Receiving one report over HTTP: the decisions, apart from the transport.

The agent's port and the unix report socket are served by the same hardened listener
(exporters.http: an event loop with a deadline per state and caps per client), which reads the body
and calls these. The headers are judged before the body is read (:func:`judge_headers`), the whole
body then goes to the store (:func:`judge_body`), and every answer that leaves a body unread closes
the connection, so a slow or hostile client costs a bounded amount of time and memory. The store
(agent.context.workload.report_store) decides. :func:`peer_pid` is what the kernel says about who
connected to the unix socket.
"""

from __future__ import annotations

import ipaddress
import math
import socket
import struct
from http import HTTPStatus
from typing import Hashable, NamedTuple, Protocol

from agent.context.workload.report_schema import MAX_BODY_BYTES
from agent.context.workload.report_store import ReportStore

REPORT_PATH = "/api/v1/report"


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and IPv4-mapped loopback (a dual-stack socket's view of 127.0.0.1)."""
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return bool(address.is_loopback or (mapped is not None and mapped.is_loopback))


class Answer(NamedTuple):
    """What to send back for a report: a status, a one-line message, and whether to close after it."""

    status: int
    message: str
    close: bool = False
    headers: dict[str, str] = {}


class Headers(Protocol):
    def get(self, name: str, default: None = None) -> str | None: ...


def judge_headers(headers: Headers, store: ReportStore, *, from_loopback: bool) -> Answer | int:
    """Decide from the headers alone: an :class:`Answer` to send at once (the body stays unread, so
    it closes the connection), or the body length to read. Nothing is read or allocated, so a huge
    Content-Length or a client that may not report costs nothing."""
    if headers.get("Transfer-Encoding"):
        store.note_rejected("length_required")
        return Answer(HTTPStatus.LENGTH_REQUIRED, "chunked bodies are not accepted; send Content-Length", close=True)
    length_text = headers.get("Content-Length")
    if length_text is None:
        store.note_rejected("length_required")
        return Answer(HTTPStatus.LENGTH_REQUIRED, "Content-Length is required", close=True)
    length_text = length_text.strip()
    digits = length_text.isascii() and length_text.isdigit()  # str.isdigit() alone accepts "²", which int() refuses
    if not digits or len(length_text) > 18:
        if digits:  # absurdly long digits: certainly over the limit
            store.note_rejected("too_large")
            return Answer(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"report body over {MAX_BODY_BYTES} bytes", close=True)
        store.note_rejected("bad_length")
        return Answer(HTTPStatus.BAD_REQUEST, "Content-Length is not a number", close=True)
    length = int(length_text)
    if length > MAX_BODY_BYTES:
        store.note_rejected("too_large")
        return Answer(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"report body over {MAX_BODY_BYTES} bytes", close=True)
    refused = store.refusal(authorization=headers.get("Authorization"), from_loopback=from_loopback)
    if refused is not None:  # the body stays unread: answer and close
        return Answer(*refused, close=True)
    return length


def judge_body(body: bytes, headers: Headers, store: ReportStore, *, peer_pid: int | None, from_loopback: bool,
               client: Hashable) -> Answer:
    """The answer to a whole body of the length :func:`judge_headers` asked for: over the client's
    rate (429, never parsed), or what the store says."""
    wait = store.throttle(client)
    if wait is not None:  # the body was read (keep-alive stays usable) but is never parsed
        return Answer(HTTPStatus.TOO_MANY_REQUESTS, f"over {store.rate_per_s:g} reports a second",
                      headers={"Retry-After": str(max(1, math.ceil(wait)))})
    status, message = store.accept(body, content_type=headers.get("Content-Type"), peer_pid=peer_pid,
                                   authorization=headers.get("Authorization"), from_loopback=from_loopback)
    return Answer(status, message)


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
