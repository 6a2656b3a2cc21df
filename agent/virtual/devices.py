"""How a simulated GPU presents itself: driver name, reported memory, links, bus IDs, UUIDs.

The catalogue (:mod:`agent.model.specs`) holds datasheet peaks; the driver reports slightly different
things (``81559 MiB`` rather than 80 GB, a marketing name rather than our key). The virtual
backend must look like the real one so that code keyed on those values (spec lookup by PCI
device ID and memory size, model-name labels) is exercised by the demo and the tests.
"""

from __future__ import annotations

import hashlib
import math
import re
import uuid as uuidlib
from dataclasses import dataclass
from typing import Literal

from agent.model import DeviceInfo, GpuSpec
from agent.model.specs import mig_slice_spec, partition_slice_spec
from agent.model.specs.slices import mig_total_slices
from agent.model.specs.vgpu import vgpu_profile, vgpu_spec

MIB = 1024**2
GIB = 1024**3

CounterPreset = Literal["full", "amdsmi", "nvml_basic", "minimal"]
COUNTER_PRESETS: tuple[str, ...] = ("full", "amdsmi", "nvml_basic", "minimal")

_PIPE_FIELDS = ("sm_active", "sm_occupancy", "tensor_active", "fp64_active", "fp32_active", "fp16_active",
                "tensor_hmma_active", "tensor_imma_active", "tensor_dmma_active", "tensor_dfma_active")
HIDDEN_FIELDS: dict[str, tuple[str, ...]] = {
    "full": (),
    "amdsmi": _PIPE_FIELDS,
    "nvml_basic": _PIPE_FIELDS + ("dram_active",),
    "minimal": _PIPE_FIELDS + ("gr_active", "dram_active"),
}
MEM_BUSY_PRESETS: frozenset[str] = frozenset({"nvml_basic"})
"""Presets whose memory signal is NVML's utilization.memory (a busy-time share), not bandwidth."""
"""GpuSample fields each counter preset cannot read (reported as None, i.e. unknown).

``amdsmi`` has gfx_activity (engine) and umc_activity (DRAM) but no SM, occupancy, tensor or
FP-pipe counters; ``nvml_basic`` is NVML without GPM/DCGM (pre-Hopper): utilization.gpu and
utilization.memory only; ``minimal`` is a GPU whose utilisation cannot be read at all (e.g.
NoPermission), so only power, clocks, temperature, memory, processes and bus rates remain.
"""

MIG_HIDDEN_FIELDS: tuple[str, ...] = (
    "power_w", "energy_j", "power_limit_w", "temperature_c",
    "pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s", "link_tx_bytes_per_s", "link_rx_bytes_per_s")
"""What NVML does not report per MIG instance: these are whole-GPU quantities."""

VGPU_HIDDEN_FIELDS: tuple[str, ...] = ("power_w", "energy_j", "power_limit_w", "temperature_c")
"""What a guest's driver does not read on a time-sliced vGPU: the board's power and temperature, which it
shares with every other vGPU on it (nvidia-smi in the guest shows N/A; the published vks capture of a
GRID A100-10C has no power, energy or temperature series)."""

_HOPPER_OR_NEWER = ("h100", "h200", "gh200", "b200")
_MIG_CAPABLE = ("a100", "a30") + _HOPPER_OR_NEWER
MIG_SLICES = 7
"""Compute slices of a MIG-capable GPU (``7g`` is the whole GPU), but for the A30's four."""
MIG_GI_ID_MAX = 14
"""The largest GPU instance id NVIDIA's drivers assign (A100: 7g 0, 3g 1-2, 2g 3-6, 1g 7-14)."""
MIG_PROFILE = re.compile(r"^([1-7])g\.(\d+)gb$")
_MIG_MEM_KEEP = 0.98
_MIG_MEM_GRANULE_MIB = 256


@dataclass(frozen=True, slots=True)
class DriverView:
    """What the vendor driver reports for one catalogue model."""

    name: str
    memory_mib: int | None
    link_count: int
    pci_device_id: int | None
    pcie_bytes_per_s: float
    """Host link peak per direction (Gen5 x16 about 64 GB/s, Gen4 about 32 GB/s)."""
    fabric_bytes_per_s: float | None = None
    """Fabric peak per direction, used only when the catalogue has none (XGMI on AMD)."""


DRIVER_VIEWS: dict[str, DriverView] = {
    "h100-sxm": DriverView("NVIDIA H100 80GB HBM3", 81559, 18, 0x2330, 64e9),
    "h100-pcie": DriverView("NVIDIA H100 PCIe", 81559, 0, 0x2331, 64e9),
    "h100-nvl": DriverView("NVIDIA H100 NVL", 95830, 6, 0x2321, 64e9),
    "h200-sxm": DriverView("NVIDIA H200", 143771, 18, 0x2335, 64e9),
    "gh200-96gb": DriverView("NVIDIA GH200 480GB", 97871, 18, 0x2342, 64e9),
    "gh200-144gb": DriverView("NVIDIA GH200 144G HBM3e", 146647, 18, 0x2348, 64e9),
    "b200": DriverView("NVIDIA B200", 183359, 18, 0x2901, 64e9),
    "a100-sxm-80gb": DriverView("NVIDIA A100-SXM4-80GB", 81920, 12, 0x20B2, 32e9),
    "a100-sxm-40gb": DriverView("NVIDIA A100-SXM4-40GB", 40960, 12, 0x20B0, 32e9),
    "a100-pcie-80gb": DriverView("NVIDIA A100 80GB PCIe", 81920, 0, 0x20B5, 32e9),
    "a100-pcie-40gb": DriverView("NVIDIA A100-PCIE-40GB", 40960, 0, 0x20F1, 32e9),
    "l40s": DriverView("NVIDIA L40S", 46068, 0, 0x26B9, 32e9),
    "l4": DriverView("NVIDIA L4", 23034, 0, 0x27B8, 32e9),
    "a10": DriverView("NVIDIA A10", 23028, 0, 0x2236, 32e9),
    "a10g": DriverView("NVIDIA A10G", 23028, 0, 0x2237, 32e9),
    "mi250x": DriverView("AMD Instinct MI250X", 65520, 8, 0x740C, 32e9, 400e9),
    "mi300x": DriverView("AMD Instinct MI300X", 196592, 7, 0x74A1, 64e9, 448e9),
    "mi325x": DriverView("AMD Instinct MI325X", 262128, 7, 0x74A5, 64e9, 448e9),
    "mi355x": DriverView("AMD Instinct MI355X", 294896, 7, 0x75A3, 64e9, 512e9),
}

# Bus numbers of the eight GPUs on a typical HGX / OAM baseboard.
_BUS_NUMBERS = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
NET_BYTES_PER_S = 50e9
"""One 400 Gb/s InfiniBand/RoCE port per GPU, per direction."""


def driver_view(key: str, spec: GpuSpec) -> DriverView:
    """The table entry, or a plausible fallback built from the spec for models not listed."""
    view = DRIVER_VIEWS.get(key)
    if view is not None:
        return view
    prefix = "AMD" if spec.vendor == "amd" else "NVIDIA"
    name = spec.name if spec.name.upper().startswith(prefix) else f"{prefix} {spec.name}"
    memory_mib = int(spec.memory_bytes * 0.995 // MIB) if spec.memory_bytes else None
    links = 18 if spec.link_bandwidth_bytes_per_s else 0
    device_id = spec.pci_device_ids[0] if spec.pci_device_ids else None
    return DriverView(name, memory_mib, links, device_id, 32e9)


def device_uuid(seed: int, node: str, index: int, vendor: str) -> str:
    """Stable per (seed, node, index): the same scenario always shows the same UUIDs."""
    digest = hashlib.blake2b(f"{seed}/{node}/{index}".encode(), digest_size=16).digest()
    text = str(uuidlib.UUID(bytes=digest, version=4))
    return f"GPU-{text}" if vendor == "nvidia" else text


def pci_bus_id(index: int, vendor: str) -> str:
    """NVML style ``00000000:2A:00.0`` (upper-case hex, as the driver prints it); amdsmi ``0000:2a:00.0``."""
    bus = _BUS_NUMBERS[index] if index < len(_BUS_NUMBERS) else (0x100 - 8 + index) % 0x100
    domain = "00000000" if vendor == "nvidia" else "0000"
    return f"{domain}:{bus:02X}:00.0" if vendor == "nvidia" else f"{domain}:{bus:02x}:00.0"


def default_counters(key: str, vendor: str) -> CounterPreset:
    """The counters a real backend reads on this model without extra tooling.

    AMD: amdsmi. NVIDIA Hopper and newer: NVML GPM gives the full per-pipe set. Older NVIDIA
    (Ampere, Ada): NVML alone has only utilization.gpu / utilization.memory (DCGM would be needed).
    """
    if vendor == "amd":
        return "amdsmi"
    return "full" if key.startswith(_HOPPER_OR_NEWER) else "nvml_basic"


def capabilities(vendor: str, links: int, counters: str = "full", *, mig_instance: bool = False) -> tuple[str, ...]:
    """What a real backend would find it can read on this model, for ``doctor``.

    Follows the counter preset (:data:`HIDDEN_FIELDS`); a MIG instance has no power, energy,
    temperature, PCIe or fabric readings of its own (NVML reports those for the whole GPU).
    """
    util = {"full": ("gr_active", "sm_active", "sm_occupancy", "tensor_active", "dram_active", "pipe_activity"),
            "amdsmi": ("gr_active", "dram_active"), "nvml_basic": ("gr_active", "mem_busy"),
            "minimal": ()}[counters]
    device = () if mig_instance else ("pcie", "power", "energy", "temperature")
    extra = ("gpm",) if vendor == "nvidia" and counters == "full" else ()
    fabric = ("nvlink",) if vendor == "nvidia" else ("xgmi",)
    return (extra + util + device + ("clocks", "clock_event_reasons", "memory", "processes")
            + (fabric if links and not mig_instance else ()))


# ----------------------------------------------------------------------------- MIG


def mig_capable(key: str, vendor: str) -> bool:
    """NVIDIA data-centre parts with MIG: A100, A30, H100, H200, GH200, B200."""
    return vendor == "nvidia" and key.startswith(_MIG_CAPABLE)


def mig_slices(key: str) -> int:
    """Compute slices of a MIG-capable model (the catalogue's rule: 4 on the A30, 7 on every other); also
    the most MIG devices nvmlDeviceGetMaxMigDeviceCount reports on it."""
    return mig_total_slices(key)


def parse_mig_profile(profile: str) -> tuple[int, int] | None:
    """``"3g.40gb"`` -> (3 compute slices, 40 GB); None if it is not a MIG profile name."""
    match = MIG_PROFILE.match(profile)
    if match is None or int(match.group(2)) < 1:
        return None
    return int(match.group(1)), int(match.group(2))


def mig_memory_mib(profile_gb: int) -> int:
    """Memory the driver reports for a ``<g>g.<N>gb`` instance: 98% of N GiB, in 256 MiB steps.

    Real instances report a little less than the profile name (the instance's own reservation):
    10gb -> 9984 MiB, 40gb -> 39936 MiB, 80gb -> 80128 MiB, close to what nvidia-smi shows.
    """
    return math.floor(profile_gb * 1024 * _MIG_MEM_KEEP / _MIG_MEM_GRANULE_MIB) * _MIG_MEM_GRANULE_MIB


def mig_spec(spec: GpuSpec, profile: str) -> GpuSpec:
    """Peaks of one instance, scaled exactly as the real backends and ``classify`` scale them (g of the
    model's compute slices: an A30 1g.6gb has 14 of the 56 SMs)."""
    parsed = parse_mig_profile(profile)
    if parsed is None:
        raise ValueError(f"invalid MIG profile {profile!r}")
    return mig_slice_spec(spec, *parsed)


def mig_uuid(seed: int, node: str, gpu: str) -> str:
    """``MIG-<uuid>``, stable per (seed, node, instance id) as NVML's MIG device UUIDs are."""
    digest = hashlib.blake2b(f"{seed}/{node}/mig/{gpu}".encode(), digest_size=16).digest()
    return f"MIG-{uuidlib.UUID(bytes=digest, version=4)}"


# ----------------------------------------------------------------------------- AMD partitions

ComputePartition = Literal["SPX", "DPX", "QPX", "CPX"]
MemoryPartition = Literal["NPS1", "NPS2", "NPS4"]
COMPUTE_PARTITIONS: dict[str, int] = {"SPX": 1, "DPX": 2, "QPX": 4, "CPX": 8}
"""Partitions per GPU in each compute-partition mode of an 8-XCD part (MI300X, MI325X, MI355X)."""
MEMORY_PARTITIONS: dict[str, int] = {"NPS1": 1, "NPS2": 2, "NPS4": 4}
_PARTITIONABLE = ("mi300x", "mi325x", "mi355x")


def partitionable(key: str) -> bool:
    """AMD parts whose XCDs can be split into compute partitions (MI250X's two GCDs are simply two devices)."""
    return key.startswith(_PARTITIONABLE)


def partition_count(key: str, compute_partition: str) -> int:
    """Devices one GPU shows in ``compute_partition`` mode (1 for models without partitions)."""
    return COMPUTE_PARTITIONS[compute_partition] if partitionable(key) else 1


def partition_uuid(seed: int, node: str, gpu: str) -> str:
    digest = hashlib.blake2b(f"{seed}/{node}/xcp/{gpu}".encode(), digest_size=16).digest()
    return str(uuidlib.UUID(bytes=digest, version=4))


def partition_info(seed: int, node: str, index: int, partition: int, count: int, mode: str, key: str,
                   spec: GpuSpec, counters: str = "amdsmi") -> DeviceInfo:
    """Identity of partition ``<index>/<partition>`` (partition = the id KFD reports, from 0).

    Each partition is its own device to amdsmi: own UUID, the parent's bus and device with the
    partition id as PCI function, 1/count of the compute units and memory. Socket power, energy
    and the fabric links are read on partition 0 only.
    """
    view = driver_view(key, spec)
    scaled = partition_slice_spec(spec, count, mode)
    bus = pci_bus_id(index, spec.vendor)
    primary = partition == 0
    caps = capabilities(spec.vendor, view.link_count if primary else 0, counters, mig_instance=not primary)
    if not primary:
        caps += ("temperature",)
    return DeviceInfo(
        gpu=f"{index}/{partition}",
        uuid=partition_uuid(seed, node, f"{index}/{partition}"),
        vendor=spec.vendor,
        model=view.name,
        memory_total_bytes=(view.memory_mib * MIB // count) if view.memory_mib else scaled.memory_bytes,
        sm_count=scaled.sm_count,
        link_count=view.link_count if primary else 0,
        pci_device_id=_pci_device_id(view, spec),
        pci_bus_id=f"{bus[:-1]}{partition}",
        sm_clock_max_mhz=spec.max_clock_mhz,
        spec=scaled,
        capabilities=caps,
    )


def _pci_device_id(view: DriverView, spec: GpuSpec) -> int | None:
    """The catalogue's ID wins: real backends look specs up by it, so the two must agree."""
    if spec.pci_device_ids and view.pci_device_id not in spec.pci_device_ids:
        return spec.pci_device_ids[0]
    return view.pci_device_id


def device_info(seed: int, node: str, index: int, key: str, spec: GpuSpec, counters: str = "full",
                vgpu: str | None = None) -> DeviceInfo:
    """The static identity the virtual backend's ``discover()`` returns for one GPU.

    ``vgpu`` (a time-sliced vGPU profile name such as ``GRID A100-10C``, see :func:`check_vgpu`): the GPU
    as a guest's driver shows it, named after the profile, with the profile's frame buffer as its
    memory and the vGPU's peaks; the board's SMs, clocks, bus and PCI device ID; no power, energy or
    temperature (:data:`VGPU_HIDDEN_FIELDS`)."""
    view = driver_view(key, spec)
    shown = vgpu_spec(vgpu) if vgpu else None
    memory = view.memory_mib * MIB if view.memory_mib else spec.memory_bytes
    return DeviceInfo(
        gpu=str(index),
        uuid=device_uuid(seed, node, index, spec.vendor),
        vendor=spec.vendor,
        model=vgpu.strip() if shown is not None and vgpu else view.name,
        memory_total_bytes=shown.memory_bytes if shown is not None else memory,
        sm_count=spec.sm_count,
        link_count=view.link_count,
        pci_device_id=_pci_device_id(view, spec),
        pci_bus_id=pci_bus_id(index, spec.vendor),
        sm_clock_max_mhz=spec.max_clock_mhz,
        spec=shown or spec,
        capabilities=tuple(c for c in capabilities(spec.vendor, view.link_count, counters)
                           if shown is None or c not in ("power", "energy", "temperature")),
    )


def check_vgpu(name: str, key: str) -> str | None:
    """Why ``name`` cannot be what a guest's driver calls a vGPU on catalogue board ``key``, or None.

    Only time-sliced C-series profiles (``GRID A100-10C``) of the board: a MIG-backed vGPU is a MIG
    instance, which a guest sees with its own slice of the SMs (play those with ``mig``)."""
    profile = vgpu_profile(name)
    if profile is None:
        return f"{name!r} is no vGPU profile NVIDIA's C-series tables list for a catalogued board (e.g. 'GRID A100-10C')"
    if profile[1] is not None:
        return f"{name!r} is MIG-backed; only time-sliced profiles (no '-<g>-') are played"
    spec = vgpu_spec(name)
    board = spec.key.split("-vgpu-", 1)[0] if spec is not None else None
    if board != key:
        return f"{name!r} runs on {board}, not on {key}"
    return None


def mig_instance_info(seed: int, node: str, index: int, instance: int, profile: str, key: str, spec: GpuSpec,
                      counters: str = "full") -> DeviceInfo:
    """Identity of MIG instance ``<index>/<instance>`` as NVML's MIG device handle shows it.

    Named like nvmlDeviceGetName does (``NVIDIA H100 80GB HBM3 MIG 3g.40gb``); bus ID and PCI
    device ID are the parent's; no links of its own; peaks scaled to the slice.
    """
    view = driver_view(key, spec)
    gpu = f"{index}/{instance}"
    parsed = parse_mig_profile(profile)
    assert parsed is not None, profile
    memory = mig_memory_mib(parsed[1]) * MIB
    if view.memory_mib:
        memory = min(memory, view.memory_mib * MIB)
    scaled = mig_spec(spec, profile)
    return DeviceInfo(
        gpu=gpu,
        uuid=mig_uuid(seed, node, gpu),
        vendor=spec.vendor,
        model=f"{view.name} MIG {profile}",
        memory_total_bytes=memory,
        sm_count=scaled.sm_count,
        link_count=0,
        pci_device_id=_pci_device_id(view, spec),
        pci_bus_id=pci_bus_id(index, spec.vendor),
        sm_clock_max_mhz=spec.max_clock_mhz,
        spec=scaled,
        capabilities=capabilities(spec.vendor, 0, counters, mig_instance=True),
    )
