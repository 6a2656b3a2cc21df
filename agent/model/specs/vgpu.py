"""Peaks of an NVIDIA vGPU (C-series, "vGPU for Compute"): its profile's share of the board it runs on.

A guest's driver names its vGPU after the profile (``GRID A100-10C``, which dcgm-exporter prints as
``modelName``), never after the physical board, so no catalogue entry has that name. NVIDIA's vGPU
type tables (NVIDIA AI Enterprise, "NVIDIA AI Enterprise and NVIDIA vGPU (C-Series)",
docs.nvidia.com/ai-enterprise/release-6/latest/appendix/vgpu.html) name the board behind each
profile prefix and give each profile's frame buffer: "Time-Sliced NVIDIA vGPU (C-Series) for NVIDIA
A100 PCIe 40GB" lists A100-40C, -20C, -10C (10240 MB, 4 per GPU), -8C, -5C and -4C; the A100 HGX
40GB's are A100X-*, the A100 HGX 80GB's A100DX-*.

**Time-sliced** (``<board>-<N>C``). The same page's "Differences Between Time-Sliced and MIG-Backed
vGPUs": a time-sliced vGPU "gets full access to all streaming multiprocessors (SMs) and engines, but
only for a specific time slice", and "processes run in series, with each vGPU waiting while others
use the GPU"; its frame buffer is carved out of the board's for good. So the share applies to memory
only:

* memory: the profile's frame buffer (A100-10C: 10 GiB of the A100 PCIe 40GB's 40);
* FLOP/s, SM count and DRAM bandwidth: the whole board's. While the vGPU's slice runs, its kernels
  have every SM and the whole memory interface; MFU against them is how well the vGPU used the slices
  it got, and time spent waiting for other vGPUs reads as idle duty, not as low MFU;
* TDP: unknown. The board's power budget is shared by every vGPU on it, and a guest reads no power
  (the published vks capture of a GRID A100-10C has no power series).

**MIG-backed** (``<board>-<g>-<N>C``, ``...CME`` with media engines). The vGPU is one MIG GPU
instance (NVIDIA's tables pair A100-2-10C with MIG 2g.10gb), so it is sliced as a MIG device is
(:func:`agent.model.specs.slices.mig_slice_spec`): FLOP/s x g/7, memory and bandwidth x its share.

Only prefixes that name one catalogued board are read. A100D is left out: NVIDIA's tables use it for
the A100 PCIe 80GB and for the A100X converged card, which is not catalogued. A profile not in the
tables (a typo, a future size) is not read either: unknown, never a guessed share.
"""

from __future__ import annotations

import dataclasses
import re

from agent.model import GpuSpec
from agent.model.specs.catalogue import CATALOGUE
from agent.model.specs.slices import mig_slice_spec

GIB = 2**30

_40GB_TIME_SLICED = frozenset({4, 5, 8, 10, 20, 40})
_40GB_MIG = frozenset({(1, 5), (1, 10), (2, 10), (3, 20), (4, 20), (7, 40)})
_80GB_TIME_SLICED = frozenset({4, 8, 10, 16, 20, 40, 80})
_80GB_MIG = frozenset({(1, 10), (1, 20), (2, 20), (3, 40), (4, 40), (7, 80)})

BOARDS: dict[str, tuple[str, frozenset[int], frozenset[tuple[int, int]]]] = {
    "A100": ("a100-pcie-40gb", _40GB_TIME_SLICED, _40GB_MIG),
    "A100X": ("a100-sxm-40gb", _40GB_TIME_SLICED, _40GB_MIG),
    "A100DX": ("a100-sxm-80gb", _80GB_TIME_SLICED, _80GB_MIG),
}
"""Profile prefix -> (catalogue key of the board, time-sliced sizes in GB, MIG-backed (slices, GB) pairs),
as NVIDIA's vGPU C-series tables list them (A100 PCIe 40GB, A100 HGX 40GB, A100 HGX 80GB)."""

_NAME = re.compile(r"^(?:GRID|NVIDIA)[\s-]+(?P<board>[A-Z0-9]+)-(?:(?P<g>[1-7])-)?(?P<gb>\d{1,3})C(?P<me>ME)?$",
                   re.IGNORECASE)
"""``GRID A100-10C``, ``GRID A100-2-10C``, ``GRID A100-1-5CME`` (dashes for blanks where an exporter
replaced them)."""


def _board(key: str) -> GpuSpec:
    """The catalogue entry of a board (a KeyError here is a typo in :data:`BOARDS`, caught by the tests)."""
    return next(s for s in CATALOGUE if s.key == key)


def vgpu_profile(name: str | None) -> tuple[str, int | None, int] | None:
    """(board prefix, MIG slices or None when time-sliced, frame buffer GB) of a vGPU name NVIDIA's
    tables list for a catalogued board, else None."""
    match = _NAME.match((name or "").strip())
    if match is None:
        return None
    board, gb = match.group("board").upper(), int(match.group("gb"))
    slices = int(match.group("g")) if match.group("g") else None
    if board not in BOARDS or (match.group("me") and slices != 1):
        return None
    _, time_sliced, mig = BOARDS[board]
    known = (slices, gb) in mig if slices is not None else gb in time_sliced
    return (board, slices, gb) if known else None


def vgpu_spec(name: str | None) -> GpuSpec | None:
    """The peaks of the vGPU the driver names ``name`` (see the module docstring for which share applies
    to what), or None when ``name`` is no vGPU profile of a catalogued board."""
    profile = vgpu_profile(name)
    if profile is None:
        return None
    prefix, slices, gb = profile
    board = _board(BOARDS[prefix][0])
    label = f"{prefix}-{slices}-{gb}C" if slices is not None else f"{prefix}-{gb}C"
    if slices is not None:
        sliced = mig_slice_spec(board, slices, gb)
        return dataclasses.replace(sliced, key=f"{board.key}-vgpu-{label.lower()}",
                                   name=f"{board.name} [vGPU {label}, MIG-backed]",
                                   notes=f"{sliced.notes} vGPU {label} is MIG {slices}g.{gb}gb (NVIDIA vGPU "
                                         "C-series tables).")
    return time_sliced_spec(board, label, gb)


def time_sliced_spec(board: GpuSpec, label: str, gb: int) -> GpuSpec:
    """A time-sliced vGPU of ``gb`` GiB on ``board``: the board's FLOP/s, SMs and bandwidth, its own
    memory, no TDP (shared by every vGPU on the board, and unread in a guest)."""
    share = f"{gb} of {board.memory_bytes / GIB:g} GiB" if board.memory_bytes else f"{gb} GiB"
    return dataclasses.replace(
        board, key=f"{board.key}-vgpu-{label.lower()}", name=f"{board.name} [vGPU {label}, time-sliced]",
        memory_bytes=gb * GIB, tdp_w=None,
        notes=(f"{board.notes} vGPU {label}: time-sliced on this board (NVIDIA vGPU C-series tables); memory "
               f"is its frame buffer ({share}); FLOP/s, SMs and bandwidth are the whole board's, which a "
               "time-sliced vGPU has while its slice runs (NVIDIA: 'full access to all SMs and engines, but "
               "only for a specific time slice'); TDP unknown: the board's power is shared and unread in a "
               "guest."))
