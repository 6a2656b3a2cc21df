"""The roofline chart and the palette shared by the terminal, the status page and the report."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET

from agent.model import WORKLOAD_CLASSES
from agent.views import palette
from agent.views import roofline_chart as chart
from agent.views.roofline_chart import ChartPoint, roof_for, roofline_svg

H100 = roof_for("H100", "bf16", {"bf16": 989.4e12}, 3.35e12)


def _svg(roofs, points):
    return ET.fromstring(roofline_svg(roofs, points))


def _roof_path(root):
    (roof,) = [el for el in root.iter("polyline") if el.get("class") == "roof"]
    return [tuple(map(float, p.split(","))) for p in roof.get("points").split()]


def _on_segment(px, py, path):
    """Distance in pixels from (px, py) to the nearest segment of the roof path."""
    best = math.inf
    for (x1, y1), (x2, y2) in zip(path, path[1:]):
        dx, dy = x2 - x1, y2 - y1
        t = max(0.0, min(1.0, ((px - x1) * dx + (py - y1) * dy) / (dx * dx + dy * dy)))
        best = min(best, math.hypot(px - (x1 + t * dx), py - (y1 + t * dy)))
    return best


def test_points_at_the_roofs_sit_on_the_drawn_roof():
    at_memory_roof = ChartPoint(10.0, 10.0 * H100.peak_bytes_per_s, "memory_bound", "m")
    at_compute_roof = ChartPoint(2000.0, H100.peak_flops, "compute_bound", "c")
    far_below = ChartPoint(10.0, 1e12, "input_starved", "s")
    root = _svg([H100], [at_memory_roof, at_compute_roof, far_below])
    path = _roof_path(root)
    circles = {g.get("data-gpu"): g.find("circle") for g in root.iter("g") if g.get("class") == "gpu-point"}
    for name in ("m", "c"):
        c = circles[name]
        assert _on_segment(float(c.get("cx")), float(c.get("cy")), path) < 0.5, name
    s = circles["s"]
    assert _on_segment(float(s.get("cx")), float(s.get("cy")), path) > 50  # visibly under the roof
    assert float(s.get("cx")) == float(circles["m"].get("cx"))  # same intensity, same column


def test_points_take_their_class_colour_and_escape_their_text():
    point = ChartPoint(50.0, 1e14, "latency_bound", "<b>0</b>", "GPU <0> & co")
    svg = roofline_svg([H100], [point])
    root = ET.fromstring(svg)
    circle = next(root.iter("circle"))
    assert circle.get("fill") == palette.CLASS_COLOURS["latency_bound"]
    assert circle.find("title").text == "GPU <0> & co"
    assert "<b>" not in svg


def test_unplottable_points_are_left_out_and_an_empty_chart_says_why():
    idle = ChartPoint(None, None, "idle", "6")
    no_flops = ChartPoint(40.0, None, "memory_bound", "2")
    root = _svg([H100], [idle, no_flops])
    assert not list(root.iter("circle"))
    assert len(_roof_path(root)) == 3
    empty = roofline_svg([], [idle])
    assert "no roofline" in empty


def test_axes_enclose_every_point_and_the_ridge():
    points = [ChartPoint(0.05, 2e9, "latency_bound", "low"), ChartPoint(5e4, 9e14, "compute_bound", "high")]
    root = _svg([H100], points)
    box = (chart._LEFT, chart.WIDTH - chart._RIGHT, chart._TOP, chart.HEIGHT - chart._BOTTOM)
    for circle in root.iter("circle"):
        x, y = float(circle.get("cx")), float(circle.get("cy"))
        assert box[0] < x < box[1] and box[2] < y < box[3], "inside the axes, not clamped to an edge"
    ticks = [t.text for t in root.iter("text") if t.get("class") == "tick"]
    assert "0.1" in ticks and "10k" in ticks  # x: decades around 0.05 .. 5e4
    assert "10G" in ticks and "1P" in ticks  # y: decades around 2e9 .. the 989 TFLOP/s roof


def test_two_models_draw_two_roofs_and_duplicates_collapse():
    mi300x = roof_for("MI300X", "bf16", {"bf16": 1307e12}, 5.3e12)
    root = _svg([H100, mi300x, H100], [ChartPoint(100.0, 1e14, "memory_bound", "0")])
    assert [el.get("data-roof") for el in root.iter("polyline")] == ["H100 bf16", "MI300X bf16"]


def test_roof_needs_both_peaks():
    assert roof_for("X", "fp8", {"bf16": 1e15}, 1e12) is None
    assert roof_for("X", "bf16", {"bf16": 1e15}, None) is None
    assert H100.ridge == 989.4e12 / 3.35e12


def test_palette_covers_every_class_and_bands_mfu():
    assert set(palette.CLASS_COLOURS) == set(WORKLOAD_CLASSES)
    assert not hasattr(palette, "WASTED_CLASSES"), "what is wasted is agent.model.waste's to say, not the palette's"
    assert palette.mfu_colour(0.05) != palette.mfu_colour(0.3) != palette.mfu_colour(0.5)
    assert palette.mfu_colour(palette.MFU_TARGET) == palette.mfu_colour(0.9)
    assert palette.mfu_colour(None) == palette.CLASS_COLOURS["unknown"]
    assert palette.class_label("no_such_class") == "no_such_class"


def test_position_prefers_counters_then_the_jobs_reported_flops():
    assert chart.position(4e14, 1e12, 0.9, 1e15) == (400.0, 4e14, False)
    intensity, flops, reported = chart.position(None, 2e12, 0.3, 1e15)
    assert reported and flops == 0.3 * 1e15 and intensity == flops / 2e12
    assert chart.position(None, 2e12, None, 1e15) == (None, None, False)
    assert chart.position(None, None, 0.3, 1e15) == (None, None, False)  # no bytes: no intensity


def test_reported_points_are_hollow():
    root = _svg([H100], [ChartPoint(100.0, 1e14, "memory_bound", "0", reported=True)])
    circle = next(root.iter("circle"))
    assert circle.get("class") == "point reported" and circle.get("fill") == "#fff"
    assert circle.get("stroke") == palette.CLASS_COLOURS["memory_bound"]


def test_overlapping_points_share_one_label():
    points = [ChartPoint(500.0, 3e14, "communication_jittered", "5"), ChartPoint(505.0, 3.02e14, "communication_jittered", "4"),
              ChartPoint(20.0, 5e13, "memory_bound", "10")]
    root = _svg([H100], points)
    labels = sorted(t.text for t in root.iter("text") if t.get("class") == "point-label")
    assert labels == ["10", "4,5"]
    assert len(list(root.iter("circle"))) == 3  # every GPU is still drawn
