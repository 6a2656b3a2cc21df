"""The report's tables: GPU-hours by class, waste by cluster/namespace/user, the worst jobs, the
incidents and the dcgm verdicts. Rows carry ``data-*`` attributes so a reader (or a test) can find
them; every name in them comes from the store and is escaped (agent.views.svg.esc)."""

from __future__ import annotations

import math
from typing import Callable, Iterable, Sequence

from agent.model import WORKLOAD_CLASSES
from agent.model.waste import WASTE_KINDS
from agent.views.fleet_report.data import Group
from agent.views.html_parts import class_badge, pct
from agent.views.palette import class_colour, class_label, mfu_colour
from agent.views.svg import esc


DIGITS = 1
"""Decimals of the GPU-hour cells."""


def hours(value: float | None) -> str:
    return "—" if value is None or not math.isfinite(value) else f"{value:,.{DIGITS}f}"


def rounded_parts(values: Sequence[float], digits: int = DIGITS) -> list[float] | None:
    """``values`` rounded to ``digits`` so that they add up to their own rounded total (largest remainder):
    three cells of 0.14 h read 0.2, 0.1, 0.1 beside a row of 0.4, not 0.1 each. Each part moves by less than one
    unit of the last digit. None when a value is not finite or is negative (shown as they are)."""
    if not all(math.isfinite(v) and v >= 0 for v in values):
        return None
    scale = 10 ** digits
    exact = [v * scale for v in values]
    parts = [math.floor(x) for x in exact]
    short = round(math.fsum(exact)) - sum(parts)
    by_remainder = sorted(range(len(values)), key=lambda i: (-(exact[i] - parts[i]), i))
    for i in by_remainder[:max(0, short)]:
        parts[i] += 1
    return [p / scale for p in parts]


def hour_cells(values: Sequence[float]) -> list[str]:
    """The cells of ``values`` and, last, of their total, rounded together so the cells add up to it."""
    parts = rounded_parts(values)
    if parts is None:
        return [hours(v) for v in values] + [hours(math.fsum(values))]
    return [hours(p) for p in parts] + [hours(math.fsum(parts))]


def usd(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "—"
    return f"${value:,.0f}" if abs(value) >= 100 else f"${value:,.2f}"


def share_bar(group: Group) -> str:
    total = group.total
    if not total:
        return '<span class="muted">no GPU-hours</span>'
    cells = "".join(f'<span style="width:{group.hours[c] / total * 100:.1f}%;background:{class_colour(c)}" '
                    f'title="{esc(class_label(c))}: {hours(group.hours[c])} GPU-h"></span>'
                    for c in WORKLOAD_CLASSES if group.hours.get(c, 0) > 0)
    return f'<span class="share">{cells}</span>'


def _cell(group: Group, name: str) -> str:
    value = group.key.get(name, "")
    return f"<td>{esc(value) if value else '<span class=muted>(none)</span>'}</td>"


def class_table(groups: Sequence[Group], key: str = "cluster") -> str:
    """GPU-hours per class of every GPU, one row per cluster."""
    head = "".join(f"<th>{esc(class_label(c))}</th>" for c in WORKLOAD_CLASSES)
    rows = "".join(
        f'<tr data-{key}="{esc(g.key.get(key, ""))}">{_cell(g, key)}<td>{share_bar(g)}</td>'
        + "".join(f'<td class="num">{cell}</td>' for cell in hour_cells([g.hours.get(c, 0.0) for c in WORKLOAD_CLASSES]))
        + f'<td class="num">{usd(g.cost)}</td></tr>' for g in groups)
    return (f'<table class="wide"><tr><th>{esc(key)}</th><th>time per class</th>{head}<th>GPU-h</th><th>cost</th></tr>'
            f"{rows}</table>")


WASTE_TITLES = {"idle_held": "idle-allocated", "input_starved": "input-starved", "communication_jittered": "comm-jittered"}
WASTE_COLUMNS = tuple((kind, WASTE_TITLES[kind]) for kind in WASTE_KINDS)
"""The kinds of waste (agent.model.waste.WASTE_KINDS, in its order) and their column titles."""


def waste_table(groups: Sequence[Group], keys: Iterable[str], table_id: str, limit: int = 25,
                empty: str = "No GPUs in this period.",
                extra: Sequence[tuple[str, Callable[[Group], str]]] = ()) -> str:
    """GPU-hours and what of them was wasted (idle-allocated, starved, jittered) or spare, most costly first.
    The kinds' cells add up to the wasted cell as shown (:func:`hour_cells`). ``extra``: more columns (title,
    cell text) after those, such as the namespace bill's kWh and MFU."""
    keys = tuple(keys)
    if not groups:
        return f'<p class="muted" id="{table_id}-empty">{esc(empty)}</p>'
    rows = []
    for g in groups[:limit]:
        attrs = " ".join(f'data-{k}="{esc(g.key.get(k, ""))}"' for k in keys)
        cells = hour_cells([g.waste_hours.get(k, 0.0) for k, _ in WASTE_COLUMNS])
        rows.append(
            f"<tr {attrs}>" + "".join(_cell(g, k) for k in keys)
            + f'<td class="num">{hours(g.total)}</td>' + "".join(f'<td class="num">{c}</td>' for c in cells[:-1])
            + f'<td class="num"><b>{cells[-1]}</b></td><td class="num">{pct(g.wasted / g.total if g.total else None)}</td>'
            f'<td class="num"><b>{usd(g.wasted_cost)}</b>{"*" if g.assumed_price else ""}</td>'
            f'<td class="num muted">{hours(g.spare)}</td>'
            + "".join(f'<td class="num">{cell(g)}</td>' for _, cell in extra) + "</tr>")
    more = f'<p class="muted small">{len(groups) - limit} more rows in the JSON data.</p>' if len(groups) > limit else ""
    head = "".join(f"<th>{esc(k)}</th>" for k in keys) + "<th>GPU-h</th>"
    head += "".join(f"<th>{esc(title)}</th>" for _, title in WASTE_COLUMNS)
    return (f'<table id="{table_id}" class="wide"><tr>{head}<th>wasted GPU-h</th><th>wasted share</th><th>wasted cost</th>'
            f"<th>spare (idle, held by nobody)</th>{''.join(f'<th>{esc(t)}</th>' for t, _ in extra)}</tr>"
            f"{''.join(rows)}</table>{more}")


def jobs_table(jobs: Sequence[Group]) -> str:
    if not jobs:
        return '<p class="muted">No job wasted GPU-hours in this period.</p>'
    rows = []
    for g in jobs:
        dominant = max(WORKLOAD_CLASSES, key=lambda c: g.hours.get(c, 0.0))
        reasons = ", ".join(f'{esc(class_label(str(r["class"])))}/{esc(r["detail"])} ({hours(float(r["gpu_hours"]))} GPU-h)'
                            for r in g.reasons[:3]) or "—"
        mfu = f'<span style="color:{mfu_colour(g.mfu)}">{pct(g.mfu)}</span>'
        rows.append(
            f'<tr data-job="{esc(g.key.get("job_id", ""))}">{_cell(g, "job_id")}{_cell(g, "user")}{_cell(g, "cluster")}'
            f'<td>{share_bar(g)}</td><td>{class_badge(dominant)}</td><td class="num">{mfu}</td>'
            f'<td class="num">{hours(g.wasted)}</td><td class="num"><b>{usd(g.wasted_cost)}</b></td>'
            f'<td class="small">{reasons}</td></tr>')
    return ('<table id="jobs" class="wide"><tr><th>job</th><th>user</th><th>cluster</th><th>time per class</th><th>mostly</th>'
            '<th>busy MFU</th><th>wasted GPU-h</th><th>wasted cost</th><th>verdict reasons (GPU-hours)</th></tr>'
            + "".join(rows) + "</table>")


def incidents_table(rows: Sequence[dict[str, object]], columns: Sequence[tuple[str, str]], table_id: str, empty: str) -> str:
    if not rows:
        return f'<p class="muted">{esc(empty)}</p>'
    head = "".join(f"<th>{esc(title)}</th>" for _, title in columns)
    body = "".join("<tr>" + "".join(_incident_cell(row.get(name)) for name, _ in columns) + "</tr>" for row in rows)
    return f'<table id="{table_id}"><tr>{head}</tr>{body}</table>'


def _incident_cell(value: object) -> str:
    if isinstance(value, float):
        return f'<td class="num">{value:,.2f}</td>' if math.isfinite(value) else "<td>—</td>"
    return f"<td>{esc(value) if value not in (None, '') else '—'}</td>"
