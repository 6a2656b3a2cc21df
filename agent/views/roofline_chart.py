"""The roofline chart: each GPU's position (arithmetic intensity, achieved FLOP/s) under the roofs
of its model, on log-log axes, as inline SVG.

A point on the slanted roof is memory-bound at full bandwidth; on the flat roof, compute-bound at
peak; far below both, the GPU is waiting on something else (input, communication, launches). The
distance to the roof above a point is the headroom the verdict's reasons talk about.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

from agent.model.indexes import gpu_order
from agent.model.judging import NAMES, judgement
from agent.views.palette import class_colour, class_label
from agent.views.svg import LogScale, esc, line, num, polyline, si, text


@dataclass(frozen=True, slots=True)
class Roof:
    """One model's roofs at one precision: ``min(peak_flops, peak_bytes_per_s x intensity)``."""

    label: str
    peak_flops: float
    peak_bytes_per_s: float

    @property
    def ridge(self) -> float:
        return self.peak_flops / self.peak_bytes_per_s


@dataclass(frozen=True, slots=True)
class ChartPoint:
    """One GPU (status page) or one evaluation window (report) on the chart."""

    intensity: float | None
    flops: float | None
    cls: str
    label: str = ""
    """Text drawn beside the point (the GPU id on the status page; empty for report windows)."""
    title: str = ""
    """Hover text."""
    reported: bool = False
    """Placed from the job's reported FLOPs (workload MFU), not counters: drawn hollow."""

    @property
    def plottable(self) -> bool:
        return bool(self.intensity and self.flops and self.intensity > 0 and self.flops > 0)


@dataclass(frozen=True, slots=True)
class DecodePoint:
    """One inference server's decode step, per GPU: the FLOPs of a step over the bytes it reads
    (weights + KV cache), at the rate its time per output token implies. Drawn as a diamond with a
    dotted line up to the roof above it: that gap is TPOT / the decode floor (agent.views.serving_cards)."""

    intensity: float | None
    flops: float | None
    roof_flops: float | None
    """The roof at ``intensity`` (what a step at the floor would reach); None draws no gap line."""
    colour: str
    label: str = ""
    title: str = ""
    server: str = ""

    @property
    def plottable(self) -> bool:
        return bool(self.intensity and self.flops and self.intensity > 0 and self.flops > 0)


def judged_figures(cls: str | None, figures: Mapping[str, float | None]) -> str:
    """A point's hover text: the figure that judges its class first, named as such, then the other; for a class
    neither judges, both with what matters instead (agent.model.judging, the rule the cards and ``top`` colour by)."""
    def share(name: str) -> str:
        value = figures.get(name)
        return "—" if value is None else f"{value * 100:.0f}%"

    verdict = judgement(cls)
    if verdict.figure is None:
        return f"MFU {share('mfu')}, MBU {share('mbu')} ({verdict.matters})"
    other = "mbu" if verdict.figure == "mfu" else "mfu"
    return f"{NAMES[verdict.figure]} {share(verdict.figure)} (judges {class_label(cls)}), {NAMES[other]} {share(other)}"


def position(achieved_flops: float | None, achieved_bytes_per_s: float | None, mfu_workload: float | None,
             peak_flops: float | None) -> tuple[float | None, float | None, bool]:
    """(intensity, FLOP/s, reported?) of a GPU on the chart.

    Counters first. A GPU without a FLOP counter (AMD, NVIDIA without GPM) can still be placed
    when its job reports its throughput: the model FLOP/s are workload MFU x peak, over the DRAM
    bytes the counters measured. Otherwise it has no position.
    """
    if achieved_flops is not None:
        return (achieved_flops / achieved_bytes_per_s if achieved_bytes_per_s else None), achieved_flops, False
    if mfu_workload is not None and peak_flops and achieved_bytes_per_s:
        flops = mfu_workload * peak_flops
        return flops / achieved_bytes_per_s, flops, True
    return None, None, False


def roof_for(model: str, dtype: str, peak_flops: dict[str, float] | None, bandwidth: float | None) -> Roof | None:
    """The roof of ``model`` at ``dtype``, or None when the catalogue lacks either peak."""
    peak = (peak_flops or {}).get(dtype)
    if not peak or not bandwidth:
        return None
    return Roof(f"{model} {dtype}", float(peak), float(bandwidth))


WIDTH, HEIGHT = 720, 420
_LEFT, _RIGHT, _TOP, _BOTTOM = 64, 16, 16, 48


def roofline_svg(roofs: list[Roof], points: list[ChartPoint], *, radius: float = 7.0, opacity: float = 1.0,
                 width: int = WIDTH, height: int = HEIGHT, chart_id: str = "roofline",
                 decodes: Sequence[DecodePoint] = ()) -> str:
    """Log-log chart of ``points`` (and serving ``decodes``) under ``roofs``; points without coordinates
    are left out (the caller says why beside the chart). Axes span whole decades around the roofs and the points."""
    roofs = list(dict.fromkeys(roofs))
    plotted = [p for p in points if p.plottable]
    steps = [d for d in decodes if d.plottable]
    if not roofs and not plotted and not steps:
        return (f'<svg id="{esc(chart_id)}" class="roofline empty" viewBox="0 0 {width} 80" role="img" '
                f'aria-label="roofline chart">{text(width / 2, 44, "no roofline: no GPU has a known peak or a measured position", anchor="middle", cls="note")}</svg>')
    placed: list[ChartPoint | DecodePoint] = [*plotted, *steps]
    xs = [r.ridge / 100 for r in roofs] + [r.ridge * 10 for r in roofs] + [p.intensity for p in placed]  # type: ignore[misc]
    ys = [r.peak_flops * 1.5 for r in roofs] + [p.flops for p in placed]  # type: ignore[misc]
    # Floor: a decade under the lowest point, and at least two decades under the lowest peak, so a
    # starved GPU's distance from its roof stays visible without empty decades below it.
    floors = [p.flops / 2 for p in placed] + [r.peak_flops / 50 for r in roofs]  # type: ignore[operator]
    ys.append(min(floors))
    x = LogScale.around(xs, _LEFT, width - _RIGHT)
    y = LogScale.around(ys, height - _BOTTOM, _TOP)
    parts = [f'<svg id="{esc(chart_id)}" class="roofline" viewBox="0 0 {width} {height}" role="img" '
             f'aria-label="roofline chart: achieved FLOP/s against arithmetic intensity">']
    parts += _axes(x, y, width, height)
    for i, roof in enumerate(roofs):
        parts += _roof(roof, x, y, i)
    for point in sorted(plotted, key=lambda p: p.cls == "idle"):  # busy GPUs drawn last, on top
        parts.append(_point(point, x, y, radius, opacity))
    parts += [_decode(step, x, y, radius) for step in steps]
    for (lx, ly), labels in _label_clusters(plotted, x, y, radius):
        parts.append(text(lx + radius + 3, ly + 4, _joined(labels), cls="point-label"))
    parts.append("</svg>")
    return "".join(parts)


def _axes(x: LogScale, y: LogScale, width: int, height: int) -> list[str]:
    parts = []
    for tick in x.decades():
        px = x(tick)
        parts.append(line(px, _TOP, px, height - _BOTTOM, "grid"))
        parts.append(text(px, height - _BOTTOM + 16, si(tick), anchor="middle", cls="tick"))
    for tick in y.decades():
        py = y(tick)
        parts.append(line(_LEFT, py, width - _RIGHT, py, "grid"))
        parts.append(text(_LEFT - 6, py + 4, si(tick), anchor="end", cls="tick"))
    parts.append(text((_LEFT + width - _RIGHT) / 2, height - 10, "arithmetic intensity (FLOP per DRAM byte)", anchor="middle", cls="axis"))
    parts.append(text(14, (_TOP + height - _BOTTOM) / 2, "achieved FLOP/s", anchor="middle", cls="axis",
                      extra=f' transform="rotate(-90 14 {num((_TOP + height - _BOTTOM) / 2)})"'))
    return parts


def _roof(roof: Roof, x: LogScale, y: LogScale, index: int) -> list[str]:
    """The slanted memory roof up to the ridge, then the flat compute roof, clipped to the axes."""
    start = max(x.lo, y.lo / roof.peak_bytes_per_s)
    ridge = min(max(roof.ridge, x.lo), x.hi)
    path = [(x(start), y(roof.peak_bytes_per_s * start)), (x(ridge), y(min(roof.peak_flops, roof.peak_bytes_per_s * ridge))),
            (x(x.hi), y(roof.peak_flops))]
    label_y = y(roof.peak_flops) - 6 - 14 * index
    caption = f"{roof.label}: {si(roof.peak_flops, 'FLOP/s')}, {si(roof.peak_bytes_per_s, 'B/s')}, ridge {roof.ridge:.0f}"
    return [polyline(path, "roof", f' data-roof="{esc(roof.label)}"'),
            line(x(ridge), y(roof.peak_flops), x(ridge), y(y.lo), "ridge"),
            text(x.end_px - 4, label_y, caption, anchor="end", cls="roof-label")]


def _point(point: ChartPoint, x: LogScale, y: LogScale, radius: float, opacity: float) -> str:
    cx, cy = x(point.intensity), y(point.flops)  # type: ignore[arg-type]
    title = point.title or f"{class_label(point.cls)}: {point.intensity:.1f} FLOP/B, {si(point.flops, 'FLOP/s')}"  # type: ignore[arg-type]
    colour = class_colour(point.cls)
    paint = (f'fill="#fff" stroke="{colour}" stroke-width="2.5" class="point reported"' if point.reported
             else f'fill="{colour}" fill-opacity="{opacity:g}" class="point"')
    dot = (f'<circle cx="{num(cx)}" cy="{num(cy)}" r="{num(radius)}" {paint} data-class="{esc(point.cls)}">'
           f'<title>{esc(title)}</title></circle>')
    if not point.label:
        return dot
    return f'<g class="gpu-point" data-gpu="{esc(point.label)}">{dot}</g>'


def _decode(step: DecodePoint, x: LogScale, y: LogScale, radius: float) -> str:
    """A diamond in the serving state's colour, its label on the left (GPU labels sit on the right),
    and a dotted line up to the roof: the decode floor's distance, on the chart's log scale."""
    cx, cy = x(step.intensity), y(step.flops)  # type: ignore[arg-type]
    r = radius * 1.3
    gap = line(cx, cy - r, cx, y(step.roof_flops), "decode-gap") if step.roof_flops and step.roof_flops > step.flops else ""  # type: ignore[operator]
    diamond = (f'<polygon points="{num(cx)},{num(cy - r)} {num(cx + r)},{num(cy)} {num(cx)},{num(cy + r)} {num(cx - r)},{num(cy)}" '
               f'fill="{esc(step.colour)}" class="decode"><title>{esc(step.title)}</title></polygon>')
    label = text(cx - r - 3, cy + 4, step.label, anchor="end", cls="decode-label") if step.label else ""
    return f'<g class="decode-point" data-server="{esc(step.server)}">{gap}{diamond}{label}</g>'


def _label_clusters(points: list[ChartPoint], x: LogScale, y: LogScale, radius: float) -> list[tuple[tuple[float, float], list[str]]]:
    """One label per group of overlapping points ("3,4,5"), beside the group's rightmost point:
    GPUs of one job sit on top of each other, and their ids must stay readable. Groups are
    single-linkage: a point joins every group it touches (a node has a few dozen GPUs at most)."""
    groups: list[tuple[list[tuple[float, float]], list[str]]] = []
    for point in (p for p in points if p.label):
        here = (x(point.intensity), y(point.flops))  # type: ignore[arg-type]
        touching = [g for g in groups if any(math.dist(here, spot) < 2.5 * radius for spot in g[0])]
        merged: tuple[list[tuple[float, float]], list[str]] = ([here], [point.label])
        for group in touching:
            groups.remove(group)
            merged[0].extend(group[0])
            merged[1].extend(group[1])
        groups.append(merged)
    return [(max(spots), labels) for spots, labels in groups]


def _joined(labels: list[str], limit: int = 6) -> str:
    shown = sorted(labels, key=gpu_order)
    return ",".join(shown[:limit]) + ("…" if len(shown) > limit else "")


CHART_CSS = """
svg.roofline{width:100%;height:auto;max-width:900px;background:#fff;border:1px solid #ddd;border-radius:6px}
svg.roofline .grid{stroke:#eee;stroke-width:1}
svg.roofline .tick{font-size:11px;fill:#666}
svg.roofline .axis{font-size:12px;fill:#333}
svg.roofline .roof{fill:none;stroke:#c0392b;stroke-width:2.5}
svg.roofline .ridge{stroke:#c0392b;stroke-dasharray:4 4;stroke-width:1;opacity:.5}
svg.roofline .roof-label{font-size:11px;fill:#c0392b}
svg.roofline .note{font-size:13px;fill:#666}
svg.roofline circle.point:not(.reported){stroke:#222;stroke-width:1}
svg.roofline .point-label{font-size:12px;font-weight:bold;fill:#222}
svg.roofline polygon.decode{stroke:#222;stroke-width:1.5}
svg.roofline .decode-gap{stroke:#222;stroke-width:1.5;stroke-dasharray:2 3}
svg.roofline .decode-label{font-size:12px;font-style:italic;fill:#222}
"""
