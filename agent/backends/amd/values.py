"""Turning amdsmi's values into the agent's units, with ``"N/A"`` as unknown.

amdsmi returns dicts whose unsupported entries are the *string* ``"N/A"`` (it maps all-ones
integers, and activity above 100 %, to it). Nothing here ever turns N/A into 0: an unreadable
counter must not look like an idle one. These are pure functions so the edge cases are tested
without a library at all.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Sequence

ENERGY_TICK_UJ = 15.259
"""Default energy-counter resolution (µJ per tick) when amdsmi_get_energy_count is unavailable."""
KB = 1024
"""amdsmi's XGMI accumulators count in KB of 1024 bytes (amdsmi.h: ``xgmi_read_data_acc`` [KB])."""

COMPUTE_PARTITION_COUNTS = {"SPX": 1, "DPX": 2, "TPX": 3, "QPX": 4, "CPX": 8}
"""Devices one GPU shows per compute-partition mode on 8-XCD parts (TPX: MI300A's three)."""


def num(value: Any) -> float | None:
    """A finite number, else None ("N/A", None, NaN, booleans, strings)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


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
