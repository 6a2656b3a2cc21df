"""``--source aggregates``: the report from the global store, which holds no per-GPU series.

A fleet of many clusters sends only its recording rules' aggregates to one global store (docs/deploy.md,
"The global layer": the ``roofwatch_cluster:``, ``roofwatch_job:`` and ``roofwatch_namespace:`` families).
This reads those alone, so the report works there and costs a few thousand series per query at any fleet
size. The figures are the per-GPU report's, computed the same way: GPU-hours are the sum over the
window's steps of the GPUs counted at each (``roofwatch_cluster:gpus:sum`` is the count of GPUs per class
that the per-GPU query counts one by one), waste the same ``waste`` labels, the busy MFU the cluster means
weighted by the busy GPUs they average over; tests/test_fleet_report_global.py holds the headline figures
equal to the per-GPU report's on one synthetic fleet.

What needs a GPU's own series is not there, and the page says so (``notes``) rather than showing zeros:
the MFU histogram and its percentiles, the GPU model (every GPU-hour is priced at ``--cost-per-gpu-hour
default=``), users (a label of roofwatch_gpu_job_info), stragglers per GPU, the verdict reasons of a job
and the ALERTS series. Energy is the sum of the hourly recordings, so the window should be whole hours.
"""

from __future__ import annotations

from agent.model.waste import NOT_WASTED, WASTE_KINDS
from agent.views.fleet_report.collect import FleetReport, Progress, _Runner, _totals
from agent.views.fleet_report.data import Group, Prices, group_rows
from agent.views.fleet_report.promapi import PromClient, Series
from agent.views.fleet_report.promql import any_of, equals
from agent.views.fleet_report.queries import Queries
from agent.views.fleet_report.window import Window
from agent.views.palette import MFU_TARGET

SOURCE = "aggregates"
HOUR_S = 3600
NOT_IDLE = 'class!="idle"'
NOT_IN_THE_GLOBAL_STORE = {
    "MFU distribution": "The global store holds each cluster's mean MFU, not each GPU's: the mean is here "
                        "(weighted by busy GPUs), the histogram and its percentiles are in each cluster's own store "
                        "(run the report there, or with --prometheus per cluster).",
    "Waste by user": "Users are a label of roofwatch_gpu_job_info, a per-GPU series that stays in each cluster's "
                     "store; the worst jobs below name the jobs.",
    "Bill by account": "Slurm accounts are a label of roofwatch_gpu_job_info and roofwatch_gpu_holder_info, per-GPU "
                       "series that stay in each cluster's store (run the report there, or with --prometheus per "
                       "cluster).",
    "Stragglers": "Stragglers are single GPUs: their series stay in each cluster's store.",
    "Alerts": "ALERTS series stay in each cluster's store (each cluster evaluates its own alerts).",
    "Cost": "The global store holds no GPU model: every GPU-hour is priced at --cost-per-gpu-hour default=.",
}


class AggregateQueries:
    """The queries over the aggregate families, for ``window``, optionally one ``cluster``."""

    def __init__(self, window: Window, cluster: str | None = None, top: int = 25) -> None:
        self.w, self.cluster, self.top = window, cluster, top

    def sel(self, metric: str, extra: str = "") -> str:
        parts = [equals("cluster", self.cluster)] if self.cluster is not None else []
        parts += [extra] if extra else []
        return metric + ("{" + ",".join(parts) + "}" if parts else "")

    def hours(self, metric: str, by: str, extra: str = "") -> str:
        """GPU-hours: the GPUs the recording counts, summed over the window's steps."""
        return (f"sum by ({by}) (sum_over_time({self.sel(metric, extra)}{self.w.subquery()}))"
                f" * {self.w.hours_per_point():.10g}")

    def class_hours(self) -> str:
        return self.hours("roofwatch_cluster:gpus:sum", "cluster, class")

    def waste_hours(self) -> str:
        return self.hours("roofwatch_cluster:gpus_by_waste:sum", "cluster, waste")

    def held_class_hours(self) -> str:
        return self.hours("roofwatch_job:gpus_by_class:sum", "cluster, class")

    def namespace_waste_hours(self) -> str:
        return self.hours("roofwatch_namespace:gpus_by_waste:sum", "cluster, namespace, waste")

    def worst_jobs(self) -> str:
        wasted = self.hours("roofwatch_job:gpus_by_waste:sum", "cluster, job_id", any_of("waste", WASTE_KINDS))
        return f"topk({self.top}, {wasted})"

    def job_class_hours(self, jobs: list[str]) -> str:
        return self.hours("roofwatch_job:gpus_by_class:sum", "cluster, job_id, class", any_of("job_id", jobs))

    def job_waste_hours(self, jobs: list[str]) -> str:
        return self.hours("roofwatch_job:gpus_by_waste:sum", "cluster, job_id, waste", any_of("job_id", jobs))

    def job_mfu(self, jobs: list[str]) -> str:
        return f"avg_over_time({self.sel('roofwatch_job:gpu_mfu:avg', any_of('job_id', jobs))}{self.w.subquery()})"

    def busy_gpus(self) -> str:
        """GPUs that are not idle per cluster, at each point: what roofwatch_cluster:gpu_mfu_busy:avg averages over."""
        return f"sum by (cluster) ({self.sel('roofwatch_cluster:gpus:sum', NOT_IDLE)})"

    def mfu_weighted(self, by: str = "cluster") -> str:
        """(sum over the window of busy MFU x busy GPUs, sum of busy GPUs): their ratio is the busy GPU-time mean."""
        agg = f"sum by ({by})" if by else "sum"
        sub = self.w.subquery()
        weighted = f"({self.sel('roofwatch_cluster:gpu_mfu_busy:avg')} * on (cluster) {self.busy_gpus()})"
        weights = f"({self.busy_gpus()} and on (cluster) {self.sel('roofwatch_cluster:gpu_mfu_busy:avg')})"
        return f"{agg} (sum_over_time({weighted}{sub})) / {agg} (sum_over_time({weights}{sub}))"

    def mfu_busy_hours(self) -> str:
        sub = self.w.subquery()
        weights = f"({self.busy_gpus()} and on (cluster) {self.sel('roofwatch_cluster:gpu_mfu_busy:avg')})"
        return f"sum (sum_over_time({weights}{sub})) * {self.w.hours_per_point():.10g}"

    def jitter_hours(self) -> str:
        """The per-GPU report's own query: it reads a per-job recording already."""
        return Queries(self.w, self.cluster, self.top).jitter_hours()

    def energy_kwh(self, metric: str = "roofwatch_cluster:gpu_energy_kwh:sum_1h", by: str = "cluster") -> str:
        """The hourly recordings summed over the window's whole hours."""
        return f"sum by ({by}) (sum_over_time({self.sel(metric)}[{self.w.range_s - 1}s:{HOUR_S}s]))"

    def namespace_energy_kwh(self) -> str:
        """Each namespace's kWh: whole GPUs' counters and shared GPUs' holder estimates (docs/attribution.md, "The bill")."""
        return self.energy_kwh("roofwatch_namespace:gpu_energy_kwh:sum_1h", "cluster, namespace")


def collect_aggregates(client: PromClient, window: Window, *, cluster: str | None, prices: Prices, top: int = 25,
                       progress: Progress = lambda _: None) -> FleetReport:
    """The report's sections that the aggregates answer, and a note for each that they cannot."""
    report = FleetReport(window=window, cluster=cluster, prices=prices, source=SOURCE)
    report.notes.update(NOT_IN_THE_GLOBAL_STORE)
    run = _Runner(client, report, progress)
    q = AggregateQueries(window, cluster, top)
    report.fleet = _fleet(run, q, prices, "GPU-hours by class")
    if report.fleet == []:
        run.missing("GPU-hours by class", "no roofwatch_cluster:gpus:sum in the period (is this the global store, "
                    "and do the clusters remote-write their aggregates?)", q.class_hours())
    report.held = group_rows(_rows(run.instant("Held GPU-hours", q.held_class_hours(), window.end)), ("cluster",), prices)
    namespaces = _rows(run.instant("Waste by namespace", q.namespace_waste_hours(), window.end))
    report.namespaces = _waste_groups(namespaces, ("cluster", "namespace"), prices)
    if report.namespaces:
        by_key = {(g.key["cluster"], g.key["namespace"]): g for g in report.namespaces}
        for s in run.instant("Energy by namespace", q.namespace_energy_kwh(), window.end) or []:
            group = by_key.get((s.labels.get("cluster", ""), s.labels.get("namespace", "")))
            if group is not None:
                group.kwh = s.value
    _jobs(run, q, report, window)
    report.mfu = _mfu(run, q, window)
    jitter = run.instant("Communication jitter", q.jitter_hours(), window.end)
    report.jitter = sorted(({"cluster": s.labels.get("cluster", ""), "job_id": s.labels.get("job_id", ""),
                             "hours": round(s.value, 6)} for s in jitter or [] if s.value > 0),
                           key=lambda r: -float(r["hours"]))
    energy = run.instant("Energy", q.energy_kwh(), window.end)
    if energy is not None:
        report.energy = {"kwh": round(sum(s.value for s in energy), 6),
                         "by_cluster": {s.labels.get("cluster", ""): round(s.value, 6) for s in energy}}
    report.previous = _previous(run, AggregateQueries(window.previous, cluster, top), prices)
    return report


def _rows(answer: list[Series] | None) -> list[tuple[dict[str, str], float]]:
    return [(s.labels, s.value) for s in answer or []]


def _fleet(run: _Runner, q: AggregateQueries, prices: Prices, section: str) -> list[Group]:
    """GPU-hours per class per cluster, with the hours per waste label of the same clusters."""
    classes = run.instant(section, q.class_hours(), q.w.end)
    if classes is None:
        return []
    groups = group_rows(_rows(classes), ("cluster",), prices)
    waste = _rows(run.instant(section, q.waste_hours(), q.w.end))
    return _set_waste(groups, waste, ("cluster",), prices)


def _set_waste(groups: list[Group], rows: list[tuple[dict[str, str], float]], keys: tuple[str, ...],
               prices: Prices) -> list[Group]:
    """``groups`` (hours per class, added with no waste label) with their hours per waste label from ``rows``."""
    rate, _ = prices.rate("", "")
    by_key = {tuple(g.key.values()): g for g in groups}
    for group in groups:
        group.waste_hours = dict.fromkeys(group.waste_hours, 0.0)
        group.waste_cost = dict.fromkeys(group.waste_cost, 0.0)
    for labels, hours in rows:
        group = by_key.get(tuple(labels.get(k, "") for k in keys))
        if group is not None:
            waste = labels.get("waste", NOT_WASTED)
            group.waste_hours[waste] = group.waste_hours.get(waste, 0.0) + hours
            group.waste_cost[waste] = group.waste_cost.get(waste, 0.0) + hours * rate
    return sorted(groups, key=lambda g: (-g.wasted_cost, -g.wasted, tuple(g.key.values())))


def _waste_groups(rows: list[tuple[dict[str, str], float]], keys: tuple[str, ...], prices: Prices) -> list[Group]:
    """Groups from hours per waste label alone (a namespace's classes do not cross): a GPU-hour is counted once,
    under its waste label, and its class left unknown."""
    groups = group_rows([({**labels, "class": "unknown"}, hours) for labels, hours in rows], keys, prices)
    return _set_waste(groups, rows, keys, prices)


def _jobs(run: _Runner, q: AggregateQueries, report: FleetReport, window: Window) -> None:
    worst = run.instant("Worst jobs", q.worst_jobs(), window.end)
    names = sorted({s.labels.get("job_id", "") for s in worst or [] if s.value > 0})
    if not names:
        return
    classes = _rows(run.instant("Worst jobs", q.job_class_hours(names), window.end))
    jobs = group_rows([({**labels, "user": ""}, hours) for labels, hours in classes], ("cluster", "job_id", "user"),
                      report.prices)
    waste = _rows(run.instant("Worst jobs", q.job_waste_hours(names), window.end))
    jobs = _set_waste(jobs, [({**labels, "user": ""}, hours) for labels, hours in waste], ("cluster", "job_id", "user"),
                      report.prices)
    by_job = {(g.key["cluster"], g.key["job_id"]): g for g in jobs}
    for s in run.instant("MFU of the worst jobs", q.job_mfu(names), window.end) or []:
        group = by_job.get((s.labels.get("cluster", ""), s.labels.get("job_id", "")))
        if group is not None and s.value == s.value:
            group.mfu = s.value
    report.jobs = [g for g in jobs if g.wasted > 0][: q.top]


def _mfu(run: _Runner, q: AggregateQueries, window: Window) -> dict[str, object]:
    fleet = run.instant("MFU distribution", q.mfu_weighted(by=""), window.end)
    means = run.instant("MFU distribution", q.mfu_weighted(), window.end)
    busy = run.instant("MFU distribution", q.mfu_busy_hours(), window.end)
    mean = fleet[0].value if fleet else None
    return {"target": MFU_TARGET, "busy_gpu_hours": round(busy[0].value, 6) if busy else 0.0, "histogram": {},
            "mean": None if mean is None or mean != mean else round(mean, 6),
            "by_cluster": {s.labels.get("cluster", ""): round(s.value, 6) for s in means or [] if s.value == s.value},
            "p10": None, "p50": None, "p90": None, "below_target_share": None}


def _previous(run: _Runner, q: AggregateQueries, prices: Prices) -> dict[str, object]:
    fleet = _fleet(run, q, prices, "Trend (previous period)")
    held = group_rows(_rows(run.instant("Trend (previous period)", q.held_class_hours(), q.w.end)), ("cluster",), prices)
    means = run.instant("Trend (previous period)", q.mfu_weighted(by=""), q.w.end)
    energy = run.instant("Trend (previous period)", q.energy_kwh(), q.w.end)
    mfu = {"mean": round(means[0].value, 6) if means and means[0].value == means[0].value else None}
    kwh = {"kwh": round(sum(s.value for s in energy), 6)} if energy else {}
    return {"start": q.w.start, "end": q.w.end, **_totals(fleet, held, kwh, mfu)}
