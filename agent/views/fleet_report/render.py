"""The fleet report as one self-contained HTML page (the look of ``roofwatch report``: same
palette, shell and stylesheet), with the computed numbers embedded as JSON for machines.

Sections: the headline numbers against the previous period, GPU-hours by class, waste by
cluster, namespace and user, the worst jobs with their verdict reasons, the MFU distribution
against the 40% target, straggler/jitter incidents, energy, the dcgm verdicts (``--source dcgm``),
the definitions, and what could not be computed.
"""

from __future__ import annotations

import math
import time

from agent import __version__
from agent.classifier.thresholds import Thresholds
from agent.model.waste import MEASURES
from agent.views.fleet_report.collect import FleetReport, finite
from agent.views.fleet_report.data import DEFAULT_COST_PER_GPU_HOUR, USEFUL_CLASSES
from agent.views.fleet_report.queries import STRAGGLER_LEAD, STRAGGLER_MIN_GPUS
from agent.views.fleet_report.render_tables import (WASTE_COLUMNS, class_table, hours, incidents_table, jobs_table, usd,
                                                    waste_table)
from agent.views.fleet_report.window import span_text
from agent.views.html_parts import page, pct
from agent.views.palette import MFU_TARGET, class_label, mfu_colour
from agent.views.svg import LinearScale, esc, line, num, text

FLEET_CSS = """
.cards{display:flex;flex-wrap:wrap;gap:10px;margin:10px 0}
.card{background:#fff;border:1px solid #ddd;border-radius:6px;padding:8px 14px;min-width:170px}
.card .v{font-size:22px;font-weight:600}
.card .d{font-size:12px}
.up{color:#c4162a}.down{color:#37872d}
.share{display:flex;width:220px;height:12px;border-radius:3px;overflow:hidden;background:#e8e8ea}
.share span{display:block;height:100%}
table.wide{width:100%;max-width:1400px}
svg.chart{width:100%;max-width:900px;height:auto;background:#fff;border:1px solid #ddd;border-radius:6px}
svg.chart .grid{stroke:#eee}
svg.chart .tick{font-size:11px;fill:#555}
svg.chart .target{stroke:#c4162a;stroke-width:2;stroke-dasharray:6 4}
dl.defs dt{font-weight:600;margin-top:6px}
dl.defs dd{margin-left:16px}
"""


def build_page(report: FleetReport, *, title: str | None = None) -> str:
    w = report.window
    scope = f"cluster {report.cluster}" if report.cluster else "all clusters"
    title = title or f"roofwatch fleet report · {scope} · {_utc(w.start)} – {_utc(w.end)}"
    data = report.to_json_text().replace("<", "\\u003c")  # strict JSON: no NaN or Infinity tokens
    body = [
        f"<h1>{esc(title)}</h1>",
        f'<p class="muted">{_utc(w.start)} – {_utc(w.end)} ({span_text(w.range_s)}), compared with the '
        f"{span_text(w.range_s)} before · {esc(scope)} · source: {esc(report.source)} · sampled every "
        f"{span_text(w.step_s)}</p>",
        _problems_banner(report),
        _cards(report),
    ]
    if report.source == "aggregates":  # what the global store cannot answer, said once, not shown as zeros
        body.append('<ul class="muted small" id="aggregates-notes">' + "".join(
            f"<li><b>{esc(section)}</b>: {esc(note)}</li>" for section, note in report.notes.items()
            if section != "Waste by namespace") + "</ul>")
    if report.source in ("roofwatch", "aggregates"):
        body += [
            "<h2>GPU-hours by class</h2>", class_table(report.fleet),
            "<h2>Wasted GPU-hours and their cost</h2>",
            f'<p class="muted small">Wasted = {" + ".join(t for _, t in WASTE_COLUMNS)} GPU-hours, counted in '
            f'{esc(MEASURES["windows"])}. Idle-allocated: idle while a process or a job held the GPU; an idle GPU nobody '
            "held is spare capacity, not waste. * marks a price assumed, not configured.</p>",
            "<h3>By cluster</h3>", waste_table(report.fleet, ("cluster",), "waste-cluster"),
            f'<p class="muted small" id="shared-rule">{esc(SHARED_RULE)}</p>',
            "<h3>By namespace</h3>", _namespaces(report),
            "<h3>By user</h3>", '<p class="muted small">GPUs a job held (roofwatch_gpu_job_info), and the shares of '
            "shared GPUs held by Slurm jobs and processes (roofwatch_gpu_holder_info).</p>",
            waste_table(report.users, ("cluster", "user"), "waste-user", extra=BILL_COLUMNS,
                        empty=report.notes.get("Waste by user", "No GPUs held by a job in this period.")),
            "<h3>By Slurm account</h3>",
            waste_table(report.accounts, ("cluster", "account"), "waste-account", extra=BILL_COLUMNS,
                        empty=report.notes.get("Bill by account", "No GPUs held by a Slurm account in this period.")),
            "<h2>Worst jobs</h2>", jobs_table(report.jobs),
            "<h2>MFU distribution</h2>", _mfu_section(report),
            "<h2>Straggler and jitter incidents</h2>", _incidents(report),
            "<h2>Energy</h2>", _energy(report),
        ]
    if report.dcgm is not None:
        from agent.views.fleet_report.render_dcgm import dcgm_section
        body += ["<h2>GPU-hours by class</h2>", class_table(report.fleet), dcgm_section(report.dcgm)]
    if report.amd is not None:
        from agent.views.fleet_report.render_dcgm import amd_section
        body += ["<h2>GPU-hours by class</h2>", class_table(report.fleet), amd_section(report.amd)]
    body += [_definitions(report), "<h2>What this report could not compute</h2>", _problems(report),
             f'<script type="application/json" id="fleet-data">{data}</script>',
             f"<footer>roofwatch {esc(__version__)} fleet report, {report.queries} queries, generated "
             f"{_utc(time.time())}. Definitions and limits: docs/fleet-report.md.</footer>"]
    return page(title, "".join(body), extra_css=FLEET_CSS)


def _cards(report: FleetReport) -> str:
    now, before = finite(report.totals()), finite(report.previous)
    cards = [("GPU-hours", "gpu_hours", hours, False), ("wasted GPU-hours (whole verdict windows)", "wasted_gpu_hours", hours, True),
             ("wasted cost", "wasted_cost_usd", usd, True), ("idle-allocated GPU-hours", "idle_allocated_gpu_hours", hours, True),
             ("busy MFU (mean)", "mfu_mean", pct, False), ("kWh per useful GPU-hour", "kwh_per_useful_gpu_hour",
                                                           lambda v: "—" if v is None else f"{v:.2f}", True)]
    if report.source not in ("roofwatch", "aggregates"):
        cards = cards[:1] + cards[4:5]
    out = []
    for label, key, show, lower_is_better in cards:
        value, old = now.get(key), before.get(key)
        delta = ""
        if isinstance(value, (int, float)) and isinstance(old, (int, float)):
            change = value - old
            worse = change > 0 if lower_is_better else change < 0
            css = "up" if worse and change else "down" if change else "muted"
            delta = f'<div class="d {css}">{"+" if change > 0 else ""}{show(change)} vs previous ({show(old)})</div>'
        elif before:
            delta = '<div class="d muted">no previous value</div>'
        out.append(f'<div class="card" data-card="{key}"><div class="muted small">{esc(label)}</div>'
                   f'<div class="v">{show(value)}</div>{delta}</div>')
    return '<div class="cards">' + "".join(out) + "</div>"


def _mfu_section(report: FleetReport) -> str:
    mfu = report.mfu
    histogram = {int(k): float(v) for k, v in dict(mfu.get("histogram") or {}).items()}
    if not histogram and report.source == "aggregates" and mfu.get("mean") is not None:
        return (f'<p data-mfu-mean="{mfu.get("mean")}">Mean {pct(_f(mfu.get("mean")), 1)} over '
                f'{hours(_f(mfu.get("busy_gpu_hours")))} busy GPU-hours (the clusters\' means weighted by their busy '
                "GPUs; the distribution is in each cluster's own store).</p>")
    if not histogram:
        return '<p class="muted">No MFU readings from busy GPUs in this period.</p>'
    width, height, left, bottom, top = 900, 260, 50, 225, 15
    x = LinearScale(0, 100, left, width - 20)
    peak = max(histogram.values())
    y = LinearScale(0, peak, bottom, top)
    parts = [f'<svg class="chart" id="mfu-histogram" viewBox="0 0 {width} {height}" role="img" '
             f'aria-label="Busy GPU-hours per percent of MFU">']
    for tick in range(0, 101, 10):
        parts.append(line(x(tick), top, x(tick), bottom, "grid"))
        parts.append(text(x(tick), bottom + 16, f"{tick}%", cls="tick", anchor="middle"))
    parts.append(text(left - 6, top + 8, hours(peak), cls="tick", anchor="end"))
    parts.append(text(left - 6, bottom, "0", cls="tick", anchor="end"))
    for bucket, value in sorted(histogram.items()):
        bar_top = y(value)
        parts.append(f'<rect x="{num(x(bucket) + 0.5)}" y="{num(bar_top)}" width="{num(x(1) - x(0) - 1)}" '
                     f'height="{num(bottom - bar_top)}" fill="{mfu_colour(bucket / 100)}"><title>{bucket}%: '
                     f"{hours(value)} GPU-h</title></rect>")
    parts.append(line(x(MFU_TARGET * 100), top, x(MFU_TARGET * 100), bottom, "target"))
    parts.append(text(x(MFU_TARGET * 100) + 4, top + 10, f"target {MFU_TARGET:.0%}", cls="tick"))
    parts.append(text(width / 2, height - 4, "MFU of busy GPU-time (workload-reported, else counter estimate)",
                      cls="tick", anchor="middle"))
    parts.append("</svg>")
    stats = (f'<p data-mfu-mean="{mfu.get("mean")}">Mean {pct(_f(mfu.get("mean")), 1)} · p10 {pct(_f(mfu.get("p10")))} · '
             f'median {pct(_f(mfu.get("p50")))} · p90 {pct(_f(mfu.get("p90")))} · '
             f'<b>{pct(_f(mfu.get("below_target_share")))}</b> of {hours(_f(mfu.get("busy_gpu_hours")))} busy GPU-hours '
             f"below the {MFU_TARGET:.0%} target. Idle GPU-time is left out.</p>")
    return "".join(parts) + stats


def _incidents(report: FleetReport) -> str:
    return (
        "<h3>Stragglers</h3>" + _stragglers(report)
        + "<h3>Communication jitter</h3>" + incidents_table(
            report.jitter, (("cluster", "cluster"), ("job_id", "job"), ("hours", "hours with >50% of GPUs jittered")),
            "jitter", "No job had most of its GPUs communication-jittered (roofwatch_job:gpu_class:ratio).")
        + "<h3>Firing alerts</h3>" + incidents_table(
            report.alerts, (("alertname", "alert"), ("cluster", "cluster"), ("job_id", "job"), ("hours", "firing hours")),
            "alerts", "No efficiency alert fired (ALERTS series), or this store does not keep them."))


def _stragglers(report: FleetReport) -> str:
    """Two rules, each stated above its table and again where it finds nothing: the alert's (a lead over the job's
    median, in jobs of 3 GPUs or more) and the classifier's (the busiest rank while another computes less, from 2
    ranks), which the status page shows: so the report never says "no stragglers" beside a page that names one."""
    lead = f"led its job's median tensor activity by more than {STRAGGLER_LEAD:.0%}"
    jobs = f"a job of {STRAGGLER_MIN_GPUS} or more GPUs"
    named_rule = (f"the classifier's rule, the one the status page shows: a job's busiest rank while another rank "
                  f"computes at least {Thresholds().rank_skew:.0%} less (classifier.rank_skew, its default), "
                  "from 2 ranks (verdict detail straggler)")
    columns = (("cluster", "cluster"), ("job_id", "job"), ("node", "node"), ("gpu", "GPU"))
    return (
        f'<p class="muted small">Led the job\'s median: a GPU of {esc(jobs)} that {esc(lead)} '
        "(roofwatch:gpu_straggler_lead:ratio, GpuJobStraggler's rule; with two GPUs the median is their mean).</p>"
        + incidents_table(report.stragglers, (*columns, ("hours", "hours above the lead threshold"),
                                              ("peak_lead", "peak lead")),
                          "stragglers", f"No straggler by this rule: no GPU of {jobs} {lead}.")
        + f'<p class="muted small">Named by its verdict: {esc(named_rule)}.</p>'
        + incidents_table(report.named_stragglers, (*columns, ("hours", "hours named the straggler")),
                          "named-stragglers", "No straggler by this rule: no verdict named a GPU its job's straggler."))


def _energy(report: FleetReport) -> str:
    totals = report.totals()
    by_cluster = dict(report.energy.get("by_cluster") or {})  # type: ignore[call-overload]
    rows = "".join(f'<tr><td>{esc(c or "(none)")}</td><td class="num">{float(v):,.1f}</td></tr>' for c, v in sorted(by_cluster.items()))
    return (f'<p>{hours(_f(totals.get("energy_kwh")))} kWh for {hours(_f(totals.get("useful_gpu_hours")))} useful GPU-hours: '
            f'<b>{_f(totals.get("kwh_per_useful_gpu_hour")) or 0:.2f} kWh per useful GPU-hour</b> (all GPUs\' energy, idle '
            "ones too, over the hours spent in " + ", ".join(class_label(c) for c in USEFUL_CLASSES) + ").</p>"
            + (f"<table><tr><th>cluster</th><th>kWh</th></tr>{rows}</table>" if rows else ""))


def _definitions(report: FleetReport) -> str:
    prices = ", ".join(f"{esc(k)} ${v:g}" for k, v in sorted(report.prices.rates.items())) or "none configured"
    default = (f"${report.prices.default:g} (configured)" if report.prices.default_configured
               else f"${DEFAULT_COST_PER_GPU_HOUR:g} (assumed; set --cost-per-gpu-hour default=USD)")
    return (
        '<h2>Definitions</h2><dl class="defs">'
        "<dt>GPU-hours</dt><dd>Each GPU counts one step for every query step it reported a class "
        f"(every {span_text(report.window.step_s)}), so a GPU present half the period counts half.</dd>"
        "<dt>Wasted GPU-hours</dt><dd>Hours a GPU was " + ", ".join(t for _, t in WASTE_COLUMNS)
        + " (agent/model/waste.py, the definition the status page, top and the alerts use). Idle-allocated: idle "
        "while a process held device memory or the scheduler allocated the GPU (verdict detail idle_held); an idle GPU "
        "nobody held (idle_free) is spare capacity, not waste. Measured in " + esc(MEASURES["windows"])
        + "; idle-allocated alone is the lower bound. The user and account tables count the GPUs a job held "
        "(roofwatch_gpu_job_info) and the shares of shared GPUs its holders held, the namespace table those a "
        "Kubernetes pod held, by the shared-GPU rule above.</dd>"
        "<dt>Useful GPU-hours</dt><dd>Hours classified " + ", ".join(class_label(c) for c in USEFUL_CLASSES) + ".</dd>"
        f"<dt>Cost</dt><dd>GPU-hours × $/GPU-hour of the GPU's model: {prices}; other models {default}.</dd>"
        f"<dt>MFU</dt><dd>The job's reported MFU where it reports one, else the counter estimate; busy GPU-time only. "
        f"Target {MFU_TARGET:.0%}.</dd></dl>")


SHARED_RULE = ("A whole GPU counts whole for its pod's namespace and for its job's user and Slurm account. A shared GPU "
               "(time-sliced, a shared DRA claim, MPS, Slurm jobs sharing a GPU) counts an equal share for each holder "
               "the agent names on it: its GPU-hours in the GPU's class, or as idle-allocated when that holder itself "
               "held memory and ran nothing; its kWh is the agent's estimate per holder (busy energy by SM-time share, "
               "the idle floor evenly). A holder is billed to its pod's namespace, or to its Slurm job's user and account "
               "(a plain process: to its owner); pods carry no user, and holders with no pod (MPS clients, Slurm jobs, "
               "plain processes) are in no namespace. MFU: whole GPUs' busy MFU and holders' own reported MFU; a shared "
               "GPU's counters mix its holders, so they are no one's.")
"""The shared GPUs' rule, stated once on the page above the namespace, user and account tables (docs/attribution.md,
"The bill")."""

BILL_COLUMNS = (("kWh", lambda g: "—" if g.kwh is None else f"{g.kwh:,.2f}"), ("busy MFU", lambda g: pct(g.mfu)))
"""The bills' columns after the waste columns: each group's energy and busy MFU."""


def _namespaces(report: FleetReport) -> str:
    """The namespace table, or why it is empty: outside Kubernetes that is expected, said in a neutral note."""
    note = report.notes.get("Waste by namespace")
    if note and not report.namespaces:
        return f'<p class="muted" id="waste-namespace-note">{esc(note)}</p>'
    return waste_table(report.namespaces, ("cluster", "namespace"), "waste-namespace",
                       empty="No GPUs held by a Kubernetes pod in this period.", extra=BILL_COLUMNS)


def _problems_banner(report: FleetReport) -> str:
    if not report.problems:
        return ""
    sections = sorted({p.section for p in report.problems})
    late = (f" The --deadline of {report.deadline_s:g} s passed before {report.not_run} more queries could run."
            if report.not_run and report.deadline_s is not None else "")
    return f'<div class="banner">Incomplete: {esc(", ".join(sections))} (see the last section).{esc(late)}</div>'


def _problems(report: FleetReport) -> str:
    if not report.problems:
        return '<p class="muted" id="problems">Nothing: every query answered.</p>'
    rows = "".join(f"<tr><td>{esc(p.section)}</td><td>{esc(p.error)}</td><td class='small'><code>{esc(p.query[:600])}</code>"
                   "</td></tr>" for p in report.problems)
    return f'<table id="problems" class="wide"><tr><th>section</th><th>why</th><th>query</th></tr>{rows}</table>'


def _f(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def _utc(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(ts))
