"""Which source the counters behind a verdict came from: GPM, DCGM, dcgm-exporter, DME, NVML or amdsmi.

A verdict's ``basis`` (:data:`agent.model.verdict.EVIDENCE_BASES`) says what kind of evidence decided it
(compute-pipe and DRAM counters, power and memory busy time, ...); this module says where that evidence was
read, per GPU, so the status page, ``top``'s source, the node dashboard and doctor can say "verdict rests on
compute-pipe and DRAM bandwidth counters from GPM" rather than a list of every source roofwatch knows.

Where a sample's fields came from is what the backend knows: a join names each field's source in
``counter_sources(gpu)`` (dcgm-exporter or DME beside the vendor library, DCGM's profiling join), which the
collector keeps with the device (``DeviceState.counter_sources``). A field no join names is the vendor
library's own: NVML (its profiling fields are GPM's where the device reads GPM) or amdsmi.

The names are a fixed set (:data:`COUNTER_SOURCES`), so the ``basis_source`` label of
``roofwatch_gpu_workload_reason_info`` stays bounded.
"""

from __future__ import annotations

from typing import Callable, Iterable, Mapping

from agent.model.device import DeviceState

COUNTER_SOURCES: dict[str, str] = {
    "gpm": "GPM",
    "gpm-totals": "GPM totals",
    "dcgm": "DCGM",
    "dcgm-totals": "DCGM totals",
    "dcgm-exporter": "dcgm-exporter",
    "dcgm-exporter-totals": "dcgm-exporter totals",
    "amd-exporter": "DME",
    "nvml": "NVML",
    "amdsmi": "amdsmi",
}
"""Every source a verdict's counters can come from (the ``basis_source`` label's values, joined by ``+``), and
its short name (a terminal's). ``dcgm-totals``, ``dcgm-exporter-totals``: a field DCGM (through its bindings, or
dcgm-exporter) gave as DCGM 4.6's cumulative cycle counters, Δactive / Δelapsed over the agent's own window
(agent.backends.cumulative), not as DCGM's sampled ratio; ``gpm-totals``: the same from NVML GPM's cumulative
metrics 248-260, over the two GPM samples the ratios use (agent.backends.nvml.gpm_totals)."""
SPELLED_OUT: dict[str, str] = {
    "amd-exporter": "DME (AMD's Device Metrics Exporter)",
    "gpm-totals": "GPM's cumulative counters (Δactive / Δelapsed over the window)",
    "dcgm-totals": "DCGM's cumulative counters (Δactive / Δelapsed over the window)",
    "dcgm-exporter-totals": "dcgm-exporter's cumulative counters (Δactive / Δelapsed over the window)",
}
"""How a sentence names a source whose short name a reader may not know."""
NO_SOURCE = "none"
"""The label value when no counter stands behind the verdict (step reports, the ranks' spread, no verdict)."""

MIG_SHARE = "mig-share"
"""The source of a MIG instance's ``energy_j``: no counter of its own (NVML counts energy per board), but its
**estimated** share of its parent GPU's counter step, by activity and compute slices (agent.collector.mig_energy,
docs/attribution.md). Named in the device's ``counter_sources``; never a verdict's basis source."""
ESTIMATED_SOURCES: dict[str, str] = {MIG_SHARE: "estimate: the MIG parent GPU's energy split by activity and slices"}
"""Sources that are estimates rather than a counter, and how a view words them."""

VENDOR_LIBRARIES: dict[str, str] = {"nvidia": "nvml", "amd": "amdsmi"}
"""The source of a field no join names: the vendor library the backend reads."""
EXPORTERS = ("dcgm-exporter", "amd-exporter")
"""Sources a backend can read alone (``--backend dcgm-exporter``, ``amd-exporter``): their devices list the
source's name among their capabilities."""

GPM_FIELDS = frozenset({
    "gr_active", "sm_active", "sm_occupancy", "tensor_active", "dram_active", "fp64_active", "fp32_active",
    "fp16_active", "tensor_hmma_active", "tensor_imma_active", "tensor_dmma_active", "tensor_dfma_active",
})
"""The fields the NVML backend reads from GPM on a device whose capabilities include ``gpm``."""

_COMPUTE = ("tensor_active", "fp16_active", "fp32_active", "fp64_active")
_MEMORY = ("dram_active", "mem_busy")
BASIS_FIELDS: dict[str, tuple[tuple[str, ...], ...]] = {
    "counters": (_COMPUTE, ("dram_active",)),
    "compute_counter": (_COMPUTE,),
    "reported_mfu": (_MEMORY,),
    "power_and_dram": (("power_w",), ("dram_active",)),
    "power_and_mem_busy": (("power_w",), ("mem_busy",)),
    "power": (("power_w",),),
    "memory_only": (_MEMORY,),
    "duty": (("gr_active",),),
    "comm_counters": (("sm_active", "tensor_active"),),
    "fabric_and_power": (("power_w",),),
    "rank_spread": (("tensor_active", "sm_active", "gr_active"),),
}
"""The sample fields each basis reads: per group, the first field the sample carries (the ranks' spread compares
each rank's compute share: tensor activity, else SM, else duty; agent.classifier.jobs). Bases read from the job's
step reports or the NIC's counters (and any basis added later) name no counter source."""


def field_source(field: str, vendor: str | None, capabilities: Iterable[str],
                 counter_sources: Mapping[str, str]) -> str | None:
    """Where ``field`` of a GPU's latest sample came from: the source its backend named, else the library the
    device is read through (an exporter read alone names itself in its capabilities; NVML's profiling fields are
    GPM's on a device that reads GPM); None when unknown."""
    caps = set(capabilities)
    alone = next((s for s in EXPORTERS if s in caps), None)
    named = counter_sources.get(field) or alone or VENDOR_LIBRARIES.get(vendor or "")
    if named == "nvml" and field in GPM_FIELDS and "gpm" in caps:
        return "gpm"
    return named if named in COUNTER_SOURCES else None


def basis_sources(basis: str, vendor: str | None, capabilities: Iterable[str], counter_sources: Mapping[str, str],
                  carries: Callable[[str], bool]) -> tuple[str, ...]:
    """The sources of the fields ``basis`` reads (``carries(field)``: whether the GPU's latest sample has it), in
    the order of :data:`COUNTER_SOURCES`; () where the basis reads no counter or none is known."""
    caps = tuple(capabilities)
    found = set()
    for group in BASIS_FIELDS.get(basis, ()):
        field = next((f for f in group if carries(f)), None)
        source = field_source(field, vendor, caps, counter_sources) if field is not None else None
        if source is not None:
            found.add(source)
    return tuple(s for s in COUNTER_SOURCES if s in found)


def source_label(sources: Iterable[str]) -> str:
    """The bounded label value for a verdict's sources: ``gpm``, ``amd-exporter+amdsmi``, or ``none``."""
    known = [s for s in COUNTER_SOURCES if s in set(sources)]
    return "+".join(known) or NO_SOURCE


def sources_of_label(label: str | None) -> tuple[str, ...]:
    """The sources a ``basis_source`` label value names (unknown names dropped)."""
    return tuple(s for s in (label or "").split("+") if s in COUNTER_SOURCES)


def source_names(sources: Iterable[str], *, short: bool = False) -> list[str]:
    """The sources' names in the order of :data:`COUNTER_SOURCES` (spelled out unless ``short``)."""
    given = set(sources)
    return [COUNTER_SOURCES[s] if short else SPELLED_OUT.get(s, COUNTER_SOURCES[s]) for s in COUNTER_SOURCES if s in given]


def from_sources(sources: Iterable[str]) -> str:
    """``from GPM``, ``from amdsmi and DME (AMD's Device Metrics Exporter)``; empty without a known source."""
    names = source_names(sources)
    return "from " + " and ".join(names) if names else ""


SAID_AFTER: dict[str, tuple[str, str]] = {
    "counters": ("counters", " {origin}"),
    "compute_counter": ("compute-pipe counters", " {origin}"),
    "reported_mfu": ("memory activity", " {origin}"),
    "power_and_dram": ("DRAM activity counter", " {origin}"),
    "power_and_mem_busy": ("(utilization.memory)", " {origin}"),
    "power": ("power against its limit", " {origin}"),
    "memory_only": ("a memory counter", " {origin}"),
    "duty": ("kernel duty cycle", " {origin}"),
    "comm_counters": ("SM and tensor counters", " {origin}"),
    "fabric_and_power": ("power and memory activity", " {origin}"),
    "rank_spread": ("", "; each rank's compute share {origin}"),
}
"""Where a basis's words (:data:`EVIDENCE_BASES`) say where their counters came from: after which words (the end
when empty), and how."""


def with_sources(basis: str, words: str, sources: Iterable[str]) -> str:
    """A basis's words with where its counters came from: "compute-pipe and DRAM bandwidth counters from GPM",
    "power against its limit and a DRAM activity counter from amdsmi; no compute counter". The words unchanged
    without a known source (a replayed trace) or a place to say it."""
    origin = from_sources(sources)
    anchor, template = SAID_AFTER.get(basis, ("", ""))
    at = words.find(anchor) if anchor else len(words)
    if not origin or not template or at < 0:
        return words
    at += len(anchor) if anchor else 0
    return words[:at] + template.format(origin=origin) + words[at:]


CAPABILITY_OF: dict[str, str] = {
    "tensor_active": "tensor_active", "fp16_active": "pipe_activity", "fp32_active": "pipe_activity",
    "fp64_active": "pipe_activity", "sm_active": "sm_active", "dram_active": "dram_active", "mem_busy": "mem_busy",
    "power_w": "power", "gr_active": "gr_active",
}
"""The ``DeviceInfo.capabilities`` name that says a device reads a sample field."""


def reads(field: str, capabilities: Iterable[str], counter_sources: Mapping[str, str]) -> bool:
    """Whether a device reads ``field`` by what it found readable or a join named: the fallback where the latest
    sample lacks it (GPM's first interval after start, one failed read), so the source does not flap."""
    return field in counter_sources or CAPABILITY_OF.get(field, field) in set(capabilities)


def device_basis_sources(basis: str, device: DeviceState) -> tuple[str, ...]:
    """:func:`basis_sources` of one device as the snapshot holds it (its identity, latest sample and the sources
    its backend named): a field counts where the latest sample carries it, else where the device reads it."""
    sample, caps, named = device.sample, device.info.capabilities, device.counter_sources
    return basis_sources(basis, device.info.vendor, caps, named,
                         lambda name: (sample is not None and getattr(sample, name, None) is not None)
                         or reads(name, caps, named))
