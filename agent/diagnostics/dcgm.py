"""The DCGM part of ``roofwatch doctor``: can this node's GPUs without GPM get their profiling counters?

Reads what the agent's own DCGM join found (agent.backends.profiling.ProfilingJoin over
agent.backends.dcgm.DcgmSource): whether the bindings and the host engine answered, which
profiling fields each GPU offers, and, after one real read, whether profiling is paused.
GPUs with GPM (Hopper and newer) read these counters through NVML and need no DCGM.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from agent.backends.dcgm.fields import CUMULATIVE, CUMULATIVE_ELAPSED, field_name
from agent.backends.profiling import ProfilingJoin
from agent.diagnostics.findings import Finding

CHECK = "dcgm"
IMPACT = ("SM activity, SM occupancy, tensor and FP-pipe activity, DRAM bandwidth utilisation of GPUs without GPM; "
          "counter MFU; compute_bound / latency_bound fall back to a power proxy with lower confidence")
RESUME_FIX = ("run `dcgmi profile --resume` if profiling was paused for a profiling session, or wait for Nsight "
              "Systems/Compute (or another CUPTI profiler) to finish: before Hopper DCGM and profilers share the "
              "GPU's profiling counters")


def dcgm_findings(backend: Any, settings: Any, *, sleep: Callable[[float], None] = time.sleep) -> list[Finding]:
    """Findings about DCGM profiling for ``backend`` (the agent's NVML backend as ``open_backend`` made it)."""
    join = _dcgm_join(backend)
    if join is None:
        if getattr(settings, "dcgm", "off") == "off":
            return [Finding(CHECK, "info", "DCGM profiling is off (setting dcgm: off)")]
        return []
    if join.source is None:
        if join.unavailable is None or "not needed" in join.unavailable:
            return [Finding(CHECK, "ok", "every GPU has GPM (Hopper or newer): NVML gives the profiling counters, "
                                         "DCGM is not needed")]
        return [Finding(CHECK, "fail" if join.required else "warn", join.unavailable, IMPACT,
                        "see docs/nvidia.md, \"Pre-Hopper GPUs\"")]
    source = join.source
    found = [Finding(CHECK, "ok", f"DCGM {_version(source.version)} at {source.host}: profiling counters for "
                                  f"{len(join.joined)} GPU(s) without GPM")]
    reads = _first_reads(join, sleep)
    by_uuid = {uuid: gpu for gpu, uuid in join.joined.items()}
    for uuid, state in source.gpus.items():
        gpu = by_uuid.get(uuid)
        if not state.fields:
            why = state.absent.get("profiling", "no profiling fields")
            fix = ("run nv-hostengine as root (the nvidia-dcgm service does), or use dcgm_host: embedded with the "
                   "agent as root") if "root" in why else ""
            found.append(Finding(CHECK, "warn", f"no DCGM profiling fields: {why}", IMPACT, fix, gpu=gpu))
            continue
        names = ", ".join(field_name(f, _version(source.version)) for f in state.fields)
        read = reads.get(uuid)
        if read is not None and read.paused:
            found.append(Finding(CHECK, "warn", read.reason or "profiling paused", IMPACT, RESUME_FIX, gpu=gpu))
        elif read is not None and read.reason:
            found.append(Finding(CHECK, "warn", read.reason, IMPACT, gpu=gpu))
        else:
            found.append(Finding(CHECK, "ok", f"DCGM profiling fields: {names}", gpu=gpu))
        found.extend(activity_finding(state.fields, gpu))
        missing = [k for k in state.absent if k != "profiling"]
        if missing:
            found.append(Finding(CHECK, "info", f"not offered by DCGM on this GPU: {', '.join(missing)}", gpu=gpu))
    return found


def activity_finding(fields: tuple[int, ...], gpu: str | None) -> list[Finding]:
    """That the GPU's activity is DCGM 4.6's cumulative counters over the agent's own window (Δactive / Δelapsed,
    preferred where the host engine offers them); none where it is DCGM's sampled ratios, as before 4.6 (the
    fields line names them)."""
    if CUMULATIVE_ELAPSED not in fields:
        return []
    counted = sorted({name for f in fields if f in CUMULATIVE and (name := CUMULATIVE[f][1]) is not None})
    if counted:
        return [Finding("activity", "info", f"cumulative counters: {', '.join(counted)} as Δactive / Δelapsed over "
                        f"the agent's own window (DCGM_FI_PROF_*_CYCLES_ACTIVE_TOTAL over "
                        f"DCGM_FI_PROF_{CUMULATIVE[CUMULATIVE_ELAPSED][0]}), preferred to the sampled ratios", gpu=gpu)]
    return []


def _dcgm_join(backend: Any) -> ProfilingJoin | None:
    """The DCGM join among ``backend`` and the backends it wraps."""
    seen = 0
    while backend is not None and seen < 8:
        if isinstance(backend, ProfilingJoin) and backend.label == "DCGM":
            return backend
        backend = backend.__dict__.get("inner") if hasattr(backend, "__dict__") else None
        seen += 1
    return None


def _first_reads(join: ProfilingJoin, sleep: Callable[[float], None]) -> dict[str, Any]:
    """One read per GPU after DCGM's first update (values appear one update period after the watch)."""
    source = join.source
    period = source.update_us / 1e6
    reads: dict[str, Any] = {}
    for _ in range(int(3 / period) + 3 if period < 1 else 5):
        now = time.time()
        reads = {uuid: source.read(uuid, now) for uuid, s in source.gpus.items() if s.fields}
        if not any(r.reason and "first profiling update" in r.reason for r in reads.values()):
            break
        sleep(min(period, 1.0))
    return reads


def _version(raw: str | None) -> str:
    if not raw:
        return "(version unknown)"
    for part in raw.split(";"):
        if part.startswith("version:"):
            return part.split(":", 1)[1]
    return raw
