"""Peak numbers for a sample that carries only what the driver said (a trace line).

In the daemon the backend already resolved each device's spec; ``roofwatch classify`` has only
the trace, so it looks the model name up in the catalogue the same way, including MIG
instances, whose driver name ends in the profile (``NVIDIA H100 80GB HBM3 MIG 3g.40gb``).
"""

from __future__ import annotations

import functools
import re

from agent.model import GpuSample, GpuSpec
from agent.specs import lookup, scale_spec

_MIG = re.compile(r"^(?P<parent>.+?)\s+MIG\s+(?P<g>[1-7])g\.(?P<gb>\d+)gb$", re.IGNORECASE)
MIG_COMPUTE_SLICES = 7


def mig_profile(model: str) -> tuple[str, int, int] | None:
    """(parent model, compute slices, memory GB) of a MIG device name, else None."""
    match = _MIG.match(model.strip())
    if not match:
        return None
    return match.group("parent"), int(match.group("g")), int(match.group("gb"))


@functools.lru_cache(maxsize=256)
def _resolve(vendor: str | None, model: str | None, memory_bytes: int | None) -> GpuSpec | None:
    if model is None:
        return None
    mig = mig_profile(model)
    if mig is None:
        return lookup(vendor=vendor, name=model, memory_bytes=memory_bytes)
    parent_name, slices, gb = mig
    parent = lookup(vendor=vendor, name=parent_name)
    if parent is None:
        return None
    mem_fraction = None
    if parent.memory_bytes:
        mem_fraction = min(1.0, gb * 2**30 / parent.memory_bytes)  # catalogue sizes are GiB
    return scale_spec(parent, slices / MIG_COMPUTE_SLICES, suffix=f"-mig-{slices}g.{gb}gb", mem_fraction=mem_fraction)


def spec_for_sample(sample: GpuSample) -> GpuSpec | None:
    """The catalogue spec (scaled for a MIG slice) for a sample's model, or None if unknown."""
    return _resolve(sample.vendor, sample.model, sample.mem_total_bytes)
