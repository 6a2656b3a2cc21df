"""Pieces both HTML views use: the page shell, the stylesheet, class badges, bars and number
formatting. Everything is inline: a page must open from a file or behind a strict CSP with no
network access beyond its own agent."""

from __future__ import annotations

import base64
import hashlib

from agent.model.judging import NAMES, PEAKS, Figure, judgement
from agent.views.palette import CLASS_COLOURS, class_colour, class_label, figure_colour, mfu_colour
from agent.views.roofline_chart import CHART_CSS
from agent.views.svg import esc

BASE_CSS = """
*{box-sizing:border-box}
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;margin:0;padding:16px 24px;color:#1d1d1f;background:#f6f7f9}
h1{font-size:22px;margin:0 0 4px}
h2{font-size:17px;margin:24px 0 8px}
a{color:#1f60c4}
.muted{color:#666}
.small{font-size:12px}
.banner{padding:8px 12px;border-radius:6px;margin:8px 0;background:#fdecea;color:#8a1c12;border:1px solid #f5c2bd}
.summary{display:flex;flex-wrap:wrap;gap:6px;margin:8px 0}
.chip{display:inline-block;padding:2px 8px;border-radius:10px;font-size:12px;color:#111;white-space:nowrap}
.badge{display:inline-block;padding:3px 10px;border-radius:4px;font-weight:600;font-size:13px;color:#111}
.badge.dark{color:#fff}
.pill{display:inline-block;padding:1px 6px;border-radius:8px;font-size:11px;background:#f2495c;color:#fff;margin-left:4px}
.bar{display:grid;grid-template-columns:56px 1fr 44px;align-items:center;gap:6px;font-size:12px;margin:2px 0}
.bar .track{height:8px;background:#e8e8ea;border-radius:4px;overflow:hidden}
.bar .fill{height:100%;background:#5794f2}
table{border-collapse:collapse;background:#fff;font-size:13px}
th,td{padding:4px 10px;text-align:left;border-bottom:1px solid #eee;vertical-align:top}
th{font-weight:600;background:#fafafa}
td.num{text-align:right;font-variant-numeric:tabular-nums}
footer{margin-top:24px;font-size:12px;color:#666}
""" + CHART_CSS

_DARK_TEXT_ON = {CLASS_COLOURS["unknown"], CLASS_COLOURS["communication_jittered"]}


def pct(value: float | None, digits: int = 0) -> str:
    return "—" if value is None else f"{value * 100:.{digits}f}%"


def fmt(value: float | None, unit: str, digits: int = 0) -> str:
    return "—" if value is None else f"{value:.{digits}f} {unit}"


def class_badge(cls: str | None, extra: str = "") -> str:
    colour = class_colour(cls)
    dark = " dark" if colour in _DARK_TEXT_ON else ""
    return (f'<span class="badge{dark}" style="background:{colour}" data-class="{esc(cls or "unknown")}">'
            f'{esc(class_label(cls))}{esc(extra)}</span>')


def class_chip(cls: str, text: str) -> str:
    colour = class_colour(cls)
    style = f"background:{colour}" + (";color:#fff" if colour in _DARK_TEXT_ON else "")
    return f'<span class="chip" style="{style}">{esc(text)}</span>'


def bar(label: str, value: float | None, colour: str = "#5794f2") -> str:
    width = 0.0 if value is None else max(0.0, min(1.0, value)) * 100
    return (f'<div class="bar" data-metric="{esc(label)}"><span>{esc(label)}</span><span class="track">'
            f'<span class="fill" style="display:block;width:{width:.0f}%;background:{colour}"></span></span>'
            f'<span class="num">{pct(value)}</span></div>')


SOURCE_NOTES = {"workload": "reported by the job", "counters": "counter estimate"}
"""Where an MFU or MBU came from: a counter estimate says so, since it is not what the job reported."""
SHORT_NOTES = {"workload": "reported", "counters": "est."}
"""The same in a table cell whose header names the figure and its peak."""


def mfu_html(mfu: float | None, source: str | None) -> str:
    """MFU in its band colour (a figure that judges on its own: the fleet's, a trace's compute-bound GPU); a GPU's
    own figures take :func:`figure_html`."""
    note = SOURCE_NOTES.get(source or "", "not measurable")
    return (f'<span class="mfu" style="color:{mfu_colour(mfu)}" data-mfu="{"" if mfu is None else f"{mfu:.4f}"}">'
            f'{pct(mfu)}</span> <span class="muted small">MFU · {esc(note)}</span>')


def figure_html(cls: str | None, figure: Figure, value: float | None, source: str | None, *, named: bool = True) -> str:
    """A GPU's MFU or MBU named with its reference (the peak; ``named=False`` in a table cell whose header names it,
    with a short note), in its band colour where it judges the GPU's class and grey where it does not
    (agent.model.judging): a memory-bound decode's low MFU is not painted red."""
    judged = judgement(cls).figure == figure
    note = (SOURCE_NOTES if named else SHORT_NOTES).get(source or "", "not measurable" if named else "")
    data = "" if value is None else f"{value:.4f}"
    return (f'<span class="figure {figure}{" judged" if judged else ""}" style="color:{figure_colour(cls, figure, value)}" '
            f'data-{figure}="{data}" data-judged="{"yes" if judged else "no"}">{pct(value)}</span> '
            f'<span class="muted small">{f"{NAMES[figure]} of {PEAKS[figure]} · " if named else ""}{esc(note)}</span>')


def figures_html(cls: str | None, figures: dict[str, tuple[float | None, str | None]]) -> str:
    """MFU and MBU (``figures``: name -> (value, source)), the one that judges the class first, then what matters
    for the class in a line of its own (agent.model.judging.Judgement.matters)."""
    verdict = judgement(cls)
    order: tuple[Figure, Figure] = ("mbu", "mfu") if verdict.figure == "mbu" else ("mfu", "mbu")
    lead, other = (figure_html(cls, f, *figures.get(f, (None, None))) for f in order)
    return (f'<div class="figures lead">{lead}</div><div class="figures other">{other}</div>'
            f'<div class="judged small muted" data-judged-by="{verdict.figure or "none"}">{esc(verdict.matters)}</div>')


def script_hash(script: str) -> str:
    """The CSP source for one inline script, so the page needs no ``'unsafe-inline'`` scripts."""
    return "'sha256-" + base64.b64encode(hashlib.sha256(script.encode()).digest()).decode() + "'"


def page(title: str, body: str, *, script: str = "", body_attrs: str = "", extra_css: str = "") -> str:
    tag = f"<script>{script}</script>" if script else ""
    return ("<!doctype html><html lang='en'><head><meta charset='utf-8'>"
            "<meta name='viewport' content='width=device-width,initial-scale=1'>"
            f"<title>{esc(title)}</title><style>{BASE_CSS}{extra_css}</style></head>"
            f"<body{body_attrs}>{body}{tag}</body></html>")
