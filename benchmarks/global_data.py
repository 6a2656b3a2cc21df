"""The global store's history: the aggregates of many clusters, as their recording rules write them.

A 200,000-GPU fleet cannot run here, and does not need to for the global layer: what reaches the global
store is only the ``roofwatch_cluster:``, ``roofwatch_job:`` and ``roofwatch_namespace:`` recordings of each
cluster's own rule evaluation (deploy/prometheus/remote-write-global.yml). This writes exactly those series,
with the labels the rules give them (``by (cluster, ...)``), for a fleet of ``clusters`` x ``gpus`` GPUs in jobs
of ``job_gpus``, at the intervals the docs recommend (every group each minute, ``roofwatch-hourly`` every five:
docs/deploy.md, "Large fleets"). :data:`FAMILIES` names every family with the labels beyond ``cluster`` and
``job_id``/``namespace`` it carries; tests/test_global_benchmark.py holds it equal to the rule file's.

The values are plausible, not the output of the arithmetic (a job's GPUs per class sum to its size, ratios
stay in 0..1, counts are whole): what the queries cost depends on the series, their labels and their number
of samples, which are the rules'. Values vary from sample to sample as live ones do, so that the stores
compress them no better than real ones.
"""

from __future__ import annotations

import dataclasses
from typing import Iterator

from agent.model.waste import NOT_WASTED, SPARE, WASTE_KINDS

EVAL_S = 60
HOURLY_S = 300
CLASSES = ("compute_bound", "memory_bound", "input_starved", "communication_jittered", "latency_bound", "idle", "unknown")
WASTE_OF = {"idle": "idle_held", "input_starved": "input_starved", "communication_jittered": "communication_jittered"}
JOB_MIXES = (("compute_bound",), ("compute_bound", "communication_jittered"), ("compute_bound", "input_starved"),
             ("memory_bound",), ("compute_bound", "idle"), ("latency_bound", "memory_bound"))
"""The classes a job's GPUs are in (most jobs are in one or two at a time)."""
MODELS = ("llama-3-70b", "llama-3-8b", "mixtral-8x7b", "qwen2-72b", "deepseek-v3", "gemma-2-27b")
SERVING_STATES = ("at_floor", "under_batched", "kv_saturated")


@dataclasses.dataclass(frozen=True)
class Family:
    name: str
    scope: str
    """cluster, job or namespace: what besides ``cluster`` identifies a series."""
    label: str | None = None
    """The one more label the rule groups by (class, waste, model+state, model)."""
    hourly: bool = False


FAMILIES = (
    Family("roofwatch_cluster:gpu_mfu:avg", "cluster"), Family("roofwatch_cluster:gpu_mfu_busy:avg", "cluster"),
    Family("roofwatch_cluster:gpus:sum", "cluster", "class"), Family("roofwatch_cluster:gpu_idle_allocated:sum", "cluster"),
    Family("roofwatch_cluster:gpus_by_waste:sum", "cluster", "waste"),
    Family("roofwatch_cluster:gpu_waste_lost:sum", "cluster", "waste_kind"),
    Family("roofwatch_cluster:gpu_hours:sum_1h", "cluster", "class", True),
    Family("roofwatch_cluster:gpu_idle_allocated_hours:sum_1h", "cluster", None, True),
    Family("roofwatch_cluster:gpu_waste_hours:sum_1h", "cluster", "waste", True),
    Family("roofwatch_cluster:gpu_lost_hours:sum_1h", "cluster", "waste_kind", True),
    Family("roofwatch_cluster:gpu_energy_kwh:sum_1h", "cluster", None, True),
    Family("roofwatch_cluster:serving_servers:count", "cluster", "model_state"),
    Family("roofwatch_cluster:serving_gpus:count", "cluster", "model_state"),
    Family("roofwatch_cluster:serving_output_tokens_per_second:sum", "cluster", "model"),
    Family("roofwatch_job:gpu_tensor_active:median5m", "job"), Family("roofwatch_job:step_time_spread:ratio", "job"),
    Family("roofwatch_job:gpu_mfu:avg", "job"), Family("roofwatch_job:gpus:count", "job"),
    Family("roofwatch_job:gpus_by_class:sum", "job", "class"), Family("roofwatch_job:gpu_class:ratio", "job", "class"),
    Family("roofwatch_job:gpus_by_waste:sum", "job", "waste_kind"), Family("roofwatch_job:gpu_waste:ratio", "job", "waste_kind"),
    Family("roofwatch_job:gpu_waste_lost:sum", "job", "waste_kind"), Family("roofwatch_job:gpu_idle_allocated:sum", "job"),
    Family("roofwatch_job:gpu_hours:sum_1h", "job", "class", True),
    Family("roofwatch_job:gpu_idle_allocated_hours:sum_1h", "job", None, True),
    Family("roofwatch_job:gpu_waste_hours:sum_1h", "job", "waste_kind", True),
    Family("roofwatch_job:gpu_lost_hours:sum_1h", "job", "waste_kind", True),
    Family("roofwatch_job:gpu_energy_kwh:sum_1h", "job", None, True),
    Family("roofwatch_namespace:gpus_by_waste:sum", "namespace", "waste"),
    Family("roofwatch_namespace:gpu_waste_hours:sum_1h", "namespace", "waste", True),
    Family("roofwatch_namespace:gpu_hours:sum_1h", "namespace", None, True),
    Family("roofwatch_namespace:gpu_energy_kwh:sum_1h", "namespace", None, True),
)


@dataclasses.dataclass(frozen=True)
class GlobalShape:
    clusters: int
    gpus: int
    """GPUs per cluster."""
    job_gpus: int = 128
    namespaces: int = 16
    """Kubernetes namespaces per cluster."""

    @property
    def jobs(self) -> int:
        """Jobs per cluster (the GPUs left over are spare)."""
        return self.gpus // self.job_gpus

    @property
    def total_gpus(self) -> int:
        return self.clusters * self.gpus

    def cluster(self, c: int) -> str:
        return f"cluster-{c:02d}"


@dataclasses.dataclass(frozen=True)
class Series:
    """One series: its label text, its base value, and whether it is hourly (written every :data:`HOURLY_S`)."""

    labels: str
    base: float
    whole: bool
    """A count (written as an integer) rather than a ratio or an amount."""
    hourly: bool


def _mix(job: int) -> tuple[str, ...]:
    return JOB_MIXES[job % len(JOB_MIXES)]


def _values(family: Family, shape: GlobalShape, job: int | None) -> list[tuple[str, float]]:
    """(extra labels, base value) of each series of ``family`` for one cluster, job or namespace."""
    size = shape.job_gpus
    if family.label is None:
        base = {"gpu_mfu": 0.3, "median5m": 0.6, "spread": 0.05, "gpus:count": size, "idle_allocated": 2,
                "energy": 0.7 * size}
        key = next((k for k in base if k in family.name), "")
        scale = shape.gpus if family.scope == "cluster" and key in ("idle_allocated", "energy") else 1
        return [("", base.get(key, 0.3) * scale)]
    if family.label == "class":
        if family.scope == "job":
            classes = _mix(job or 0)
            return [(f'class="{c}"', size / len(classes) if "ratio" not in family.name else 1 / len(classes))
                    for c in classes]
        return [(f'class="{c}"', shape.gpus / len(CLASSES)) for c in CLASSES]
    if family.label == "waste_kind":
        kinds = [WASTE_OF[c] for c in _mix(job or 0) if c in WASTE_OF] if family.scope == "job" else list(WASTE_KINDS)
        return [(f'waste="{k}"', 0.5 if "ratio" in family.name else size / 2) for k in kinds]
    if family.label == "waste":
        labels = (*WASTE_KINDS, SPARE, NOT_WASTED)
        per = shape.gpus / len(labels) if family.scope == "cluster" else size / len(labels)
        return [(f'waste="{w}"', per) for w in labels]
    if family.label == "model_state":
        return [(f'model="{m}",state="{s}"', 8.0) for m in MODELS for s in SERVING_STATES]
    return [(f'model="{m}"', 20_000.0) for m in MODELS]


def series(shape: GlobalShape) -> list[Series]:
    """Every series the fleet's clusters send to the global store."""
    out = []
    for c in range(shape.clusters):
        cluster = f'cluster="{shape.cluster(c)}"'
        for family in FAMILIES:
            owners: list[tuple[str, int | None]]
            if family.scope == "cluster":
                owners = [("", None)]
            elif family.scope == "job":
                owners = [(f',job_id="job-{c:02d}-{j:04d}"', j) for j in range(shape.jobs)]
            else:
                owners = [(f',namespace="team-{n:02d}"', n) for n in range(shape.namespaces)]
            for owner, index in owners:
                for extra, base in _values(family, shape, index):
                    labels = cluster + owner + ("," + extra if extra else "")
                    whole = family.name.endswith((":sum", ":count")) and "kwh" not in family.name \
                        and "lost" not in family.name and "tokens" not in family.name
                    out.append(Series(f"{family.name}{{{labels}}}", base, whole, family.hourly))
    return out


def per_cluster(shape: GlobalShape) -> dict[str, float]:
    """What one cluster sends: series, and samples per second at the recommended intervals."""
    one = series(dataclasses.replace(shape, clusters=1))
    return {"series": len(one),
            "samples_per_s": sum(1 / (HOURLY_S if s.hourly else EVAL_S) for s in one)}


def _value(s: Series, i: int, t: int) -> str:
    """The sample of series number ``i`` at ``t``: its base moved by up to 10%, a different phase per series."""
    wave = ((t // EVAL_S + 7 * i) % 11 - 5) / 50.0
    v = s.base * (1 + wave)
    if s.whole:
        return str(max(0, round(v)))
    return f"{v:.4g}"


def lines(all_series: list[Series], start: int, end: int, step_s: int) -> Iterator[str]:
    """Import lines (``series value ms``) for every sample in [start, end) at ``step_s``, time-major; hourly
    series only at multiples of :data:`HOURLY_S` (and at every point when ``step_s`` is coarser)."""
    for t in range(start, end, step_s):
        hourly_due = t % HOURLY_S == 0 or step_s >= HOURLY_S
        ms = f" {t * 1000}\n"
        for i, s in enumerate(all_series):
            if s.hourly and not hourly_due:
                continue
            yield s.labels + " " + _value(s, i, t) + ms


def openmetrics(all_series: list[Series], start: int, end: int, step_s: int) -> Iterator[str]:
    """The same samples for ``promtool tsdb create-blocks-from openmetrics`` (seconds, ``# EOF`` last): each
    series' samples together, as promtool wants them."""
    for i, s in enumerate(all_series):
        for t in range(start, end, step_s):
            if s.hourly and not (t % HOURLY_S == 0 or step_s >= HOURLY_S):
                continue
            yield f"{s.labels} {_value(s, i, t)} {t}\n"
    yield "# EOF\n"
