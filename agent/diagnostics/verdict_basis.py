"""doctor: what each GPU's verdicts will rest on, from the counters its backend found readable and the source
that gives them, and the precedence by which the classes are decided.

The same vocabulary as the ``basis`` and ``basis_source`` labels of ``roofwatch_gpu_workload_reason_info`` and
the status page (:data:`agent.model.EVIDENCE_BASES`, agent.model.counter_source), predicted from capabilities
before any verdict exists: a user reads here, before deploying, that an A100 read through NVML alone is judged by
power and memory busy time from NVML, that an H100's counters come from GPM, and an A100 beside dcgm-exporter has
them from dcgm-exporter; and what would give a GPU real counters.
"""

from __future__ import annotations

from typing import Any, Iterator, Sequence

from agent.backends.dcgm_exporter.backend import SOURCE as EXPORTER, DcgmExporterBackend
from agent.backends.dcgm_exporter.exposition import GpuRecord
from agent.backends.dcgm_exporter.join import DcgmExporterJoin
from agent.classifier.decision import PRECEDENCE
from agent.diagnostics.findings import Finding
from agent.model import EVIDENCE_BASES, DeviceInfo
from agent.model.counter_source import basis_sources, reads, with_sources

_COMPUTE = ("tensor_active", "pipe_activity")
_PROFILING_FIELDS = ("tensor_active", "sm_active", "dram_active")
_EXPORTERS = (EXPORTER, "amd-exporter")

_STATUS = {"counters": "ok", "compute_counter": "ok", "power_and_dram": "warn", "power_and_mem_busy": "warn",
           "power": "warn", "memory_only": "warn", "duty": "warn", "none": "fail"}
_FIX = {
    "nvidia": "before Hopper, DCGM profiling (dcgm: auto with nv-hostengine running) or a co-located dcgm-exporter "
              "(dcgm_exporter_url) gives tensor and DRAM counters; a job that reports tokens/s and FLOPs/token "
              "(from agent.client import report) lets its own MFU stand in (docs/classification.md, GPUs without a "
              "compute counter)",
    "amd": "amdsmi has no tensor counter: the Device Metrics Exporter's profiler series give one (amd_exporter_url "
           "joins them to amdsmi, or backend amd-exporter alone; docs/amd.md); a job that reports tokens/s and FLOPs/token (from agent.client import "
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
        exporter_alone = getattr(layer, "name", None) == "amd-exporter"  # its capabilities say what it has
        given = sources(layer, gpu) if sources is not None and not exporter_alone else {}
        if any(given.get(f) in _EXPORTERS for f in _PROFILING_FIELDS):
            return True  # dcgm-exporter or the Device Metrics Exporter, by what its latest read gave
        layer = state.get("inner")
    return False


DUTY_FIELDS = ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_DEV_GPU_UTIL")
"""The DCGM fields a dcgm-exporter sample's duty cycle (``gr_active``) is built from, first present wins
(:func:`agent.backends.dcgm_exporter.mapping.sample_values`)."""


def _layers(backend: Any) -> Iterator[Any]:
    """The backend and every backend it wraps (joins keep theirs as ``inner``)."""
    layer: Any = backend
    while layer is not None:
        yield layer
        layer = getattr(layer, "__dict__", {}).get("inner")


def _exporter_record(backend: Any, gpu: str) -> GpuRecord | None:
    """The exporter's latest record behind GPU ``gpu``: its own key on ``--backend dcgm-exporter``, the
    UUID (and GPU instance) the NVML join matched on otherwise; None without an exporter."""
    for layer in _layers(backend):
        if isinstance(layer, DcgmExporterBackend):
            return layer.reader.records().get(gpu)
        if isinstance(layer, DcgmExporterJoin):
            state = layer.join_state(gpu)
            key = state.key if state is not None else None
            return next((r for r in layer.reader.records().values() if (r.uuid, r.instance) == key), None)
    return None


def duty_source(backend: Any, gpu: str) -> str | None:
    """The DCGM field GPU ``gpu``'s duty cycle came from when dcgm-exporter gave it, else None (NVML's
    utilization.gpu, which :data:`EVIDENCE_BASES` names). Why: the duty is the fallback every basis ends
    in, and on the exporter it is one of two fields with different meanings (engine activity, or the
    share of time a kernel ran), so doctor must not name a third."""
    sources = getattr(backend, "counter_sources", None)
    if sources is None or sources(gpu).get("gr_active") != EXPORTER:
        return None
    record = _exporter_record(backend, gpu)
    return next((f for f in DUTY_FIELDS if f in record.values), None) if record is not None else None


def basis_text(basis: str, duty: str | None) -> str:
    """:data:`EVIDENCE_BASES`' words for ``basis``, naming the duty source actually read when it is known."""
    text = EVIDENCE_BASES[basis]
    if duty is None or basis == "none":
        return text
    return text.replace("utilization.gpu", duty) if "utilization.gpu" in text else f"{text}; duty cycle from {duty}"


def _named_sources(backend: Any, info: DeviceInfo) -> dict[str, str]:
    """The sources the backend will name for the GPU's fields (agent.model.counter_source): DCGM's profiling join
    the profiling fields; an exporter, joined or read alone, what its latest read gave (an exporter read alone is
    named by its devices' capabilities whatever it gave)."""
    for layer in _layers(backend):
        state = getattr(layer, "__dict__", {})
        if state.get("source") is not None and info.gpu in (state.get("joined") or {}):
            return {name: "dcgm" for name in (*_PROFILING_FIELDS, "gr_active", "fp32_active")}
    sources = getattr(backend, "counter_sources", None)
    try:
        return dict(sources(info.gpu)) if sources is not None else {}
    except Exception:  # noqa: BLE001 - which source is an extra; the vendor library's own stands in
        return {}


def predicted_sources(backend: Any, info: DeviceInfo, basis: str) -> tuple[str, ...]:
    """Where the counters a GPU's verdicts rest on will be read (``gpm``, ``dcgm``, ``dcgm-exporter``, ...): the
    status page's and the ``basis_source`` label's words, before any sample."""
    named = _named_sources(backend, info)
    return basis_sources(basis, info.vendor, info.capabilities, named,
                         lambda name: reads(name, info.capabilities, named))


def basis_findings(backend: Any, devices: Sequence[DeviceInfo]) -> list[Finding]:
    """One finding per group of GPUs sharing a basis, its source (and duty source): what their verdicts rest on,
    read from where, and how to do better."""
    groups: dict[tuple[str, str, str | None, tuple[str, ...]], list[str]] = {}
    for info in devices:
        basis = predicted_basis(info.capabilities, _joined(backend, info.gpu))
        key = (basis, info.vendor, duty_source(backend, info.gpu), predicted_sources(backend, info, basis))
        groups.setdefault(key, []).append(info.gpu)
    out = []
    for (basis, vendor, duty, sources), gpus in sorted(groups.items(),
                                                       key=lambda kv: list(EVIDENCE_BASES).index(kv[0][0])):
        status = _STATUS[basis]
        what = f"verdicts rest on {with_sources(basis, basis_text(basis, duty), sources)} (basis {basis})"
        impact = ("" if status == "ok" else "compute- vs memory- vs latency-bound is inferred with lower confidence; "
                  "where the evidence cannot separate them the verdict is unknown with the missing counter named")
        fix = "" if status == "ok" else _FIX.get(vendor, "")
        label = f"GPU {gpus[0]}" if len(gpus) == 1 else f"GPUs {', '.join(gpus)}"
        out.append(Finding("verdict basis", status, f"{label}: {what}", impact, fix))
    if out:
        out.append(precedence_finding())
    return out


def precedence_finding() -> Finding:
    """The order in which a window's class is decided (agent.classifier.decision): where a lower score wins,
    this is why, and the verdict's ``precedence`` field names the step that took precedence."""
    steps = "; ".join(f"{i}. {step.gives} if {step.why}" for i, step in enumerate(PRECEDENCE, 1))
    return Finding("verdict precedence", "info",
                   f"a class is decided in this order, not by the highest score: {steps}; then hysteresis keeps the "
                   "published class. A verdict that is not its highest score names the step in its precedence field "
                   '(e.g. "idle: no kernel ran; takes precedence over input_starved (score 0.953)"); each step\'s '
                   "rule: docs/classification.md §2")
