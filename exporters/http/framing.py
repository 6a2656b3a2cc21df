"""Framing helpers of the agent's HTTP listener: answers built from a report verdict, answers framed
by hand (for requests the parser could not read), the Date header. Kept apart from
exporters.http.connection so that module holds the connection's states and nothing else."""

from __future__ import annotations

import email.utils
import time
from http import HTTPStatus
from typing import Callable

import h11

from agent.context.workload.report_http import Answer
from exporters.http.routes import Response, text


def closing(job: Callable[[], Response]) -> Callable[[], Response]:
    def run() -> Response:
        response = job()
        response.close = True
        return response
    return run


def from_answer(answer: Answer) -> Response:
    if answer.status == HTTPStatus.NO_CONTENT:
        return Response(204, b"", "text/plain; charset=utf-8", dict(answer.headers), answer.close)
    headers = dict(answer.headers)
    if answer.status == HTTPStatus.UNAUTHORIZED:  # every 401 says which scheme would do
        headers.setdefault("WWW-Authenticate", 'Bearer realm="roofwatch"')
    return text(answer.status, answer.message, headers=headers, close=answer.close)


def phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


def raw_response(status: int, headers: list[tuple[str, str]], body: bytes) -> bytes:
    """An answer framed by hand, for a request h11 could not parse (it then has none to answer)."""
    lines = [f"HTTP/1.1 {status} {phrase(status)}"] + [f"{k}: {v}" for k, v in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class HttpDate:
    """The Date header, formatted once a second at most."""

    def __init__(self) -> None:
        self._second = -1
        self._text = ""

    def __call__(self) -> str:
        now = int(time.time())
        if now != self._second:
            self._second, self._text = now, email.utils.formatdate(now, usegmt=True)
        return self._text


def answer_headers(configured: dict[str, str], response: Response, close: bool, date: str,
                   server: str) -> list[tuple[str, str]]:
    """The web config's headers on every answer (error pages too), the answer's own on top."""
    own = {name.lower() for name in response.headers}
    headers = [(k, v) for k, v in configured.items() if k.lower() not in own]
    headers += list(response.headers.items())
    if response.status != HTTPStatus.NO_CONTENT:
        headers += [("Content-Type", response.content_type), ("Content-Length", str(len(response.body)))]
    headers += [("Date", date), ("Server", server)]
    if close:
        headers.append(("Connection", "close"))
    return headers


def protocol_error(exc: h11.RemoteProtocolError, max_header_bytes: int) -> Response:
    """The answer to a request h11 could not read; the connection closes after it. Never a 5xx:
    h11's 501 for an unknown transfer coding becomes 411 (send Content-Length instead)."""
    if exc.error_status_hint == HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE:
        return text(431, f"request line and headers over {max_header_bytes} bytes", close=True)
    if "Transfer-Encoding" in str(exc):
        return text(411, "only chunked transfer coding is understood; send Content-Length", close=True)
    return text(400, "malformed HTTP request", close=True)


def buffered(parser: h11.Connection) -> int:
    """Bytes the parser holds that it has not turned into events. ``trailing_data`` copies them out on
    every call (a pipelining client made that quadratic); the buffer's length is what is needed."""
    return len(parser._receive_buffer)  # noqa: SLF001 - h11 has no public length


_BUSY_TEXT = b"too many open connections\n"
BUSY = raw_response(503, [("Content-Type", "text/plain; charset=utf-8"), ("Connection", "close"), ("Retry-After", "1"),
                          ("Content-Length", str(len(_BUSY_TEXT)))], _BUSY_TEXT)
"""What a job on the report socket gets when it finds no room: a connection refused, or closed to make room."""
