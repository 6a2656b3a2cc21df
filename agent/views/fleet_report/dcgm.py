"""``--source dcgm``: roofwatch's verdicts over a fleet that runs only dcgm-exporter today.

dcgm-exporter publishes DCGM's profiling fields as gauges named after them (``DCGM_FI_PROF_*``,
ratios 0..1 averaged over DCGM's watch interval; ``*_BYTES`` in bytes per second) and the device
fields (``DCGM_FI_DEV_POWER_USAGE`` W, ``DCGM_FI_DEV_GPU_UTIL`` and ``DCGM_FI_DEV_MEM_COPY_UTIL`` %,
``DCGM_FI_DEV_SM_CLOCK`` MHz), labelled ``gpu``, ``UUID``, ``modelName``, ``Hostname`` and, with
pod mapping, ``namespace``/``pod``/``container`` (/work/shared/reference/vendor-apis.md §D,
NVIDIA/dcgm-exporter default-counters.csv). Each GPU's fields come back as range queries
averaged over one step (``avg_over_time(F[step])``), become vendor-neutral :class:`GpuSample`
objects at that step, and go through the same engine ``roofwatch classify`` runs on a trace,
with the classifier's windows stretched to the step (a week at 5-minute points cannot show a
20-second window).

Cost bound: GPUs are listed once, at most ``max_gpus`` are read (the page says when more exist),
each field is one range query per batch of ``batch`` GPUs and slice of at most 1440 steps (one
slice up to 10 days, where the step reaches its 600 s ceiling), so an answer holds at most
``batch`` x 1440 points (promapi.MAX_POINTS is sized from it).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from typing import Any, Callable

from agent.classifier.engine import classify_samples
from agent.classifier.thresholds import Thresholds
from agent.model import WORKLOAD_CLASSES, GpuSample
from agent.model.indexes import gpu_order
from agent.model.waste import waste_of
from agent.views.fleet_report.data import Prices, Problem, group_rows, skipped_text
from agent.views.fleet_report.promapi import Answer, PromClient, PromError
from agent.views.fleet_report.promql import any_of, equals
from agent.views.fleet_report.window import Window

FIELDS: dict[str, tuple[str, float]] = {
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("gr_active", 1.0),
    "DCGM_FI_PROF_SM_ACTIVE": ("sm_active", 1.0),
    "DCGM_FI_PROF_SM_OCCUPANCY": ("sm_occupancy", 1.0),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("tensor_active", 1.0),
    "DCGM_FI_PROF_DRAM_ACTIVE": ("dram_active", 1.0),
    "DCGM_FI_PROF_PIPE_FP64_ACTIVE": ("fp64_active", 1.0),
    "DCGM_FI_PROF_PIPE_FP32_ACTIVE": ("fp32_active", 1.0),
    "DCGM_FI_PROF_PIPE_FP16_ACTIVE": ("fp16_active", 1.0),
    "DCGM_FI_PROF_PCIE_TX_BYTES": ("pcie_tx_bytes_per_s", 1.0),
    "DCGM_FI_PROF_PCIE_RX_BYTES": ("pcie_rx_bytes_per_s", 1.0),
    "DCGM_FI_PROF_NVLINK_TX_BYTES": ("link_tx_bytes_per_s", 1.0),
    "DCGM_FI_PROF_NVLINK_RX_BYTES": ("link_rx_bytes_per_s", 1.0),
    "DCGM_FI_DEV_POWER_USAGE": ("power_w", 1.0),
    "DCGM_FI_DEV_SM_CLOCK": ("sm_clock_mhz", 1.0),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("mem_busy", 0.01),
    "DCGM_FI_DEV_GPU_UTIL": ("_gpu_util", 0.01),
}
"""DCGM field -> (GpuSample field, scale to its unit). GPU_UTIL (percent of time a kernel ran)
stands in for GR_ENGINE_ACTIVE where profiling is off."""
RATIO_FIELDS = {"gr_active", "sm_active", "sm_occupancy", "tensor_active", "dram_active", "fp64_active",
                "fp32_active", "fp16_active", "mem_busy", "_gpu_util"}
MAX_POINTS = 1440
Progress = Callable[[str], None]


def dcgm_step(range_s: int) -> int:
    """Whole minutes, at least one, at most 600 s (the classifier's longest evaluation step)."""
    return min(600, max(60, math.ceil(range_s / MAX_POINTS / 60) * 60))


def dcgm_slices(window: Window, step: int) -> list[tuple[float, float]]:
    """(start, end) of each range query: every ``step`` after the window's start up to its end, at
    most MAX_POINTS steps a query."""
    slices, first = [], window.start + step
    while first <= window.end:
        last = min(window.end, first + (MAX_POINTS - 1) * step)
        slices.append((first, last))
        first = last + step
    return slices


def listed(client: PromClient, listing: str, when: float, what: str, empty: str) -> tuple[Answer | None, list[Problem]]:
    """The answer of an exporter source's listing query (None when it failed) and its problems: the
    error, samples left out, or nothing found. Shared by the dcgm and amd sections."""
    try:
        found = client.query(listing, when)
    except PromError as exc:
        return None, [Problem(what, str(exc), listing)]
    problems = [Problem(what, skipped_text(found.skipped), listing)] if found.skipped else []
    if not found:
        problems.append(Problem(what, empty, listing))
    return found, problems


def ranged(client: PromClient, expr: str, slices: list[tuple[float, float]], step: int, what: str,
           problems: list[Problem], progress: Callable[[int], None]) -> tuple[list, int]:
    """Every series ``expr`` answers over ``slices`` (a failed slice becomes a problem, the others
    still count) and how many samples were left out; ``progress(part)`` before each slice."""
    series, skipped = [], 0
    for part, (start, end) in enumerate(slices):
        progress(part)
        try:
            answer = client.query_range(expr, start, end, step)
        except PromError as exc:
            problems.append(Problem(what, str(exc), expr))
            continue
        skipped += answer.skipped
        series.extend(answer)
    return series, skipped


def dcgm_thresholds(base: Thresholds, step_s: int) -> Thresholds:
    """The classifier's thresholds with its windows stretched to whole steps of the query."""
    window = min(3600.0, max(base.window_s, 3.0 * step_s))
    return Thresholds(**{**base.model_dump(), "evaluate_every_s": float(step_s), "window_s": window,
                         "long_window_s": max(base.long_window_s, window), "min_dwell_s": min(base.min_dwell_s, window)})


def collect_dcgm(client: PromClient, window: Window, *, cluster: str | None, thresholds: Thresholds, prices: Prices,
                 max_gpus: int = 64, batch: int = 16, progress: Progress = lambda _: None) -> tuple[dict[str, Any], list, list[Problem]]:
    """(the dcgm section's data, fleet groups by cluster, problems)."""
    step = dcgm_step(window.range_s)
    match = equals("cluster", cluster) + "," if cluster is not None else ""
    listing = (f"max by (cluster, UUID, gpu, Hostname, modelName, namespace, pod) (last_over_time("
               f'{{__name__=~"DCGM_FI_PROF_GR_ENGINE_ACTIVE|DCGM_FI_DEV_GPU_UTIL",{match}UUID!=""}}[{window.range_s}s]))')
    progress("dcgm: listing GPUs")
    found, problems = listed(client, listing, window.end, "dcgm GPUs",
                             "no DCGM_FI_PROF_GR_ENGINE_ACTIVE or DCGM_FI_DEV_GPU_UTIL series in the period")
    if found is None:
        return {"gpus": [], "step_s": step}, [], problems
    gpus: dict[str, dict[str, str]] = {}
    for s in sorted(found, key=lambda s: (s.labels.get("Hostname", ""), gpu_order(s.labels.get("gpu", "")))):
        gpus.setdefault(s.labels.get("UUID", ""), s.labels)
    uuids = list(gpus)[:max_gpus]
    values: dict[str, dict[float, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
    absent: list[str] = []
    slices = dcgm_slices(window, step)
    for name, (attr, scale) in FIELDS.items():
        seen, skipped, expr = False, 0, ""
        for first in range(0, len(uuids), batch):
            chunk = uuids[first:first + batch]
            expr = f"max by (UUID) (avg_over_time({name}{{{match}{any_of('UUID', chunk)}}}[{step}s]))"
            answered, left_out = ranged(client, expr, slices, step, f"dcgm {name}", problems, lambda part: progress(
                f"dcgm: {name} ({first + len(chunk)}/{len(uuids)} GPUs"
                + (f", part {part + 1}/{len(slices)})" if len(slices) > 1 else ")")))
            skipped += left_out
            for series in answered:
                seen = True
                for ts, value in series.points:
                    if math.isfinite(value):
                        v = value * scale
                        values[series.labels.get("UUID", "")][ts][attr] = min(1.0, max(0.0, v)) if attr in RATIO_FIELDS else max(0.0, v)
        if skipped:
            problems.append(Problem(f"dcgm {name}", skipped_text(skipped), expr))
        if not seen:
            absent.append(name)
    samples = [_sample(gpus[u], ts, fields, step) for u in uuids for ts, fields in sorted(values[u].items())]
    progress(f"dcgm: classifying {len(samples)} samples")
    per_gpu: dict[str, dict[str, Any]] = {u: {"hours": Counter(), "waste": Counter(), "details": Counter(), "mfu": []} for u in uuids}
    by_node_gpu = {(gpus[u].get("Hostname", ""), gpus[u].get("gpu", "")): u for u in uuids}
    for verdict in classify_samples(samples, thresholds):
        u = by_node_gpu.get((verdict.node, verdict.gpu))
        if u is None:
            continue
        per_gpu[u]["hours"][verdict.cls] += step / 3600.0
        per_gpu[u]["waste"][(verdict.cls, waste_of(verdict).label)] += step / 3600.0
        per_gpu[u]["details"][(verdict.cls, verdict.detail)] += step / 3600.0
        if verdict.roofline.mfu is not None and verdict.cls != "idle":
            per_gpu[u]["mfu"].append(verdict.roofline.mfu)
    rows, table = [], []
    for u in uuids:
        labels, acc = gpus[u], per_gpu[u]
        spent: Counter = acc["hours"]
        for (cls, waste), spent_h in sorted(acc["waste"].items()):  # waste as agent.model.waste gives it
            rows.append(({"cluster": labels.get("cluster", ""), "class": cls, "waste": waste,
                          "model": labels.get("modelName", ""), "spec": ""}, spent_h))
        top = acc["details"].most_common(1)
        table.append({"node": labels.get("Hostname", ""), "gpu": labels.get("gpu", ""), "uuid": u,
                      "model": labels.get("modelName", ""), "namespace": labels.get("namespace", ""),
                      "pod": labels.get("pod", ""), "hours": {c: round(spent.get(c, 0.0), 6) for c in WORKLOAD_CLASSES},
                      "class": top[0][0][0] if top else None, "detail": top[0][0][1] if top else None,
                      "mfu": round(sum(acc["mfu"]) / len(acc["mfu"]), 6) if acc["mfu"] else None})
    data = {"gpus": table, "step_s": step, "window_s": thresholds.window_s, "gpus_found": len(gpus),
            "gpus_read": len(uuids), "max_gpus": max_gpus, "absent_fields": absent, "samples": len(samples)}
    return data, group_rows(rows, ("cluster",), prices), problems


def _sample(labels: dict[str, str], ts: float, fields: dict[str, float], step: int) -> GpuSample:
    fields = dict(fields)
    util = fields.pop("_gpu_util", None)
    if "gr_active" not in fields and util is not None:
        fields["gr_active"] = util
    return GpuSample(ts=ts, gpu=labels.get("gpu", "") or labels.get("UUID", ""), node=labels.get("Hostname", "") or "unknown",
                     uuid=labels.get("UUID") or None, vendor="nvidia", model=labels.get("modelName") or None,
                     interval_s=float(step), **fields)


def dcgm_report(client: PromClient, window: Window, *, cluster: str | None, prices: Prices, thresholds: Thresholds,
                max_gpus: int = 64, progress: Progress = lambda _: None) -> Any:
    """The whole ``--source dcgm`` report (a FleetReport with its dcgm section and class totals)."""
    from agent.views.fleet_report.collect import FleetReport

    report = FleetReport(window=window, cluster=cluster, prices=prices, source="dcgm")
    data, fleet, problems = collect_dcgm(client, window, cluster=cluster, thresholds=thresholds, prices=prices,
                                         max_gpus=max_gpus, progress=progress)
    mfus = [g["mfu"] for g in data["gpus"] if g.get("mfu") is not None]
    report.dcgm, report.fleet, report.problems = data, fleet, problems
    report.mfu = {"mean": round(sum(mfus) / len(mfus), 6) if mfus else None}
    report.queries = client.queries
    return report
