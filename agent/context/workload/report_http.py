"""Receiving one report over HTTP, shared by the unix socket server and the agent's own port (exporters.http).

The decisions (:func:`judge_headers`, :func:`judge_body`) are apart from the transport: the agent's
port reads the body on its event loop (exporters.http.connection), the unix socket in a thread
(:func:`serve_report`). The headers are judged before the body is read, the body is read within one deadline and a size
cap, and every answer that leaves a body unread closes the connection, so a slow or hostile client
costs a bounded amount of time and memory. The store (agent.context.workload.report_store) decides.
"""

from __future__ import annotations

import ipaddress
import math
import socket
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import Hashable, NamedTuple, Protocol

from agent.context.workload.report_schema import MAX_BODY_BYTES
from agent.context.workload.report_store import ReportStore

REPORT_PATH = "/api/v1/report"


BODY_READ_TIMEOUT_S = 5.0
"""A client that announces a body and does not send it must not hold a server thread forever."""


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


def serve_report(handler: BaseHTTPRequestHandler, store: ReportStore, *, peer_pid: int | None,
                 from_loopback: bool, client: Hashable) -> int:
    """Answer one ``POST /api/v1/report`` on a thread-per-connection ``handler`` (the unix socket):
    judge the headers, read the body within limits, hand it to the store. Returns the status sent."""
    headers = handler.headers
    verdict = judge_headers(headers, store, from_loopback=from_loopback)
    if isinstance(verdict, Answer):
        return respond(handler, verdict.status, verdict.message, close=verdict.close, headers=verdict.headers)
    length = verdict
    connection = handler.connection
    previous = connection.gettimeout()
    try:
        body = _read_within(handler, length, BODY_READ_TIMEOUT_S if previous is None else min(previous, BODY_READ_TIMEOUT_S))
    except (TimeoutError, socket.timeout):
        store.note_rejected("timeout")
        return respond(handler, HTTPStatus.REQUEST_TIMEOUT, "body not received in time", close=True)
    finally:
        try:
            connection.settimeout(previous)
        except OSError:
            pass
    if len(body) < length:
        store.note_rejected("bad_length")
        return respond(handler, HTTPStatus.BAD_REQUEST, "body shorter than Content-Length", close=True)
    answer = judge_body(body, headers, store, peer_pid=peer_pid, from_loopback=from_loopback, client=client)
    return respond(handler, answer.status, answer.message, close=answer.close, headers=answer.headers)


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


def respond(handler: BaseHTTPRequestHandler, status: int, message: str, *, close: bool = False,
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
