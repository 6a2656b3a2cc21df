"""The PromQL the report sends, one function per table, all pure (tested without a server).

Every GPU series carries ``node``, ``gpu`` and ``uuid`` (and ``cluster`` where relabelling adds
it), so joins match ``on (cluster, node, gpu, uuid)``: an absent cluster label is the empty value
on both sides. The right side of a join is reduced with ``max by`` to exactly the labels it
contributes, so ``instance``/``job`` target labels or a duplicate scrape cannot make it
many-to-many. Time totals are ``sum_over_time`` of a subquery sampled at the window's step: each
point counts one GPU present for one step, so a GPU that joined halfway counts half.

What each query returns is bounded by what it groups by (clusters, models, classes, users,
namespaces) or by ``topk`` on the server (jobs, stragglers), never one series per GPU.

Waste is agent/model/waste.py's, written in PromQL by :meth:`Queries.waste_classes`: every class
series gets a ``waste`` label (a value of ``WASTE_LABELS``), so each table counts the GPU-hours of
each kind of waste beside those of each class, from the same one query.
"""

from __future__ import annotations

from agent.model.waste import NOT_WASTED, SPARE, SPARE_DETAIL, WASTE_KINDS, WASTED_CLASSES
from agent.views.fleet_report.promql import equals, regex_of, string
from agent.views.fleet_report.window import Window

KEY = "cluster, node, gpu, uuid"
ON = f"on ({KEY})"
IDLE = "idle"
"""The one wasted class whose GPUs are wasted only when held (agent.model.waste.waste_of)."""
SELF_NAMED = tuple(c for c in WASTED_CLASSES if c != IDLE)
"""The wasted classes that are always waste, each its own kind: input_starved, communication_jittered."""
HELD_IDLE = next(k for k in WASTE_KINDS if k not in WASTED_CLASSES)
"""The kind of an idle GPU someone holds: idle_held."""
STRAGGLER_LEAD = 0.15
"""roofwatch:alert_threshold:straggler_lead_ratio in deploy/prometheus/roofwatch-rules.yml."""
STRAGGLER_MIN_GPUS = 3
"""GpuJobStraggler's ``roofwatch_job:gpus:count >= 3``: a lead over the job's median needs three ranks (with
two, the median is their mean and the faster one leads it by half their gap)."""
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
        """``metric{cluster="C", name="value", name=~"regex", name!~"regex"}``: a matcher value starting with ``~``
        is a regex, with ``!`` one it must not match (``--cluster`` is always a plain value)."""
        parts = [equals("cluster", self.cluster)] if self.cluster is not None else []
        parts += [f"{k}=~{string(v[1:])}" if v.startswith("~") else f"{k}!~{string(v[1:])}" if v.startswith("!")
                  else equals(k, v) for k, v in matchers.items()]
        return metric + ("{" + ",".join(parts) + "}" if parts else "")

    # -- joins ----------------------------------------------------------------------------------
    def _model(self) -> str:
        return f"{ON} group_left (model, spec) max by ({KEY}, model, spec) ({self.sel('roofwatch_gpu_info')})"

    def _job(self, jobs: list[str] | None = None) -> str:
        info = self.sel("roofwatch_gpu_job_info", **({"job_id": "~" + regex_of(jobs)} if jobs else {}))
        return f"{ON} group_left (job_id, user) max by ({KEY}, job_id, user) ({info})"

    def _namespace(self) -> str:
        return f"{ON} group_left (namespace) max by ({KEY}, namespace) ({self.sel('roofwatch_gpu_pod_info')})"

    def waste_classes(self, wasted_only: bool = False) -> str:
        """``roofwatch_gpu_workload_class`` with a ``waste`` label as agent.model.waste.waste_of gives it: an idle
        GPU is ``idle_held`` unless its reason series says ``idle_free`` (``spare``), input-starved and
        comm-jittered GPUs are their own kind, every other class ``none``; ``wasted_only`` keeps the kinds of
        waste alone. Agents also export this as the ``waste`` label of roofwatch_gpu_workload_reason_info; the
        report derives it from class and detail by the same rule instead, so that agents older than the label
        count the same, and no query joins on a label that changes with the verdict (in a store without
        staleness markers, a backfill, the old and new value overlap and such a join fails many-to-many)."""
        cls = "roofwatch_gpu_workload_class"
        free = f"{ON} {self.sel('roofwatch_gpu_workload_reason_info', **{'class': IDLE, 'detail': SPARE_DETAIL})}"
        idle = self.sel(cls, **{"class": IDLE})
        parts = [_labelled(f"{idle} unless {free}", HELD_IDLE),
                 f'label_replace({self.sel(cls, **{"class": "~" + regex_of(SELF_NAMED)})}, "waste", "$1", "class", "(.*)")']
        if not wasted_only:
            parts += [_labelled(f"{idle} and {free}", SPARE),
                      _labelled(self.sel(cls, **{"class": "!" + regex_of(WASTED_CLASSES)}), NOT_WASTED)]
        return "(" + " or ".join(parts) + ")"

    def _hours(self, inner: str, by: str) -> str:
        return f"sum by ({by}) (sum_over_time(({inner}){self.w.subquery()})) * {self.w.hours_per_point():.10g}"

    # -- tables -----------------------------------------------------------------------------------
    def class_hours_fleet(self) -> str:
        """GPU-hours per class of every GPU, held or not, by cluster and model."""
        return self._hours(f"{self.waste_classes()} * {self._model()}", "cluster, model, spec, class, waste")

    def class_hours_by_user(self) -> str:
        """GPU-hours per class of GPUs a job held, by cluster, user and model."""
        return self._hours(f"{self.waste_classes()} * {self._job()} * {self._model()}", "cluster, user, model, spec, class, waste")

    def class_hours_by_namespace(self) -> str:
        """GPU-hours per class of GPUs a Kubernetes pod held, by cluster, namespace and model: a whole GPU whole for
        its pod's namespace, a shared GPU by its holders' shares (:meth:`_shared_by_namespace`)."""
        whole = f"({self.waste_classes()} * {self._namespace()} unless {ON} {self._holder_energy()})"
        return self._hours(f"({whole} or {self._shared_by_namespace()}) * {self._model()}",
                           "cluster, namespace, model, spec, class, waste")

    # -- shared GPUs (docs/attribution.md, "The bill") ------------------------------------------------
    def _holder_energy(self, named: bool = False) -> str:
        """The per-holder energy series: every holder of a shared GPU has one (``named``: without the
        ``unattributed`` remainder, which is energy no holder explains, not a holder)."""
        return self.sel("roofwatch_gpu_holder_energy_joules_total", **({"holder": "!unattributed"} if named else {}))

    def _holder_shares(self) -> str:
        """Each holder's share of its shared GPU's time: an equal share for every holder the agent names (pods, jobs,
        processes, ``other``), as a time-sliced replica or a share of a DRA claim is an equal slot of the GPU.
        roofwatch:gpu_holder_share:ratio in deploy/prometheus/roofwatch-rules.yml records the same."""
        named = f"group by ({KEY}, holder) ({self._holder_energy(named=True)})"
        return f"({named} / {ON} group_left () count by ({KEY}) ({named}))"

    def _holder_namespace(self) -> str:
        info = self.sel("roofwatch_gpu_holder_info", namespace="!")
        return f"on ({KEY}, holder) group_left (namespace) max by ({KEY}, holder, namespace) ({info})"

    def _shared_by_namespace(self) -> str:
        """Each namespaced holder's share of its shared GPU with a class and waste: a holder whose own class is
        ``idle_held`` counts its share as idle and idle_held (the waste a shared GPU hides); any other holder its
        share in the GPU's class and waste. Holders with no namespace (MPS clients, plain processes, ``other``)
        are in no namespace, as a whole GPU no pod holds."""
        share = self._holder_shares()
        idle = f"max by ({KEY}, holder) ({self.sel('roofwatch_gpu_holder_class', **{'class': HELD_IDLE})})"
        own = (f'label_replace(label_replace({share} * on ({KEY}, holder) group_left () {idle}, '
               f'"waste", {string(HELD_IDLE)}, "", ""), "class", {string(IDLE)}, "", "")')
        gpu = f"max by ({KEY}, class, waste) ({self.waste_classes()} == 1)"
        rest = f"({share} unless on ({KEY}, holder) {idle}) * {ON} group_left (class, waste) {gpu}"
        return f"(({own} or {rest}) * {self._holder_namespace()})"

    def energy_kwh_by_namespace(self) -> str:
        """kWh by cluster and namespace over the window: a whole GPU's energy counter for its pod's namespace, each
        namespaced holder's estimated energy (the agent's split) on a GPU shared at any time in the window."""
        span = f"[{self.w.range_s}s]"
        holders = f"increase({self._holder_energy(named=True)}{span}) * {self._holder_namespace()}"
        whole = (f"(increase({self.sel('roofwatch_gpu_energy_joules_total')}{span}) unless {ON} "
                 f"count_over_time({self._holder_energy()}{span})) * {self._namespace()}")
        return f"sum by (cluster, namespace) ({holders} or {whole}) / 3.6e6"

    def mfu_by_namespace(self) -> str:
        """Mean busy MFU by cluster and namespace over the whole GPUs its pods held: a shared GPU's MFU is its
        holders' together, no one holder's (a holder's own MFU has no series yet)."""
        sub = self.w.subquery()
        inner = f"({self._mfu_busy()} * {self._namespace()} unless {ON} {self._holder_energy()})"
        return (f"sum by (cluster, namespace) (sum_over_time({inner}{sub})) / "
                f"sum by (cluster, namespace) (count_over_time({inner}{sub}))")

    def worst_jobs(self) -> str:
        """The ``top`` jobs by wasted GPU-hours (ranked on the server)."""
        inner = self._hours(f"{self.waste_classes(wasted_only=True)} * {self._job()} * {self._model()}",
                            "cluster, job_id, user, model, spec")
        return f"topk({self.top}, {inner})"

    def class_hours_of_jobs(self, jobs: list[str]) -> str:
        return self._hours(f"{self.waste_classes()} * {self._job(jobs)} * {self._model()}",
                           "cluster, job_id, user, model, spec, class, waste")

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
    def _lead(self) -> str:
        """A GPU's lead over its job's median tensor activity while above the alert threshold, in jobs of at
        least :data:`STRAGGLER_MIN_GPUS` GPUs (counted from roofwatch_gpu_job_info, as the rule counts them)."""
        size = f"count by (cluster, job_id) ({self.sel('roofwatch_gpu_job_info')}) >= {STRAGGLER_MIN_GPUS}"
        return (f"({self.sel('roofwatch:gpu_straggler_lead:ratio')} > {STRAGGLER_LEAD} "
                f"and on (cluster, job_id) ({size}))")

    def straggler_hours(self) -> str:
        """Hours each GPU led its job's median tensor activity by more than the alert threshold."""
        inner = f"sum by (cluster, job_id, node, gpu) (count_over_time({self._lead()}{self.w.subquery()}))"
        return f"topk({self.top}, {inner} * {self.w.hours_per_point():.10g})"

    def straggler_peak(self) -> str:
        return f"topk({self.top}, max by (cluster, job_id, node, gpu) (max_over_time({self._lead()}{self.w.subquery()})))"

    def classifier_straggler_hours(self) -> str:
        """Hours each GPU's verdict named it its job's straggler (detail ``straggler``: the classifier's rule, the
        one the status page and ``top`` show), by job: a job of two GPUs has them too."""
        named = self.sel("roofwatch_gpu_workload_reason_info", **{"class": "communication_jittered", "detail": "straggler"})
        inner = self._hours(f"max by ({KEY}) ({named}) * {self._job()}", "cluster, job_id, node, gpu")
        return f"topk({self.top}, {inner})"

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


def _labelled(expr: str, waste: str) -> str:
    """``expr`` with the label ``waste="<waste>"`` added to every series."""
    return f'label_replace({expr}, "waste", {string(waste)}, "class", ".*")'
