"""What each request to the agent's port gets: a whole request in, a whole :class:`Response` out.

No sockets here: the listener (exporters.http.connection) reads and frames, these functions decide.
They run in the listener's worker threads, because two of them may take milliseconds (a bcrypt
check, the first render of a new snapshot); every GET reads the last published snapshot only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Protocol
from urllib.parse import parse_qs

from prometheus_client.exposition import choose_encoder

from agent.model import NodeSnapshot
from exporters.http.page import HtmlPage
from exporters.prometheus import ExpositionCache
from exporters.snapshot_json import snapshot_to_dict
from exporters.web_config import REALM, UNAUTHENTICATED_PATHS, WebConfig

TEXT = "text/plain; charset=utf-8"
MAX_REFRESH_S = 3600.0


class Headers:
    """Request headers by case-insensitive name; the first of repeated ones counts."""

    def __init__(self, pairs: list[tuple[bytes, bytes]]) -> None:
        self._values: dict[str, str] = {}
        for name, value in pairs:
            self._values.setdefault(name.decode("latin-1").lower(), value.decode("latin-1"))

    def get(self, name: str, default: str | None = None) -> str | None:
        return self._values.get(name.lower(), default)


@dataclass
class Request:
    method: str
    path: str
    query: str
    headers: Headers
    client: str
    """The peer's address (no port)."""
    body: bytes = b""


@dataclass
class Response:
    status: int
    body: bytes = b""
    content_type: str = TEXT
    headers: dict[str, str] = field(default_factory=dict)
    close: bool = False
    """Close the connection after this answer (the listener also closes when the client asked)."""


def text(status: int, message: str, **kwargs: object) -> Response:
    return Response(status, (message + "\n").encode(), TEXT, **kwargs)  # type: ignore[arg-type]


class Served(Protocol):
    """What a GET reads (exporters.http.AgentHTTPServer provides it)."""

    web: WebConfig
    exposition: ExpositionCache
    page: HtmlPage | None
    """The ``/`` page the app registered (exporters.http.page); None: ``/`` is not found."""

    def health(self) -> tuple[bool, str]: ...

    def readiness(self) -> tuple[bool, str]: ...

    def snapshot_json(self) -> bytes: ...

    def status_page(self, refresh_s: float) -> bytes: ...


class NeedsWorker(Exception):
    """Raised by an inline answer that would have to bcrypt or render: answer it in a worker instead."""


def answer_get(server: Served, request: Request, *, inline: bool = False) -> Response:
    """GET and HEAD: basic auth when configured (not for /healthz and /readyz), then the page asked for.

    ``inline``: on the event loop, from what is already known (remembered credentials, cached
    renderings); anything that costs more raises :class:`NeedsWorker`. Most requests, honest scrapes
    between two snapshots and hostile unauthenticated ones alike, so never wait for a worker."""
    auth = server.web.auth
    if auth.enabled and request.path not in UNAUTHENTICATED_PATHS:
        header = request.headers.get("Authorization")
        allowed = auth.quick_verdict(header) if inline else auth.allows(header)
        if allowed is None:
            raise NeedsWorker
        if not allowed:
            return text(HTTPStatus.UNAUTHORIZED, "unauthorized",
                        headers={"WWW-Authenticate": f'Basic realm="{REALM}", charset="UTF-8"'})
    path = request.path
    if path == "/metrics":
        encoder, content_type = choose_encoder(request.headers.get("Accept", "") or "")
        gzipped = accepts_gzip(request.headers.get("Accept-Encoding"))
        body = (server.exposition.cached(content_type, gzipped=gzipped) if inline
                else server.exposition.render(encoder, content_type, gzipped=gzipped))
        if body is None:
            raise NeedsWorker
        return Response(HTTPStatus.OK, body, content_type, {"Content-Encoding": "gzip"} if gzipped else {})
    if path in ("/healthz", "/readyz"):
        ok, reason = server.health() if path == "/healthz" else server.readiness()
        return text(HTTPStatus.OK if ok else HTTPStatus.SERVICE_UNAVAILABLE, reason)
    if path == "/api/v1/snapshot":
        if inline:
            raise NeedsWorker
        return Response(HTTPStatus.OK, server.snapshot_json(), "application/json")
    page = server.page
    if path == "/" and page is not None and inline:
        raise NeedsWorker
    if path == "/" and page is not None:
        try:
            refresh_s = refresh_param(request.query, page.default_refresh_s)
        except ValueError as exc:
            return text(HTTPStatus.BAD_REQUEST, str(exc))
        return Response(HTTPStatus.OK, server.status_page(refresh_s), "text/html; charset=utf-8",
                        {"Content-Security-Policy": page.content_security_policy, "Cache-Control": "no-store",
                         "X-Content-Type-Options": "nosniff"})
    return text(HTTPStatus.NOT_FOUND,
                f"not found; try /metrics, /healthz, /readyz, /api/v1/snapshot{' or /' if page else ''}")


def accepts_gzip(header: str | None) -> bool:
    """RFC 9110 12.5.3: gzip (or ``*``) with a q-value above 0; ``gzip;q=0`` says "never gzip"."""
    if not header:
        return False
    chosen: float | None = None
    star: float | None = None
    for item in header.split(","):
        coding, _, params = item.strip().partition(";")
        q = 1.0
        for param in params.split(";"):
            key, _, value = param.strip().partition("=")
            if key.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        name = coding.strip().lower()
        if name in ("gzip", "x-gzip"):
            chosen = q if chosen is None else max(chosen, q)
        elif name == "*":
            star = q
    weight = chosen if chosen is not None else star
    return weight is not None and weight > 0  # NaN compares False: not gzip


def refresh_param(query: str, default_s: float) -> float:
    """``?refresh=SECONDS`` for the status page: 0 stops it, absent is the page's ``default_s``; anything else
    is a 400."""
    values = parse_qs(query).get("refresh")
    if not values:
        return default_s
    try:
        value = float(values[-1])
    except ValueError:
        value = float("nan")
    if not 0.0 <= value <= MAX_REFRESH_S:  # also rejects NaN
        raise ValueError(f"refresh: expected seconds between 0 and {MAX_REFRESH_S:g}, got {values[-1][:40]!r}")
    if 0.0 < value < 1.0:
        value = 1.0  # a browser tab polling faster than the collector only burns the node's CPU
    return value


class _Placeholder(float):
    """Stands for the refresh period while a page is rendered: compares as a period above 0, and
    formats as a marker no escaped snapshot text can contain (it holds ``<``)."""

    MARK = "<roofwatch-refresh/>"

    def __format__(self, spec: str) -> str:
        return self.MARK


def page_template(page: HtmlPage, snapshot: NodeSnapshot, *, refreshing: bool, stale: str | None) -> bytes:
    """The ``/`` page with the refresh period left as a marker, rendered once per snapshot: any
    ``?refresh=`` value is then a byte replacement, not a render (13x the CPU when it was one)."""
    refresh = _Placeholder(page.default_refresh_s) if refreshing else 0.0
    return page.render(snapshot_to_dict(snapshot), refresh_s=refresh, stale=stale).encode()


def fill_page(template: bytes, refresh_s: float) -> bytes:
    return template.replace(_Placeholder.MARK.encode(), f"{refresh_s:g}".encode())


def snapshot_json(snapshot: NodeSnapshot) -> bytes:
    return json.dumps(snapshot_to_dict(snapshot), separators=(",", ":")).encode()
