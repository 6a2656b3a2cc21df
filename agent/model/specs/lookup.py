"""Finding a device's entry: by PCI id, driver name and memory size, or an honest estimate when none fits.

A lookup that does not match returns None rather than a near miss: a wrong peak silently
misstates MFU, while a missing one says "unknown" (estimates carry ``estimated=True``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from agent.model import GpuSpec, Vendor
from agent.model.specs.catalogue import (
    CATALOGUE,
    NAME_ALIASES,
    NAME_CONFIRMED_PCI_IDS,
    SHARED_NAMES,
    SHARED_PCI_IDS,
)
from agent.model.specs.override import override_for
from agent.model.specs.vgpu import vgpu_spec

_MEMORY_TOLERANCE = 0.15


_BRAND_TOKENS = frozenset({"nvidia", "amd", "instinct", "tesla"})


def normalise_name(name: str) -> str:
    """Lower-case alphanumeric tokens without brand words: "AMD Instinct MI300X" -> "mi300x"."""
    return " ".join(t for t in re.findall(r"[a-z0-9]+", name.lower()) if t not in _BRAND_TOKENS)


def _canon_vendor(vendor: str | None) -> Vendor | None:
    """Map "NVIDIA", "NVIDIA Corporation", "AMD", "Advanced Micro Devices" to model.Vendor."""
    v = (vendor or "").strip().lower()
    if v.startswith("nvidia"):
        return "nvidia"
    if v == "amd" or v.startswith(("amd ", "advanced micro devices")):
        return "amd"
    return None


def spec_by_key(key: str, catalogue: Sequence[GpuSpec] = CATALOGUE) -> GpuSpec:
    """The entry with this key; KeyError names the valid keys (typos in config fail loudly)."""
    for spec in catalogue:
        if spec.key == key:
            return spec
    raise KeyError(f"unknown GPU spec key {key!r}; valid keys: {', '.join(s.key for s in catalogue)}")


def _nearest_by_memory(candidates: Sequence[GpuSpec], memory_bytes: int) -> GpuSpec | None:
    """Candidate whose memory is nearest to the reported size, if within the tolerance."""
    scored = [(abs(memory_bytes - c.memory_bytes) / c.memory_bytes, c)
              for c in candidates if c.memory_bytes]
    scored = [(d, c) for d, c in scored if d <= _MEMORY_TOLERANCE]
    return min(scored, key=lambda dc: dc[0])[1] if scored else None


def _choose(candidates: Sequence[GpuSpec], memory_bytes: int | None, sm_count: int | None,
            *, confirm_sm: bool) -> GpuSpec | None:
    """Pick one candidate or none: several are told apart by memory, never by guessing."""
    if confirm_sm:
        candidates = [c for c in candidates if sm_count is not None and c.sm_count == sm_count]
    if len(candidates) == 1:
        return candidates[0]
    if len(candidates) > 1 and memory_bytes:
        return _nearest_by_memory(candidates, memory_bytes)
    return None


def _name_candidates(catalogue: Sequence[GpuSpec], name: str) -> tuple[list[GpuSpec], bool]:
    """Entries a driver name can mean, and whether an SM/CU count must confirm them."""
    norm = normalise_name(name)
    if not norm:
        return [], False
    shared = {normalise_name(n): keys for n, keys in SHARED_NAMES.items()}
    index: dict[str, set[str]] = {}
    for alias, keys in NAME_ALIASES.items():
        index.setdefault(normalise_name(alias), set()).update(keys)
    for spec in catalogue:
        for alias in (spec.name, spec.key):
            index.setdefault(normalise_name(alias), set()).add(spec.key)
    keys = shared.get(norm) or index.get(norm, ())
    return [s for s in catalogue if s.key in keys], norm in shared


def _id_candidates(pool: Sequence[GpuSpec], pci_device_id: int, name: str | None) -> list[GpuSpec]:
    """Entries a PCI id can mean. An id two SKUs share (:data:`NAME_CONFIRMED_PCI_IDS`) keeps only the
    entries the driver name also names: the id alone would hand the uncatalogued sibling our peaks."""
    by_id = [s for s in pool if pci_device_id in s.pci_device_ids]
    if pci_device_id not in NAME_CONFIRMED_PCI_IDS:
        return by_id
    named = _name_candidates(pool, name)[0] if name else []
    return [s for s in by_id if s in named]


def lookup(*, vendor: str | None = None, name: str | None = None,
           pci_device_id: int | None = None, memory_bytes: int | None = None,
           sm_count: int | None = None, catalogue: Sequence[GpuSpec] = CATALOGUE) -> GpuSpec | None:
    """Catalogue entry for a device, or None when nothing matches unambiguously.

    The PCI device id is tried first (it names the SKU; §5 keys the table by id + memory), then
    the exact normalised driver name. ``memory_bytes`` is the *full device's* total memory and only
    separates entries that share an id or a name; ``sm_count`` (SMs / CUs of the device) only
    confirms ids and names shared with uncatalogued models (MI250X vs MI250).
    """
    canon = _canon_vendor(vendor)
    if vendor is not None and canon is None:
        return None
    pool = [s for s in catalogue if canon is None or s.vendor == canon]
    if pci_device_id is not None:
        by_id = _id_candidates(pool, pci_device_id, name)
        hit = _choose(by_id, memory_bytes, sm_count, confirm_sm=pci_device_id in SHARED_PCI_IDS)
        if hit is not None:
            return hit
    if name:
        by_name, confirm = _name_candidates(pool, name)
        return _choose(by_name, memory_bytes, sm_count, confirm_sm=confirm)
    return None


def _positive(x: float | None) -> bool:
    return x is not None and math.isfinite(x) and x > 0


def estimate_spec(*, vendor: str, name: str, memory_bytes: int | None = None,
                  sm_count: int | None = None, cuda_cores: int | None = None,
                  max_sm_clock_mhz: float | None = None, mem_bus_width_bits: int | None = None,
                  max_mem_clock_mhz: float | None = None,
                  reported_mem_bandwidth_bytes_per_s: float | None = None) -> GpuSpec | None:
    """Peaks derived from what the driver reports, for models the catalogue does not hold.

    Only the two §4 formulas, which are NVML-specific: bandwidth = 2 x memClock x busWidth / 8
    (double data rate) and FP32 = cores x 2 (FMA) x max SM clock. On AMD they are not validated
    (CDNA3 dual-issue FP32 doubles the vector rate; amdsmi memory clocks need not follow NVML's
    DDR convention), so only a driver-reported bandwidth (amdsmi ``vram_max_bandwidth``) is used.
    Tensor peaks are never estimated. Returns None if no peak at all can be derived.
    """
    canon = _canon_vendor(vendor)
    if canon is None:
        return None
    peak: dict[str, float] = {}
    bandwidth: float | None = None
    how: list[str] = []
    if canon == "nvidia" and _positive(cuda_cores) and _positive(max_sm_clock_mhz):
        peak["fp32"] = cuda_cores * 2 * max_sm_clock_mhz * 1e6
        how.append(f"fp32 = {cuda_cores} CUDA cores x 2 FLOP/clk (FMA) x {max_sm_clock_mhz:g} MHz "
                   "max SM clock")
    if canon == "nvidia" and _positive(max_mem_clock_mhz) and _positive(mem_bus_width_bits):
        bandwidth = 2 * max_mem_clock_mhz * 1e6 * mem_bus_width_bits / 8
        how.append(f"bandwidth = 2 (DDR) x {max_mem_clock_mhz:g} MHz max memory clock x "
                   f"{mem_bus_width_bits} bit bus / 8")
    if bandwidth is None and _positive(reported_mem_bandwidth_bytes_per_s):
        bandwidth = reported_mem_bandwidth_bytes_per_s
        how.append("bandwidth = maximum reported by the driver")
    if not peak and bandwidth is None:
        return None
    slug = normalise_name(name).replace(" ", "-") or "unknown"
    return GpuSpec(
        key=f"estimated:{slug}", name=name, vendor=canon,
        peak_flops=peak, mem_bandwidth_bytes_per_s=bandwidth, memory_bytes=memory_bytes,
        tdp_w=None, sm_count=sm_count, ref_clock_mhz=max_sm_clock_mhz if peak else None,
        max_clock_mhz=max_sm_clock_mhz, estimated=True,
        notes="Estimated at run time, not from a datasheet: " + "; ".join(how)
        + ". No tensor peaks: they cannot be derived from driver data.",
    )


def resolve_spec(*, vendor: str | None = None, name: str | None = None,
                 pci_device_id: int | None = None, memory_bytes: int | None = None,
                 sm_count: int | None = None, cuda_cores: int | None = None,
                 max_sm_clock_mhz: float | None = None, mem_bus_width_bits: int | None = None,
                 max_mem_clock_mhz: float | None = None,
                 reported_mem_bandwidth_bytes_per_s: float | None = None) -> GpuSpec | None:
    """The config's ``specs:`` override for this driver name, else a vGPU profile's share of its board
    (:mod:`agent.model.specs.vgpu`: before the catalogue, whose PCI id would give the whole board), else
    the catalogue entry, else a flagged estimate, else None."""
    configured = override_for(name)
    if configured is not None:
        return configured
    virtual = vgpu_spec(name) if _canon_vendor(vendor) in (None, "nvidia") else None
    if virtual is not None:
        return virtual
    spec = lookup(vendor=vendor, name=name, pci_device_id=pci_device_id,
                  memory_bytes=memory_bytes, sm_count=sm_count)
    if spec is not None or vendor is None or name is None:
        return spec
    return estimate_spec(vendor=vendor, name=name, memory_bytes=memory_bytes, sm_count=sm_count,
                         cuda_cores=cuda_cores, max_sm_clock_mhz=max_sm_clock_mhz,
                         mem_bus_width_bits=mem_bus_width_bits, max_mem_clock_mhz=max_mem_clock_mhz,
                         reported_mem_bandwidth_bytes_per_s=reported_mem_bandwidth_bytes_per_s)
