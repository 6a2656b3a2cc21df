"""One name per AMD Device Metrics Exporter (DME) series, whichever release printed it, and which
release a body's names point to.

DME names its series with hard-coded lower-case strings (``gpu_gfx_activity``: v1.5.1
``pkg/amdgpu/gpuagent/gpuagent_gpu_metrics.go:818-821``), every one a gauge, accumulators included.
An operator may glue a prefix onto every name (``CommonConfig.MetricsFieldPrefix``, through
``prometheus.WrapRegistererWithPrefix``, no separator: ``amd_gpu_gfx_activity``;
``pkg/exporter/metricsutil/metrics.go:59-62`` since v1.3.1): :func:`split` takes it off.

Releases (docs/amd.md, "AMD Device Metrics Exporter as a source", has the sources):

* 1.3.x (v1.3.1; the tag v1.3.0 is an empty commit): XGMI neighbour counters ``xgmi_neighbor_*`` and
  the violation names ``*_proc_hot_*``, ``*_soc_thermal_*``, ``*_vr_thermal_tracking_*``;
* 1.4.0 renamed them (``gpu_xgmi_nbr_*``, ``*_processor_hot_*``, ``*_socket_thermal_*``,
  ``*_vr_thermal_residency_*``; v1.5.1 ``docs/releasenotes.md:240-264``), stopped exporting fields the
  platform lacks (before: 0) and prints ``gpu_partition_id="NA"`` for an unpartitioned GPU object;
* 1.4.2 added ``gpu_min_clock``/``gpu_max_clock``/``gpu_afid_errors`` and the labels
  ``kfd_process_id``/``deployment_mode``, and prints ``clock_type="system"`` (before:
  ``GPU_CLOCK_TYPE_SYSTEM``);
* 1.5.x added ``gpu_process_cu_occupancy`` and ``gpu_vram_max_bandwidth`` (1.5.0 named
  ``gpu_violation_low_utilization_*`` ``gpu_violation_gfx_low_utilization_*``; 1.5.1 named it back).
"""

from __future__ import annotations

import re
from typing import Iterable, Mapping

PROFILER = "gpu_prof_"
"""Every profiler series starts so (config fields 801-1200; none without ``GPUConfig.ProfilerMetrics``)."""

READ = frozenset({
    "gpu_gfx_activity", "gpu_umc_activity", "gpu_package_power", "gpu_average_package_power", "gpu_power_usage",
    "gpu_energy_consumed", "gpu_clock", "gpu_max_clock", "gpu_min_clock", "gpu_edge_temperature",
    "gpu_junction_temperature", "gpu_memory_temperature", "gpu_hbm_temperature", "gpu_total_vram", "gpu_used_vram",
    "gpu_free_vram", "gpu_ecc_correct_total", "gpu_ecc_uncorrect_total", "gpu_xgmi_link_rx", "gpu_xgmi_link_tx",
    "gpu_gfx_busy_instantaneous", "gpu_health", "gpu_vram_max_bandwidth", "gpu_process_cu_occupancy",
    "gpu_prof_tensor_active_percent", "gpu_prof_sm_active", "gpu_prof_occupancy_percent", "gpu_prof_gui_util_percent",
    "gpu_prof_fetch_size", "gpu_prof_write_size", "gpu_prof_total_16_ops", "gpu_prof_total_32_ops",
    "gpu_prof_total_64_ops", "gpu_prof_grbm_count", "gpu_prof_grbm_gui_active", "gpu_prof_valu_pipe_issue_util",
})
"""The series this backend reads (1.5.x names)."""

_NEIGHBOUR_1_3 = {f"xgmi_neighbor_{n}_{old}": f"gpu_xgmi_nbr_{n}_{new}" for n in (0, 1) for old, new in (
    ("nop_tx", "nop_tx"), ("request_tx", "req_tx"), ("response_tx", "resp_tx"), ("beats_tx", "beats_tx"),
    ("tx_throughput", "tx_thrput"))}
_VIOLATION_1_3 = {
    "gpu_violation_proc_hot_residency_accumulated": "gpu_violation_processor_hot_residency_accumulated",
    "gpu_violation_soc_thermal_residency_accumulated": "gpu_violation_socket_thermal_residency_accumulated",
    "gpu_violation_vr_thermal_tracking_accumulated": "gpu_violation_vr_thermal_residency_accumulated",
}
RENAMED: dict[str, str] = {**_NEIGHBOUR_1_3, **_VIOLATION_1_3}
"""1.3.x name -> the 1.4.0+ name of the same field (v1.5.1 ``docs/releasenotes.md:240-264``)."""

OTHER = frozenset({
    *RENAMED.values(), "gpu_nodes_total", "gpu_afid_errors", "pcie_speed",
    "pcie_max_speed", "pcie_bandwidth", "gpu_vcn_activity", "gpu_jpeg_activity", "gpu_vcn_busy_instantaneous",
    "gpu_jpeg_busy_instantaneous", "gpu_violation_gfx_low_utilization_accumulated",
})
"""DME names this backend does not read but recognises (release hints, the node count)."""

KNOWN = READ | OTHER | frozenset(RENAMED)
_PREFIX = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_STARTS = re.compile(r"(?=(gpu_|pcie_|xgmi_))")


def split(name: str) -> tuple[str, str] | None:
    """(prefix, 1.4+ name) of a DME series, or None for a series that is not DME's. The prefix is the
    operator's ``MetricsFieldPrefix`` (empty without one); 1.3.x names come back renamed."""
    if name in KNOWN or name.startswith(PROFILER):
        return "", RENAMED.get(name, name)
    for match in _STARTS.finditer(name):
        rest, prefix = name[match.start():], name[:match.start()]
        if match.start() and (rest in KNOWN or rest.startswith(PROFILER)) and _PREFIX.fullmatch(prefix):
            return prefix, RENAMED.get(rest, rest)
    return None


def release_hints(spelled: Iterable[str], labels: Mapping[str, set[str]]) -> tuple[str, ...]:
    """What a body's names and label values say about the DME release that printed it (for doctor).
    ``spelled``: the names as printed, prefix taken off; ``labels``: label name -> values seen."""
    names = set(spelled)
    hints = []
    if names & set(RENAMED):
        hints.append("1.3.x names (xgmi_neighbor_*, *_proc_hot_*): read as their 1.4.0 names")
    clock_types = labels.get("clock_type", set())
    if any(t.startswith("GPU_CLOCK_TYPE_") for t in clock_types):
        hints.append("clock_type values GPU_CLOCK_TYPE_*: a release before 1.4.2")
    elif clock_types or "deployment_mode" in labels or "gpu_min_clock" in names:
        hints.append("1.4.2+ labels (clock_type system, deployment_mode)")
    if names & {"gpu_process_cu_occupancy", "gpu_vram_max_bandwidth"}:
        hints.append("1.5.x series (gpu_process_cu_occupancy, gpu_vram_max_bandwidth)")
    return tuple(hints)


def clock_type(value: str) -> str:
    """``GPU_CLOCK_TYPE_SYSTEM`` (before 1.4.2) and ``system`` (1.4.2+) alike: ``system``."""
    return value.removeprefix("GPU_CLOCK_TYPE_").lower()
