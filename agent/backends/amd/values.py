"""Turning amdsmi's values into the agent's units, with ``"N/A"``, sentinels and absurd values as unknown.

amdsmi marks what it cannot read by leaving an integer at all ones. Its Python package maps
*some* of them to the string ``"N/A"``, depending on the field and the release: every release
maps the gpu_metrics fields, but amdsmi_get_energy_count passes the table's 64-bit all ones
through, clock_info's ``clk`` holds the table's 16-bit 0xFFFF in a 32-bit field that 6.4+ checks
only against 0xFFFFFFFF (and 6.2/6.3 not at all), and 7.x's ``socket_power`` is UINT32_MAX in a
64-bit field that the package compares with 0xFFFF. So every value is checked here twice: against
the all-ones of every width, and against the range a real GPU can report (a socket does not draw
65 kW, a die is not at 65 000 °C). Whatever fails either check is unknown: None, never 0, so an
unreadable counter does not look like an idle one. Pure functions, tested without a library.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Sequence

ENERGY_TICK_UJ = 15.259
"""Default energy-counter resolution (µJ per tick) when amdsmi_get_energy_count is unavailable."""
KB = 1024
"""amdsmi's XGMI accumulators count in KB of 1024 bytes (amdsmi.h: ``xgmi_read_data_acc`` [KB])."""

COUNTER_SENTINELS = frozenset({0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF})
"""All ones in a counter's own (64-bit) width, and UINT32_MAX, which amdsmi 7.x writes into
unsupported members of any width. Narrower all-ones are legitimate counts (255 ECC errors)."""

MAX_WATTS = 10_000.0
"""No accelerator socket draws more (MI355X: 1 400 W); above is a sentinel or garbage."""
CELSIUS = (-40.0, 200.0)
"""Junction, edge and HBM sensors of a running GPU (the hottest shut down near 110 °C)."""
MAX_MHZ = 20_000.0
MAX_PCIE_GBPS = 1_024.0
"""Whole GB/s over the host link (PCIe 6.0 x16 moves 256 GB/s both ways together)."""
MAX_BYTES = float(1 << 50)
"""Memory sizes and uses: a petabyte is far beyond any GPU."""
MAX_COMPUTE_UNITS = 10_000.0
POWER_CAP_UW = (1e6, 1e11)
"""A power cap between 1 W and 100 kW, in µW."""

COMPUTE_PARTITION_COUNTS = {"SPX": 1, "DPX": 2, "TPX": 3, "QPX": 4, "CPX": 8}
"""Devices one GPU shows per compute-partition mode on 8-XCD parts (TPX: MI300A's three)."""


def num(value: Any) -> float | None:
    """A finite number, else None ("N/A", None, NaN, booleans, strings)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def bounded(value: Any, low: float, high: float) -> float | None:
    """A gauge within [low, high], else None. The ranges are chosen so that the all-ones of 16 bits and
    wider fall outside every one of them (65535 MHz, 4294967295 W); an 8-bit 255 W is a real reading."""
    v = num(value)
    return None if v is None or v < low or v > high else v


def watts(value: Any) -> float | None:
    return bounded(value, 0.0, MAX_WATTS)


def celsius(value: Any) -> float | None:
    return bounded(value, *CELSIUS)


def mhz(value: Any) -> float | None:
    """A clock in MHz; 0 (a gated clock) counts as unknown, like the NVML backend's."""
    v = bounded(value, 0.0, MAX_MHZ)
    return v if v else None


def counter(value: Any) -> float | None:
    """A cumulative counter: non-negative, and not one of amdsmi's sentinels."""
    v = num(value)
    if v is None or v < 0 or (v.is_integer() and int(v) in COUNTER_SENTINELS) or v >= 2.0 ** 64:
        return None
    return v


def nbytes(value: Any) -> float | None:
    return bounded(value, 0.0, MAX_BYTES)


def percent(value: Any) -> float | None:
    """An amdsmi percentage (0..100) as a 0..1 ratio; out of range is unknown."""
    v = num(value)
    if v is None or v < 0 or v > 100:
        return None
    return v / 100.0


def mean_percent(values: Iterable[Any]) -> float | None:
    """Mean of the readable percentages (one per XCC of a partition); None if none is readable."""
    ratios = [r for r in (percent(v) for v in values) if r is not None]
    return sum(ratios) / len(ratios) if ratios else None


def first_number(*values: Any) -> float | None:
    for value in values:
        v = num(value)
        if v is not None:
            return v
    return None


def max_number(values: Iterable[Any]) -> float | None:
    nums = [v for v in (num(x) for x in values) if v is not None]
    return max(nums) if nums else None


def listed(value: Any) -> Sequence[Any]:
    """A list-valued metric, or an empty one when amdsmi reports the whole entry as N/A."""
    return value if isinstance(value, (list, tuple)) else ()


def partition_count(mode: Any) -> int:
    """Devices per GPU in compute-partition ``mode`` (unknown or unreadable mode: 1)."""
    return COMPUTE_PARTITION_COUNTS.get(str(mode).upper(), 1) if isinstance(mode, str) else 1


def parent_bdf(bdf: str) -> str:
    """``0000:18:00.3`` -> ``0000:18:00``: partitions of one GPU share domain, bus and device."""
    return bdf.rsplit(".", 1)[0] if "." in bdf else bdf
