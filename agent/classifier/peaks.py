"""Peak numbers for a sample that carries only what the driver said (a trace line).

In the daemon the backend already resolved each device's spec; ``roofwatch classify`` has only
the trace, so it looks the model name up in the catalogue the same way, including MIG
instances, whose driver name ends in the profile (``NVIDIA H100 80GB HBM3 MIG 3g.40gb``).
"""

from __future__ import annotations

import functools

from agent.model import GpuSample, GpuSpec
from agent.model.specs import lookup, mig_name_spec, mig_profile


@functools.lru_cache(maxsize=256)
def _resolve(vendor: str | None, model: str | None, memory_bytes: int | None) -> GpuSpec | None:
    if model is None:
        return None
    mig = mig_profile(model)
    if mig is None:
        return lookup(vendor=vendor, name=model, memory_bytes=memory_bytes)
    parent = lookup(vendor=vendor, name=mig[0])
    if parent is None:
        return None
    return mig_name_spec(parent, model)  # a compute instance (``1c.3g.40gb``) gets its own share


def spec_for_sample(sample: GpuSample) -> GpuSpec | None:
    """The catalogue spec (scaled for a MIG slice) for a sample's model, or None if unknown."""
    return _resolve(sample.vendor, sample.model, sample.mem_total_bytes)
