"""doctor: what each GPU's verdicts will rest on, from the counters its backend found readable.

The same vocabulary as the ``basis`` label of ``roofwatch_gpu_workload_reason_info`` and the
status page (:data:`agent.model.EVIDENCE_BASES`), predicted from capabilities before any verdict
exists: a user reads here, before deploying, that an A100 read through NVML alone is judged by
power and memory busy time, and what would give it real counters.
"""

from __future__ import annotations

from typing import Any, Sequence

from agent.diagnostics.findings import Finding
from agent.model import EVIDENCE_BASES, DeviceInfo

_COMPUTE = ("tensor_active", "pipe_activity")
_PROFILING_FIELDS = ("tensor_active", "sm_active", "dram_active")

_STATUS = {"counters": "ok", "compute_counter": "ok", "power_and_dram": "warn", "power_and_mem_busy": "warn",
           "power": "warn", "memory_only": "warn", "duty": "warn", "none": "fail"}
_FIX = {
    "nvidia": "before Hopper, DCGM profiling (dcgm: auto with nv-hostengine running) or a co-located dcgm-exporter "
              "(dcgm_exporter_url) gives tensor and DRAM counters; a job that reports tokens/s and FLOPs/token "
              "(from agent.client import report) lets its own MFU stand in (docs/classification.md, GPUs without a "
              "compute counter)",
    "amd": "amdsmi has no tensor counter: a job that reports tokens/s and FLOPs/token (from agent.client import "
           "report) lets its own MFU stand in (docs/classification.md, GPUs without a compute counter)",
}


def predicted_basis(capabilities: Sequence[str], profiling_joined: bool = False) -> str:
    """The :data:`EVIDENCE_BASES` key a GPU with these capabilities gets when its job reports nothing."""
    caps = set(capabilities)
    if "gr_active" not in caps and not profiling_joined:
        return "none"
    compute = profiling_joined or any(c in caps for c in _COMPUTE)
    dram = profiling_joined or "dram_active" in caps
    if compute:
        return "counters" if dram else "compute_counter"
    memory = dram or "mem_busy" in caps
    if "power" in caps:
        return "power_and_dram" if dram else "power_and_mem_busy" if "mem_busy" in caps else "power"
    return "memory_only" if memory else "duty"


def _joined(backend: Any, gpu: str) -> bool:
    """Whether a DCGM or dcgm-exporter join around the backend fills this GPU's profiling counters."""
    layer: Any = backend
    while layer is not None:
        state = getattr(layer, "__dict__", {})
        if state.get("source") is not None and gpu in (state.get("joined") or {}):
            return True  # DCGM (agent.backends.profiling.ProfilingJoin)
        sources = getattr(type(layer), "counter_sources", None)
        if sources is not None and any(f in sources(layer, gpu) for f in _PROFILING_FIELDS):
            return True  # dcgm-exporter, by what its latest read gave
        layer = state.get("inner")
    return False


def basis_findings(backend: Any, devices: Sequence[DeviceInfo]) -> list[Finding]:
    """One finding per group of GPUs sharing a basis: what their verdicts rest on, and how to do better."""
    groups: dict[tuple[str, str], list[str]] = {}
    for info in devices:
        basis = predicted_basis(info.capabilities, _joined(backend, info.gpu))
        groups.setdefault((basis, info.vendor), []).append(info.gpu)
    out = []
    for (basis, vendor), gpus in sorted(groups.items(), key=lambda kv: list(EVIDENCE_BASES).index(kv[0][0])):
        status = _STATUS[basis]
        what = f"verdicts rest on {EVIDENCE_BASES[basis]} (basis {basis})"
        impact = ("" if status == "ok" else "compute- vs memory- vs latency-bound is inferred with lower confidence; "
                  "where the evidence cannot separate them the verdict is unknown with the missing counter named")
        fix = "" if status == "ok" else _FIX.get(vendor, "")
        label = f"GPU {gpus[0]}" if len(gpus) == 1 else f"GPUs {', '.join(gpus)}"
        out.append(Finding("verdict basis", status, f"{label}: {what}", impact, fix))
    return out
