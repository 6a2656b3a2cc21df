"""The dcgm-exporter part of ``roofwatch doctor``: is the exporter answering, which source each GPU's
counters come from, and which counters neither source gives (with the counters-CSV line to enable).

Runs over the same backend objects the agent runs (the standalone backend, or the NVML backend
joined to the exporter), after one sample of each GPU, so it reports what the agent will read."""

from __future__ import annotations

import time
from typing import Any, Iterable, Mapping

from agent.backends.dcgm_exporter.backend import UNNAMED_MODEL
from agent.backends.dcgm_exporter.mapping import ELAPSED, PROFILING_FIELDS, counter_fields, sample_values
from agent.backends.dcgm_exporter.reader import listed
from agent.classifier.rules import duty_readings_contradict
from agent.classifier.thresholds import DEFAULT_THRESHOLDS
from agent.diagnostics.findings import Finding
from agent.diagnostics.spec_advice import IMPACT as SPEC_IMPACT
from agent.diagnostics.spec_advice import config_snippet, spec_finding
from agent.model.redact import safe_url

CSV_LINES = {
    "sm_active": "DCGM_FI_PROF_SM_ACTIVE", "sm_occupancy": "DCGM_FI_PROF_SM_OCCUPANCY",
    "tensor_active": "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "dram_active": "DCGM_FI_PROF_DRAM_ACTIVE",
    "fp64_active": "DCGM_FI_PROF_PIPE_FP64_ACTIVE", "fp32_active": "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
    "fp16_active": "DCGM_FI_PROF_PIPE_FP16_ACTIVE", "gr_active": "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
}
"""Profiling fields roofwatch uses and the dcgm-exporter counters-CSV line that exports each."""

WANTED = ("gr_active", "sm_active", "sm_occupancy", "tensor_active", "dram_active", "fp16_active", "fp32_active",
          "fp64_active")
IMPACT = ("SM activity and occupancy, tensor and FP pipe activity, DRAM bandwidth: counter MFU/MBU and the "
          "compute_bound / memory_bound / latency_bound split fall back to weaker proxies")


def reader_findings(reader: Any) -> list[Finding]:
    """Whether the exporter answered the last read, and how its exposition read."""
    status = reader.status()
    if not status.up:
        return [Finding("dcgm-exporter", "fail", f"waiting for dcgm-exporter at {safe_url(status.url)}: "
                        f"{status.error}; the agent reads it again every dcgm_exporter_interval_s and joins its "
                        "counters once it answers", "every counter taken from the exporter",
                        "check that dcgm-exporter runs on this node and that the URL (dcgm_exporter_url) reaches it; "
                        "the GPU Operator serves it on port 9400")]
    out = [Finding("dcgm-exporter", "ok", f"{status.url}: {len(status.gpus)} GPU(s) or MIG instance(s) listed")]
    if status.skipped_lines:
        out.append(Finding("dcgm-exporter", "info", f"{status.skipped_lines} unreadable line(s) skipped, first "
                           f"{status.first_bad_line}"))
    for why in getattr(status, "units", ()):
        out.append(Finding("dcgm-exporter", "info", f"unit corrected: {why}"))
    for why in getattr(status, "notes", ()):  # names no release table knows, read by stem and unit suffix
        out.append(Finding("dcgm-exporter", "info", f"assumed: {why}"))
    return out


def refused_finding(backend: Any) -> list[Finding]:
    """The exporter listed more GPUs and MIG instances than ``max_devices``: which were refused, and why."""
    refused = tuple(getattr(backend, "refused", ()))
    if not refused:
        return []
    kept = len(backend.devices)
    return [Finding("dcgm-exporter", "warn", f"{backend.reader.url} lists {kept + len(refused)} GPUs and MIG "
                    f"instances, more than max_devices ({backend.max_devices}): the first {kept} are read, "
                    f"{len(refused)} refused ({listed(refused, 4)})",
                    "every metric of the refused devices",
                    "a node has at most 16 GPUs x 7 MIG instances: check that dcgm_exporter_url is this node's own "
                    "exporter (not a federating proxy or another service); raise max_devices only if the node "
                    "really has more")]


def _missing(sources: Mapping[str, str], counted: Iterable[str] = ()) -> list[str]:
    """Wanted fields no source gives; ``counted``: those the cumulative counters give from the second read on."""
    return [f for f in WANTED if f not in sources and f not in set(counted)]


def activity_finding(gpu: str, record: Any, window: Any) -> list[Finding]:
    """Which activity the GPU's verdict reads: DCGM 4.6's cumulative counters over the agent's own window
    (Δactive / Δelapsed, preferred where the exposition has them) or DCGM's sampled ratios; none without either.
    ``window``: the backend's :class:`agent.backends.cumulative.WindowState` of the GPU, or None."""
    counted = counter_fields(record)
    if counted:
        seen = ""
        if window is not None and window.window_cycles:
            seen = f"; latest window {window.window_cycles:.3g} SM cycles"
        if window is not None and window.restarts:
            seen += f", {window.restarts} reading(s) where counters went back (restart or reset: that window dropped)"
        return [Finding("activity", "info", f"cumulative counters: {', '.join(counted)} as Δactive / Δelapsed over "
                        f"the agent's own window (DCGM_FI_PROF_*_CYCLES_ACTIVE_TOTAL over {ELAPSED}, DCGM 4.6), "
                        f"preferred to the sampled ratios{seen}", gpu=gpu)]
    sampled = sorted(f for f in sample_values(record) if f in PROFILING_FIELDS and f != "gr_active")
    if sampled:
        return [Finding("activity", "info", f"sampled ratios: {', '.join(sampled)} as DCGM averaged them over its own "
                        f"update period (no {ELAPSED}: DCGM 4.6's cumulative counters, read exactly over the agent's "
                        "window where the counters CSV exports them)", gpu=gpu)]
    return []


def _source_line(gpu: str, sources: dict[str, str], backend_name: str) -> Finding:
    by_source: dict[str, list[str]] = {}
    for name, source in sorted(sources.items()):
        by_source.setdefault(source, []).append(name)
    joined = [f for f in by_source.get("dcgm-exporter", []) if f in PROFILING_FIELDS or backend_name != "dcgm-exporter"]
    detail = "; ".join(f"{source}: {len(names)} field(s)" for source, names in sorted(by_source.items()))
    if backend_name != "dcgm-exporter" and joined:
        detail += f" (from dcgm-exporter: {', '.join(joined)})"
    return Finding("counter source", "info", detail or "no sample yet", gpu=gpu)


MIXED_MODELS = ("; this node has GPUs of several models ({models}): dcgm-exporter 4.10 and later collect there only "
                "the profiling fields every GPU supports (its release notes), so a field one model lacks is missing "
                "on all; run one exporter per model (a device selector each) to read each model's own")


def _missing_finding(gpu: str, missing: list[str], where: str, models: set[str] | None = None) -> Finding:
    lines = ", ".join(CSV_LINES[f] for f in missing)
    mixed = MIXED_MODELS.format(models=", ".join(sorted(models))) if models and len(models) > 1 else ""
    return Finding("profiling counters", "warn", f"not read: {', '.join(missing)}", IMPACT,
                   f"{where}: enable {lines} in the exporter's counters CSV (etc/dcp-metrics-included.csv lists "
                   f"them commented out; profiling needs a Volta or newer data-centre GPU){mixed}", gpu=gpu)


def _unnamed_finding(gpu: str, info: Any, profiles: list[str]) -> Finding | None:
    """For a GPU no label names (dcgm-exporter 2.x prints no ``modelName``): where its peaks came from, or
    how to name them. None when a ``specs:`` entry named them (the user already did)."""
    spec = info.spec
    if spec is not None and spec.key.startswith("override:"):
        return None
    if spec is not None:
        shared = "; TDP and NVLink unknown: the boards with these profiles differ in them" if spec.tdp_w is None else ""
        return Finding("peak specs", "info", f"the exposition names no model (no modelName label): peaks of "
                       f"{spec.name} ({spec.key}), identified by MIG profile {', '.join(profiles)}{shared}", gpu=gpu)
    return Finding("peak specs", "warn", "the exposition names no model (no modelName label, as dcgm-exporter 2.x "
                   "prints none) and no MIG profile identifies it: no peak specs", SPEC_IMPACT,
                   "name its dense datasheet peaks in the config under the name roofwatch gives such GPUs, and "
                   f"restart the agent: {config_snippet(UNNAMED_MODEL)} (docs/specs.md; the entry applies to every "
                   "GPU this exporter lists without a model), or run a dcgm-exporter release that labels modelName",
                   gpu=gpu)


def spec_findings(backend: Any, gpu: str, info: Any, record: Any, seen: set[str]) -> list[Finding]:
    """The peak-specs line of one device, once per model (once per physical GPU when unnamed): what is
    lost without catalogued peaks and the ``specs:`` entry to add, as on the NVML backend."""
    if record.model is not None:
        advice = spec_finding(info.model, info.spec, gpu, seen)
        return [advice] if advice is not None else []
    gpu_key = f"unnamed:{record.index}"
    if gpu_key in seen or (info.spec is None and UNNAMED_MODEL in seen):
        return []  # one line per physical GPU; the fix for unidentified ones is said once
    seen.add(gpu_key)
    if info.spec is None:
        seen.add(UNNAMED_MODEL)
    profiles = sorted({r.profile for r in backend.reader.records().values() if r.index == record.index and r.profile})
    finding = _unnamed_finding(gpu, info, profiles)
    return [finding] if finding is not None else []


def disagreement_finding(gpu: str, values: Mapping[str, Any], utilisation_name: str = "DCGM_FI_DEV_GPU_UTIL") -> list[Finding]:
    """A warning naming both duty readings when the profiling one is far below the utilisation counter and
    power does not side with it: the rule behind the verdict detail ``counters_disagree``, on one read."""
    profiling, utilisation = values.get("gr_active"), values.get("util_gpu")
    power, limit = values.get("power_w"), values.get("power_limit_w")
    ratio = power / limit if power is not None and limit else None
    if profiling is None or utilisation is None or not duty_readings_contradict(profiling, utilisation, ratio,
                                                                                 DEFAULT_THRESHOLDS):
        return []
    drawn = f", power {power:.0f} of {limit:.0f} W" if power is not None and limit else ""
    return [Finding("counters", "warn", f"{utilisation_name} reads {utilisation:.0%} busy{drawn}, but "
                    f"DCGM_FI_PROF_GR_ENGINE_ACTIVE reads {profiling:.3f}: the profiling counters are paused or not "
                    "updating (NVIDIA/dcgm-exporter#662)", "every verdict on this GPU: unknown (counters_disagree) "
                    "until they agree", "resume profiling (dcgmi profile --resume), or restart the exporter and its "
                    "host engine", gpu=gpu)]


def standalone_findings(backend: Any, now: float | None = None) -> tuple[list[Finding], int]:
    """``--backend dcgm-exporter``: the exporter, then per GPU its state and what it lacks."""
    now = time.time() if now is None else now
    out = reader_findings(backend.reader) + refused_finding(backend)
    usable, advised = 0, set[str]()
    models = {info.model.split(" MIG ")[0] for info in backend.devices.values()}
    for gpu, info in backend.devices.items():
        record, problem = backend.reader.lookup(gpu, now)
        if record is None:
            out.append(Finding("GPU", "fail", problem or "unavailable", "every metric of this GPU", gpu=gpu))
            continue
        usable += 1
        out.append(Finding("GPU", "info", f"{info.model} ({info.uuid}), spec "
                                          f"{info.spec.key if info.spec else 'unknown'}", gpu=gpu))
        out.extend(spec_findings(backend, gpu, info, record, advised))
        out.extend(disagreement_finding(gpu, sample_values(record)))
        sources = backend.counter_sources(gpu)
        out.append(_source_line(gpu, sources, backend.name))
        out.extend(activity_finding(gpu, record, _window(backend, gpu)))
        missing = _missing(sources, counter_fields(record))
        if missing:
            out.append(_missing_finding(gpu, missing, "the exporter does not export them", models))
    unknown = backend.unknown_gpus()
    for gpu in unknown[:16]:
        out.append(Finding("GPU", "info", "listed by the exporter since the agent started; restart the agent to read "
                           "it", gpu=gpu))
    if len(unknown) > 16:
        out.append(Finding("GPU", "info", f"and {len(unknown) - 16} more listed since the agent started"))
    return out, usable


def join_findings(backend: Any, now: float | None = None) -> list[Finding]:
    """NVML joined with the exporter: one sample of each GPU, then where each field came from."""
    now = time.time() if now is None else now
    out = reader_findings(backend.reader)
    refused = backend.reader.status().refused
    if refused:
        out.append(Finding("dcgm-exporter", "warn", f"{backend.reader.url} lists more than "
                           f"{backend.reader.max_gpus} GPUs and MIG instances: {len(refused)} past them are not "
                           f"read ({listed(refused, 4)})", "the exporter's counters for GPUs among them",
                           "check that dcgm_exporter_url is this node's own exporter"))
    for gpu in backend.inner.devices:
        try:
            sample = backend.sample(gpu, now)
        except Exception as exc:  # the NVML findings already name a GPU that cannot be read
            out.append(Finding("counter source", "info", f"no sample to join: {exc}", gpu=gpu))
            continue
        out.extend(disagreement_finding(gpu, {f: getattr(sample, f) for f in ("gr_active", "util_gpu", "power_w",
                                                                          "power_limit_w")},
                                        "NVML utilization.gpu"))
        state = backend.join_state(gpu)
        sources = backend.counter_sources(gpu)
        out.append(_source_line(gpu, sources, backend.name))
        record = backend.lookup(state.key, now)[0] if state is not None and state.key is not None else None
        counted: tuple[str, ...] = ()
        if record is not None and "nvml" not in (sources.get("sm_active"), sources.get("tensor_active")):  # not GPM
            out.extend(activity_finding(gpu, record, _window(backend, gpu)))
            counted = counter_fields(record)
        if state is not None and state.problem is not None:
            out.append(Finding("dcgm-exporter join", "warn", state.problem, "the exporter's counters for this GPU",
                               "the exporter must run on this node and list the GPU with the UUID NVML reports",
                               gpu=gpu))
        missing = _missing(sources, counted)
        if missing:
            out.append(_missing_finding(gpu, missing, "neither NVML nor the exporter gives them"))
    return out


def _window(backend: Any, gpu: str) -> Any:
    """The backend's latest counter window of ``gpu`` (agent.backends.cumulative), where it keeps one."""
    window = getattr(backend, "counter_window", None)
    return window(gpu) if window is not None else None


def findings(backend: Any) -> Iterable[Finding]:
    """The findings for whichever dcgm-exporter backend this is (none for other backends)."""
    if getattr(backend, "name", None) == "dcgm-exporter":
        return standalone_findings(backend)[0]
    if hasattr(backend, "join_state"):
        return join_findings(backend)
    return []
