"""The PromQL the report sends, one function per table, all pure (tested without a server).

Every GPU series carries ``node``, ``gpu`` and ``uuid`` (and ``cluster`` where relabelling adds
it), so joins match ``on (cluster, node, gpu, uuid)``: an absent cluster label is the empty value
on both sides. The right side of a join is reduced with ``max by`` to exactly the labels it
contributes, so ``instance``/``job`` target labels or a duplicate scrape cannot make it
many-to-many. Time totals are ``sum_over_time`` of a subquery sampled at the window's step: each
point counts one GPU present for one step, so a GPU that joined halfway counts half.

What each query returns is bounded by what it groups by (clusters, models, classes, users,
namespaces) or by ``topk`` on the server (jobs, stragglers), never one series per GPU.
"""

from __future__ import annotations

from agent.views.fleet_report.promql import equals, regex_of, string
from agent.views.fleet_report.window import Window

KEY = "cluster, node, gpu, uuid"
ON = f"on ({KEY})"
WASTED_RE = "idle|input_starved|communication_jittered"
STRAGGLER_LEAD = 0.15
"""roofwatch:alert_threshold:straggler_lead_ratio in deploy/prometheus/roofwatch-rules.yml."""
JITTER_SHARE = 0.5
"""roofwatch:alert_threshold:comm_jittered_ratio in the same file."""
ALERT_NAMES = ("GpuJobStraggler", "GpuJobCommunicationJitter", "GpuIdleAllocated", "GpuInputStarved", "LowMFU")


class Queries:
    """The report's queries over ``window``, restricted to one ``cluster`` when given."""

    def __init__(self, window: Window, cluster: str | None = None, top: int = 25) -> None:
        self.w = window
        self.cluster = cluster
        self.top = top

    def sel(self, metric: str, **matchers: str) -> str:
        """``metric{cluster="C", name="value", name=~"regex"}``; a value starting with ``~`` is a regex."""
        items = [("cluster", self.cluster)] if self.cluster is not None else []
        items += list(matchers.items())
        parts = [f"{k}=~{string(v[1:])}" if v.startswith("~") else equals(k, v) for k, v in items]
        return metric + ("{" + ",".join(parts) + "}" if parts else "")

    # -- joins ----------------------------------------------------------------------------------
    def _model(self) -> str:
        return f"{ON} group_left (model, spec) max by ({KEY}, model, spec) ({self.sel('roofwatch_gpu_info')})"

    def _job(self, jobs: list[str] | None = None) -> str:
        info = self.sel("roofwatch_gpu_job_info", **({"job_id": "~" + regex_of(jobs)} if jobs else {}))
        return f"{ON} group_left (job_id, user) max by ({KEY}, job_id, user) ({info})"

    def _namespace(self) -> str:
        return f"{ON} group_left (namespace) max by ({KEY}, namespace) ({self.sel('roofwatch_gpu_pod_info')})"

    def _classes(self, wasted_only: bool = False) -> str:
        return self.sel("roofwatch_gpu_workload_class", **({"class": "~" + WASTED_RE} if wasted_only else {}))

    def _hours(self, inner: str, by: str) -> str:
        return f"sum by ({by}) (sum_over_time(({inner}){self.w.subquery()})) * {self.w.hours_per_point():.10g}"

    # -- tables -----------------------------------------------------------------------------------
    def class_hours_fleet(self) -> str:
        """GPU-hours per class of every GPU, held or not, by cluster and model."""
        return self._hours(f"{self._classes()} * {self._model()}", "cluster, model, spec, class")

    def class_hours_by_user(self) -> str:
        """GPU-hours per class of GPUs a job held, by cluster, user and model."""
        return self._hours(f"{self._classes()} * {self._job()} * {self._model()}", "cluster, user, model, spec, class")

    def class_hours_by_namespace(self) -> str:
        """GPU-hours per class of GPUs a Kubernetes pod held, by cluster, namespace and model."""
        return self._hours(f"{self._classes()} * {self._namespace()} * {self._model()}",
                           "cluster, namespace, model, spec, class")

    def worst_jobs(self) -> str:
        """The ``top`` jobs by wasted GPU-hours (ranked on the server)."""
        inner = self._hours(f"{self._classes(wasted_only=True)} * {self._job()} * {self._model()}",
                            "cluster, job_id, user, model, spec")
        return f"topk({self.top}, {inner})"

    def class_hours_of_jobs(self, jobs: list[str]) -> str:
        return self._hours(f"{self._classes()} * {self._job(jobs)} * {self._model()}",
                           "cluster, job_id, user, model, spec, class")

    def reasons_of_jobs(self, jobs: list[str]) -> str:
        """GPU-hours per published class and detail code (roofwatch_gpu_workload_reason_info)."""
        return self._hours(f"{self.sel('roofwatch_gpu_workload_reason_info')} * {self._job(jobs)}",
                           "cluster, job_id, class, detail")

    # -- MFU --------------------------------------------------------------------------------------
    def _mfu_busy(self) -> str:
        """The best MFU per GPU (as roofwatch:gpu_mfu:ratio: the workload's, else the counters'),
        left out while the GPU is idle, so idle capacity does not pile up at 0%."""
        best = (f"(max without (source, dtype) ({self.sel('roofwatch_gpu_mfu_ratio', source='workload')}) or "
                f"max without (source, dtype) ({self.sel('roofwatch_gpu_mfu_ratio', source='counters')}))")
        return f"({best} unless {ON} ({self.sel('roofwatch_gpu_workload_class', **{'class': 'idle'})} == 1))"

    def mfu_histogram(self) -> str:
        """Busy GPU-hours per whole percent of MFU: ``bucket="37"`` holds 37% <= MFU < 38%."""
        buckets = f'count_values("bucket", floor(clamp({self._mfu_busy()}, 0, 1) * 100 + 1e-6))'
        return self._hours(buckets, "bucket")

    def mfu_mean(self, by: str = "cluster") -> str:
        """Mean MFU over busy GPU-time, by cluster (or of the whole fleet with ``by=""``)."""
        sub = self.w.subquery()
        mfu = self._mfu_busy()
        agg = f"sum by ({by})" if by else "sum"
        return f"{agg} (sum_over_time({mfu}{sub})) / {agg} (count_over_time({mfu}{sub}))"

    def mfu_of_jobs(self, jobs: list[str]) -> str:
        sub = self.w.subquery()
        inner = f"({self._mfu_busy()} * {self._job(jobs)})"
        return (f"sum by (cluster, job_id) (sum_over_time({inner}{sub})) / "
                f"sum by (cluster, job_id) (count_over_time({inner}{sub}))")

    # -- incidents --------------------------------------------------------------------------------
    def straggler_hours(self) -> str:
        """Hours each GPU led its job's median tensor activity by more than the alert threshold."""
        lead = f"({self.sel('roofwatch:gpu_straggler_lead:ratio')} > {STRAGGLER_LEAD})"
        inner = f"sum by (cluster, job_id, node, gpu) (count_over_time({lead}{self.w.subquery()}))"
        return f"topk({self.top}, {inner} * {self.w.hours_per_point():.10g})"

    def straggler_peak(self) -> str:
        lead = f"({self.sel('roofwatch:gpu_straggler_lead:ratio')} > {STRAGGLER_LEAD})"
        return f"topk({self.top}, max by (cluster, job_id, node, gpu) (max_over_time({lead}{self.w.subquery()})))"

    def jitter_hours(self) -> str:
        """Hours more than half of a job's GPUs were communication-jittered."""
        share = f"({self.sel('roofwatch_job:gpu_class:ratio', **{'class': 'communication_jittered'})} > {JITTER_SHARE})"
        inner = f"sum by (cluster, job_id) (count_over_time({share}{self.w.subquery()}))"
        return f"topk({self.top}, {inner} * {self.w.hours_per_point():.10g})"

    def alert_hours(self) -> str:
        """Firing hours of the efficiency alerts (the ALERTS series Prometheus writes), by job."""
        alerts = self.sel("ALERTS", alertstate="firing", alertname="~" + "|".join(ALERT_NAMES))
        inner = f"sum by (alertname, cluster, job_id) (count_over_time({alerts}{self.w.subquery()}))"
        return f"topk({self.top}, {inner} * {self.w.hours_per_point():.10g})"

    # -- energy -----------------------------------------------------------------------------------
    def energy_kwh(self) -> str:
        """Energy by cluster over the window, from the agents' energy counters."""
        return (f"sum by (cluster) (increase({self.sel('roofwatch_gpu_energy_joules_total')}"
                f"[{self.w.range_s}s])) / 3.6e6")
