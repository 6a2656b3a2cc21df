"""The ``/`` page as the HTTP server receives it: a renderer and its headers, handed down by the app.

The page itself is a view (agent/views/status_page.py), a layer above the exporters
(docs/architecture.md, layers): the HTTP routes must not import it. ``roofwatch run`` registers it
at assembly (agent.app.assemble.status_page) as an :class:`HtmlPage`; a server given none answers
``/`` with 404 and serves everything else as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


class RenderPage(Protocol):
    """The page for one snapshot in its JSON form (exporters.snapshot_json); ``stale`` says why it should not be
    trusted (a banner), ``refresh_s`` how often it reloads itself (0: never)."""

    def __call__(self, data: dict[str, Any], *, refresh_s: float, stale: str | None) -> str: ...


@dataclass(frozen=True)
class HtmlPage:
    """What serving a page needs besides the snapshot: its renderer, its Content-Security-Policy (the page's
    inline script is allowed by hash, nothing else), and the refresh period when ``?refresh=`` does not say."""

    render: RenderPage
    content_security_policy: str
    default_refresh_s: float
