"""``--source amd``: roofwatch's verdicts over a fleet that runs only AMD's Device Metrics Exporter (DME).

DME's series (names and labels: :mod:`agent.backends.amd_exporter.names`, docs/amd.md "AMD Device
Metrics Exporter as a source") come back per GPU object (a whole GPU, or one compute partition:
``hostname`` + ``gpu_id``) as range queries averaged over one step (``avg_over_time(S[step])``),
index labels (``xcc_index``, ``clock_index``) kept. Each step's values become an
:class:`~agent.backends.amd_exporter.exposition.AmdRecord`, exactly what the agent's ``amd-exporter``
backend reads from one ``/metrics`` body, and go through that backend's own mapping
(:func:`~agent.backends.amd_exporter.mapping.sample_values` with its catalogue spec from
:func:`~agent.backends.amd_exporter.backend.device_spec`): profiler ops and bytes per sampling window,
MFMA and VALU busy scaled by GUI-active, HBM bytes/s over the catalogue bandwidth, activity and power from
partition 0 only, activity and UMC activity alone where the profiler's series are absent. The samples
then go through the engine ``roofwatch classify`` runs, with the windows of ``--source dcgm``.

The average of a profiler series over a step is the mean count per window, so ops / window is the
step's mean rate. The window is not in ``/metrics``: ``--amd-profiler-window-us`` (the agent's
``amd_exporter_profiler_window_us``). XGMI accumulators, energy and ECC are not read (no rate is formed
from a store's averages); series carrying an operator's ``MetricsFieldPrefix`` are not found.

Cost bound: GPU objects are listed once, at most ``max_gpus`` are read; each series is one range query
per host and batch of ``batch`` GPU objects and slice of at most 1440 steps; an indexed series has at most
8 indices per object, so an answer holds at most ``batch`` x 8 x 1440 points.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from typing import Any

from agent.backends.amd.values import partition_count
from agent.backends.amd_exporter.backend import device_model, device_spec
from agent.backends.amd_exporter.exposition import SENTINELS, AmdRecord
from agent.backends.amd_exporter.mapping import DEFAULT_WINDOW_US, sample_values
from agent.backends.amd_exporter.names import PROFILER, clock_type
from agent.classifier.engine import classify_samples
from agent.classifier.thresholds import Thresholds
from agent.model import WORKLOAD_CLASSES, GpuSample
from agent.views.fleet_report.data import Prices, Problem, group_rows, skipped_text
from agent.model.indexes import gpu_order, index_value
from agent.model.waste import waste_of
from agent.views.fleet_report.dcgm import Progress, dcgm_slices, dcgm_step, listed, ranged
from agent.views.fleet_report.promapi import PromClient
from agent.views.fleet_report.promql import any_of, equals, string
from agent.views.fleet_report.window import Window

SERIES: dict[str, str] = {
    "gpu_gfx_activity": "", "gpu_gfx_busy_instantaneous": "xcc_index", "gpu_umc_activity": "",
    "gpu_package_power": "", "gpu_power_usage": "", "gpu_clock": "clock_index", "gpu_max_clock": "clock_index",
    "gpu_junction_temperature": "", "gpu_total_vram": "", "gpu_used_vram": "",
    "gpu_prof_gui_util_percent": "", "gpu_prof_tensor_active_percent": "", "gpu_prof_sm_active": "",
    "gpu_prof_occupancy_percent": "", "gpu_prof_fetch_size": "", "gpu_prof_write_size": "",
    "gpu_prof_total_16_ops": "", "gpu_prof_total_32_ops": "", "gpu_prof_total_64_ops": "",
}
"""DME series read (1.4+ names) -> its index label ("" for none). Clocks: the system clocks only."""
LISTED = "gpu_gfx_activity|gpu_gfx_busy_instantaneous"
"""Every GPU object has one: partition 0 (or a whole GPU) the activity, every partition its XCCs' busy."""
IDENTITY = ("cluster", "hostname", "gpu_id", "gpu_partition_id", "gpu_compute_partition_type",
            "gpu_memory_partition_type", "serial_number", "card_model", "card_series", "gpu_uuid", "namespace", "pod")
Key = tuple[str, str, str]
"""(cluster, hostname, gpu_id): one GPU object."""


def collect_amd(client: PromClient, window: Window, *, cluster: str | None, thresholds: Thresholds, prices: Prices,
                window_us: float = DEFAULT_WINDOW_US, max_gpus: int = 64, batch: int = 8,
                progress: Progress = lambda _: None) -> tuple[dict[str, Any], list, list[Problem]]:
    """(the amd section's data, fleet groups by cluster, problems)."""
    step = dcgm_step(window.range_s)
    match = equals("cluster", cluster) + "," if cluster is not None else ""
    listing = (f"max by ({', '.join(IDENTITY)}) (last_over_time("
               f'{{__name__=~{string(LISTED)},{match}gpu_id!=""}}[{window.range_s}s]))')
    progress("amd: listing GPUs")
    found, problems = listed(client, listing, window.end, "amd GPUs", f"no {LISTED.replace('|', ' or ')} series in the period")
    if found is None:
        return {"gpus": [], "step_s": step}, [], problems
    objects: dict[Key, dict[str, str]] = {}
    for s in sorted(found, key=lambda s: (s.labels.get("hostname", ""), gpu_order(s.labels.get("gpu_id", "")))):
        objects.setdefault(_key(s.labels), s.labels)
    keys = list(objects)[:max_gpus]
    by_host: dict[tuple[str, str], list[str]] = defaultdict(list)
    for c, host, gpu in keys:
        by_host[(c, host)].append(gpu)
    wanted = set(keys)
    plain: dict[Key, dict[float, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
    indexed: dict[Key, dict[float, dict[str, dict[str, float]]]] = defaultdict(lambda: defaultdict(dict))
    absent: list[str] = []
    slices = dcgm_slices(window, step)
    for name, index in SERIES.items():
        seen, skipped, expr = False, 0, ""
        extra = ',clock_type=~"system|GPU_CLOCK_TYPE_SYSTEM"' if index == "clock_index" else ""
        by = "cluster, hostname, gpu_id" + (f", clock_type, {index}" if index == "clock_index" else f", {index}" if index else "")
        for (c, host), gpus in by_host.items():
            scope = f'{equals("cluster", c)},{equals("hostname", host)},'  # cluster="": series without one
            for first in range(0, len(gpus), batch):
                chunk = gpus[first:first + batch]
                expr = f"max by ({by}) (avg_over_time({name}{{{scope}{any_of('gpu_id', chunk)}{extra}}}[{step}s]))"
                answered, left_out = ranged(client, expr, slices, step, f"amd {name}", problems, lambda _: progress(
                    f"amd: {name} ({host}, {first + len(chunk)}/{len(gpus)} GPUs)"))
                skipped += left_out
                for series in answered:
                    key = _key(series.labels)
                    if key not in wanted:
                        continue
                    seen = True
                    at = series.labels.get(index, "") if index else ""
                    if index == "clock_index":
                        at = f"{clock_type(series.labels.get('clock_type', ''))}/{at}"
                    for ts, value in series.points:
                        if not math.isfinite(value) or value in SENTINELS:
                            continue
                        if index:
                            indexed[key][ts].setdefault(name, {})[at] = value
                        else:
                            plain[key][ts][name] = value
        if skipped:
            problems.append(Problem(f"amd {name}", skipped_text(skipped), expr))
        if not seen:
            absent.append(name)
    if "gpu_package_power" not in absent:  # gpu_power_usage is its older name: not missing evidence
        absent = [a for a in absent if a != "gpu_power_usage"]
    samples, specs = [], {}
    for key in keys:
        records = [_record(objects[key], plain[key].get(ts, {}), indexed[key].get(ts, {}))
                   for ts in sorted(set(plain[key]) | set(indexed[key]))]
        spec = next((device_spec(r) for r in records if r.values.get("gpu_total_vram")), None) \
            or (device_spec(records[0]) if records else None)
        specs[(key[1] or "unknown", key[2])] = spec
        for ts, record in zip(sorted(set(plain[key]) | set(indexed[key])), records):
            values = {k: v for k, v in sample_values(record, spec, window_us).items() if k not in ("links", "energy_j")}
            samples.append(GpuSample(ts=ts, gpu=key[2], node=key[1] or "unknown", uuid=_uuid(record, key), vendor="amd",
                                     model=device_model(record), interval_s=float(step), **values))
    progress(f"amd: classifying {len(samples)} samples")
    per: dict[Key, dict[str, Any]] = {k: {"hours": Counter(), "waste": Counter(), "details": Counter(), "mfu": []} for k in keys}
    by_node_gpu = {(k[1] or "unknown", k[2]): k for k in keys}
    resolver = lambda s: specs.get((s.node, s.gpu))  # noqa: E731 - the partition's share, as the agent holds it
    for verdict in classify_samples(samples, thresholds, spec_resolver=resolver):
        key = by_node_gpu.get((verdict.node, verdict.gpu))
        if key is None:
            continue
        per[key]["hours"][verdict.cls] += step / 3600.0
        per[key]["waste"][(verdict.cls, waste_of(verdict).label)] += step / 3600.0
        per[key]["details"][(verdict.cls, verdict.detail)] += step / 3600.0
        if verdict.roofline.mfu is not None and verdict.cls != "idle":
            per[key]["mfu"].append(verdict.roofline.mfu)
    rows, table = [], []
    for key in keys:
        labels, acc = objects[key], per[key]
        spent: Counter = acc["hours"]
        record = _record(labels, {}, {})
        model = device_model(record)
        for (cls, waste), spent_h in sorted(acc["waste"].items()):  # waste as agent.model.waste gives it
            rows.append(({"cluster": key[0], "class": cls, "waste": waste, "model": model, "spec": ""}, spent_h))
        top = acc["details"].most_common(1)
        profiled = any(k.startswith(PROFILER) for ts in plain[key].values() for k in ts)
        table.append({"node": key[1], "gpu": key[2], "uuid": _uuid(record, key), "model": model,
                      "partition": record.partition if record.partitions > 1 else None,
                      "partition_type": record.partition_type, "profiler": profiled,
                      "namespace": labels.get("namespace", ""), "pod": labels.get("pod", ""),
                      "hours": {c: round(spent.get(c, 0.0), 6) for c in WORKLOAD_CLASSES},
                      "class": top[0][0][0] if top else None, "detail": top[0][0][1] if top else None,
                      "mfu": round(sum(acc["mfu"]) / len(acc["mfu"]), 6) if acc["mfu"] else None})
    data = {"gpus": table, "step_s": step, "window_s": thresholds.window_s, "gpus_found": len(objects),
            "gpus_read": len(keys), "max_gpus": max_gpus, "absent_fields": absent, "samples": len(samples),
            "profiler_window_us": window_us}
    return data, group_rows(rows, ("cluster",), prices), problems


def _key(labels: dict[str, str]) -> Key:
    return labels.get("cluster", ""), labels.get("hostname", ""), labels.get("gpu_id", "")


def _text(labels: dict[str, str], name: str) -> str | None:
    value = labels.get(name)
    return value if value and value != "N/A" else None


def _record(labels: dict[str, str], values: dict[str, float], indexed: dict[str, dict[str, float]]) -> AmdRecord:
    """One step of one GPU object as the backend's exposition reader would have made it."""
    part = labels.get("gpu_partition_id", "")
    ptype = _text(labels, "gpu_compute_partition_type")
    gpu = labels.get("gpu_id", "")
    return AmdRecord(key=gpu, gpu_id=gpu, partition=index_value(part),
                     partitions=partition_count(ptype), partition_type=ptype,
                     memory_partition_type=_text(labels, "gpu_memory_partition_type"),
                     serial=_text(labels, "serial_number"), model=_text(labels, "card_model"),
                     series=_text(labels, "card_series"), hostname=_text(labels, "hostname"),
                     uuid=_text(labels, "gpu_uuid"), attribution=None, values=values, indexed=indexed)


def _uuid(record: AmdRecord, key: Key) -> str:
    if record.uuid:
        return record.uuid
    if record.serial:
        return f"{record.serial}/{record.partition}" if record.partitions > 1 else record.serial
    return f"{key[1]}/{key[2]}"


def amd_report(client: PromClient, window: Window, *, cluster: str | None, prices: Prices, thresholds: Thresholds,
               window_us: float = DEFAULT_WINDOW_US, max_gpus: int = 64, progress: Progress = lambda _: None) -> Any:
    """The whole ``--source amd`` report (a FleetReport with its amd section and class totals)."""
    from agent.views.fleet_report.collect import FleetReport

    report = FleetReport(window=window, cluster=cluster, prices=prices, source="amd")
    data, fleet, problems = collect_amd(client, window, cluster=cluster, thresholds=thresholds, prices=prices,
                                        window_us=window_us, max_gpus=max_gpus, progress=progress)
    mfus = [g["mfu"] for g in data["gpus"] if g.get("mfu") is not None]
    report.amd, report.fleet, report.problems = data, fleet, problems
    report.mfu = {"mean": round(sum(mfus) / len(mfus), 6) if mfus else None}
    report.queries = client.queries
    return report
