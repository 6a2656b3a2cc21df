"""DCGM's profiling fields, what each fills in a GpuSample, and how a field value is decoded.

Ids and types from NVIDIA/DCGM dcgmlib/src/dcgm_fields.cpp (4.6.0): 1001-1008 are doubles, ratios
0..1 over the update interval (GR_ENGINE_ACTIVE, SM_ACTIVE, SM_OCCUPANCY, PIPE_TENSOR_ACTIVE,
DRAM_ACTIVE, PIPE_FP64/FP32/FP16_ACTIVE); 1009-1012 are int64 bytes per second of active PCIe
and NVLink traffic (TX is from the GPU, so a device-to-host copy is PCIe TX: dcgm_fields.h).
DCGM 4.6 renamed the Python constants (``..._UTIL_RATIO``); the ids stayed, so they are asked by id.
A value is blank when its status is not OK or it is at or above its type's BLANK sentinel
(dcgm_field_helpers.DcgmFieldValue, dcgmvalue.py).
"""

from __future__ import annotations

from typing import Any

FIELDS: dict[int, str] = {
    1001: "gr_active", 1002: "sm_active", 1003: "sm_occupancy", 1004: "tensor_active", 1005: "dram_active",
    1006: "fp64_active", 1007: "fp32_active", 1008: "fp16_active", 1009: "pcie_tx_bytes_per_s",
    1010: "pcie_rx_bytes_per_s", 1011: "link_tx_bytes_per_s", 1012: "link_rx_bytes_per_s",
}
NAMES: dict[int, str] = {
    1001: "GR_ENGINE_ACTIVE", 1002: "SM_ACTIVE", 1003: "SM_OCCUPANCY", 1004: "PIPE_TENSOR_ACTIVE",
    1005: "DRAM_ACTIVE", 1006: "PIPE_FP64_ACTIVE", 1007: "PIPE_FP32_ACTIVE", 1008: "PIPE_FP16_ACTIVE",
    1009: "PCIE_TX_BYTES", 1010: "PCIE_RX_BYTES", 1011: "NVLINK_TX_BYTES", 1012: "NVLINK_RX_BYTES",
}
"""The DCGM_FI_PROF_* names people know them by (dcgmi, dcgm-exporter) for messages and doctor."""
NAMES_4_6: dict[int, str] = {
    1001: "GR_ENGINE_UTIL_RATIO", 1002: "SM_UTIL_RATIO", 1003: "SM_OCCUPANCY_RATIO", 1004: "TENSOR_UTIL_RATIO",
    1005: "DRAM_UTIL_RATIO", 1006: "FP64_UTIL_RATIO", 1007: "FP32_UTIL_RATIO", 1008: "FP16_UTIL_RATIO",
    1009: "PCIE_TX_BYTES", 1010: "PCIE_RX_BYTES", 1011: "NVLINK_TX_BYTES", 1012: "NVLINK_RX_BYTES",
}
"""The same ids as DCGM 4.6.0 names them (``dcgmlib/dcgm_fields.h``; the names above are its
deprecated aliases), for a doctor that talks to a 4.6 or newer host engine."""
NAMES_4_8: dict[int, str] = {
    **NAMES_4_6, 1009: "PCIE_TX_BYTES_PER_SECOND", 1010: "PCIE_RX_BYTES_PER_SECOND",
    1011: "NVLINK_TX_BYTES_PER_SECOND", 1012: "NVLINK_RX_BYTES_PER_SECOND",
}
"""DCGM 4.8's names of the byte rates, as dcgm-exporter 4.10.0 (which ships DCGM 4.8.0) lists them in its
collectors ("all four still use bytes per second", its release notes). DCGM 4.7 kept 1001-1012 as 4.6 named
them; its new fields in base units (clocks in Hz, energy in J, framebuffer in bytes, ids 1600-1650) are none
that this source reads, so neither release changes a value here."""


def field_name(field_id: int, version: str | None) -> str:
    """``field_id``'s DCGM_FI_PROF_* name as the host engine of ``version`` (``"4.6.0"``) calls it."""
    if field_id in CUMULATIVE:
        return CUMULATIVE[field_id][0]  # DCGM 4.6.0 introduced them under these names
    try:
        major, minor = (int(p) for p in (version or "").split(".")[:2])
    except ValueError:
        major, minor = 0, 0
    if (major, minor) >= (4, 8):
        return NAMES_4_8[field_id]
    if (major, minor) >= (4, 6):
        return NAMES_4_6[field_id]
    return NAMES[field_id]
RATIOS = frozenset(range(1001, 1009))

BLANK = object()
"""A value DCGM holds as blank: unknown, never zero."""


def decode(fv: Any, value_module: Any) -> Any:
    """A c_dcgmFieldValue_v1's number, or BLANK. ``value_module`` is the bindings' dcgmvalue."""
    kind = chr(fv.fieldType) if isinstance(fv.fieldType, int) else str(fv.fieldType)
    if kind == "d":
        v = float(fv.value.dbl)
        return BLANK if value_module.DCGM_FP64_IS_BLANK(v) else v
    if kind in ("i", "t"):
        v = int(fv.value.i64)
        return BLANK if value_module.DCGM_INT64_IS_BLANK(v) else v
    return BLANK


def sample_value(field_id: int, value: float) -> float | None:
    """Into the sample's units: ratios clamped to 0..1, rates never negative."""
    if field_id in RATIOS:
        return min(1.0, max(0.0, float(value)))
    return max(0.0, float(value))


CUMULATIVE: dict[int, tuple[str, str | None]] = {
    1084: ("SM_CYCLES_ELAPSED_TOTAL", None),
    1085: ("SM_CYCLES_ACTIVE_TOTAL", "sm_active"),
    1086: ("MMA_CYCLES_ACTIVE_TOTAL", "tensor_active"),
    1087: ("DMMA_CYCLES_ACTIVE_TOTAL", "tensor_dmma_active"),
    1088: ("HMMA_CYCLES_ACTIVE_TOTAL", "tensor_hmma_active"),
    1089: ("IMMA_CYCLES_ACTIVE_TOTAL", "tensor_imma_active"),
    1090: ("DFMA_CYCLES_ACTIVE_TOTAL", "tensor_dfma_active"),
    1091: ("PCIE_TX_BYTES_TOTAL", None),
    1092: ("PCIE_RX_BYTES_TOTAL", None),
    1093: ("INT_CYCLES_ACTIVE_TOTAL", None),
    1094: ("FP64_CYCLES_ACTIVE_TOTAL", "fp64_active"),
    1095: ("FP32_CYCLES_ACTIVE_TOTAL", "fp32_active"),
    1096: ("FP16_CYCLES_ACTIVE_TOTAL", "fp16_active"),
}
"""DCGM 4.6.0's cumulative profiling counters (``dcgmlib/dcgm_fields.h``, ids 1084-1096; ``dcgm_fields.cpp``:
``DCGM_FT_INT64``, backed by NVML's GPM metrics 248-260 "since reboot"): ``DCGM_FI_PROF_`` + name -> the sample
field ``Δ(that counter) / Δ(SM cycles elapsed)`` fills (:mod:`agent.backends.cumulative`). The elapsed cycles are
the denominator. None: not turned into a sample field: the integer pipe has no field in the sample, and the PCIe
byte totals would need the time of DCGM's own update (an exposition carries none), so the byte-rate gauges
(1009/1010) stay the PCIe source."""
CUMULATIVE_ELAPSED = 1084
CUMULATIVE_NAMES: dict[str, int] = {f"DCGM_FI_PROF_{name}": fid for fid, (name, _) in CUMULATIVE.items()}
"""The counters by the name DCGM and dcgm-exporter print them under (its counters CSV types them ``counter``)."""
