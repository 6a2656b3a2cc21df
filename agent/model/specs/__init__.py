"""GPU peak-spec catalogue: dense vendor peaks, lookup by PCI id / name, run-time estimates.

Why a static table: tensor-core peaks cannot be read from NVML or amdsmi, and they are quoted at
a clock that is *not* the max clock the driver reports (H100 SXM: 989.4 TFLOP/s BF16 = 540,672
FLOP/clk x 1.83 GHz, while NVML reports 1.98 GHz). Everything here follows
../shared/reference/gpu-specs.md ("§2" etc. below), with these rules:

* Dense peaks only. Datasheets print "with sparsity" numbers that are 2x and would halve MFU.
* Per device: each MI250X GCD is its own device, so the module values are halved.
* A missing dtype key means unknown/unsupported, never zero, and nothing is guessed: a lookup that
  does not match returns None; estimates carry ``estimated=True`` and no tensor peaks.
* ``memory_bytes`` is the marketing size read as GiB (80 GB -> 80 GiB). Drivers report a little
  less (H100 80GB: 81559 MiB), so memory matching tolerates +-15%.
* PCI ids were checked against pci.ids (pciutils/pciids, version 2026.05.24) unless noted.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence

from agent.model import DTYPES, GpuSpec, Vendor

_T = 1e12
_GIB = 2**30
_MEMORY_TOLERANCE = 0.15


def _spec(key: str, name: str, vendor: Vendor, *, bf16: float | None = None, fp8: float | None = None,
          tf32: float | None = None, fp32: float | None = None, fp64: float | None = None,
          hbm_tbs: float | None, mem_gib: float | None, tdp: float | None, sms: int | None,
          ref: float | None, max_clk: float | None, link_gbs: float | None = None,
          pci: tuple[int, ...] = (), notes: str = "") -> GpuSpec:
    """One entry in datasheet units (TFLOP/s, TB/s, GiB, GB/s per direction) -> SI units.

    FP16 always equals BF16: gpu-specs.md §2 lists them as one "BF16/FP16 TC" column.
    """
    tflops = {"fp8": fp8, "bf16": bf16, "fp16": bf16, "tf32": tf32, "fp32": fp32, "fp64": fp64}
    return GpuSpec(
        key=key, name=name, vendor=vendor,
        peak_flops={k: v * _T for k, v in tflops.items() if v is not None},
        mem_bandwidth_bytes_per_s=hbm_tbs * _T if hbm_tbs else None,
        memory_bytes=round(mem_gib * _GIB) if mem_gib else None,
        tdp_w=tdp, sm_count=sms, ref_clock_mhz=ref, max_clock_mhz=max_clk,
        link_bandwidth_bytes_per_s=link_gbs * 1e9 if link_gbs else None,
        pci_device_ids=pci, notes=notes,
    )


_FP64_NV = "FP64 = FP64 tensor peak from the NVIDIA datasheet (not in gpu-specs.md). "
_A100 = ("§2 (A100 datasheet r4). " + _FP64_NV + "ref clock derived: 312e12 / (108 SM x 2048 "
         "FLOP/clk) = 1410 MHz, the boost clock.")
_HOPPER = ("ref clock from §4: 989.4e12 = 540,672 FLOP/clk (132 SM x 4096) x 1.83 GHz; max boost "
           "1.98 GHz. " + _FP64_NV)
_GH200 = ("§2 (not confirmed). TDP unknown: 450-1000 W is the whole module. GPU-to-GPU NVLink "
          "depends on the system: unknown. " + _HOPPER)

CATALOGUE: tuple[GpuSpec, ...] = (
    # --- NVIDIA Ampere: gpu-specs.md §2 A100 rows; link = NVLink3 600 GB/s bidirectional.
    _spec("a100-sxm-40gb", "NVIDIA A100 SXM4 40GB", "nvidia", bf16=312, tf32=156, fp32=19.5,
          fp64=19.5, hbm_tbs=1.555, mem_gib=40, tdp=400, sms=108, ref=1410, max_clk=1410,
          link_gbs=300, pci=(0x20B0,), notes=_A100),
    _spec("a100-sxm-80gb", "NVIDIA A100 SXM4 80GB", "nvidia", bf16=312, tf32=156, fp32=19.5,
          fp64=19.5, hbm_tbs=2.039, mem_gib=80, tdp=400, sms=108, ref=1410, max_clk=1410,
          link_gbs=300, pci=(0x20B2,), notes=_A100),
    # pci.ids lists both 20b1 and 20f1 as "GA100 [A100 PCIe 40GB]". NVLink bridge optional: None.
    _spec("a100-pcie-40gb", "NVIDIA A100 PCIe 40GB", "nvidia", bf16=312, tf32=156, fp32=19.5,
          fp64=19.5, hbm_tbs=1.555, mem_gib=40, tdp=250, sms=108, ref=1410, max_clk=1410,
          pci=(0x20F1, 0x20B1), notes=_A100),
    _spec("a100-pcie-80gb", "NVIDIA A100 PCIe 80GB", "nvidia", bf16=312, tf32=156, fp32=19.5,
          fp64=19.5, hbm_tbs=1.935, mem_gib=80, tdp=300, sms=108, ref=1410, max_clk=1410,
          pci=(0x20B5,), notes=_A100),
    # --- NVIDIA Hopper: §2 + §3 (989.4 / 1978.9 precise values); NVLink4 900 GB/s bidirectional.
    _spec("h100-sxm", "NVIDIA H100 SXM5 80GB", "nvidia", bf16=989.4, fp8=1978.9, tf32=495,
          fp32=67, fp64=67, hbm_tbs=3.35, mem_gib=80, tdp=700, sms=132, ref=1830, max_clk=1980,
          link_gbs=450, pci=(0x2330,), notes=_HOPPER),
    _spec("h100-pcie", "NVIDIA H100 PCIe", "nvidia", bf16=756, fp8=1513, tf32=378, fp32=51,
          fp64=51, hbm_tbs=2.0, mem_gib=80, tdp=350, sms=114, ref=1619, max_clk=1755,
          pci=(0x2331,), notes="§2/§3. TDP 300-350 W configurable (upper bound kept). " + _FP64_NV
          + "ref clock derived: 756e12 / (114 SM x 4096 FLOP/clk) = 1619 MHz; max boost 1755 MHz "
          "agrees with FP32 51 TF = 114 x 256 x 1.75 GHz."),
    # Per GPU, not the bridged pair of the first datasheet (§1). pci.ids: 2321 "GH100 [H100L 94GB]"
    # (NVIDIA gpu-admin-tools devid_names.py: 0x2321 = H100). Link: NVLink bridge 600 GB/s bidi.
    _spec("h100-nvl", "NVIDIA H100 NVL", "nvidia", bf16=835, fp8=1671, tf32=418, fp32=60, fp64=60,
          hbm_tbs=3.9, mem_gib=94, tdp=400, sms=132, ref=1544, max_clk=1785, link_gbs=300,
          pci=(0x2321,), notes="§2, per GPU. TDP 350-400 W configurable (upper bound kept). "
          + _FP64_NV + "132 SMs (third-party spec pages, not vendor-confirmed); ref clock derived:"
          " 835e12 / (132 x 4096) = 1544 MHz; max boost 1785 MHz agrees with FP32 60 TF = 132 x 256 x "
          "1.78 GHz. Link = NVLink bridge between a pair only."),
    _spec("h200-sxm", "NVIDIA H200 SXM 141GB", "nvidia", bf16=989.4, fp8=1978.9, tf32=495,
          fp32=67, fp64=67, hbm_tbs=4.8, mem_gib=141, tdp=700, sms=132, ref=1830, max_clk=1980,
          link_gbs=450, pci=(0x2335,), notes="§2/§3: H100 compute with 141 GB HBM3e. " + _HOPPER),
    # GH200 (GPU part): §2 says "recalled, not confirmed". pci.ids: 2342 "GH200 120GB / 480GB"
    # (the 96 GB HBM3 module), 2348 "GH200 144G HBM3e". 132 SM @ 1980 MHz seen in an OpenCL dump
    # of "NVIDIA GH200 480GB". TDP is for the whole module (450-1000 W): GPU share unknown.
    _spec("gh200-96gb", "NVIDIA GH200 96GB HBM3", "nvidia", bf16=989.4, fp8=1978.9, tf32=495,
          fp32=67, fp64=67, hbm_tbs=4.0, mem_gib=96, tdp=None, sms=132, ref=1830, max_clk=1980,
          pci=(0x2342,), notes=_GH200),
    _spec("gh200-144gb", "NVIDIA GH200 144GB HBM3e", "nvidia", bf16=989.4, fp8=1978.9, tf32=495,
          fp32=67, fp64=67, hbm_tbs=4.9, mem_gib=144, tdp=None, sms=132, ref=1830, max_clk=1980,
          pci=(0x2348,), notes=_GH200),
    # --- NVIDIA Blackwell: §2 B200 (HGX). NVLink5 1.8 TB/s bidirectional. pci.ids: 2901 "GB100
    # [B200]" (2909 "HGX B200 168GB" is a different SKU, not catalogued).
    _spec("b200", "NVIDIA B200", "nvidia", bf16=2250, fp8=4500, tf32=1100, fp32=75,
          hbm_tbs=7.7, mem_gib=180, tdp=1000, sms=148, ref=1980, max_clk=1980, link_gbs=900,
          pci=(0x2901,), notes="§2 (HGX B200). 148 SMs @ 1980 MHz from third-party spec pages, "
          "consistent with FP32 75 TF = 148 x 256 x 1.98 GHz. The tensor peak does not divide "
          "into a power-of-two FLOP/clk, so ref clock = boost clock (an estimate). FP64 omitted "
          "(37 vs 40 TF quoted by different sources)."),
    # --- NVIDIA Ada / Ampere GA102 PCIe cards (no NVLink). SM counts = CUDA cores / 128.
    _spec("l40s", "NVIDIA L40S", "nvidia", bf16=362, fp8=733, tf32=183, fp32=91.6, hbm_tbs=0.864,
          mem_gib=48, tdp=350, sms=142, ref=2520, max_clk=2520, pci=(0x26B9,),
          notes="§2 (GDDR6). 142 SMs; FP32 91.6 = 142 x 256 x 2.52 GHz. BF16 362 implies ~2490 MHz "
          "at 1024 FLOP/clk/SM, not exact, so ref clock = datasheet boost clock 2520 MHz."),
    _spec("l4", "NVIDIA L4", "nvidia", bf16=121, fp8=242.5, tf32=60, fp32=30.3, hbm_tbs=0.300,
          mem_gib=24, tdp=72, sms=58, ref=2040, max_clk=2040, pci=(0x27B8,),
          notes="§2 (GDDR6). 58 SMs; ref derived: 121e12 / (58 x 1024 FLOP/clk) = 2037 ~ 2040 MHz "
          "boost, matching FP32 30.3 = 58 x 256 x 2.04 GHz."),
    _spec("a10", "NVIDIA A10", "nvidia", bf16=125, tf32=62.5, fp32=31.2, hbm_tbs=0.600,
          mem_gib=24, tdp=150, sms=72, ref=1695, max_clk=1695, pci=(0x2236,),
          notes="§2 (GDDR6). 72 SMs; ref derived: 125e12 / (72 x 1024 FLOP/clk) = 1695 MHz boost, "
          "matching FP32 31.2 = 72 x 256 x 1.695 GHz."),
    # A10G: no public datasheet (§2). Decision: no FLOP peaks at all rather than a guess; the
    # memory side (the part that matters for memory-bound inference) is kept.
    _spec("a10g", "NVIDIA A10G", "nvidia", hbm_tbs=0.600, mem_gib=24, tdp=None, sms=None,
          ref=None, max_clk=None, pci=(0x2237,),
          notes="§2: AWS-only part with no public NVIDIA datasheet. Tensor peak unconfirmed "
          "(~70 TF is often quoted; lower than the A10 per Baseten) and FP32 only '~31' - all FLOP "
          "peaks left out (unknown) until measured on hardware. TDP '~150 W' unconfirmed: left "
          "unknown, read the enforced power limit instead."),
    # --- AMD CDNA2/3/4 (dense figures from AMD). XGMI per-direction bandwidth not confirmed: None.
    # pci.ids: 7408 "[Instinct MI250X]"; 740c "[Instinct MI250X/MI250]" is shared with the
    # uncatalogued MI250 (104 CUs per GCD), so lookup only trusts 740c with a CU count of 110.
    _spec("mi250x", "AMD Instinct MI250X (per GCD)", "amd", bf16=191.5, fp32=23.95, fp64=47.85,
          hbm_tbs=1.6, mem_gib=64, tdp=560, sms=110, ref=1700, max_clk=1700, pci=(0x7408, 0x740C),
          notes="§2 module values halved: each GCD is one device. No TF32 (FP32 matrix 95.7/module "
          "is not TF32). FP64 = FP64 matrix 95.7 TF/module (AMD MI200 table) halved. TDP = whole "
          "OAM (500-560 W; 560 for MI250X): power is read per package. ref derived: 191.5e12 / "
          "(110 CU x 1024 FLOP/clk) = 1700 MHz peak engine clock."),
    _spec("mi300x", "AMD Instinct MI300X", "amd", bf16=1307.4, fp8=2614.9, tf32=653.7,
          fp32=163.4, fp64=163.4, hbm_tbs=5.3, mem_gib=192, tdp=750, sms=304, ref=2100,
          max_clk=2100, pci=(0x74A1,),
          notes="§2 (AMD data sheet, recalled; cross-checked with MI325X = same compute). FP64 = "
          "FP64 matrix peak (AMD). ref derived: 1307.4e12 / (304 CU x 2048 FLOP/clk) = 2100 MHz "
          "peak engine clock."),
    _spec("mi325x", "AMD Instinct MI325X", "amd", bf16=1307.4, fp8=2614.9, tf32=653.7,
          fp32=163.4, fp64=163.4, hbm_tbs=6.0, mem_gib=256, tdp=1000, sms=304, ref=2100,
          max_clk=2100, pci=(0x74A5,),
          notes="§2 (AMD spec: FP8 2614.9, FP16 1307.4, TF32 653.7). Same compute as MI300X. "
          "FP64 = FP64 matrix peak (AMD). ref derived as for MI300X."),
    _spec("mi355x", "AMD Instinct MI355X", "amd", bf16=2500, fp8=5000, fp32=157.3, hbm_tbs=8.0,
          mem_gib=288, tdp=1400, sms=256, ref=2384, max_clk=2400, pci=(0x75A3,),
          notes="§2: BF16 ~2.5 PF / FP8 ~5 PF dense (ISSCC: 256 CU x 8192 FP8 FLOP/clk). ref "
          "derived: 5e15 / (256 x 8192) = 2384 MHz; max 2400 MHz. FP32 157.3 was recalled, not "
          "read from a source (unconfirmed). TF32 not listed (believed removed in CDNA4). FP64 "
          "omitted (unconfirmed)."),
)

# PCI ids that one catalogued model shares with an uncatalogued one: only a matching SM/CU count
# may confirm them, or the sibling (MI250, 104 CUs/GCD, ~6% slower) would silently get our peaks.
_SHARED_PCI_IDS: frozenset[int] = frozenset({0x740C})

# Driver names (NVML nvmlDeviceGetName, amdsmi market_name) -> candidate keys. Each entry's own
# name and key are aliases too. Exact matches only: "NVIDIA H200 NVL" must not become an H200 SXM.
_NAME_ALIASES: dict[str, tuple[str, ...]] = {
    "NVIDIA A100-SXM4-40GB": ("a100-sxm-40gb",),
    "NVIDIA A100-SXM4-80GB": ("a100-sxm-80gb",),
    "NVIDIA A100-PCIE-40GB": ("a100-pcie-40gb",),
    "NVIDIA A100 80GB PCIe": ("a100-pcie-80gb",),
    "NVIDIA A100-PCIE-80GB": ("a100-pcie-80gb",),
    "NVIDIA H100 80GB HBM3": ("h100-sxm",),
    "NVIDIA H200": ("h200-sxm",),
    "NVIDIA GH200 480GB": ("gh200-96gb", "gh200-144gb"),  # name omits the HBM size: use memory
    "NVIDIA GH200": ("gh200-96gb", "gh200-144gb"),
    "NVIDIA GH200 144G HBM3e": ("gh200-144gb",),
}
# Names that cover an uncatalogued sibling too; like _SHARED_PCI_IDS they need an SM/CU match.
_SHARED_NAMES: dict[str, tuple[str, ...]] = {"AMD Instinct MI250X / MI250": ("mi250x",)}

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
    shared = {normalise_name(n): keys for n, keys in _SHARED_NAMES.items()}
    index: dict[str, set[str]] = {}
    for alias, keys in _NAME_ALIASES.items():
        index.setdefault(normalise_name(alias), set()).update(keys)
    for spec in catalogue:
        for alias in (spec.name, spec.key):
            index.setdefault(normalise_name(alias), set()).add(spec.key)
    keys = shared.get(norm) or index.get(norm, ())
    return [s for s in catalogue if s.key in keys], norm in shared


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
        by_id = [s for s in pool if pci_device_id in s.pci_device_ids]
        hit = _choose(by_id, memory_bytes, sm_count, confirm_sm=pci_device_id in _SHARED_PCI_IDS)
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
    """Catalogue entry if one matches, else a flagged estimate, else None."""
    spec = lookup(vendor=vendor, name=name, pci_device_id=pci_device_id,
                  memory_bytes=memory_bytes, sm_count=sm_count)
    if spec is not None or vendor is None or name is None:
        return spec
    return estimate_spec(vendor=vendor, name=name, memory_bytes=memory_bytes, sm_count=sm_count,
                         cuda_cores=cuda_cores, max_sm_clock_mhz=max_sm_clock_mhz,
                         mem_bus_width_bits=mem_bus_width_bits, max_mem_clock_mhz=max_mem_clock_mhz,
                         reported_mem_bandwidth_bytes_per_s=reported_mem_bandwidth_bytes_per_s)


MIG_COMPUTE_SLICES = 7
"""Compute slices of a MIG-capable GPU (``7g`` is the whole GPU)."""
_MIG_NAME = re.compile(r"^(?P<parent>.+?)\s+MIG\s+(?P<g>[1-7])g\.(?P<gb>\d+)gb$", re.IGNORECASE)


def mig_profile(model: str) -> tuple[str, int, int] | None:
    """(parent model, compute slices, memory GB) of a MIG device name, else None.

    NVML names a MIG device after its parent plus the profile: ``NVIDIA H100 80GB HBM3 MIG 3g.40gb``.
    """
    match = _MIG_NAME.match(model.strip())
    if not match:
        return None
    return match.group("parent"), int(match.group("g")), int(match.group("gb"))


def mig_slice_spec(parent: GpuSpec, slices: int, gb: int) -> GpuSpec:
    """Peaks of a ``<slices>g.<gb>gb`` instance: FLOP x slices/7, memory and bandwidth x its memory share."""
    mem_fraction = None
    if parent.memory_bytes:
        mem_fraction = min(1.0, gb * 2**30 / parent.memory_bytes)  # catalogue sizes are GiB
    return scale_spec(parent, slices / MIG_COMPUTE_SLICES, suffix=f"-mig-{slices}g.{gb}gb", mem_fraction=mem_fraction)


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


def achieved_flops(spec: GpuSpec, dtype: str, tensor_active: float | None,
                   sm_clock_mhz: float | None) -> float | None:
    """OFU-style FLOP/s estimate: tensor_active x peak(dtype) x min(1, clock / ref clock).

    The clock ratio is capped at 1 (and activity clamped to 0..1) so an estimate never exceeds the
    peak; an unknown clock or reference clock gives ratio 1. None when the dtype peak or the
    activity is unknown: unknown must not read as zero.
    """
    peak = spec.peak_flops.get(dtype)
    if peak is None or tensor_active is None or not math.isfinite(tensor_active):
        return None
    return min(1.0, max(0.0, tensor_active)) * peak * clock_factor(sm_clock_mhz, spec.ref_clock_mhz)


def clock_factor(sm_clock_mhz: float | None, ref_clock_mhz: float | None) -> float:
    """min(1, clock / the clock the peaks are quoted at): boost above it is not credited.

    1 when either clock is unknown, so an unknown clock never shrinks an estimate to zero.
    """
    if sm_clock_mhz is None or not math.isfinite(sm_clock_mhz) or not _positive(ref_clock_mhz):
        return 1.0
    return min(1.0, max(0.0, sm_clock_mhz / ref_clock_mhz))  # type: ignore[operator]


def _fmt(value: float | None, scale: float, digits: int) -> str:
    return "—" if value is None else f"{value / scale:.{digits}f}"


_COLUMNS = ("key", "name", "BF16 TF/s", "FP8 TF/s", "TF32 TF/s", "FP32 TF/s", "HBM TB/s",
            "Mem GiB", "TDP W", "Ridge BF16", "PCI ids")


def _row(spec: GpuSpec) -> tuple[str, ...]:
    p = spec.peak_flops
    return (spec.key, spec.name + (" (estimated)" if spec.estimated else ""),
            _fmt(p.get("bf16"), _T, 1), _fmt(p.get("fp8"), _T, 1), _fmt(p.get("tf32"), _T, 1),
            _fmt(p.get("fp32"), _T, 1), _fmt(spec.mem_bandwidth_bytes_per_s, _T, 3),
            _fmt(spec.memory_bytes, _GIB, 0), _fmt(spec.tdp_w, 1, 0),
            _fmt(spec.ridge_point("bf16"), 1, 0),
            ",".join(f"{i:04x}" for i in spec.pci_device_ids) or "—")


def specs_table(specs: Sequence[GpuSpec] = CATALOGUE) -> str:
    """Aligned plain-text table for ``roofwatch specs`` (dense peaks; ridge in FLOP/byte)."""
    rows = [_COLUMNS, *(_row(s) for s in specs)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(_COLUMNS))]

    def line(cells: Sequence[str]) -> str:
        text = (c.ljust(w) if i < 2 or i == len(cells) - 1 else c.rjust(w)
                for i, (c, w) in enumerate(zip(cells, widths)))
        return "  ".join(text).rstrip()

    return "\n".join([line(_COLUMNS), line(["-" * w for w in widths]), *(line(r) for r in rows[1:])])


def specs_json(specs: Sequence[GpuSpec] = CATALOGUE) -> list[dict[str, object]]:
    """JSON-serialisable catalogue in SI units, with ridge points (FLOP/byte) per known dtype."""
    out: list[dict[str, object]] = []
    for s in specs:
        entry = {f.name: getattr(s, f.name) for f in dataclasses.fields(s)}
        entry["peak_flops"] = {d: s.peak_flops[d] for d in DTYPES if d in s.peak_flops}
        entry["pci_device_ids"] = [f"0x{i:04x}" for i in s.pci_device_ids]
        entry["ridge_points"] = {d: s.ridge_point(d) for d in DTYPES if d in s.peak_flops
                                 and s.ridge_point(d) is not None}
        out.append(entry)
    return out


__all__ = ["CATALOGUE", "achieved_flops", "estimate_spec", "lookup", "normalise_name",
           "resolve_spec", "scale_spec", "spec_by_key", "specs_json", "specs_table"]
