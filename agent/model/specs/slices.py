"""Peaks of part of a GPU: a MIG instance (NVIDIA) or a compute partition (AMD), scaled from the whole."""

from __future__ import annotations

import dataclasses
import math
import re

from agent.model import GpuSpec

MIG_COMPUTE_SLICES = 7
"""Compute slices of a MIG-capable GPU (``7g`` is the whole GPU), but for those in ``_FOUR_SLICE_MODELS``."""
_FOUR_SLICE_MODELS = ("a30",)
"""GPUs whose MIG divides them in four compute slices: the MIG user guide's A30-24GB table gives a 1g.6gb a
quarter of the SMs and memory (up to four of them), a 2g.12gb half and the 4g.24gb the whole GPU."""


def mig_total_slices(key: str) -> int:
    """Compute slices of the whole GPU (catalogue ``key``): 4 on an A30, 7 on every other MIG-capable GPU;
    also the most MIG devices the GPU holds."""
    return 4 if key.startswith(_FOUR_SLICE_MODELS) else MIG_COMPUTE_SLICES


_MIG_NAME = re.compile(
    r"^(?P<parent>.+?)\s+MIG\s+(?:(?P<c>[1-7])c\.)?(?P<g>[1-7])g\.(?P<gb>\d+)gb(?P<extra>[+-][a-z0-9.+-]*)?$",
    re.IGNORECASE)
"""A MIG device name: ``<parent> MIG [<c>c.]<g>g.<N>gb[+me|-me|+gfx...]``.

NVML names a MIG device (one compute instance) after its parent and the profile; a compute
instance smaller than its GPU instance carries its own slice count first (``1c.3g.40gb``), and
some profiles end in an attribute suffix (``1g.10gb+me``: with media engines)."""


def _match(model: str) -> re.Match[str] | None:
    match = _MIG_NAME.match(model.strip())
    if match is None or (match.group("c") and int(match.group("c")) > int(match.group("g"))):
        return None
    return match


def mig_profile(model: str) -> tuple[str, int, int] | None:
    """(parent model, GPU-instance compute slices, memory GB) of a MIG device name, else None.

    NVML names a MIG device after its parent plus the profile: ``NVIDIA H100 80GB HBM3 MIG 3g.40gb``,
    or ``... MIG 1c.3g.40gb`` for a compute instance of a split GPU instance (see
    :func:`mig_compute_slices` for its own share).
    """
    match = _match(model)
    if not match:
        return None
    return match.group("parent"), int(match.group("g")), int(match.group("gb"))


def mig_compute_slices(model: str) -> int | None:
    """The compute slices of a MIG device name: ``c`` of ``<c>c.<g>g``, else its GPU instance's ``g``."""
    match = _match(model)
    if not match:
        return None
    return int(match.group("c") or match.group("g"))


def mig_slice_spec(parent: GpuSpec, slices: int, gb: int, compute_slices: int | None = None) -> GpuSpec:
    """Peaks of a ``<slices>g.<gb>gb`` instance: FLOP x slices / the GPU's compute slices (7, the A30's 4),
    memory and bandwidth x its memory share.

    ``compute_slices`` (``c`` of a ``<c>c.<slices>g.<gb>gb`` compute instance) scales FLOPs and SMs
    to the compute instance's share instead; memory and bandwidth stay the GPU instance's, which
    all its compute instances share.
    """
    mem_fraction = None
    if parent.memory_bytes:
        mem_fraction = min(1.0, gb * 2**30 / parent.memory_bytes)  # catalogue sizes are GiB
    c = slices if compute_slices is None else compute_slices
    if not 1 <= c <= slices:
        raise ValueError(f"compute slices must be 1..{slices}, got {compute_slices!r}")
    suffix = f"-mig-{slices}g.{gb}gb" if c == slices else f"-mig-{c}c.{slices}g.{gb}gb"
    return scale_spec(parent, c / mig_total_slices(parent.key), suffix=suffix, mem_fraction=mem_fraction)


def mig_name_spec(parent: GpuSpec, model: str) -> GpuSpec | None:
    """The peaks of the MIG device NVML names ``model`` on a ``parent`` GPU, or None if it is no MIG name."""
    profile = mig_profile(model)
    if profile is None:
        return None
    return mig_slice_spec(parent, profile[1], profile[2], mig_compute_slices(model))


def partition_slice_spec(parent: GpuSpec, count: int, mode: str) -> GpuSpec:
    """Peaks of one of ``count`` AMD compute partitions (``mode`` SPX/DPX/QPX/CPX): FLOPs, CUs,
    memory and bandwidth each divided by ``count``.

    Memory follows what KFD reports per partition (the total over the partition count);
    bandwidth is the fair share, since one XCD cannot pull the whole HBM bandwidth by itself.
    """
    if count <= 1:
        return parent
    return scale_spec(parent, 1.0 / count, suffix=f"-{mode.lower()}", mem_fraction=1.0 / count)


def _check_fraction(value: float, what: str) -> None:
    if not (math.isfinite(value) and 0 < value <= 1):
        raise ValueError(f"{what} must be in (0, 1], got {value!r}")


def scale_spec(spec: GpuSpec, fraction: float, *, suffix: str,
               mem_fraction: float | None = None) -> GpuSpec:
    """Peaks of a MIG slice / AMD partition: FLOP peaks and SM count times ``fraction``.

    Bandwidth and memory are scaled only by an explicit ``mem_fraction``, because the compute
    share and memory share of a slice differ (MIG 1g.10gb on H100: 16/132 SMs but 1/8 of memory),
    and AMD CPX partitions under NPS1 share all HBM. TDP stays: power is read per device.
    """
    _check_fraction(fraction, "fraction")
    bandwidth, memory, how = spec.mem_bandwidth_bytes_per_s, spec.memory_bytes, f"FLOP x{fraction:g}"
    if mem_fraction is not None:
        _check_fraction(mem_fraction, "mem_fraction")
        bandwidth = bandwidth * mem_fraction if bandwidth is not None else None
        memory = round(memory * mem_fraction) if memory is not None else None
        how += f", memory/bandwidth x{mem_fraction:g}"
    return dataclasses.replace(
        spec, key=f"{spec.key}{suffix}", name=f"{spec.name} [{suffix}]",
        peak_flops={k: v * fraction for k, v in spec.peak_flops.items()},
        sm_count=max(1, round(spec.sm_count * fraction)) if spec.sm_count else spec.sm_count,
        mem_bandwidth_bytes_per_s=bandwidth, memory_bytes=memory,
        notes=f"{spec.notes} Scaled for {suffix}: {how}.".strip(),
    )
