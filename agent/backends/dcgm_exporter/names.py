"""One name and one unit per DCGM field, whichever release of DCGM or the exporter printed it.

dcgm-exporter names each series after the field its counters CSV lists, so what a node exports
depends on the CSV and on the DCGM release behind it. DCGM 4.6.0 (``dcgmlib/dcgm_fields.h``, July
2026) renamed the fields and kept the old names only as deprecated aliases of the same field ids:
an exporter configured with the new names prints ``DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO`` where an
older one prints ``DCGM_FI_PROF_GR_ENGINE_ACTIVE``. Some re-exporters lower-case the names
(NVIDIA/dcgm-exporter#272). :func:`canonical` maps every spelling onto the one this backend reads
(the pre-4.6 name), so the same GPU reads the same whatever its names.

Units follow the field, not the name. A new name's suffix says what the unit should be
(``_RATIO``, ``_WATTS``, ``_CELSIUS``, ``_TOTAL``), and newer exporters are reported to move some
units, so :func:`unit_corrections` checks magnitudes over one exposition and says what it changed:

* a profiling ratio above 1.5 anywhere in a family is a percentage (``DCGM_FI_PROF_*`` are 0..1);
* ``GPU_UTIL``/``MEM_COPY_UTIL`` are integer percent in DCGM (field type int64). Under a ``_RATIO``
  name a family whose values are all within 0..1.5 and not all whole numbers is a ratio; whole
  numbers stay percent (0 and 1 read alike either way for 0; 1 stays 1 %, DCGM's own type);
* an SM clock above 100,000 is in Hz, not MHz (no GPU clocks at 100 GHz);
* framebuffer sizes above 10,000,000 are bytes, not MiB (10 TiB of device memory does not exist).
"""

from __future__ import annotations

from typing import Mapping

RENAMED: dict[str, str] = {
    "DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO": "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_PROF_SM_UTIL_RATIO": "DCGM_FI_PROF_SM_ACTIVE",
    "DCGM_FI_PROF_SM_OCCUPANCY_RATIO": "DCGM_FI_PROF_SM_OCCUPANCY",
    "DCGM_FI_PROF_TENSOR_UTIL_RATIO": "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_DRAM_UTIL_RATIO": "DCGM_FI_PROF_DRAM_ACTIVE",
    "DCGM_FI_PROF_FP64_UTIL_RATIO": "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
    "DCGM_FI_PROF_FP32_UTIL_RATIO": "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
    "DCGM_FI_PROF_FP16_UTIL_RATIO": "DCGM_FI_PROF_PIPE_FP16_ACTIVE",
    "DCGM_FI_PROF_HMMA_UTIL_RATIO": "DCGM_FI_PROF_PIPE_TENSOR_HMMA_ACTIVE",
    "DCGM_FI_PROF_IMMA_UTIL_RATIO": "DCGM_FI_PROF_PIPE_TENSOR_IMMA_ACTIVE",
    "DCGM_FI_PROF_DFMA_UTIL_RATIO": "DCGM_FI_PROF_PIPE_TENSOR_DFMA_ACTIVE",
    "DCGM_FI_DEV_GPU_UTIL_RATIO": "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_BOARD_POWER_WATTS": "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_BOARD_POWER_LIMIT_REQUESTED_WATTS": "DCGM_FI_DEV_POWER_MGMT_LIMIT",
    "DCGM_FI_DEV_BOARD_POWER_LIMIT_ENFORCED_WATTS": "DCGM_FI_DEV_ENFORCED_POWER_LIMIT",
    "DCGM_FI_DEV_GPU_TEMP_CELSIUS": "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_MEMORY_TEMP_CELSIUS": "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_DEV_PCIE_REPLAY_TOTAL": "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_XID_ERROR": "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_SYSTEM_DRIVER_VERSION": "DCGM_FI_DRIVER_VERSION",
    "DCGM_FI_DEV_ROW_REMAP_CORRECTABLE_TOTAL": "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL": "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILED": "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    "DCGM_FI_DEV_NVLINK_THROUGHPUT_TOTAL": "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
}
"""DCGM 4.6 name -> the name this backend reads, for every field it reads that 4.6 renamed (the
header's deprecated block; the fields it does not rename, such as ``FB_USED``, ``SM_CLOCK`` and the
PCIe/NVLink byte rates, keep their names)."""

PROFILING_RATIOS = frozenset({
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_SM_OCCUPANCY",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
    "DCGM_FI_PROF_PIPE_FP32_ACTIVE", "DCGM_FI_PROF_PIPE_FP16_ACTIVE", "DCGM_FI_PROF_PIPE_TENSOR_HMMA_ACTIVE",
    "DCGM_FI_PROF_PIPE_TENSOR_IMMA_ACTIVE", "DCGM_FI_PROF_PIPE_TENSOR_DFMA_ACTIVE",
})
PERCENTS = frozenset({"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL"})
CLOCKS_MHZ = frozenset({"DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MAX_SM_CLOCK"})
FRAMEBUFFER_MIB = frozenset({"DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_TOTAL",
                             "DCGM_FI_DEV_FB_RESERVED"})

RATIO_AS_PERCENT_ABOVE = 1.5
HZ_ABOVE = 100_000.0
BYTES_ABOVE = 10_000_000.0


def canonical(name: str) -> str | None:
    """The name this backend reads for series ``name`` (any case, old or DCGM 4.6 spelling), or None
    for a series that is not a DCGM field."""
    upper = name.upper()
    if not upper.startswith("DCGM_FI_"):
        return None
    return RENAMED.get(upper, upper)


def unit_corrections(families: Mapping[str, list[float]], spelled: Mapping[str, str]) -> dict[str, tuple[float, str]]:
    """Canonical name -> (factor to multiply by, why) for the families of one exposition whose values
    are not in the canonical unit. ``families``: canonical name -> every value it has in the body;
    ``spelled``: canonical name -> the name the body used."""
    out: dict[str, tuple[float, str]] = {}
    for name, values in families.items():
        if not values:
            continue
        top = max(values)
        if name in PROFILING_RATIOS and top > RATIO_AS_PERCENT_ABOVE:
            out[name] = (0.01, f"{spelled.get(name, name)} reads up to {top:g}: a percentage, read as a ratio 0..1")
        elif name in PERCENTS and spelled.get(name, name).endswith("_RATIO") and top <= RATIO_AS_PERCENT_ABOVE \
                and any(v != int(v) for v in values):
            out[name] = (100.0, f"{spelled[name]} reads up to {top:g}: a ratio, read as percent")
        elif name in CLOCKS_MHZ and top > HZ_ABOVE:
            out[name] = (1e-6, f"{spelled.get(name, name)} reads {top:g}: Hz, read as MHz")
        elif name in FRAMEBUFFER_MIB and top > BYTES_ABOVE:
            out[name] = (1.0 / (1024 * 1024), f"{spelled.get(name, name)} reads {top:g}: bytes, read as MiB")
    return out
