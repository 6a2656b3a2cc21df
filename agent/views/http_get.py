"""One bounded HTTP GET for the commands that read a remote agent (``snapshot --url``, ``top``).

The server at the other end may be anything the user typed, so the answer is bounded in time and
size: a per-read timeout alone let a server that sends a byte a second (headers or body) hold the
command forever, and reading the whole body let a server fill memory. The request is the agent's one
bounded request (agent.context.neighbour_http: an overall deadline, the body in chunks up to a cap,
redirects only to http(s)); here every failure becomes :class:`FetchError` with a one-line reason.
The user's proxy settings apply: the agent may be anywhere.
"""

from __future__ import annotations

import urllib.parse

from agent.context.neighbour_http import FetchFailed, fetch
from agent.model.text import one_line


class FetchError(Exception):
    """The GET failed; the message is one short printable line that names the URL, ``reason`` the
    same without it (for a caller that names the URL itself)."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


def bounded_get(url: str, *, accept: str, timeout_s: float, deadline_s: float, max_bytes: int) -> bytes:
    """The body of ``GET url``: within ``timeout_s`` per read, ``deadline_s`` in all, at most ``max_bytes``."""
    try:
        reply = fetch(url, timeout_s=timeout_s, deadline_s=deadline_s, max_bytes=max_bytes,
                      headers={"Accept": accept}, use_proxy=True)
    except FetchFailed as exc:
        if exc.kind == "too_large":
            why = f"more than {max_bytes // 2**20} MiB: not what was asked for"
            raise FetchError(f"{url} answered {why}", f"it answered {why}") from None
        if exc.kind in ("deadline", "timeout"):
            raise FetchError(f"{url} {exc}", f"it {exc}") from None
        why = one_line(exc)
        if exc.kind in ("refused", "unreachable"):
            raise FetchError(f"cannot reach {url}: {why}", f"cannot reach it: {why}") from None
        raise FetchError(f"cannot read {url}: {why}", why) from None
    if not 200 <= reply.status < 300:
        why = f"HTTP {reply.status} {one_line(reply.reason, 80)}"
        raise FetchError(f"{url} answered {why}", f"it answered {why}")
    return reply.body


def agent_endpoint(url: str, path: str) -> str:
    """The URL of ``path`` (``/metrics``, ``/api/v1/snapshot``) on the agent ``url`` names: people type a host
    and port (``node:9477``), a base URL or the full endpoint, and ``top`` and ``snapshot --url`` take the
    same. ValueError for a URL that is not http(s) or has no host."""
    url = url.strip()
    if "://" not in url:
        url = "http://" + url
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"{one_line(url, 120)}: not an http(s) URL of a roofwatch agent")
    base = parts.path.rstrip("/")
    if not base.endswith(path):
        base += path
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, base, parts.query, ""))
