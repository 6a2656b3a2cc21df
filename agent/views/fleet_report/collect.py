"""Runs the report's queries into a :class:`FleetReport`, section by section.

A section whose query fails (a metric the fleet does not export, a recording rule not loaded,
a server-side timeout, an answer past a cap) becomes a :class:`Problem` on the page and the rest
goes on; so do NaN and +-Inf samples an answer carried (left out, counted per query). Only a
server that cannot be reached at all stops the report (:class:`Unreachable`).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from agent.views.fleet_report.data import Group, Prices, Problem, group_rows, percentile, share_below, skipped_text
from agent.views.fleet_report.promapi import Answer, PromClient, PromError, Series
from agent.views.fleet_report.queries import Queries
from agent.views.fleet_report.window import Window
from agent.views.palette import MFU_TARGET

Progress = Callable[[str], None]
NO_NAMESPACES = ("No GPU was held by a Kubernetes pod in this period (no roofwatch_gpu_pod_info): expected for GPUs "
                 "outside Kubernetes. Their waste is counted in the cluster table, and by user where a job holds them.")
NO_ACCOUNTS = ("No GPU was held by a Slurm job with an account in this period (no account label on roofwatch_gpu_job_info "
               "or roofwatch_gpu_holder_info): expected outside Slurm. Their waste is counted by user and by cluster.")


class Unreachable(Exception):
    """The server did not answer at all: nothing in the report could be computed."""


@dataclass
class FleetReport:
    """Everything the page shows; ``to_json`` is embedded in the page for machines and tests."""

    window: Window
    cluster: str | None
    prices: Prices
    source: str = "roofwatch"
    fleet: list[Group] = field(default_factory=list)
    """Every GPU, held or not, by cluster."""
    held: list[Group] = field(default_factory=list)
    """GPUs a job held, by cluster (whole, whoever holds a share of a shared one)."""
    users: list[Group] = field(default_factory=list)
    """The user bill: whole GPUs by their job's user, shared GPUs by each holder's share (docs/attribution.md)."""
    namespaces: list[Group] = field(default_factory=list)
    accounts: list[Group] = field(default_factory=list)
    """The Slurm account bill, by the same rule as the user and namespace bills."""
    jobs: list[Group] = field(default_factory=list)
    mfu: dict[str, object] = field(default_factory=dict)
    stragglers: list[dict[str, object]] = field(default_factory=list)
    """GPUs that led their job's median tensor activity (jobs of at least queries.STRAGGLER_MIN_GPUS GPUs)."""
    named_stragglers: list[dict[str, object]] = field(default_factory=list)
    """GPUs the classifier named their job's straggler (detail ``straggler``: the status page's rule)."""
    jitter: list[dict[str, object]] = field(default_factory=list)
    alerts: list[dict[str, object]] = field(default_factory=list)
    energy: dict[str, object] = field(default_factory=dict)
    previous: dict[str, object] = field(default_factory=dict)
    dcgm: dict[str, object] | None = None
    amd: dict[str, object] | None = None
    problems: list[Problem] = field(default_factory=list)
    notes: dict[str, str] = field(default_factory=dict)
    """Sections empty for an expected reason (no namespaces outside Kubernetes): said on the page, not problems."""
    queries: int = 0
    deadline_s: float | None = None
    """The command's ``--deadline`` (None: not run by the command)."""
    not_run: int = 0
    """Queries not sent because that deadline had passed (each is also a problem)."""
    generated: float = field(default_factory=time.time)

    def totals(self) -> dict[str, object]:
        return _totals(self.fleet, self.held, self.energy, self.mfu)

    def to_json(self) -> dict[str, object]:
        """The numbers as plain data, every float finite (a non-finite one, say a sum that overflowed,
        is ``None``), so that strict JSON holds them."""
        w = self.window
        return finite({
            "window": {"start": w.start, "end": w.end, "range_s": w.range_s, "step_s": w.step_s},
            "cluster": self.cluster, "source": self.source, "generated": self.generated, "queries": self.queries,
            "deadline_s": self.deadline_s, "not_run": self.not_run,
            "prices": {"rates": self.prices.rates, "default": self.prices.default,
                       "default_configured": self.prices.default_configured},
            "totals": self.totals(), "previous": self.previous,
            "clusters": [g.to_json() for g in self.fleet], "held_by_cluster": [g.to_json() for g in self.held],
            "users": [g.to_json() for g in self.users], "namespaces": [g.to_json() for g in self.namespaces],
            "accounts": [g.to_json() for g in self.accounts],
            "jobs": [g.to_json() for g in self.jobs], "mfu": self.mfu, "stragglers": self.stragglers,
            "named_stragglers": self.named_stragglers, "notes": self.notes,
            "jitter": self.jitter, "alerts": self.alerts, "energy": self.energy, "dcgm": self.dcgm, "amd": self.amd,
            "problems": [p.to_json() for p in self.problems],
        })

    def to_json_text(self, indent: int | None = None) -> str:
        """:meth:`to_json` as strict JSON (no ``NaN``/``Infinity`` tokens): how the report writes JSON."""
        return json.dumps(self.to_json(), indent=indent, sort_keys=True, allow_nan=False)


def finite(value: Any) -> Any:
    """``value`` with every non-finite float in its dicts and lists replaced by ``None``."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def _totals(fleet: list[Group], held: list[Group], energy: dict[str, object], mfu: dict[str, object]) -> dict[str, object]:
    """The headline numbers. Waste is counted over every GPU (agent.model.waste: a GPU a process holds is
    wasted while idle whether or not a job names it), ``held_gpu_hours`` over the GPUs a job held."""
    useful = sum(g.useful for g in fleet)
    kwh = energy.get("kwh")
    return {
        "gpu_hours": round(sum(g.total for g in fleet), 6),
        "gpu_hours_by_class": {c: round(sum(g.hours.get(c, 0.0) for g in fleet), 6) for c in (fleet[0].hours if fleet else {})},
        "held_gpu_hours": round(sum(g.total for g in held), 6),
        "waste_measure": "windows",
        "wasted_gpu_hours": round(sum(g.wasted for g in fleet), 6),
        "idle_allocated_gpu_hours": round(sum(g.idle_allocated for g in fleet), 6),
        "spare_gpu_hours": round(sum(g.spare for g in fleet), 6),
        "wasted_cost_usd": round(sum(g.wasted_cost for g in fleet), 4),
        "cost_usd": round(sum(g.cost for g in fleet), 4),
        "useful_gpu_hours": round(useful, 6),
        "mfu_mean": mfu.get("mean"),
        "energy_kwh": kwh,
        "kwh_per_useful_gpu_hour": (round(float(kwh) / useful, 6) if isinstance(kwh, (int, float)) and useful > 0 else None),
    }


class _Runner:
    """One query at a time, counting them, reporting progress, turning failures into problems."""

    def __init__(self, client: PromClient, report: FleetReport, progress: Progress) -> None:
        self.client, self.report, self.progress = client, report, progress

    def instant(self, section: str, expr: str, at: float) -> list[Series] | None:
        self.progress(section)
        try:
            answer = self.client.query(expr, at)
        except PromError as exc:
            if exc.unreachable and self.client.queries <= 1:
                raise Unreachable(str(exc)) from None
            self.report.problems.append(Problem(section, str(exc), expr))
            return None
        finally:
            self.report.queries = self.client.queries
        self.skipped(section, answer, expr)
        return answer

    def skipped(self, section: str, answer: Answer, expr: str) -> None:
        if answer.skipped:
            self.report.problems.append(Problem(section, skipped_text(answer.skipped), expr))

    def missing(self, section: str, what: str, expr: str) -> None:
        self.report.problems.append(Problem(section, f"no data: {what}", expr))


def collect(client: PromClient, window: Window, *, cluster: str | None, prices: Prices, top: int = 25,
            progress: Progress = lambda _: None) -> FleetReport:
    """The roofwatch-source report: every section, each from one or two bounded queries."""
    report = FleetReport(window=window, cluster=cluster, prices=prices)
    run = _Runner(client, report, progress)
    q = Queries(window, cluster, top)

    def rows(answer: list[Series] | None) -> list[tuple[dict[str, str], float]]:
        return [(s.labels, s.value) for s in answer or []]

    fleet = run.instant("GPU-hours by class", q.class_hours_fleet(), window.end)
    if fleet == []:
        run.missing("GPU-hours by class", "no roofwatch_gpu_workload_class series in the period", q.class_hours_fleet())
    report.fleet = group_rows(rows(fleet), ("cluster",), prices)
    held = run.instant("Waste by user", q.class_hours_by_user(), window.end)
    if held == []:
        run.missing("Waste by user", "no GPU held by a job (roofwatch_gpu_job_info) in the period", q.class_hours_by_user())
    report.held = group_rows(rows(held), ("cluster",), prices)
    for label, section, attr, note in (("namespace", "Waste by namespace", "namespaces", NO_NAMESPACES),
                                       ("user", "Bill by user", "users", None),
                                       ("account", "Bill by account", "accounts", NO_ACCOUNTS)):
        answer = run.instant(section, q.class_hours_billed(label), window.end)
        if answer == [] and note:  # expected outside Kubernetes, outside Slurm: a note, not a problem
            report.notes[section] = note
        groups = group_rows(rows(answer), ("cluster", label), prices)
        setattr(report, attr, groups)
        if groups:
            _bill(run, q, groups, label, window)
    _jobs(run, q, report, window)
    _mfu(run, q, report, window)
    _incidents(run, q, report, window)
    energy = run.instant("Energy", q.energy_kwh(), window.end)
    if energy is not None:
        report.energy = {"kwh": round(sum(s.value for s in energy), 6),
                         "by_cluster": {s.labels.get("cluster", ""): round(s.value, 6) for s in energy}}
    _previous(run, Queries(window.previous, cluster, top), report, prices)
    return report


def _bill(run: _Runner, q: Queries, groups: list[Group], label: str, window: Window) -> None:
    """Each group's kWh (whole GPUs' counters, shared GPUs' holder estimates) and busy MFU (whole GPUs, and
    holders' own reported MFU) for the bill by ``label`` (namespace, user, account)."""
    by_key = {(g.key["cluster"], g.key[label]): g for g in groups}
    for section, expr, attr in ((f"Energy by {label}", q.energy_kwh_billed(label), "kwh"),
                                (f"MFU by {label}", q.mfu_billed(label), "mfu")):
        for s in run.instant(section, expr, window.end) or []:
            group = by_key.get((s.labels.get("cluster", ""), s.labels.get(label, "")))
            if group is not None and s.value == s.value:
                setattr(group, attr, s.value)


def _jobs(run: _Runner, q: Queries, report: FleetReport, window: Window) -> None:
    worst = run.instant("Worst jobs", q.worst_jobs(), window.end)
    names = sorted({s.labels.get("job_id", "") for s in worst or [] if s.value > 0})
    if not names:
        return
    detail = run.instant("Worst jobs", q.class_hours_of_jobs(names), window.end)
    jobs = group_rows([(s.labels, s.value) for s in detail or []], ("cluster", "job_id", "user"), report.prices)
    by_job = {(g.key["cluster"], g.key["job_id"]): g for g in jobs}
    for s in run.instant("MFU of the worst jobs", q.mfu_of_jobs(names), window.end) or []:
        group = by_job.get((s.labels.get("cluster", ""), s.labels.get("job_id", "")))
        if group is not None and s.value == s.value:
            group.mfu = s.value
    for s in run.instant("Verdict reasons", q.reasons_of_jobs(names), window.end) or []:
        group = by_job.get((s.labels.get("cluster", ""), s.labels.get("job_id", "")))
        if group is not None and s.value > 0:
            group.reasons.append({"class": s.labels.get("class", ""), "detail": s.labels.get("detail", ""),
                                  "gpu_hours": round(s.value, 6)})
    for group in jobs:
        group.reasons.sort(key=lambda r: -float(r["gpu_hours"]))  # type: ignore[arg-type]
    report.jobs = [g for g in jobs if g.wasted > 0][: q.top]


def _mfu(run: _Runner, q: Queries, report: FleetReport, window: Window) -> None:
    answer = run.instant("MFU distribution", q.mfu_histogram(), window.end)
    histogram: dict[int, float] = {}
    for s in answer or []:
        try:
            histogram[min(100, max(0, int(float(s.labels.get("bucket", "")))))] = s.value
        except ValueError:
            continue
    means = run.instant("MFU distribution", q.mfu_mean(), window.end)
    fleet = run.instant("MFU distribution", q.mfu_mean(by=""), window.end)
    if answer == [] and not fleet:
        run.missing("MFU distribution", "no roofwatch_gpu_mfu_ratio while GPUs were busy", q.mfu_histogram())
    busy_hours = sum(histogram.values())
    mean = fleet[0].value if fleet else None
    report.mfu = {
        "target": MFU_TARGET, "busy_gpu_hours": round(busy_hours, 6),
        "histogram": {str(b): round(h, 6) for b, h in sorted(histogram.items())},
        "mean": None if mean is None or mean != mean else round(mean, 6),
        "by_cluster": {s.labels.get("cluster", ""): round(s.value, 6) for s in means or [] if s.value == s.value},
        "p10": _round(percentile(histogram, 0.1)), "p50": _round(percentile(histogram, 0.5)),
        "p90": _round(percentile(histogram, 0.9)),
        "below_target_share": _round(share_below(histogram, MFU_TARGET)),
    }


def _incidents(run: _Runner, q: Queries, report: FleetReport, window: Window) -> None:
    hours = run.instant("Stragglers", q.straggler_hours(), window.end)
    peaks = {tuple(s.labels.get(k, "") for k in ("cluster", "job_id", "node", "gpu")): s.value
             for s in run.instant("Stragglers", q.straggler_peak(), window.end) or []}
    named = run.instant("Stragglers", q.classifier_straggler_hours(), window.end)
    report.named_stragglers = sorted(({"cluster": s.labels.get("cluster", ""), "job_id": s.labels.get("job_id", ""),
                                       "node": s.labels.get("node", ""), "gpu": s.labels.get("gpu", ""),
                                       "hours": round(s.value, 6)} for s in named or [] if s.value > 0),
                                     key=lambda r: -float(r["hours"]))
    report.stragglers = sorted(({"cluster": s.labels.get("cluster", ""), "job_id": s.labels.get("job_id", ""),
                                 "node": s.labels.get("node", ""), "gpu": s.labels.get("gpu", ""),
                                 "hours": round(s.value, 6),
                                 "peak_lead": _round(peaks.get(tuple(s.labels.get(k, "") for k in
                                                                    ("cluster", "job_id", "node", "gpu"))))}
                                for s in hours or [] if s.value > 0), key=lambda r: -float(r["hours"]))
    jitter = run.instant("Communication jitter", q.jitter_hours(), window.end)
    report.jitter = sorted(({"cluster": s.labels.get("cluster", ""), "job_id": s.labels.get("job_id", ""),
                             "hours": round(s.value, 6)} for s in jitter or [] if s.value > 0),
                           key=lambda r: -float(r["hours"]))
    alerts = run.instant("Alerts", q.alert_hours(), window.end)
    report.alerts = sorted(({"alertname": s.labels.get("alertname", ""), "cluster": s.labels.get("cluster", ""),
                             "job_id": s.labels.get("job_id", ""), "hours": round(s.value, 6)}
                            for s in alerts or [] if s.value > 0), key=lambda r: -float(r["hours"]))


def _previous(run: _Runner, q: Queries, report: FleetReport, prices: Prices) -> None:
    """The same totals over the period before, for the trend column."""
    at = q.w.end
    fleet = run.instant("Trend (previous period)", q.class_hours_fleet(), at)
    users = run.instant("Trend (previous period)", q.class_hours_by_user(), at)
    means = run.instant("Trend (previous period)", q.mfu_mean(by=""), at)
    energy = run.instant("Trend (previous period)", q.energy_kwh(), at)
    rows_f = [(s.labels, s.value) for s in fleet or []]
    rows_u = [(s.labels, s.value) for s in users or []]
    mfu = {"mean": round(means[0].value, 6) if means and means[0].value == means[0].value else None}
    kwh = {"kwh": round(sum(s.value for s in energy), 6)} if energy else {}
    report.previous = {"start": q.w.start, "end": q.w.end,
                       **_totals(group_rows(rows_f, ("cluster",), prices), group_rows(rows_u, ("cluster",), prices), kwh, mfu)}


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 6)
