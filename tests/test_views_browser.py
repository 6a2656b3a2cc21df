"""The status page and the report as a person sees them: rendered by headless Chromium.

Screenshots are checked for what must be visible (the roof, each class's colour, the cards) and,
with ``ROOFWATCH_UPDATE_SCREENSHOTS=1``, saved as the images the README shows.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
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
from tests.agent_process import AgentProcess
from tests.test_status_page import elements

pytestmark = pytest.mark.e2e

DOCS = Path(__file__).resolve().parent.parent / "docs"
PAGE_SHOT, REPORT_SHOT = DOCS / "status-page.png", DOCS / "report.png"
PAGE_SIZE, REPORT_SIZE = (1280, 1200), (1280, 1100)
ROOF = "#c0392b"
UPDATE = os.environ.get("ROOFWATCH_UPDATE_SCREENSHOTS") == "1"


@pytest.fixture(scope="module")
def demo():
    agent = AgentProcess("demo", "--listen", "127.0.0.1:0")
    agent.wait_healthy()
    yield agent
    agent.kill()


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


def test_status_page_refreshes_itself_under_its_policy(demo, profile):
    first = int(re.search(r'data-sequence="(\d+)"', demo.get("?refresh=1")[1].decode()).group(1))
    dom = chromium.dump_dom(demo.url + "?refresh=1", profile, budget_ms=4000)
    body = elements(dom, "body")[0]
    assert int(body.get("data-refreshes", "0")) >= 1, "the inline script ran (its CSP hash matches) and refreshed"
    (live,) = elements(dom, "div", id="live")
    assert int(live["data-sequence"]) > first
    assert len(elements(dom, "div", **{"class": "card"})) == 8


class _OnceThenDown(BaseHTTPRequestHandler):
    """Serves the page once, then answers 503 as an agent going away would."""

    page = ""
    served = 0

    def do_GET(self):  # noqa: N802
        cls = type(self)
        cls.served += 1
        if cls.served == 1:
            body = cls.page.encode()
            self.send_response(HTTPStatus.OK)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Security-Policy", CONTENT_SECURITY_POLICY)
        else:
            body = b"down"
            self.send_response(HTTPStatus.SERVICE_UNAVAILABLE)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_status_page_keeps_the_last_data_when_the_agent_goes_away(demo, profile):
    data = json.loads(demo.get("api/v1/snapshot")[1])
    _OnceThenDown.page, _OnceThenDown.served = status_page(data, refresh_s=1), 0
    server = ThreadingHTTPServer(("127.0.0.1", 0), _OnceThenDown)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        dom = chromium.dump_dom(f"http://127.0.0.1:{server.server_address[1]}/", profile, budget_ms=2500)
    finally:
        server.shutdown()
        server.server_close()
    assert _OnceThenDown.served >= 2
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


def test_readme_shows_the_committed_screenshots():
    readme = (DOCS.parent / "README.md").read_text()
    for shot, size in ((PAGE_SHOT, PAGE_SIZE), (REPORT_SHOT, REPORT_SIZE)):
        with Image.open(shot) as image:
            assert image.format == "PNG" and image.size == size, shot.name
        assert f"(docs/{shot.name})" in readme, f"README shows {shot.name}"
