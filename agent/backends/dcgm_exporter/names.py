"""One name per DCGM field, whichever release of DCGM or the exporter printed it, and the unit that name says.

dcgm-exporter names each series after the field its counters CSV lists, so what a node exports depends on
the CSV and on the DCGM release behind it. This module maps every spelling onto the one name the backend
reads (the pre-4.6 name) and says which unit the spelling is in; :mod:`agent.backends.dcgm_exporter.units`
turns the values into the canonical unit and checks their magnitudes. The releases, and where each fact
was read (docs/nvidia.md, "Names and units by release", lists them with the sources):

* **DCGM 4.6.0** (``dcgmlib/dcgm_fields.h``, July 2026) renamed fields and kept the old names as deprecated
  aliases of the same field ids, units unchanged: ``DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO`` for
  ``DCGM_FI_PROF_GR_ENGINE_ACTIVE``, ``DCGM_FI_DEV_BOARD_POWER_WATTS`` for ``DCGM_FI_DEV_POWER_USAGE``
  (:data:`RENAMED`). Some re-exporters lower-case every name (NVIDIA/dcgm-exporter#272).
* **DCGM 4.6.1 and 4.7** added fields in base units under new ids beside the old ones (go-dcgm
  ``pkg/dcgm/const_fields.go``: ``DCGM_FI_DEV_SM_CLOCK_HERTZ`` 1603, ``DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL``
  1611; 4.7: ``DCGM_FI_DEV_GPU_UTIL_RATIO`` 1613 as a double ratio, ``DCGM_FI_DEV_FB_*_BYTES`` 1625-1628,
  ``DCGM_FI_DEV_NVLINK_THROUGHPUT_BYTES_PER_SECOND`` 1648) (:data:`BASE_UNIT`).
* **dcgm-exporter 4.9.0** (DCGM 4.7.0) prints the 23 default and profiling-preset fields under those DCGM 4.7
  names; 11 change unit: clocks MHz -> Hz, energy mJ -> J, utilisation % -> ratio 0..1, framebuffer MiB ->
  bytes, NVLink MB/s -> B/s. Its driver label is ``DCGM_FI_SYSTEM_DRIVER_VERSION``, and it collects
  ``DCGM_FI_DEV_FB_CAPACITY_BYTES`` by default.
* **dcgm-exporter 4.10.0** (DCGM 4.8.0) renames ``DCGM_FI_PROF_{PCIE,NVLINK}_{TX,RX}_BYTES`` to
  ``..._BYTES_PER_SECOND``, still bytes per second (:data:`RENAMED_4_10`).

One name meant two things: ``DCGM_FI_DEV_GPU_UTIL_RATIO`` is DCGM 4.6's new name for field 203, an int64
percent, and DCGM 4.7's field 1613, a double ratio (4.7 gives 203 back its old name). dcgm-exporter prints
an int64 with ``%d`` and a double with ``%f``, so the printed value says which (:data:`TYPED_BY_PRINT`).

A ``DCGM_FI_`` name none of these tables knows is read by its stem and unit suffix where that names a field
the backend reads in a unit it can convert (:func:`resolve`, ``by_stem``): ``DCGM_FI_DEV_FB_TOTAL_BYTES``
is ``DCGM_FI_DEV_FB_TOTAL`` in bytes. Its magnitude is then checked like any other family's, and
``doctor`` says what was assumed. A release whose names this module has not seen is read that way.
"""

from __future__ import annotations

from dataclasses import dataclass

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
"""DCGM 4.6 name -> the name this backend reads, for every field it reads that 4.6 renamed, same field id and
unit (the header's deprecated block; the fields it does not rename, such as ``FB_USED``, ``SM_CLOCK`` and the
PCIe/NVLink byte rates, keep their names). ``GPU_UTIL_RATIO`` changed meaning in 4.7: :data:`TYPED_BY_PRINT`."""

RENAMED_4_10: dict[str, str] = {
    "DCGM_FI_PROF_PCIE_TX_BYTES_PER_SECOND": "DCGM_FI_PROF_PCIE_TX_BYTES",
    "DCGM_FI_PROF_PCIE_RX_BYTES_PER_SECOND": "DCGM_FI_PROF_PCIE_RX_BYTES",
    "DCGM_FI_PROF_NVLINK_TX_BYTES_PER_SECOND": "DCGM_FI_PROF_NVLINK_TX_BYTES",
    "DCGM_FI_PROF_NVLINK_RX_BYTES_PER_SECOND": "DCGM_FI_PROF_NVLINK_RX_BYTES",
}
"""dcgm-exporter 4.10.0's names of the profiling byte rates (its release notes: "all four still use bytes per
second")."""

BASE_UNIT: dict[str, tuple[str, str]] = {
    "DCGM_FI_DEV_SM_CLOCK_HERTZ": ("DCGM_FI_DEV_SM_CLOCK", "Hz"),  # 1603
    "DCGM_FI_DEV_MEMORY_CLOCK_HERTZ": ("DCGM_FI_DEV_MEM_CLOCK", "Hz"),  # 1604
    "DCGM_FI_DEV_SM_MAX_CLOCK_HERTZ": ("DCGM_FI_DEV_MAX_SM_CLOCK", "Hz"),  # 1608
    "DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL": ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "J"),  # 1611
    "DCGM_FI_DEV_MEMORY_UTIL_RATIO": ("DCGM_FI_DEV_MEM_COPY_UTIL", "ratio"),  # 1614
    "DCGM_FI_DEV_ENC_UTIL_RATIO": ("DCGM_FI_DEV_ENC_UTIL", "ratio"),  # 1615
    "DCGM_FI_DEV_DEC_UTIL_RATIO": ("DCGM_FI_DEV_DEC_UTIL", "ratio"),  # 1616
    "DCGM_FI_DEV_FB_CAPACITY_BYTES": ("DCGM_FI_DEV_FB_TOTAL", "B"),  # 1625
    "DCGM_FI_DEV_FB_FREE_BYTES": ("DCGM_FI_DEV_FB_FREE", "B"),  # 1626
    "DCGM_FI_DEV_FB_USED_BYTES": ("DCGM_FI_DEV_FB_USED", "B"),  # 1627
    "DCGM_FI_DEV_FB_RESERVED_BYTES": ("DCGM_FI_DEV_FB_RESERVED", "B"),  # 1628
    "DCGM_FI_DEV_NVLINK_THROUGHPUT_BYTES_PER_SECOND": ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "B/s"),  # 1648
}
"""DCGM 4.6.1/4.7 fields in base units -> (the name this backend reads, the unit the new field is in). The
field ids in the comments; ``GPU_UTIL_RATIO`` (1613) is in :data:`RENAMED` and :data:`TYPED_BY_PRINT`."""

TYPED_BY_PRINT = frozenset({"DCGM_FI_DEV_GPU_UTIL_RATIO"})
"""Names that meant an int64 percent in one DCGM release and a double ratio in another: a value printed with
a decimal point (``%f``) is the 4.7 ratio, one printed as an integer the 4.6 percent
(:func:`agent.backends.dcgm_exporter.units.family_factor`)."""

UNITS: dict[str, str] = {
    **dict.fromkeys(("DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_MAX_SM_CLOCK"), "MHz"),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": "mJ",
    **dict.fromkeys(("DCGM_FI_DEV_FB_TOTAL", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_RESERVED"),
                    "MiB"),
    **dict.fromkeys(("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_ENC_UTIL",
                     "DCGM_FI_DEV_DEC_UTIL"), "%"),
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": "MB/s",
    **dict.fromkeys(("DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_POWER_MGMT_LIMIT", "DCGM_FI_DEV_ENFORCED_POWER_LIMIT"),
                    "W"),
    **dict.fromkeys(("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_MEMORY_TEMP"), "C"),
    **dict.fromkeys(("DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_RX_BYTES", "DCGM_FI_PROF_NVLINK_TX_BYTES",
                     "DCGM_FI_PROF_NVLINK_RX_BYTES"), "B/s"),
    **dict.fromkeys(("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
                     "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
                     "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"), "count"),
}
"""The unit of each field this backend reads with a unit, under its canonical (pre-4.6) name; the profiling
ratios are :data:`PROFILING_RATIOS`."""

PROFILING_RATIOS = frozenset({
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_SM_OCCUPANCY",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
    "DCGM_FI_PROF_PIPE_FP32_ACTIVE", "DCGM_FI_PROF_PIPE_FP16_ACTIVE", "DCGM_FI_PROF_PIPE_TENSOR_HMMA_ACTIVE",
    "DCGM_FI_PROF_PIPE_TENSOR_IMMA_ACTIVE", "DCGM_FI_PROF_PIPE_TENSOR_DFMA_ACTIVE",
})
PERCENTS = frozenset(f for f, unit in UNITS.items() if unit == "%")
CLOCKS_MHZ = frozenset(f for f, unit in UNITS.items() if unit == "MHz")
FRAMEBUFFER_MIB = frozenset(f for f, unit in UNITS.items() if unit == "MiB")

Scale = tuple[int, int]
"""A conversion as (multiplier, divisor), applied ``value * multiplier / divisor``: exact where the result is
representable (1,410,000,000 Hz / 10**6 is 1410.0 exactly; x 1e-6 is not)."""

FACTORS: dict[tuple[str, str], Scale] = {
    ("Hz", "MHz"): (1, 10**6), ("J", "mJ"): (1000, 1), ("B", "MiB"): (1, 2**20), ("ratio", "%"): (100, 1),
    ("B/s", "MB/s"): (1, 1_024_000),
}
"""(unit a name says, canonical unit) -> scale. NVLink: the legacy total is KiB/s / 1000 ("MB/s"), the 4.7
field KiB/s x 1024 (bytes/s), so one is the other / 1,024,000."""
SAME: Scale = (1, 1)

SUFFIXES: tuple[tuple[str, str | None], ...] = (
    ("_BYTES_PER_SECOND", "B/s"), ("_JOULES_TOTAL", "J"), ("_HERTZ", "Hz"), ("_JOULES", "J"), ("_BYTES", "B"),
    ("_RATIO", "ratio"), ("_WATTS", "W"), ("_CELSIUS", "C"), ("_TOTAL", None),
)
"""DCGM's Field Naming Standard (``dcgmlib/dcgm_field_naming.py``: units BYTES, CELSIUS, HERTZ, JOULES, SECONDS,
WATTS; suffixes RATIO, TOTAL) and 4.10's ``_BYTES_PER_SECOND``, longest first; None: the field's own unit."""


@dataclass(frozen=True, slots=True)
class Name:
    """How one series name is read: the field it is, the unit the name says, and whether that was assumed."""

    field: str
    """The name this backend reads (pre-4.6 spelling)."""
    unit: str | None = None
    """The unit the name says, where it differs from :data:`UNITS`' (``"Hz"``); None: the field's own."""
    by_stem: bool = False
    """Read by its stem and unit suffix: no table here knows the name, so its unit is an assumption."""


def _stems() -> dict[str, str]:
    """Stem -> canonical field, for the names read by their stem: each field read with a unit, under its own
    name and the stems of its renamed spellings (``DCGM_FI_DEV_GPU_ENERGY`` is the energy counter)."""
    out = {field: field for field in (*UNITS, *PROFILING_RATIOS)}
    for spelled, field in (*RENAMED.items(), *((n, f) for n, (f, _) in BASE_UNIT.items())):
        for suffix, _ in SUFFIXES:
            if spelled.endswith(suffix):
                out.setdefault(spelled[:-len(suffix)], field)
                break
    return out


_STEMS = _stems()


def factor(unit: str | None, field: str) -> Scale | None:
    """What a value in ``unit`` is multiplied by to be in ``field``'s unit; None when it cannot be converted.
    ``unit`` None (a ``_TOTAL`` suffix) fits counts only: ``DCGM_FI_PROF_PCIE_TX_BYTES_TOTAL`` is a cumulative
    counter (DCGM 4.6, field 1091), not the byte rate its stem names."""
    own = "ratio" if field in PROFILING_RATIOS else UNITS.get(field)
    if unit is None:
        return SAME if own == "count" else None
    if unit == own:
        return SAME
    return FACTORS.get((unit, own)) if own is not None else None


def resolve(name: str) -> Name | None:
    """How series ``name`` is read (any case, any release's spelling), or None for a series that is not a
    DCGM field. A ``DCGM_FI_`` name no table knows is itself unless its stem and suffix name a field read here."""
    upper = name.upper()
    if not upper.startswith("DCGM_FI_"):
        return None
    if upper in BASE_UNIT:
        field, unit = BASE_UNIT[upper]
        return Name(field, unit)
    known = RENAMED.get(upper) or RENAMED_4_10.get(upper)
    if known is not None:
        return Name(known)
    if upper in _STEMS:
        return Name(upper)
    for suffix, unit in SUFFIXES:
        stem = upper[:-len(suffix)] if upper.endswith(suffix) else None
        field = _STEMS.get(stem) if stem else None
        if field is not None and factor(unit, field) is not None:
            return Name(field, unit, by_stem=True)
    return Name(upper)


def canonical(name: str) -> str | None:
    """The name this backend reads for series ``name``, or None for a series that is not a DCGM field."""
    read = resolve(name)
    return read.field if read is not None else None
