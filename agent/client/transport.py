"""How a report reaches the agent: one HTTP/1.1 connection, over a unix socket or TCP.

The unix socket comes first because the agent learns the sender's PID from the socket itself
(SO_PEERCRED), which is how it matches a report to the GPU the process drives; the URL is the
fallback for agents that only listen on HTTP. Every call here may block up to the timeout it is
given, so only the reporter's sender thread calls it, never the caller's loop.
"""

from __future__ import annotations

import http.client
import os
import socket
import urllib.parse

__all__ = ["REPORT_PATH", "DEFAULT_SOCKET", "BACKOFF_STATUSES", "Unreachable", "UnixHTTPConnection",
           "open_connection", "post"]

REPORT_PATH = "/api/v1/report"
DEFAULT_SOCKET = "/run/roofwatch/report.sock"

BACKOFF_STATUSES = frozenset({401, 403, 404, 405, 411, 415, 429, 500, 502, 503, 504})
"""Failures of a sent report that say "this agent will not take reports for a while" (auth,
reports switched off, overloaded): back off instead of hammering it every step."""


class Unreachable(Exception):
    """No agent to talk to (no socket, no URL, connection refused)."""


class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP over a unix socket: the agent learns our PID from the socket itself (SO_PEERCRED)."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


def open_connection(socket_path: str | None, url: str | None, timeout_s: float) -> tuple[http.client.HTTPConnection, str]:
    """A connected connection and the path to post reports to; raises :class:`Unreachable`.

    The socket is used when it exists (checked on every attempt: the agent may start after the
    job), else ``url``; with neither there is nothing to try.
    """
    if socket_path and os.path.exists(socket_path):
        conn: http.client.HTTPConnection = UnixHTTPConnection(socket_path, timeout_s)
        path = REPORT_PATH
    elif url:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise Unreachable(f"ROOFWATCH_REPORT_URL {url!r} is not an http:// URL")
        conn = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout_s)
        path = parts.path.rstrip("/") + REPORT_PATH
    else:
        raise Unreachable(f"no agent: {socket_path or 'no socket'} does not exist and ROOFWATCH_REPORT_URL is not set")
    try:
        conn.connect()
    except OSError as exc:
        conn.close()
        raise Unreachable(f"cannot connect to the agent: {exc}") from None
    return conn, path


def post(conn: http.client.HTTPConnection, path: str, body: bytes, token: str | None) -> tuple[int, bool]:
    """Send one JSON report; returns the HTTP status and whether the agent will close the connection.

    The answer is drained (bounded) so that a kept-alive connection can carry the next report.
    """
    headers = {"Content-Type": "application/json", "User-Agent": "roofwatch-client/1"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    conn.request("POST", path, body=body, headers=headers)
    response = conn.getresponse()
    response.read(65536)
    return response.status, response.will_close
