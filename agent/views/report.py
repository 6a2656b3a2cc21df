"""``roofwatch report``: a recorded trace as one self-contained HTML page for post-mortems.

The same verdicts ``roofwatch classify`` prints, drawn the way a person reads them: how each GPU
spent its time (a verdict timeline), where its windows sat under the roofs (the roofline scatter)
and how its MFU moved. Output is bounded whatever the trace length: timeline windows merge into
runs of one class, and the MFU and scatter series are thinned to a fixed number of points per GPU.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from agent import __version__
from agent.classifier.peaks import spec_for_sample
from agent.model import WORKLOAD_CLASSES, GpuSample, Verdict
from agent.model.indexes import gpu_order
from agent.model.judging import PEAKS, judgement
from agent.model.waste import MEASURES, SPARE, waste_of
from agent.views.html_parts import class_badge, figure_html, page, pct
from agent.views.palette import CLASS_LABELS, MFU_POOR, MFU_TARGET, class_colour, class_label
from agent.views.report_serving import serving_section
from agent.views.roofline_chart import ChartPoint, Roof, judged_figures, position, roof_for, roofline_svg
from agent.views.svg import LinearScale, esc, line, num, polyline, text

MAX_LINE_POINTS = 500
"""MFU points per GPU: a day at 5 s windows is 17,280 verdicts; the chart is 900 px wide."""
MAX_SCATTER_POINTS = 300
"""Roofline windows per GPU: more only stacks circles on top of each other."""

SERIES_COLOURS = ("#7eb26d", "#eab839", "#6ed0e0", "#ef843c", "#e24d42", "#1f78c1", "#ba43a9", "#705da0",
                  "#508642", "#cca300", "#447ebc", "#c15c17")
"""Grafana's classic series palette: one colour per GPU on the MFU chart."""


@dataclass
class GpuHistory:
    """One GPU's verdicts in time order, and what the trace said about it."""

    key: str
    gpu: str
    node: str
    model: str = "?"
    roofs: dict[str, Roof] = field(default_factory=dict)
    """Per dtype, from the catalogue spec of the GPU's model."""
    jobs: list[str] = field(default_factory=list)
    verdicts: list[Verdict] = field(default_factory=list)
    labelled: bool = False

    def durations(self) -> Counter[str]:
        """Seconds per class, each verdict covering the time since the previous one."""
        spent: Counter[str] = Counter()
        for start, end, verdict in self.spans():
            spent[verdict.cls] += end - start
        return spent

    def spans(self) -> list[tuple[float, float, Verdict]]:
        """(start, end, verdict): a verdict speaks for the time since the GPU's previous verdict,
        or for its own window when it follows a gap (or is the first)."""
        out = []
        previous: float | None = None
        for verdict in self.verdicts:
            own = verdict.window_end - verdict.window_start
            start = verdict.window_start if previous is None or verdict.window_end - previous > own else previous
            out.append((start, verdict.window_end, verdict))
            previous = verdict.window_end
        return out

    def waste(self) -> "WasteTime":
        """Seconds wasted (whole windows), lost, of unknown loss, and spare, by agent.model.waste."""
        out = WasteTime()
        for start, end, verdict in self.spans():
            w, span = waste_of(verdict), end - start
            out.total += span
            if w.wasted:
                out.wasted += span
                if w.lost_fraction is None:
                    out.unmeasured += span
                else:
                    out.lost += span * w.lost_fraction
            elif w.label == SPARE:
                out.spare += span
        return out

    def throttled_s(self) -> float:
        return sum(end - start for start, end, v in self.spans() if v.throttled)

    def mfu_values(self) -> list[float]:
        return self.figure_values("mfu")

    def figure_values(self, figure: str) -> list[float]:
        """The GPU's MFU or MBU (``figure``) over its windows, unknown ones left out."""
        return [x for v in self.verdicts if (x := getattr(v.roofline, figure)) is not None]

    def figure_source(self, figure: str) -> str | None:
        """Where most of those figures came from (``workload`` or ``counters``)."""
        sources = Counter(s for v in self.verdicts if (s := getattr(v.roofline, f"{figure}_source")))
        return sources.most_common(1)[0][0] if sources else None


@dataclass
class WasteTime:
    """One GPU's time by agent.model.waste's two measures (seconds)."""

    total: float = 0.0
    wasted: float = 0.0
    """Whole verdict windows whose GPU was wasted: an upper bound on the time lost."""
    lost: float = 0.0
    """The time actually lost in them (each window's lost share x its time)."""
    unmeasured: float = 0.0
    """Wasted windows whose lost share is unknown (not in ``lost``)."""
    spare: float = 0.0
    """Windows idle with nobody holding the GPU: capacity, not waste."""

    def share(self, seconds: float) -> float | None:
        return seconds / self.total if self.total else None


def histories(samples: Iterable[GpuSample], verdicts: Iterable[Verdict]) -> list[GpuHistory]:
    """Group by GPU (node-qualified when the trace spans several nodes), in numeric GPU order."""
    samples = list(samples)
    multi_node = len({s.node for s in samples}) > 1
    by_key: dict[str, GpuHistory] = {}

    def key_of(node: str, gpu: str) -> str:
        return f"{node}:{gpu}" if multi_node else gpu

    for sample in samples:
        h = by_key.setdefault(key_of(sample.node, sample.gpu), GpuHistory(key_of(sample.node, sample.gpu), sample.gpu, sample.node))
        if sample.model and h.model == "?":
            h.model = sample.model
            spec = spec_for_sample(sample)
            if spec is not None:
                for dtype in spec.peak_flops:
                    roof = roof_for(spec.name, dtype, spec.peak_flops, spec.mem_bandwidth_bytes_per_s)
                    if roof:
                        h.roofs[dtype] = roof
        job = (sample.attribution.job_id if sample.attribution else None) or (sample.workload.job if sample.workload else None)
        if job and job not in h.jobs:
            h.jobs.append(job)
        h.labelled = h.labelled or sample.label is not None
    for verdict in verdicts:
        key = key_of(verdict.node, verdict.gpu)
        by_key.setdefault(key, GpuHistory(key, verdict.gpu, verdict.node)).verdicts.append(verdict)
    for h in by_key.values():
        h.verdicts.sort(key=lambda v: v.window_end)
    return sorted(by_key.values(), key=lambda h: (h.node, gpu_order(h.gpu)))


def build_report(samples: Sequence[GpuSample], verdicts: Sequence[Verdict], *, title: str | None = None,
                 sources: Sequence[str] = ()) -> str:
    """The whole page. ``sources`` names the trace files in the footer."""
    gpus = histories(samples, verdicts)
    start = min(s.ts - (s.interval_s or 0.0) for s in samples)
    end = max(s.ts for s in samples)
    nodes = sorted({s.node for s in samples})
    title = title or f"roofwatch report · {', '.join(nodes)} · {_utc(start)}"
    body = [
        f"<h1>{esc(title)}</h1>",
        f'<p class="muted">{esc(", ".join(nodes))} · {_utc(start)} – {_utc(end)} ({_duration(end - start)}) · '
        f"{len(gpus)} GPUs · {len(samples)} samples · {len(verdicts)} verdicts</p>",
        _summary_table(gpus),
        _findings(gpus),
        "<h2>Verdict timeline</h2>", _timeline(gpus, start, end), _legend(),
        f'<h2>MFU over time <span class="muted small">(of {PEAKS["mfu"]}; the 20% and 40% lines judge compute-bound '
        "GPUs)</span></h2>", _mfu_chart(gpus, start, end),
        "<h2>Roofline</h2>", _scatter(gpus),
        serving_section(verdicts),
        f"<footer>roofwatch {esc(__version__)} report of {esc(', '.join(sources) or 'a trace')}, generated "
        f"{_utc(time.time())}. Classes, thresholds and sources: docs/classification.md.</footer>",
    ]
    return page(title, "".join(body), extra_css=REPORT_CSS)


def _summary_table(gpus: list[GpuHistory]) -> str:
    rows = []
    for h in gpus:
        spent = h.durations()
        total = sum(spent.values())
        dominant = spent.most_common(1)[0][0] if spent else None
        waste = h.waste()
        lost = pct(waste.share(waste.lost))
        rows.append(
            f'<tr data-gpu="{esc(h.key)}"><td>{esc(h.key)}</td><td>{esc(h.model)}</td><td>{esc(", ".join(h.jobs) or "—")}</td>'
            f"<td>{_share_bar(spent, total)}</td><td>{class_badge(dominant) if dominant else '—'}</td>"
            + "".join(f'<td class="num" title="{esc(judgement(dominant).matters)}">'
                      f'{figure_html(dominant, f, _mean(h.figure_values(f)), h.figure_source(f), named=False)}</td>'
                      for f in ("mfu", "mbu")) +
            f'<td class="num" data-measure="windows">{pct(waste.share(waste.wasted))}</td>'
            f'<td class="num" data-measure="lost">{"≥ " + lost if waste.unmeasured else lost}</td>'
            f'<td class="num" data-measure="spare">{pct(waste.share(waste.spare))}</td>'
            f'<td class="num">{pct(h.throttled_s() / total if total else None)}</td></tr>'
        )
    return ('<h2>At a glance</h2><table id="summary"><tr><th>GPU</th><th>model</th><th>job</th><th>time per class</th>'
            f'<th>mostly</th><th>mean MFU (of {PEAKS["mfu"]})</th><th>mean MBU (of {PEAKS["mbu"]})</th>'
            f'<th title="{esc(MEASURES["windows"])}">wasted (whole windows)</th>'
            f'<th title="{esc(MEASURES["lost"])}">time lost</th><th>spare (nobody held it)</th><th>throttled</th></tr>'
            + "".join(rows) + "</table>" + _measures_note()
            + '<p class="muted small" id="judging">Colour judges the figure that matters for the class the GPU was mostly '
              "in (agent.model.judging): MFU for compute-bound, MBU for memory-bound; grey where neither judges it "
              "(hover a cell for what does).</p>")


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _measures_note() -> str:
    return (f'<p class="muted small" id="measures">Wasted (agent/model/waste.py): held idle, input-starved or '
            f'communication-jittered; an idle GPU nobody holds is spare capacity, not waste. Wasted counts '
            f'{esc(MEASURES["windows"])}. Time lost counts {esc(MEASURES["lost"])}; "≥" where a jittered GPU\'s wait '
            f"is not measured.</p>")


def _share_bar(spent: Counter[str], total: float) -> str:
    if not total:
        return '<span class="muted">no verdicts</span>'
    cells = "".join(
        f'<span style="width:{spent[c] / total * 100:.1f}%;background:{class_colour(c)}" '
        f'title="{esc(class_label(c))}: {pct(spent[c] / total)}"></span>'
        for c in WORKLOAD_CLASSES if spent[c] > 0)
    return f'<span class="share">{cells}</span>'


def _findings(gpus: list[GpuHistory]) -> str:
    """The GPUs that lost the most time, worst first. The headline is the lost-time measure, the one the reason
    beside it gives ("no kernel ran in 46% of the time"); the share of whole windows follows, named as such."""
    items = []
    for h in gpus:
        waste = h.waste()
        windows = waste.share(waste.wasted)
        if windows is None or windows < 0.05:
            continue
        cls, run, verdict = _longest_wasted_run(h)
        who = f" ({esc(', '.join(h.jobs))})" if h.jobs else ""
        why = f": {esc(verdict.reasons[0])}" if verdict is not None and verdict.reasons else ""
        lost = waste.share(waste.lost) or 0.0
        headline = (f"lost {'at least ' if waste.unmeasured else ''}{pct(lost)} of its time{why}" if lost or not
                    waste.unmeasured else f"lost time not measured (no wait counter, no rank spread){why}")
        kinds = {v.cls for _, _, v in h.spans() if waste_of(v).wasted}
        what = class_label(cls) if len(kinds) == 1 else "wasted"
        items.append(((lost, windows), f'<li data-gpu="{esc(h.key)}" data-lost="{lost:.4f}" data-windows="{windows:.4f}">'
                      f"GPU {esc(h.key)}{who} {headline}; {esc(what)} in {pct(windows)} of its windows (whole "
                      f"windows); longest run {esc(class_label(cls))} for {_duration(run)}</li>"))
    low = [h for h in gpus if h.mfu_values() and sum(h.mfu_values()) / len(h.mfu_values()) < MFU_POOR
           and h.durations().most_common(1)[0][0] == "compute_bound"]
    for h in low:
        items.append(((0.0, 0.0), f'<li data-gpu="{esc(h.key)}">GPU {esc(h.key)} is compute-bound at a mean MFU under '
                                  f"{MFU_POOR:.0%}: check the precision and the clocks</li>"))
    if not items:
        return ('<h2>Findings</h2><p id="findings">No GPU was wasted (held idle, input-starved or '
                "communication-jittered) in more than 5% of its windows.</p>")
    items.sort(key=lambda kv: kv[0], reverse=True)
    return '<h2>Findings</h2><ul id="findings">' + "".join(text for _, text in items) + "</ul>"


def _longest_wasted_run(h: GpuHistory) -> tuple[str | None, float, Verdict | None]:
    """The class, length and first verdict of the GPU's longest run of wasted windows (agent.model.waste)."""
    best: tuple[str | None, float, Verdict | None] = (None, 0.0, None)
    run: tuple[str, float, float, Verdict] | None = None
    for start, end, verdict in h.spans():
        if not waste_of(verdict).wasted:
            run = None
            continue
        if run is not None and run[0] == verdict.cls and abs(run[2] - start) < 1e-6:
            run = (run[0], run[1], end, run[3])
        else:
            run = (verdict.cls, start, end, verdict)
        if run[2] - run[1] > best[1]:
            best = (run[0], run[2] - run[1], run[3])
    return best


def _runs(h: GpuHistory, attribute: str = "cls") -> list[tuple[Any, float, float, Verdict]]:
    """Consecutive spans with the same ``attribute`` (the class, ``throttled``, the labelled ``truth``) merged:
    (value, start, end, first verdict of the run). Spans without a value are left out."""
    runs: list[tuple[Any, float, float, Verdict]] = []
    for start, end, verdict in h.spans():
        value = getattr(verdict, attribute)
        if value is None:
            continue
        if runs and runs[-1][0] == value and abs(runs[-1][2] - start) < 1e-6:
            runs[-1] = (value, runs[-1][1], end, runs[-1][3])
        else:
            runs.append((value, start, end, verdict))
    return runs


_W, _LEFT, _RIGHT, _ROW, _GAP = 960, 90, 16, 22, 8


def _timeline(gpus: list[GpuHistory], start: float, end: float) -> str:
    x = LinearScale(start, end, _LEFT, _W - _RIGHT)
    rows: list[str] = []
    y = 8.0
    for h in gpus:
        rows.append(text(_LEFT - 8, y + _ROW * 0.7, f"GPU {h.key}", anchor="end", cls="tick"))
        for cls, run_start, run_end, first in _runs(h):
            run_start = max(run_start, start)  # the first window reaches back before the trace began
            rows.append(f'<rect x="{num(x(run_start))}" y="{num(y)}" width="{num(max(x(run_end) - x(run_start), 0.5))}" '
                        f'height="{_ROW}" fill="{class_colour(cls)}" class="run" data-gpu="{esc(h.key)}" data-class="{cls}">'
                        f"<title>GPU {esc(h.key)} {esc(class_label(cls))} {_utc(run_start)} – {_utc(run_end)}"
                        f"{esc(': ' + first.reasons[0]) if first.reasons else ''}</title></rect>")
        for throttled, run_start, run_end, _ in _runs(h, "throttled"):
            if throttled:
                rows.append(line(x(max(run_start, start)), y - 2, x(run_end), y - 2, "throttle"))
        y += _ROW
        if h.labelled:
            rows += _truth_row(h, x, y)
            y += 8
        y += _GAP
    height = y + 24
    axis = _time_axis(x, start, end, height - 24, 8)
    return (f'<svg id="timeline" viewBox="0 0 {_W} {num(height)}" class="chart" role="img" '
            f'aria-label="verdict per GPU over time">{axis}{"".join(rows)}</svg>')


def _truth_row(h: GpuHistory, x: LinearScale, y: float) -> list[str]:
    """Labelled traces: a thin strip of the true class under the verdicts, to see where they differ."""
    return [f'<rect x="{num(x(max(start, x.lo)))}" y="{num(y + 1)}" width="{num(max(x(end) - x(max(start, x.lo)), 0.5))}" '
            f'height="5" fill="{class_colour(truth)}" class="truth"><title>labelled {esc(class_label(truth))}</title></rect>'
            for truth, start, end, _ in _runs(h, "truth")]


def _time_axis(x: LinearScale, start: float, end: float, bottom: float, top: float) -> str:
    step = _tick_step(end - start)
    first = (int(start // step) + 1) * step
    parts = []
    t = first
    while t < end:
        parts.append(line(x(t), top, x(t), bottom, "grid"))
        parts.append(text(x(t), bottom + 14, _clock(t, step), anchor="middle", cls="tick"))
        t += step
    return "".join(parts)


_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)


def _tick_step(span: float) -> int:
    return next((s for s in _STEPS if span / s <= 10), _STEPS[-1] * (int(span / _STEPS[-1] / 10) + 1))


def _mfu_chart(gpus: list[GpuHistory], start: float, end: float) -> str:
    height = 260
    x = LinearScale(start, end, _LEFT, _W - _RIGHT)
    series = [(h, [(v.window_end, v.roofline.mfu) for v in h.verdicts if v.roofline.mfu is not None]) for h in gpus]
    series = [(h, pts) for h, pts in series if pts]
    if not series:
        return '<p class="muted" id="mfu">No MFU in this trace: no tensor counter and no workload reports.</p>'
    top = max(0.5, max(m for _, pts in series for _, m in pts) * 1.1)
    y = LinearScale(0.0, min(top, 1.0), height - 24, 8)
    parts = [_time_axis(x, start, end, height - 24, 8)]
    for level in (0.0, 0.25, 0.5, 0.75, 1.0):
        if level <= y.hi:
            parts.append(text(_LEFT - 6, y(level) + 4, f"{level:.0%}", anchor="end", cls="tick"))
    for level, name in ((MFU_POOR, "poor"), (MFU_TARGET, "target")):
        parts.append(line(_LEFT, y(level), _W - _RIGHT, y(level), f"band {name}"))
        parts.append(text(_W - _RIGHT - 4, y(level) - 4, f"compute-bound {name} {level:.0%}", anchor="end", cls="tick"))
    legend = []
    for i, (h, pts) in enumerate(series):
        colour = SERIES_COLOURS[i % len(SERIES_COLOURS)]
        thinned = _thin_mean(pts, MAX_LINE_POINTS)
        parts.append(polyline([(x(t), y(m)) for t, m in thinned], "mfu-line",
                              f' stroke="{colour}" data-gpu="{esc(h.key)}" data-points="{len(thinned)}"'))
        legend.append(f'<span class="chip" style="background:{colour}">GPU {esc(h.key)}</span>')
    return (f'<svg id="mfu" viewBox="0 0 {_W} {height}" class="chart" role="img" aria-label="MFU per GPU over time">'
            + "".join(parts) + f'</svg><div class="summary">{"".join(legend)}</div>')


def _thin_mean(points: list[tuple[float, float]], limit: int) -> list[tuple[float, float]]:
    """At most ``limit`` points: consecutive buckets averaged, so a dip survives thinning as a dip."""
    if len(points) <= limit:
        return points
    size = len(points) / limit
    out = []
    for i in range(limit):
        bucket = points[int(i * size): int((i + 1) * size)] or [points[int(i * size)]]
        out.append((bucket[-1][0], sum(m for _, m in bucket) / len(bucket)))
    return out


def _scatter(gpus: list[GpuHistory]) -> str:
    roofs: list[Roof] = []
    points: list[ChartPoint] = []
    for h in gpus:
        chosen = h.verdicts[:: max(1, -(-len(h.verdicts) // MAX_SCATTER_POINTS))]
        for v in chosen:
            rl = v.roofline
            roof = h.roofs.get(rl.dtype)
            if roof and roof not in roofs:
                roofs.append(roof)
            intensity, flops, reported = position(rl.achieved_flops, rl.achieved_bytes_per_s, rl.mfu_workload, rl.peak_flops)
            points.append(ChartPoint(intensity, flops, v.cls, "",
                                     f"GPU {h.key} {_utc(v.window_end)}: {class_label(v.cls)}, "
                                     f"{judged_figures(v.cls, {'mfu': rl.mfu, 'mbu': rl.mbu})}"
                                     + (" (from the job's reported FLOPs)" if reported else ""), reported))
    plotted = sum(1 for p in points if p.plottable)
    note = (f'<p class="muted small">{plotted} of {len(points)} windows plotted (idle windows and windows without a FLOP '
            "counter, workload report or DRAM traffic have no position); colour = class, hollow = placed from the "
            "job's reported FLOPs.</p>")
    return roofline_svg(roofs, points, radius=3.5, opacity=0.55, chart_id="roofline") + note


def _legend() -> str:
    chips = "".join(f'<span class="chip" style="background:{class_colour(c)}">{esc(CLASS_LABELS[c])}</span>'
                    for c in WORKLOAD_CLASSES)
    return (f'<div class="summary">{chips}<span class="chip" style="background:#fff;border:1px solid #f2495c">'
            "red line above: throttled</span></div>")


def _utc(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts))


def _clock(ts: float, step: int) -> str:
    return time.strftime("%H:%M" if step >= 60 else "%H:%M:%S", time.gmtime(ts))


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h {minutes:02d}m" if hours else (f"{minutes}m {secs:02d}s" if minutes else f"{secs}s")


REPORT_CSS = """
svg.chart{width:100%;max-width:1100px;height:auto;background:#fff;border:1px solid #ddd;border-radius:6px}
svg.chart .grid{stroke:#eee}
svg.chart .tick{font-size:11px;fill:#555}
svg.chart .throttle{stroke:#f2495c;stroke-width:3}
svg.chart .mfu-line{fill:none;stroke-width:1.8}
svg.chart .band{stroke-dasharray:6 5;stroke-width:1}
svg.chart .band.poor{stroke:#f2495c}
svg.chart .band.target{stroke:#73bf69}
#summary td{white-space:nowrap}
#summary td:nth-child(2){white-space:normal;min-width:120px}
.share{display:inline-flex;width:160px;height:12px;border-radius:3px;overflow:hidden;background:#eee;vertical-align:middle}
.share span{display:block;height:100%}
#findings li{margin:3px 0}
"""
