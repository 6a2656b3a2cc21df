"""Framing helpers of the agent's HTTP listener: answers built from a report verdict, answers framed
by hand (for requests the parser could not read), the Date header. Kept apart from
exporters.http_connection so that module holds the connection's states and nothing else."""

from __future__ import annotations

import email.utils
import time
from http import HTTPStatus
from typing import Callable

from agent.context.workload.report_http import Answer
from exporters.http_routes import Response, text


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
