"""A GPU no name identifies, recognised by the MIG profiles of its instances.

dcgm-exporter 2.x labels no series with ``modelName`` (NVIDIA's own published A100 example has none),
so nothing names the GPU. A MIG profile name does carry the GPU instance's memory, and NVIDIA sizes
the profiles by the GPU's memory: the MIG user guide ("Supported MIG Profiles") lists 1g.5gb,
1g.5gb+me, 1g.10gb, 2g.10gb, 3g.20gb, 4g.20gb and 7g.40gb for the A100-SXM4-40GB, and the 80 GB A100
and the H100s get other names (1g.10gb, 2g.20gb, 3g.40gb, ...). NVIDIA's vGPU C-series tables give the
same 40 GB names to the A100 PCIe 40GB, the A100 HGX 40GB and the A800 PCIe 40GB Active Cooled, an
export variant third-party spec pages list with the same GA100: 108 SMs, 1410 MHz boost, HBM2 at
1215 MHz on 5120 bits (1.555 TB/s).

So such a profile identifies "a GA100 with 40 GB", not a board. Its peaks are the ones those boards
share, :func:`shared_spec` of the catalogue's A100 SXM4 40GB and A100 PCIe 40GB: FLOP/s, bandwidth,
memory, SMs and clocks are equal; the TDP (400 W vs 250 W) and the NVLink are not, and stay unknown.
1g.10gb names no GPU (the 80 GB A100 and the H100 80GB have it too) and is not read. When the whole
GPU's framebuffer is exported it must agree with the profiles' GPU, or nothing is identified.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from agent.model import GpuSpec
from agent.model.specs.catalogue import CATALOGUE

MEMORY_TOLERANCE = 0.15
"""As the catalogue lookup's: drivers report a little less than the marketing size."""

A100_40GB_PROFILES = frozenset({"1g.5gb", "1g.5gb+me", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"})
"""MIG GPU-instance profiles only a 40 GB GA100 offers (MIG user guide; vGPU C-series tables)."""

FAMILIES: dict[str, tuple[tuple[str, ...], frozenset[str], str]] = {
    "a100-40gb": (("a100-sxm-40gb", "a100-pcie-40gb"), A100_40GB_PROFILES, "NVIDIA A100 40GB (SXM4 or PCIe)"),
}
"""Key -> (catalogue entries whose shared peaks apply, the profiles that identify them, name)."""


_SCALARS = ("tdp_w", "link_bandwidth_bytes_per_s", "mem_bandwidth_bytes_per_s", "memory_bytes", "sm_count",
            "ref_clock_mhz", "max_clock_mhz")
"""The single-valued figures of an entry that :func:`shared_spec` keeps only where every candidate agrees."""


def shared_spec(candidates: Sequence[GpuSpec], key: str, name: str, why: str) -> GpuSpec:
    """The peaks every candidate agrees on; a figure they differ on is unknown (None), never one of them."""
    first = candidates[0]
    agreed = {f: getattr(first, f) if all(getattr(c, f) == getattr(first, f) for c in candidates) else None
              for f in _SCALARS}
    flops = {d: p for d, p in first.peak_flops.items() if all(c.peak_flops.get(d) == p for c in candidates)}
    differ = [f for f in _SCALARS if agreed[f] is None and getattr(first, f)]
    unknown = f"; unknown, as the boards differ: {', '.join(differ)}" if differ else ""
    return dataclasses.replace(
        first, key=key, name=name, peak_flops=flops, pci_device_ids=(), **agreed,
        notes=(f"{why}: the peaks {', '.join(c.key for c in candidates)} share{unknown}. "
               f"Source of the shared figures: {first.notes}"))


def _family_of(profiles: Iterable[str]) -> str | None:
    """The one family these profile names identify; None for none, or for names of two families."""
    found = {key for p in profiles for key, (_, names, _) in FAMILIES.items() if p.strip().lower() in names}
    return found.pop() if len(found) == 1 else None


def spec_from_mig_profiles(profiles: Iterable[str], memory_bytes: int | None = None) -> GpuSpec | None:
    """The whole GPU's peaks from the MIG profiles of its instances (slice them per instance as usual),
    or None when no profile identifies a GPU or ``memory_bytes`` (the whole GPU's framebuffer, when
    exported) contradicts it."""
    seen = sorted({p.strip().lower() for p in profiles if p})
    family = _family_of(seen)
    if family is None:
        return None
    keys, identifying, name = FAMILIES[family]
    candidates = [next(s for s in CATALOGUE if s.key == k) for k in keys]
    why = "No model name; identified by MIG profile " + ", ".join(p for p in seen if p in identifying)
    spec = shared_spec(candidates, family, name, why)
    expected = spec.memory_bytes
    if memory_bytes and expected and abs(memory_bytes - expected) > MEMORY_TOLERANCE * expected:
        return None
    return spec
