"""Every figure names its reference, and colour judges the figure that matters for the verdict (issue 43, item 6).

A newcomer read "DRAM 82% busy while kernels run, 103% of the memory roof" beside MBU 81% (the memory roof was
the practical one, 80% of peak, and nothing said so), and a memory-bound decode at its floor showed its MFU in
red on every view. Here, from the demo node collected in process (a compute-bound trainer, a latency-bound
service, a memory-bound decode at its roof, starved, jittered and idle GPUs):

- a reason that gives a share of a roof names the practical roof and the share of peak it stands at, and its
  number is the busy share over that level;
- the status page, ``top``, ``roofwatch report`` and the roofline chart's hover texts colour MFU only where
  compute is the roof (compute-bound) and MBU only where memory is (memory-bound), by the bands the docs state,
  and leave the other figures grey; each names what it is a share of.

The expected colours come from the issue's rule and docs/views.md's bands, written here, not from
agent.model.judging.
"""

from __future__ import annotations

import re
from html import unescape

import pytest
from prometheus_client.exposition import generate_latest

from agent.backends.virtual import VirtualBackend
from agent.classifier.live import LiveClassifier
from agent.classifier.thresholds import DEFAULT_THRESHOLDS as T
from agent.collector import Collector
from agent.views import top_render
from agent.views.report import build_report
from agent.views.status_page import status_page
from agent.views.top_source import parse_exposition
from exporters.prometheus import ExpositionCache
from exporters.snapshot_json import snapshot_to_dict

START = 1_800_000_000.0
GREEN, ORANGE, RED = "#73bf69", "#ff9830", "#f2495c"
JUDGED_BY = {"compute_bound": "mfu", "memory_bound": "mbu"}
"""The issue's rule: MFU where compute is the roof, MBU where memory bandwidth is; nothing judges the others."""
BANDS = {"mfu": (0.2, 0.4), "mbu": (0.4, 0.55)}
"""docs/views.md: MFU red below 20%, green from the 40% target; MBU red below 40%, green from 55%."""


def expected_colour(cls: str, figure: str, value: float | None) -> str | None:
    """The band colour where ``figure`` judges ``cls``; None where it must be shown without one."""
    if JUDGED_BY.get(cls) != figure or value is None:
        return None
    poor, good = BANDS[figure]
    return GREEN if value >= good else ORANGE if value >= poor else RED


@pytest.fixture(scope="module")
def demo():
    """90 s of the demo node through the real collector and classifier, on a manual clock: its last snapshot,
    and every sample and verdict on the way (for the report)."""
    clock = {"t": START}
    backend = VirtualBackend("demo", start_time=START - 60.0, interval_s=1.0)
    collector = Collector(backend, node="demo-node", interval_s=1.0, clock=lambda: clock["t"],
                          monotonic=lambda: clock["t"], analyzer=LiveClassifier())
    samples, verdicts = [], {}
    try:
        for _ in range(90):  # the first window's verdicts are unknown; the report's "mostly" needs a minute more
            snapshot = collector.collect_once()
            samples += [d.sample for d in snapshot.devices if d.sample is not None]
            verdicts.update({(v.gpu, v.window_end): v for v in snapshot.verdicts})
            clock["t"] += 1.0
    finally:
        collector.stop()
    return snapshot, samples, list(verdicts.values())


def test_the_demo_has_the_verdicts_this_is_about(demo) -> None:
    snapshot, _, _ = demo
    by_class = {v.cls: v for v in snapshot.verdicts}
    assert {"compute_bound", "memory_bound", "latency_bound", "idle"} <= set(by_class)
    decode = by_class["memory_bound"]
    assert decode.roofline.mfu < BANDS["mfu"][0], "the decode's MFU is low: what an MFU-only colour painted red"


# -- reasons ----------------------------------------------------------------------------------------------------

ROOF = re.compile(r"(\d+)% of the (\w+ )?(compute|memory) roof(?: \((\d+)% of ([^)]+)\))?")
PEAK_WORDS = {"memory": {"peak bandwidth": T.dram_saturation},
              "compute": {"the tensor pipes' peak": T.tensor_saturation, "the FP pipes' peak": T.fp_pipe_saturation}}
"""What each practical roof is a share of, and the share of it (docs/classification.md §5's settings)."""


def test_every_roof_share_in_a_reason_names_the_practical_roof_and_its_share_of_peak(demo) -> None:
    _, _, verdicts = demo
    found = 0
    for verdict in verdicts:
        for reason in verdict.reasons:
            for share, practical, roof, level, peak in ROOF.findall(reason):
                found += 1
                assert practical == "practical ", reason
                assert peak in PEAK_WORDS[roof], reason
                assert int(level) == round(100 * PEAK_WORDS[roof][peak]), reason
    assert found, "no reason gave a share of a roof: the check would hold vacuously"


@pytest.mark.parametrize(("busy", "roof"), [("DRAM", "memory"), ("tensor pipes", "compute")])
def test_a_roof_share_is_the_busy_share_over_the_practical_level(demo, busy: str, roof: str) -> None:
    """'DRAM 82% busy while kernels run, 103% of the practical memory roof (80% of peak bandwidth)': 82 / 0.8."""
    _, _, verdicts = demo
    pattern = re.compile(rf"{busy} (\d+)% busy while kernels run, (\d+)% of the practical {roof} roof \((\d+)% of ")
    matched = [m.groups() for v in verdicts for r in v.reasons if (m := pattern.search(r))]
    assert matched, f"no {roof}-bound reason in the demo"
    for busy_pct, share, level in matched:
        assert abs(int(busy_pct) / (int(level) / 100) - int(share)) <= 1.5, (busy_pct, share, level)


# -- the status page --------------------------------------------------------------------------------------------


def _figure_spans(html: str) -> dict[tuple[str, str], tuple[float | None, str]]:
    """(GPU, mfu|mbu) -> (value, colour) of each card's figures."""
    out = {}
    for gpu, card in re.findall(r'<div class="card" data-gpu="([^"]+)"(.*?)(?=<div class="card"|<footer>)', html, re.S):
        for figure, colour, value in re.findall(r'<span class="figure (mfu|mbu)[^"]*" style="color:(#[0-9a-f]{6})" '
                                                r'data-\1="([^"]*)"', card):
            out[(gpu, figure)] = (float(value) if value else None, colour)
    return out


def test_the_status_page_colours_only_the_figure_that_judges_each_verdict(demo) -> None:
    snapshot, _, _ = demo
    data = snapshot_to_dict(snapshot)
    spans = _figure_spans(status_page(data, refresh_s=0))
    for verdict in data["verdicts"]:
        for figure in ("mfu", "mbu"):
            value, colour = spans[(verdict["gpu"], figure)]
            want = expected_colour(verdict["class"], figure, verdict[figure])
            if want is None:
                assert colour not in (GREEN, ORANGE, RED), (verdict["gpu"], verdict["class"], figure, colour)
            else:
                assert colour == want, (verdict["gpu"], verdict["class"], figure, value)


def test_the_decode_at_its_floor_is_not_red_for_its_mfu_and_its_card_says_what_judges_it(demo) -> None:
    snapshot, _, _ = demo
    data = snapshot_to_dict(snapshot)
    html = status_page(data, refresh_s=0)
    decode = next(v for v in data["verdicts"] if v["class"] == "memory_bound")
    spans = _figure_spans(html)
    assert spans[(decode["gpu"], "mfu")][1] != RED
    assert spans[(decode["gpu"], "mbu")][1] == GREEN, "MBU at its roof, above the 55% good servers reach"
    card = re.search(rf'<div class="card" data-gpu="{decode["gpu"]}".*?<div class="facts', html, re.S).group(0)
    text = unescape(re.sub(r"<[^>]+>", " ", card))
    assert "MBU of peak memory bandwidth" in text and "MFU of peak FLOP/s" in text
    assert "MBU judges it" in text


def test_the_roofline_points_name_the_figure_that_judges_them(demo) -> None:
    snapshot, _, _ = demo
    data = snapshot_to_dict(snapshot)
    titles = dict(re.findall(r"<title>GPU (\S+): ([^<]+)</title>", status_page(data, refresh_s=0)))
    for verdict in data["verdicts"]:
        title = unescape(titles.get(verdict["gpu"], ""))
        if not title:
            continue  # not placed on the chart (idle): listed under it instead
        judged = JUDGED_BY.get(verdict["class"])
        if judged is not None:
            assert re.search(rf", {judged.upper()} \d+% \(judges ", title), title
        else:
            assert "MFU" in title and "MBU" in title and "not MFU or MBU" in title, title


# -- top --------------------------------------------------------------------------------------------------------


def test_top_colours_mfu_and_mbu_by_the_same_rule(demo) -> None:
    snapshot, _, _ = demo
    text = ExpositionCache(lambda: snapshot).render(generate_latest, "text/plain").decode()
    rows = top_render.sort_rows(parse_exposition(text, "http://demo/metrics").rows, "gpu")
    assert {r.cls for r in rows} >= {"compute_bound", "memory_bound"}
    table = top_render.render_table(rows, top_render.ClassHistory(), 220)
    cells = {str(column.header): list(column._cells) for column in table.columns}
    assert "MFU" in cells and "MBU" in cells, f"columns {list(cells)}"
    for figure in ("mfu", "mbu"):
        for row, cell in zip(rows, cells[figure.upper()]):
            colour = str(cell.style).lower()
            want = expected_colour(row.cls, figure, getattr(row, figure))
            if want is None:
                assert colour not in (GREEN, ORANGE, RED), (row.gpu, row.cls, figure, colour)
            else:
                assert colour == want, (row.gpu, row.cls, figure, colour)


# -- the report -------------------------------------------------------------------------------------------------


def test_the_report_colours_each_gpus_means_by_the_class_it_was_mostly_in(demo) -> None:
    _, samples, verdicts = demo
    html = build_report(samples, verdicts)
    table = re.search(r'<table id="summary">.*?</table>', html, re.S).group(0)
    assert "mean MFU (of peak FLOP/s)" in table and "mean MBU (of peak memory bandwidth)" in table
    rows = re.findall(r'<tr data-gpu="([^"]+)">(.*?)</tr>', table, re.S)
    mostly = {gpu: re.search(r'class="badge[^"]*"[^>]*data-class="([a-z_]+)"', row).group(1) for gpu, row in rows}
    assert set(mostly.values()) >= {"compute_bound", "memory_bound"}
    for gpu, row in rows:
        figures = re.findall(r'<span class="figure (mfu|mbu)[^"]*" style="color:(#[0-9a-f]{6})" data-\1="([^"]*)"', row)
        assert sorted(f for f, _, _ in figures) == ["mbu", "mfu"], (gpu, figures)
        for figure, colour, value in figures:
            want = expected_colour(mostly[gpu], figure, float(value) if value else None)
            if want is None:
                assert colour not in (GREEN, ORANGE, RED), (gpu, mostly[gpu], figure, colour)
            else:
                assert colour == want, (gpu, mostly[gpu], figure, value)
