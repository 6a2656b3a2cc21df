"""The status page and the report as a person sees them: rendered by headless Chromium.

Screenshots are checked for what must be visible (the roof, each class's colour, the cards) and,
with ``ROOFWATCH_UPDATE_SCREENSHOTS=1``, saved as the images the README shows.
"""

from __future__ import annotations

import json
import os
import shutil
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from PIL import Image

from agent.classifier.engine import classify_samples
from agent.views.palette import CLASS_COLOURS
from agent.views.report import build_report
from agent.views.status_page import CONTENT_SECURITY_POLICY, status_page
from agent.virtual.engine import VirtualEngine
from agent.virtual.scenario import resolve_scenario
from tests import chromium
from tests.agent_process import AgentProcess, running_demo, serving
from tests.test_status_page import elements

pytestmark = pytest.mark.slow

DOCS = Path(__file__).resolve().parent.parent / "docs"
PAGE_SHOT, REPORT_SHOT = DOCS / "status-page.png", DOCS / "report.png"
PAGE_SIZE, REPORT_SIZE = (1280, 1200), (1280, 1100)
ROOF = "#c0392b"
UPDATE = os.environ.get("ROOFWATCH_UPDATE_SCREENSHOTS") == "1"


@pytest.fixture(scope="module")
def demo():
    with running_demo() as agent:
        yield agent


@pytest.fixture
def profile(tmp_path):
    return tmp_path / "chromium-profile"


def _classes(agent: AgentProcess) -> list[str]:
    return [v["class"] for v in json.loads(agent.get("api/v1/snapshot")[1])["verdicts"]]


def test_status_page_renders_cards_and_chart(demo, profile, tmp_path):
    dom = chromium.dump_dom(demo.url + "?refresh=0", profile)
    cards = elements(dom, "div", **{"class": "card"})
    assert len(cards) == 8
    points = elements(dom, "g", **{"class": "gpu-point"})
    assert 4 <= len(points) <= 8 and {p["data-gpu"] for p in points} <= {c["data-gpu"] for c in cards}
    image = chromium.screenshot(demo.url + "?refresh=0", tmp_path / "page.png", profile, size=PAGE_SIZE)
    assert image.size == PAGE_SIZE
    assert chromium.pixels_near(image, ROOF, tolerance=6) > 300, "the roof line is drawn"
    for cls in set(_classes(demo)):
        assert chromium.pixels_near(image, CLASS_COLOURS[cls], tolerance=6) > 200, f"{cls} is visible"
    assert len(image.getcolors(maxcolors=1 << 24)) > 200, "a rendered page, not a blank one"
    if UPDATE:
        shutil.copy(tmp_path / "page.png", PAGE_SHOT)


def test_status_page_refreshes_itself_under_the_agents_policy(demo, profile):
    dom = chromium.dump_dom(demo.url + "?refresh=1", profile, budget_ms=4000)
    body = elements(dom, "body")[0]
    assert int(body.get("data-refreshes", "0")) >= 1, "the inline script ran (its CSP hash matches) and refreshed"
    assert "hidden" in elements(dom, "div", id="conn")[0], "no error banner"
    assert len(elements(dom, "div", **{"class": "card"})) == 8


class _ScriptedAgent(BaseHTTPRequestHandler):
    """Answers the n-th request with ``respond(n)``: a stand-in agent whose snapshots the test controls."""

    respond = staticmethod(lambda n: (HTTPStatus.OK, ""))
    served = 0

    def do_GET(self):  # noqa: N802
        cls = type(self)
        cls.served += 1
        status, page = cls.respond(cls.served)
        body = page.encode() or b"down"
        self.send_response(status)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Security-Policy", CONTENT_SECURITY_POLICY)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def _render_scripted(respond, profile) -> str:
    _ScriptedAgent.respond, _ScriptedAgent.served = staticmethod(respond), 0
    with serving(ThreadingHTTPServer(("127.0.0.1", 0), _ScriptedAgent)) as server:
        return chromium.dump_dom(f"http://127.0.0.1:{server.server_address[1]}/", profile, budget_ms=2500)


def test_refresh_swaps_in_each_newer_snapshot(demo, profile):
    data = json.loads(demo.get("api/v1/snapshot")[1])

    def snapshot(n):
        data["sequence"] = n
        data["health"]["cycles_total"] = 1000 + n
        return HTTPStatus.OK, status_page(data, refresh_s=1)

    dom = _render_scripted(snapshot, profile)
    (live,) = elements(dom, "div", id="live")
    assert _ScriptedAgent.served >= 2 and int(live["data-sequence"]) == _ScriptedAgent.served
    assert f"(cycle {1000 + _ScriptedAgent.served})" in dom
    assert "hidden" in elements(dom, "div", id="conn")[0]


def test_status_page_keeps_the_last_data_when_the_agent_goes_away(demo, profile):
    page = status_page(json.loads(demo.get("api/v1/snapshot")[1]), refresh_s=1)
    dom = _render_scripted(lambda n: (HTTPStatus.OK, page) if n == 1 else (HTTPStatus.SERVICE_UNAVAILABLE, ""), profile)
    assert _ScriptedAgent.served >= 2
    (conn,) = elements(dom, "div", id="conn")
    assert "hidden" not in conn
    assert "agent unreachable (HTTP 503)" in dom
    assert len(elements(dom, "div", **{"class": "card"})) == 8, "the last data stays on screen"


def test_report_renders(profile, tmp_path):
    samples = list(VirtualEngine(resolve_scenario("demo")).iter_trace(900, 1.0, start_ts=1_800_000_000.0))
    verdicts = list(classify_samples(samples))
    path = tmp_path / "report.html"
    path.write_text(build_report(samples, verdicts, title="roofwatch report · demo node, 15 minutes", sources=["demo.jsonl.gz"]))
    dom = chromium.dump_dom(path.as_uri(), profile, budget_ms=100)
    assert len(elements(dom, "tr")) == 9  # header and one row per GPU
    image = chromium.screenshot(path.as_uri(), tmp_path / "report.png", profile, size=REPORT_SIZE)
    for cls in {v.cls for v in verdicts}:
        assert chromium.pixels_near(image, CLASS_COLOURS[cls], tolerance=6) > 200, f"{cls} is visible"
    if UPDATE:
        shutil.copy(tmp_path / "report.png", REPORT_SHOT)


def test_the_docs_show_the_committed_screenshots():
    """The README shows one picture, the status page; docs/views.md shows both views."""
    readme, views = (DOCS.parent / "README.md").read_text(), (DOCS / "views.md").read_text()
    for shot, size in ((PAGE_SHOT, PAGE_SIZE), (REPORT_SHOT, REPORT_SIZE)):
        with Image.open(shot) as image:
            assert image.format == "PNG" and image.size == size, shot.name
        assert f"]({shot.name})" in views, f"docs/views.md shows {shot.name}"
    assert "(docs/status-page.png)" in readme, "README shows the status page"
