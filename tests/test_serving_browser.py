"""The status page's serving cards and decode points as a person sees them: served by the agent's own
HTTP server over a snapshot in which three of the demo node's GPUs serve (tests/serving_fixtures.py),
and rendered by headless Chromium under the page's CSP (tests/chromium.py).
"""

from __future__ import annotations

import contextlib

import pytest

from agent.views.palette import SERVING_COLOURS
from tests import chromium
from tests.agent_process import serving
from tests.serving_fixtures import HOSTILE, demo_snapshot, serving_snapshot
from tests.test_status_page import elements

pytestmark = pytest.mark.slow

SIZE = (1280, 1700)
"""Tall enough that the chart, the serving cards and the first GPU cards are in the screenshot."""


@contextlib.contextmanager
def agent_over(snapshot):
    """The agent's HTTP server answering from ``snapshot``, with a clock that keeps it fresh."""
    from agent.app.assemble import status_page
    from exporters.http import AgentHTTPServer

    now = snapshot.health.last_cycle_ts
    with serving(AgentHTTPServer(("127.0.0.1", 0), lambda: snapshot, stale_after_s=10.0, clock=lambda: now,
                                 page=status_page())) as server:
        yield f"http://127.0.0.1:{server.server_address[1]}/"


@pytest.fixture(scope="module")
def snapshots():
    plain = demo_snapshot()
    return plain, serving_snapshot(plain)


@pytest.fixture
def profile(tmp_path):
    return tmp_path / "chromium-profile"


def test_serving_cards_render_and_survive_a_refresh(snapshots, profile):
    with agent_over(snapshots[1]) as url:
        dom = chromium.dump_dom(url + "?refresh=1", profile, budget_ms=3000)
    assert int(elements(dom, "body")[0].get("data-refreshes", "0")) >= 1, "the page's script ran under its CSP"
    cards = elements(dom, "div", **{"class": "card serving"})
    assert [(c["data-server"], c["data-gpus"], c["data-state"]) for c in cards] == [
        ("vllm 10.0.0.7:8000", "1,2", "under_batched"), (HOSTILE, "6", "kv_saturated"), ("GPU 7", "7", "unknown")]
    assert "TPOT 31 ms = 1.3x the floor of 23.9 ms" in dom
    assert len(elements(dom, "script")) == 1, "the hostile server name stayed text: only the page's own script"
    assert "&lt;script&gt;alert" in dom
    (decode,) = elements(dom, "g", **{"class": "decode-point"})
    assert decode["data-server"] == "vllm 10.0.0.7:8000"
    assert len(elements(dom, "polygon", **{"class": "decode"})) == 1


def test_serving_cards_are_visible(snapshots, profile, tmp_path):
    """The states' colours (card borders, badges, the decode diamond) add pixels to the page of the same node."""
    shots = {}
    for name, snapshot in zip(("plain", "serving"), snapshots):
        with agent_over(snapshot) as url:
            shots[name] = chromium.screenshot(url + "?refresh=0", tmp_path / f"{name}.png", profile, size=SIZE)
    for state in ("under_batched", "kv_saturated"):
        colour = SERVING_COLOURS[state]
        added = chromium.pixels_near(shots["serving"], colour, tolerance=6) - chromium.pixels_near(shots["plain"], colour, tolerance=6)
        assert added > 300, f"{state} ({colour}) is visible"
