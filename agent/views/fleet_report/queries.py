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
BILLED_BY = ("namespace", "user", "account")
"""What the report bills, each by the same rule (docs/attribution.md, "The bill"): Kubernetes namespaces, users,
Slurm accounts."""
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
        """GPU-hours per class of GPUs a job held, by cluster, user and model, each GPU whole (the held GPU-hours of
        the headline; the user bill, shared GPUs by holder, is :meth:`class_hours_billed`)."""
        return self._hours(f"{self.waste_classes()} * {self._job()} * {self._model()}", "cluster, user, model, spec, class, waste")

    def class_hours_by_namespace(self) -> str:
        """GPU-hours per class of GPUs a Kubernetes pod held, by cluster, namespace and model: a whole GPU whole for
        its pod's namespace, a shared GPU by its holders' shares (:meth:`_shared_by`)."""
        return self.class_hours_billed("namespace")

    # -- bills: per namespace, per user, per Slurm account (docs/attribution.md, "The bill") ----------------
    def _whole_owner(self, label: str) -> str:
        """The join that names a whole GPU's ``label``: its pod's namespace (roofwatch_gpu_pod_info), its job's user
        (roofwatch_gpu_job_info; a job without one is the user ``""``, as the user table always counted it) or its
        job's Slurm account (only jobs that have one: outside Slurm the account table is empty, not one blank row)."""
        if label == "namespace":
            return self._namespace()
        info = self.sel("roofwatch_gpu_job_info", **({label: "!"} if label == "account" else {}))
        return f"{ON} group_left ({label}) max by ({KEY}, {label}) ({info})"

    def class_hours_billed(self, label: str) -> str:
        """GPU-hours per class by cluster, ``label`` (:data:`BILLED_BY`) and model: a whole GPU whole for its owner,
        a shared GPU by its holders' shares (:meth:`_shared_by`)."""
        whole = f"({self.waste_classes()} * {self._whole_owner(label)} unless {ON} {self._holder_energy()})"
        return self._hours(f"({whole} or {self._shared_by(label)}) * {self._model()}",
                           f"cluster, {label}, model, spec, class, waste")

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

    def _holder_owner(self, label: str) -> str:
        """The join that names a holder's ``label`` (roofwatch_gpu_holder_info): a pod's namespace, a Slurm job's
        user and account, a plain process's owner; holders without one are left out of that bill."""
        info = self.sel("roofwatch_gpu_holder_info", **{label: "!"})
        return f"on ({KEY}, holder) group_left ({label}) max by ({KEY}, holder, {label}) ({info})"

    def _shared_by(self, label: str) -> str:
        """Each holder's share of its shared GPU with a class and waste, for the holders that have a ``label``: a
        holder whose own class is ``idle_held`` counts its share as idle and idle_held (the waste a shared GPU
        hides); any other holder its share in the GPU's class and waste. Holders without one (for namespaces: MPS
        clients, plain processes, Slurm jobs, ``other``; for users and accounts: pods, ``other``) are not in that
        bill, as a whole GPU no pod (no job) holds."""
        share = self._holder_shares()
        idle = f"max by ({KEY}, holder) ({self.sel('roofwatch_gpu_holder_class', **{'class': HELD_IDLE})})"
        own = (f'label_replace(label_replace({share} * on ({KEY}, holder) group_left () {idle}, '
               f'"waste", {string(HELD_IDLE)}, "", ""), "class", {string(IDLE)}, "", "")')
        gpu = f"max by ({KEY}, class, waste) ({self.waste_classes()} == 1)"
        rest = f"({share} unless on ({KEY}, holder) {idle}) * {ON} group_left (class, waste) {gpu}"
        return f"(({own} or {rest}) * {self._holder_owner(label)})"

    def energy_kwh_by_namespace(self) -> str:
        return self.energy_kwh_billed("namespace")

    def energy_kwh_billed(self, label: str) -> str:
        """kWh by cluster and ``label`` over the window: a whole GPU's energy counter for its owner, each holder's
        estimated energy (the agent's split) on a GPU shared at any time in the window for the holder's owner."""
        span = f"[{self.w.range_s}s]"
        holders = f"increase({self._holder_energy(named=True)}{span}) * {self._holder_owner(label)}"
        whole = (f"(increase({self.sel('roofwatch_gpu_energy_joules_total')}{span}) unless {ON} "
                 f"count_over_time({self._holder_energy()}{span})) * {self._whole_owner(label)}")
        return f"sum by (cluster, {label}) ({holders} or {whole}) / 3.6e6"

    def mfu_by_namespace(self) -> str:
        return self.mfu_billed("namespace")

    def mfu_billed(self, label: str) -> str:
        """Mean busy MFU by cluster and ``label``: over the whole GPUs its owner held and the time its holders on
        shared GPUs had an MFU of their own (roofwatch_gpu_holder_mfu_ratio, from their own reports). A shared
        GPU's own MFU is all its holders' together, so no one owner is given it."""
        sub = self.w.subquery()
        whole = f"({self._mfu_busy()} * {self._whole_owner(label)} unless {ON} {self._holder_energy()})"
        own = f"({self.sel('roofwatch_gpu_holder_mfu_ratio')} * {self._holder_owner(label)})"
        inner = f"({whole} or {own})"
        return (f"sum by (cluster, {label}) (sum_over_time({inner}{sub})) / "
                f"sum by (cluster, {label}) (count_over_time({inner}{sub}))")

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
        """Energy by cluster over the window, from the agents' energy counters: every device's, and each MIG GPU's
        remainder (the energy of the board none of its instances was given), so a MIG GPU counts whole."""
        counters = self.sel("", __name__="~roofwatch_gpu_energy_joules_total|roofwatch_gpu_mig_unattributed_energy_joules_total")
        return f"sum by (cluster) (increase({counters}[{self.w.range_s}s])) / 3.6e6"


def _labelled(expr: str, waste: str) -> str:
    """``expr`` with the label ``waste="<waste>"`` added to every series."""
    return f'label_replace({expr}, "waste", {string(waste)}, "class", ".*")'
