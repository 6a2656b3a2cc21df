"""dcgm-exporter fields onto :class:`agent.model.GpuSample` fields, in the sample's units.

Units are the ones dcgm-exporter's counters CSVs (``etc/default-counters.csv``,
``etc/dcp-metrics-included.csv``) and DCGM's field documentation give: power in W, energy in mJ
since the driver loaded, clocks in MHz, framebuffer in MiB, ``DCGM_FI_PROF_*`` activity as ratios
0..1, ``DCGM_FI_PROF_PCIE_*``/``NVLINK_*`` in bytes per second, ``GPU_UTIL`` and
``MEM_COPY_UTIL`` in percent. ``MEM_COPY_UTIL`` is the share of time memory was read or written
(NVML's utilization.memory), so it becomes ``mem_busy``, never ``dram_active`` (which is
``PROF_DRAM_ACTIVE``: the share of cycles the memory interface was busy, near a fraction of peak
bandwidth). ``GPU_UTIL`` stands in for ``gr_active`` only when ``PROF_GR_ENGINE_ACTIVE`` is absent.

A field the exposition lacks is None, never zero; so is a value that means "no sensor": DCGM
reports ``MEMORY_TEMP`` 0 on boards with GDDR memory, which have no memory temperature sensor. ``DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL`` (in the
default CSV) is left out: DCGM documents no unit for it; the per-direction profiling rates are used.

DCGM 4.6's cumulative counters (``DCGM_FI_PROF_*_CYCLES_*_TOTAL``, ``TYPE counter``) are not a reading of one
record: :func:`totals` hands them to the backend, whose :class:`agent.backends.cumulative.CounterWindows` turns two
reads into activity over the window between them, winning over the ratios of the same fields.
"""

from __future__ import annotations

from typing import Any, Mapping

from agent.backends.cumulative import Totals
from agent.backends.dcgm.fields import CUMULATIVE, CUMULATIVE_ELAPSED
from agent.backends.dcgm_exporter.exposition import GpuRecord
from agent.model import RemappedRows

MIB = 1024 * 1024

RATIOS: dict[str, str] = {
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "gr_active",
    "DCGM_FI_PROF_SM_ACTIVE": "sm_active",
    "DCGM_FI_PROF_SM_OCCUPANCY": "sm_occupancy",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "tensor_active",
    "DCGM_FI_PROF_PIPE_FP64_ACTIVE": "fp64_active",
    "DCGM_FI_PROF_PIPE_FP32_ACTIVE": "fp32_active",
    "DCGM_FI_PROF_PIPE_FP16_ACTIVE": "fp16_active",
    "DCGM_FI_PROF_DRAM_ACTIVE": "dram_active",
    "DCGM_FI_PROF_PIPE_TENSOR_HMMA_ACTIVE": "tensor_hmma_active",
    "DCGM_FI_PROF_PIPE_TENSOR_IMMA_ACTIVE": "tensor_imma_active",
    "DCGM_FI_PROF_PIPE_TENSOR_DFMA_ACTIVE": "tensor_dfma_active",
}
"""DCGM profiling (DCP) ratios, 0..1 already."""

ELAPSED = f"DCGM_FI_PROF_{CUMULATIVE[CUMULATIVE_ELAPSED][0]}"
CUMULATIVE_FIELDS: dict[str, str] = {f"DCGM_FI_PROF_{name}": f for name, f in CUMULATIVE.values() if f is not None}
"""DCGM 4.6's cumulative counters (``TYPE counter`` in the exporter's counters CSV) -> the sample field their
Δ over :data:`ELAPSED`'s Δ gives (:mod:`agent.backends.cumulative`); they win over the ratios above."""

PROFILING_FIELDS: frozenset[str] = frozenset({*RATIOS.values(), *CUMULATIVE_FIELDS.values()})
"""Sample fields that only profiling counters give (NVML GPM on Hopper+, DCGM DCP on Volta+)."""

RATES: dict[str, str] = {
    "DCGM_FI_PROF_PCIE_TX_BYTES": "pcie_tx_bytes_per_s",
    "DCGM_FI_PROF_PCIE_RX_BYTES": "pcie_rx_bytes_per_s",
    "DCGM_FI_PROF_NVLINK_TX_BYTES": "link_tx_bytes_per_s",
    "DCGM_FI_PROF_NVLINK_RX_BYTES": "link_rx_bytes_per_s",
}
"""Bytes per second as DCGM averages them."""

PLAIN: dict[str, str] = {
    "DCGM_FI_DEV_POWER_USAGE": "power_w",
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": "power_limit_w",
    "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": "power_limit_w",
    "DCGM_FI_DEV_GPU_TEMP": "temperature_c",
    "DCGM_FI_DEV_MEMORY_TEMP": "memory_temperature_c",
    "DCGM_FI_DEV_SM_CLOCK": "sm_clock_mhz",
    "DCGM_FI_DEV_MAX_SM_CLOCK": "sm_clock_max_mhz",
}
"""Same unit on both sides (W, degrees C, MHz); the first listed of two for one field wins."""

COUNTS: dict[str, str] = {
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": "pcie_replays",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": "ecc_corrected_errors",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": "ecc_uncorrected_errors",
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": "clock_event_reasons",
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": "clock_event_reasons",
}
"""Integers: counts since the driver loaded, or NVML's clock-event bitmask."""


COUNTER_FIELDS: frozenset[str] = frozenset({
    *PROFILING_FIELDS, "gr_active", "util_gpu", "mem_busy", *RATES.values(), *PLAIN.values(), *COUNTS.values(),
    "energy_j", "mem_used_bytes", "mem_total_bytes", "remapped_rows"})
"""Every sample field :func:`sample_values` can give: the counters whose source ``doctor`` names."""


def totals(record: GpuRecord) -> Totals | None:
    """The record's cumulative counters, or None when it has no elapsed-cycles counter to divide by."""
    v = record.values
    if ELAPSED not in v:
        return None
    return Totals(v[ELAPSED], {f: v[name] for name, f in CUMULATIVE_FIELDS.items() if name in v})


def counter_fields(record: GpuRecord) -> tuple[str, ...]:
    """The sample fields the record's cumulative counters can give from its second reading on."""
    counted = totals(record)
    return tuple(sorted(counted.active)) if counted is not None else ()


def _ratio(value: float) -> float:
    return min(1.0, max(0.0, value))


def sample_values(record: GpuRecord) -> dict[str, Any]:
    """The sample fields this record gives (only those it has), converted to the sample's units."""
    v = record.values
    out: dict[str, Any] = {}
    for name, field in RATIOS.items():
        if name in v:
            out[field] = _ratio(v[name])
    if "DCGM_FI_DEV_GPU_UTIL" in v:
        util = _ratio(v["DCGM_FI_DEV_GPU_UTIL"] / 100.0)
        if "gr_active" in out:
            out["util_gpu"] = util  # a second duty reading beside the profiling one: the cross-check's input
        else:
            out["gr_active"] = util  # the duty itself, not a second reading: no util_gpu to compare
    if "DCGM_FI_DEV_MEM_COPY_UTIL" in v:
        out["mem_busy"] = _ratio(v["DCGM_FI_DEV_MEM_COPY_UTIL"] / 100.0)
    for name, field in RATES.items():
        if name in v and v[name] >= 0:
            out[field] = v[name]
    for name, field in PLAIN.items():
        if name in v and field not in out and (v[name] >= 0 or field.endswith("_c")):
            out[field] = v[name]
    if out.get("memory_temperature_c") == 0.0:
        del out["memory_temperature_c"]  # GDDR boards (T4, L4, L40S, RTX, vGPU) have no memory sensor: DCGM says 0
    for name, field in COUNTS.items():
        if name in v and field not in out and v[name] >= 0:
            out[field] = int(v[name])
    if "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION" in v and v["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] >= 0:
        out["energy_j"] = v["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] / 1000.0
    used, total = _memory(v)
    if used is not None:
        out["mem_used_bytes"] = used
    if total is not None:
        out["mem_total_bytes"] = total
    rows = _remapped_rows(v)
    if rows is not None:
        out["remapped_rows"] = rows
    return out


def _memory(v: Mapping[str, float]) -> tuple[int | None, int | None]:
    """Used and total framebuffer in bytes. DCGM splits the total into used + free + reserved
    (``FB_RESERVED``, DCGM 3.1+); ``FB_TOTAL`` wins when the CSV lists it."""
    used = int(v["DCGM_FI_DEV_FB_USED"] * MIB) if v.get("DCGM_FI_DEV_FB_USED", -1) >= 0 else None
    if v.get("DCGM_FI_DEV_FB_TOTAL", -1) > 0:
        return used, int(v["DCGM_FI_DEV_FB_TOTAL"] * MIB)
    if used is None or v.get("DCGM_FI_DEV_FB_FREE", -1) < 0:
        return used, None
    reserved = max(0.0, v.get("DCGM_FI_DEV_FB_RESERVED", 0.0))
    return used, int((v["DCGM_FI_DEV_FB_USED"] + v["DCGM_FI_DEV_FB_FREE"] + reserved) * MIB)


def _remapped_rows(v: Mapping[str, float]) -> RemappedRows | None:
    """Row remapping, only when all four fields are exported (pending is not in the default CSV,
    and a guessed ``pending=False`` would hide a GPU that waits for a reset)."""
    names = ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
             "DCGM_FI_DEV_ROW_REMAP_PENDING", "DCGM_FI_DEV_ROW_REMAP_FAILURE")
    if not all(name in v and v[name] >= 0 for name in names):
        return None
    return RemappedRows(correctable=int(v[names[0]]), uncorrectable=int(v[names[1]]),
                        pending=bool(v[names[2]]), failure=bool(v[names[3]]))


CAPABILITIES: dict[str, tuple[str, ...]] = {
    "gr_active": ("gr_active",), "sm_active": ("sm_active",), "sm_occupancy": ("sm_occupancy",),
    "tensor_active": ("tensor_active",), "pipe_activity": ("fp64_active", "fp32_active", "fp16_active"),
    "dram_active": ("dram_active",), "mem_busy": ("mem_busy",), "power": ("power_w",), "energy": ("energy_j",),
    "pcie": ("pcie_tx_bytes_per_s",), "nvlink": ("link_tx_bytes_per_s",), "temperature": ("temperature_c",),
    "clocks": ("sm_clock_mhz",), "memory": ("mem_used_bytes",), "ecc": ("ecc_uncorrected_errors",),
    "remapped_rows": ("remapped_rows",), "clock_event_reasons": ("clock_event_reasons",),
}
"""``DeviceInfo.capabilities`` names (as the NVML backend uses them) and the fields behind each."""


def capabilities(values: Mapping[str, Any]) -> tuple[str, ...]:
    """What a record's fields let the agent read, named as the other backends name it."""
    return tuple(cap for cap, fields in CAPABILITIES.items() if any(f in values for f in fields))
