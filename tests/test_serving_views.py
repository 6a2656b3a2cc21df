"""The serving views: the status page's serving cards and decode points, and ``roofwatch top``'s serving lines.

Built from the demo node's snapshot with servers put on three of its GPUs (tests/serving_fixtures.py):
a tensor-parallel pair (GPUs 1 and 2), a server with a hostile name (GPU 6) and a nameless one
(GPU 7). The browser-side check is in test_serving_browser.py.
"""

from __future__ import annotations

import copy
import re
from html import escape

import pytest
from rich.console import Console

from agent.views.serving_cards import ServingGroup, decode_point, floor_sentence, serving_groups
from agent.views.status_page import status_page
from agent.views.top_render import TopState, render_frame
from agent.views.top_attention import render_attention
from agent.views.top_serving import ServingRow, render_serving
from agent.views.top_source import GpuRow, parse_exposition
from exporters.snapshot_json import snapshot_to_dict
from tests.serving_fixtures import HOSTILE, LLAMA_70B, demo_snapshot, exposition, serving_snapshot
from tests.test_status_page import elements, svg_of
from tests.top_exposition import FIXTURE

URL = "http://node7:9477/metrics"
SERVERS = ["vllm 10.0.0.7:8000", HOSTILE, "GPU 7"]


@pytest.fixture(scope="module")
def snapshot():
    return serving_snapshot(demo_snapshot())


@pytest.fixture
def data(snapshot):
    return copy.deepcopy(snapshot_to_dict(snapshot))


def card_of(html: str, server: str) -> str:
    match = re.search(rf'<div class="card serving" data-server="{re.escape(escape(server))}".*?data-fact="gpus">.*?</div></div>',
                      html, re.S)
    assert match, server
    return match.group(0)


def rendered(renderable, width: int = 200) -> str:
    console = Console(record=True, width=width, force_terminal=True, color_system="truecolor")
    console.print(renderable)
    return console.export_text()


# -- status page: cards ---------------------------------------------------------------------


def test_one_serving_card_per_server_with_its_gpus(data):
    html = status_page(data, refresh_s=0)
    cards = elements(html, "div", **{"class": "card serving"})
    assert [c["data-server"] for c in cards] == SERVERS
    assert [c["data-gpus"] for c in cards] == ["1,2", "6", "7"]
    assert [c["data-state"] for c in cards] == ["under_batched", "kv_saturated", "unknown"]
    assert html.index("<h2>Serving</h2>") < html.index("<h2>GPUs</h2>"), "servers above the GPU cards"
    assert len(elements(html, "div", **{"class": "card"})) == 8, "the GPU cards stay"


def test_the_card_shows_the_floor_the_batch_and_the_queue(data):
    card = card_of(status_page(data, refresh_s=0), "vllm 10.0.0.7:8000")
    assert '<span class="muted small">llama-70b</span>' in card
    assert 'data-state="under_batched">under-batched</span>' in card and "advice: raise_batch" in card
    assert "raise max_num_seqs" in card
    assert '<div class="floor" data-fact="floor">TPOT 31 ms = 1.3x the floor of 23.9 ms</div>' in card
    assert "memory 23.9 ms: weights 140 GB + KV cache 20 GB read per step · compute 1.7 ms" in card
    assert "decode reads 2.58TB/s per GPU = 77% of HBM bandwidth" in card  # 160 GB / 31 ms / 2 over 3.35 TB/s
    assert "tokens/s per GPU <b>387</b>" in card
    assert "batch <b>24 of ~120 possible</b>" in card and "waiting <b>40</b>" in card
    assert "preempted/s <b>0</b>" in card
    kv = re.search(r'data-metric="KV cache">.*?<span class="num">(.*?)</span>', card).group(1)
    prefill = re.search(r'data-metric="prefill">.*?<span class="num">(.*?)</span>', card).group(1)
    assert (kv, prefill) == ("20%", "10%")
    assert "GPUs 1, 2</div>" in card


def test_a_server_without_a_floor_says_what_is_missing(data):
    card = card_of(status_page(data, refresh_s=0), "GPU 7")
    assert "TPOT 10 ms; no floor to compare it with" in card
    assert 'data-state="unknown">unknown</span>' in card and "advice: report_model_bytes" in card
    assert "set model_bytes for this server" in card
    assert "tokens/s per GPU <b>—</b>" in card and "waiting <b>—</b>" in card


def test_server_and_model_names_are_escaped(data):
    html = status_page(data, refresh_s=0)
    assert "<script" not in html and "<b>qwen" not in html
    card = card_of(html, HOSTILE)
    assert f"<b>{escape(HOSTILE)}</b>" in card and escape("<b>qwen</b>") in card
    assert "KV cache 97% full with 12 requests waiting" in card and "preempted/s <b>0.5</b>" in card
    svg_of(html)  # the chart stays well-formed XML


def test_control_characters_in_a_server_name_are_replaced(data):
    for verdict in data["verdicts"]:
        if verdict.get("serving", {}).get("server") == HOSTILE:
            verdict["serving"]["server"] = "vllm\x1b[2J\u202egnp.exe"
    html = status_page(data, refresh_s=0)
    assert "\x1b" not in html and "\u202e" not in html
    assert "vllm\ufffd[2J\ufffdgnp.exe" in html


def test_down_gpus_and_gpus_without_serving_have_no_card(data):
    for device in data["devices"]:
        if device["info"]["gpu"] == "7":
            device["up"] = False
    html = status_page(data, refresh_s=0)
    assert [c["data-server"] for c in elements(html, "div", **{"class": "card serving"})] == SERVERS[:2]


def test_no_serving_section_on_a_node_that_serves_nothing():
    html = status_page(snapshot_to_dict(demo_snapshot()), refresh_s=0)
    assert "Serving</h2>" not in html and "card serving" not in html and "decode-point" not in html
    assert 'id="decode-note"' not in html and 'id="decode-unplotted"' not in html


def test_floor_sentence_when_a_figure_is_missing():
    assert floor_sentence({"tpot_s": 0.0075, "floor_s": 0.0056, "floor_ratio": 1.34}) == "TPOT 7.5 ms = 1.3x the floor of 5.6 ms"
    assert floor_sentence({"tpot_s": 0.2, "floor_s": 0.01, "floor_ratio": 20.0}) == "TPOT 200 ms = 20x the floor of 10 ms"
    assert floor_sentence({"tpot_s": None, "floor_s": 0.0056}) == "no TPOT reported; the floor is 5.6 ms"
    assert floor_sentence({}) == "no TPOT reported"


# -- status page: decode point --------------------------------------------------------------


def _group(data, server: str) -> ServingGroup:
    verdicts = {v["gpu"]: v for v in data["verdicts"]}
    return next(g for g in serving_groups(data["devices"], verdicts) if g.key == server)


def test_the_decode_point_sits_the_floor_multiple_under_its_roof(data):
    point, why = decode_point(_group(data, "vllm 10.0.0.7:8000"))
    assert why is None and point is not None
    serving = LLAMA_70B.serving
    step_bytes = 140e9 + 100e9 * serving.kv_usage  # weights + the KV cache of the batch
    assert point.intensity == pytest.approx(serving.running * 1.4e11 / step_bytes)
    assert point.flops == pytest.approx(serving.running * 1.4e11 / serving.tpot_s / 2)  # per GPU of the pair
    assert point.roof_flops == pytest.approx(3.35e12 * point.intensity)  # memory-bound: under the slanted roof
    assert point.roof_flops / point.flops == pytest.approx(1.298, abs=1e-3)  # = TPOT / floor on the card
    assert point.label == "decode 1,2"


def test_the_chart_draws_the_decode_point_with_its_gap_to_the_roof(data):
    html = status_page(data, refresh_s=0)
    svg = svg_of(html)
    groups = [g for g in svg.iter() if g.get("class") == "decode-point"]
    assert [g.get("data-server") for g in groups] == ["vllm 10.0.0.7:8000"]
    (group,) = groups
    polygon = next(e for e in group.iter() if e.tag.endswith("polygon"))
    gap = next(e for e in group.iter() if e.tag.endswith("line"))
    ys = [float(p.split(",")[1]) for p in polygon.get("points").split()]
    assert float(gap.get("y2")) < min(ys), "the dotted line goes up, to the roof"
    title = next(e for e in polygon.iter() if e.tag.endswith("title")).text
    assert "batch 24 x 140GFLOP per token over 160 GB read per step = 21 FLOP/B" in title
    assert "The roof above is 1.3x higher: TPOT / the floor" in title
    label = next(e for e in group.iter() if e.tag.endswith("text"))
    assert label.text == "decode 1,2" and label.get("text-anchor") == "end"
    assert 'id="decode-note"' in html


def test_a_server_without_flops_per_token_is_listed_with_its_bandwidth(data):
    html = status_page(data, refresh_s=0)
    note = re.search(r'<p class="muted small" id="decode-unplotted">(.*?)</p>', html).group(1)
    assert escape(HOSTILE) + ": no FLOPs per token reported, so no intensity to place decode at" in note
    assert "it reads 54.8 GB per step, 1.37TB/s per GPU = 41% of HBM bandwidth" in note  # (16 + 38.8) GB / 40 ms
    assert "GPU 7: no weight bytes (model_bytes)" in note


# -- roofwatch top --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def view(snapshot):
    return parse_exposition(exposition(snapshot), URL)


def test_top_reads_one_serving_row_per_server(view):
    assert [r.server for r in view.serving] == SERVERS
    pair = view.serving[0]
    assert (pair.node, pair.gpus, pair.model, pair.state, pair.advice) == (
        "demo-node", ("1", "2"), "llama-70b", "under_batched", "raise_batch")
    assert pair.floor_multiple == pytest.approx(1.298, abs=1e-3) and pair.floor_s == pytest.approx(0.023881, abs=1e-6)
    assert (pair.tpot_s, pair.running, pair.waiting, pair.kv_usage, pair.prefill) == (0.031, 24, 40, 0.2, 0.1)
    assert pair.possible == pytest.approx(120) and pair.tokens_per_s_per_gpu == pytest.approx(387)
    nameless = view.serving[2]
    assert (nameless.gpus, nameless.model, nameless.state, nameless.floor_multiple, nameless.kv_usage) == (
        ("7",), None, "unknown", None, None)


def test_top_shows_a_serving_line_per_server(view):
    state = TopState(url=URL)
    state.apply(view)
    text = rendered(render_frame(state, 200, interactive=False))
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("SERVER"))
    assert lines[header - 1].startswith("SERVING")
    for name in ("STATE", "TPOT", "TPOT/FLOOR", "BATCH", "WAITING", "KV", "PREFILL", "GPUS"):
        assert name in lines[header]
    pair = lines[header + 2]
    assert re.search(r"^vllm 10\.0\.0\.7:8000\s+llama-70b\s+under-batched\s+31 ms\s+1\.3x of 23\.9 ms\s+24/~120\s+"
                     r"40\s+20%\s+10%\s+1,2\s*$", pair), pair
    assert re.search(r"KV cache saturated\s+40 ms\s+2\.4x of 16\.4 ms\s+64/~66\s+12\s+97%\s+20%\s+6\s*$", lines[header + 3])
    assert re.search(r"^GPU 7\s+—\s+unknown\s+10 ms\s+—\s+4\s+—\s+—\s+—\s+7\s*$", lines[header + 4])


def test_top_draws_names_as_text_and_cuts_them(view):
    text = rendered(render_serving(view.serving), 200)
    assert '<script>alert…</script> vllm' in text  # text, not markup; cut in its middle to 28 cells
    row = ServingRow(node="n", server="[bold]evil[/]\x1b]52;c;aGk=\x07", gpus=("0",), state="near_floor")
    text = rendered(render_serving([row]), 200)
    assert "[bold]evil[/]" in text and "\x1b]52" not in text and "\x07" not in text
    assert "near the floor" in text


def test_top_keeps_state_floor_batch_and_kv_on_a_narrow_terminal(view):
    text = rendered(render_serving(view.serving, 80), 80)
    header = next(line for line in text.splitlines() if line.startswith("SERVER"))
    assert header.split() == ["SERVER", "STATE", "TPOT/FLOOR", "BATCH", "WAITING", "KV"]
    assert all(len(line) <= 80 for line in text.splitlines())
    assert "1.3x of 23.9 ms" in text and "24/~120" in text and "97%" in text


def test_top_shows_no_serving_lines_where_nothing_serves():
    state = TopState(url=URL)
    state.apply(parse_exposition(FIXTURE.read_text(), URL))
    assert state.view.serving == ()
    assert "SERVING" not in rendered(render_frame(state, 200, interactive=False))


def test_serving_rows_of_several_nodes_name_their_node(view):
    rows = [*view.serving[:1], ServingRow(node="other", server="sglang 10.0.0.9:30000", gpus=("0",), state="at_floor",
                                         floor_multiple=1.1, floor_s=0.012)]
    lines = rendered(render_serving(rows), 200).splitlines()
    assert lines[1].split()[:2] == ["NODE", "SERVER"]
    assert lines[3].startswith("demo-node") and lines[4].startswith("other")
    assert "at the floor" in lines[4] and "1.1x of 12 ms" in lines[4]


# -- needs attention (issue 43, item 2) -------------------------------------------------------


def test_the_attention_list_names_each_server_with_its_figure_and_as_text(data):
    html = status_page(data, refresh_s=0)
    panel = re.search(r'<div class="attention" id="attention">(.*?)</div>', html, re.S).group(1)
    listed = dict(re.findall(r'<li data-server="([^"]+)" data-gpus="([^"]+)" data-kind="serving"', panel))
    assert listed == {"vllm 10.0.0.7:8000": "1,2", escape(HOSTILE): "6"}, "the under-batched pair and the saturated one"
    assert "batch 24 of a possible ~120, 40 requests waiting" in panel
    assert "KV cache 97% full, 0.5 requests preempted a second, 12 requests waiting" in panel
    assert "<script" not in panel and f"<b>{escape(HOSTILE)}</b>" in panel


def test_top_names_servers_that_need_attention_as_text():
    row = GpuRow(node="n", gpu="0", uuid="U0", up=True, cls="memory_bound", waste="none")
    server = ServingRow(node="n", server="[bold]evil[/]\x1b]52;c;aGk=\x07", gpus=("0",), state="kv_saturated",
                        kv_usage=0.95, waiting=7.0)
    text = rendered(render_attention([row], [server]), 200)
    assert "[bold]evil[/]" in text and "\x1b]52" not in text and "\x07" not in text
    assert "KV cache 95% full, 7 requests waiting: add replicas (scale out)" in text
