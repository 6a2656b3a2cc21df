"""The virtual node's inference servers as the agent would have scraped them before it started.

The demo comes up with verdicts from its first scrape: the classifier is primed with the minute of
samples before the agent started (``VirtualBackend.warm_samples``). A server's serving figures are
rates between two scrapes (time per output token, tokens per second, the prefill share), so without
the same head start they would appear one ``inference_interval_s`` (5 s) after the verdicts, and the
first minutes of a demo would show a serving node with nothing to say about its servers.

:class:`WarmFetch` plays each fake server's page two and one interval before now into the agent's
own scraper (agent.context.workload.inference.scraper.InferenceScraper, through its ``fetch``), as
the pages the server showed at those virtual times (``FakeInferenceServer.render``); every later
scrape goes over HTTP, as on a real node. The bodies go through the scraper's whole parse and rate
path; only the transport of those two past scrapes is skipped.
"""

from __future__ import annotations

from typing import Sequence

from agent.context.workload.inference.fetch import http_fetch
from agent.context.workload.inference.scraper import InferenceScraper
from agent.virtual.serving.server import FakeInferenceServer

WARM_SCRAPES = 2
"""Scrapes played before the agent starts: two give a rate, as the second scrape of a real node does."""


class WarmFetch:
    """The scraper's fetch: a body queued for a URL answers once, anything else is an HTTP GET."""

    def __init__(self) -> None:
        self._queued: dict[str, bytes] = {}

    def queue(self, url: str, body: bytes) -> None:
        self._queued[url] = body

    def __call__(self, url: str, timeout_s: float, max_bytes: int) -> bytes:
        body = self._queued.pop(url, None)
        return body if body is not None else http_fetch(url, timeout_s, max_bytes)


def warm_scrapes(scraper: InferenceScraper, fetch: WarmFetch, servers: Sequence[FakeInferenceServer], *,
                 now: float, start_time: float, interval_s: float) -> bool:
    """Scrape ``servers`` at ``now - 2 x interval_s`` and ``now - interval_s`` from their rendered pages, stamped
    with those times, so the scraper has rates (fresh for three intervals) before its thread's first scrape over
    HTTP. False, and nothing scraped, when the scenario had not run that long yet."""
    times = [now - k * interval_s for k in range(WARM_SCRAPES, 0, -1)]
    if not servers or times[0] - start_time < 0.0:
        return False
    for t in times:
        for server in servers:
            fetch.queue(server.url, server.render(t - start_time))
        scraper.scrape_once(now=t)
    return True
