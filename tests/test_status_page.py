"""The agent's ``/`` status page: what it shows per GPU, its chart, and how the server serves it.

Rendered from a real collector over the virtual fleet (the demo node); the browser-side checks
(rendering, refreshing) are in test_views_browser.py.
"""

from __future__ import annotations

import copy
import re
import urllib.error
import urllib.request
import xml.etree.ElementTree as ET
from html import escape
from html.parser import HTMLParser

import pytest

from agent.app.assemble import make_collector, open_backend_or_fail
from agent.app.config import Settings
from agent.model.waste import MEASURES
from agent.views.html_parts import script_hash
from agent.views.status_page import CONTENT_SECURITY_POLICY, REFRESH_SCRIPT, status_page
from exporters.snapshot_json import snapshot_to_dict
from tests.agent_process import SLOW_MACHINE_SAMPLE_TIMEOUT_S, serving_collector


@pytest.fixture(scope="module")
def collector():
    settings = Settings(backend="virtual", sample_timeout_s=SLOW_MACHINE_SAMPLE_TIMEOUT_S)
    collector = make_collector(settings, open_backend_or_fail(settings))
    collector.collect_once()
    yield collector
    collector.stop()


@pytest.fixture
def data(collector):
    return copy.deepcopy(snapshot_to_dict(collector.snapshot))


class _Elements(HTMLParser):
    """Every start tag with its attributes: enough to check structure without a DOM library."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str]]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, {k: v or "" for k, v in attrs}))


def elements(html: str, tag: str, **attrs: str) -> list[dict[str, str]]:
    parser = _Elements()
    parser.feed(html)
    return [a for t, a in parser.tags if t == tag and all(a.get(k) == v for k, v in attrs.items())]


def svg_of(html: str) -> ET.Element:
    return ET.fromstring(re.search(r"<svg id=\"roofline\".*?</svg>", html, re.S).group(0))


def test_one_card_per_gpu_with_its_verdict(data):
    html = status_page(data)
    cards = elements(html, "div", **{"class": "card"})
    verdicts = {v["gpu"]: v for v in data["verdicts"]}
    assert [c["data-gpu"] for c in cards] == [d["info"]["gpu"] for d in data["devices"]]
    assert {c["data-gpu"]: c["data-class"] for c in cards} == {g: v["class"] for g, v in verdicts.items()}
    for verdict in data["verdicts"]:
        for reason in verdict["reasons"]:
            assert escape(reason) in html
    mfus = [float(s["data-mfu"]) for s in elements(html, "span") if s.get("data-mfu")]
    assert sorted(mfus) == sorted(round(v["mfu"], 4) for v in data["verdicts"] if v["mfu"] is not None)


def test_summary_counts_classes_and_wasted_gpus(data):
    html = status_page(data)
    summary = re.search(r'<div class="summary" id="summary">(.*?)</div>', html).group(1)
    classes = [v["class"] for v in data["verdicts"]]
    wasted = sum(v["class"] in ("input_starved", "communication_jittered")
                 or (v["class"] == "idle" and v["detail"] != "idle_free") for v in data["verdicts"])
    assert f"{wasted} of {len(data['devices'])} GPUs wasted" in summary and wasted == 4
    assert f"{classes.count('compute_bound')} compute-bound" in summary
    note = re.search(r'<p class="muted small" id="measures">(.*?)</p>', html).group(1)
    assert escape(MEASURES["windows"]) in note and escape(MEASURES["lost"]) in note  # each figure names its measure


def test_chart_plots_every_gpu_with_a_position_and_lists_the_rest(data):
    html = status_page(data)
    root = svg_of(html)
    plotted = {g.get("data-gpu"): g.find("circle").get("data-class") for g in root.iter("g") if g.get("class") == "gpu-point"}
    verdicts = {v["gpu"]: v for v in data["verdicts"]}
    positioned = {g for g, v in verdicts.items() if v["roofline"]["intensity"] and v["roofline"]["achieved_flops"]}
    assert set(plotted) == positioned and positioned
    assert all(plotted[g] == verdicts[g]["class"] for g in plotted)
    others = set(verdicts) - positioned
    assert others, "the demo has an idle GPU"
    unplotted = re.search(r'id="unplotted">(.*?)</p>', html).group(1)
    assert all(f"GPU {g} (" in unplotted for g in others)
    roofs = [p.get("data-roof") for p in root.iter("polyline")]
    assert roofs == ["NVIDIA H100 SXM5 80GB bf16"]  # eight identical GPUs: one roof, drawn once


def test_down_gpu_card_and_escaping(data):
    data["devices"][3]["up"] = False
    data["devices"][3]["error"] = "<script>alert(1)</script> GPU is lost"
    data["verdicts"][0]["reasons"] = ["DRAM <b>99%</b> & rising"]
    html = status_page(data)
    (down,) = elements(html, "div", **{"class": "card down"})
    assert down["data-gpu"] == data["devices"][3]["info"]["gpu"]
    assert "&lt;script&gt;alert(1)&lt;/script&gt; GPU is lost" in html and "<script>alert" not in html
    assert "DRAM &lt;b&gt;99%&lt;/b&gt; &amp; rising" in html
    assert "1 down" in html


def test_page_is_self_contained(data):
    html = status_page(data)
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html), "no external asset may load"
    assert not elements(html, "link") and not elements(html, "img")
    (script,) = re.findall(r"<script>(.*?)</script>", html, re.S)
    assert script == REFRESH_SCRIPT and script_hash(script) in CONTENT_SECURITY_POLICY
    assert "<script" not in status_page(data, refresh_s=0)


def test_stale_and_empty_snapshots_say_so(data):
    html = status_page(data, stale="snapshot is 99.0s old (limit 10.0s): the collector is stuck")
    assert 'id="stale"' in html and "the collector is stuck" in html
    data["verdicts"] = []
    html = status_page(data)
    assert "No verdicts yet" in html
    assert not list(svg_of(html).iter("circle"))


# -- served by the agent's HTTP server --------------------------------------------------------


@pytest.fixture
def server(collector):
    with serving_collector(collector) as srv:
        yield srv


def get(url: str, method: str = "GET"):
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=10) as response:
            return response.status, dict(response.headers), response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read().decode()


def test_served_with_a_strict_policy_and_cached_per_snapshot(server):
    status, headers, body = get(server.url)
    assert status == 200 and headers["Content-Type"] == "text/html; charset=utf-8"
    assert headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
    assert "default-src 'none'" in CONTENT_SECURITY_POLICY and "unsafe-inline'; img" in CONTENT_SECURITY_POLICY
    assert "script-src 'sha256-" in CONTENT_SECURITY_POLICY
    assert headers["Cache-Control"] == "no-store"
    assert server.status_page(5.0) == server.status_page(5.0)  # rendered once per snapshot: test_http_hostile.py
    assert 'data-refresh="5"' in body


def test_refresh_parameter(server):
    stopped = get(server.url + "?refresh=0")[2]
    assert 'data-refresh="0"' in stopped
    assert "refreshes every 0 s" not in stopped and 'id="no-refresh">does not refresh itself' in stopped
    assert "refreshes every 5 s" in get(server.url)[2]
    assert 'data-refresh="30"' in get(server.url + "?refresh=30")[2]
    assert 'data-refresh="1"' in get(server.url + "?refresh=0.01")[2]  # never faster than once a second
    for bad in ("abc", "-1", "nan", "99999"):
        status, _, body = get(server.url + f"?refresh={bad}")
        assert status == 400 and body.startswith("refresh:"), bad


def test_stale_snapshot_shows_a_banner(server):
    assert 'id="stale"' not in get(server.url)[2]
    server.test_clock["t"] += 60
    body = get(server.url)[2]
    assert 'id="stale"' in body and "collector is stuck" in body


def test_head_sends_no_body(server):
    status, headers, body = get(server.url, method="HEAD")
    assert status == 200 and body == "" and int(headers["Content-Length"]) > 1000


def test_attention_lists_wasted_down_and_throttled_gpus_first(data):
    data["devices"][1]["up"] = False
    data["devices"][1]["error"] = "GPU is lost"
    html = status_page(data)
    panel = re.search(r'<div class="attention" id="attention">(.*?)</div>', html, re.S).group(1)
    listed = re.findall(r'<li data-gpu="([^"]+)" data-kind="([^"]+)"', panel)
    verdicts = {v["gpu"]: v for v in data["verdicts"]}
    wasted = [g for g, v in verdicts.items() if g != "1" and (v["class"] in ("input_starved", "communication_jittered")
                                                              or (v["class"] == "idle" and v["detail"] != "idle_free"))]
    throttled = [g for g, v in verdicts.items() if v["throttled"] and g != "1"]
    assert listed[0] == ("1", "down") and "GPU is lost" in panel, "a down GPU comes first"
    assert [g for g, kind in listed if kind == "waste"] == wasted and wasted
    assert [g for g, kind in listed if kind == "throttled"] == throttled
    kinds = [kind for _, kind in listed]
    assert kinds == sorted(kinds, key=["down", "waste", "serving", "low_mfu", "throttled"].index)
    for verdict in data["verdicts"]:  # a node where every GPU does its own work
        verdict["attention"], verdict["waste"] = [], {"label": "none", "wasted": False, "lost_fraction": 0.0}
    data["devices"][1]["up"] = True
    assert "Nothing needs attention" in status_page(data)


def test_gpus_without_a_flop_counter_are_placed_from_their_jobs_reports():
    """The AMD demo: amdsmi has no tensor counter, so only GPUs whose job reports are on the chart."""
    settings = Settings(backend="amd-virtual", sample_timeout_s=SLOW_MACHINE_SAMPLE_TIMEOUT_S)
    amd = make_collector(settings, open_backend_or_fail(settings))
    try:
        data = snapshot_to_dict(amd.collect_once())
    finally:
        amd.stop()
    html = status_page(data)
    hollow = {g.get("data-gpu") for g in svg_of(html).iter("g") if g.find("circle").get("class") == "point reported"}
    reporting = {v["gpu"] for v in data["verdicts"] if v["mfu_workload"] is not None and v["roofline"]["achieved_bytes_per_s"]}
    assert hollow == reporting and reporting, f"every GPU whose job reports, and only those: {hollow} vs {reporting}"
    assert all(v["roofline"]["achieved_flops"] is None for v in data["verdicts"])
    unplotted = re.search(r'id="unplotted">(.*?)</p>', html).group(1)
    assert all(f"GPU {v['gpu']} (" in unplotted for v in data["verdicts"] if v["gpu"] not in reporting)
