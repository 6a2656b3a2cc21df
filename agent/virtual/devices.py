"""How a simulated GPU presents itself: driver name, reported memory, links, bus IDs, UUIDs.

The catalogue (:mod:`agent.specs`) holds datasheet peaks; the driver reports slightly different
things (``81559 MiB`` rather than 80 GB, a marketing name rather than our key). The virtual
backend must look like the real one so that code keyed on those values (spec lookup by PCI
device ID and memory size, model-name labels) is exercised by the demo and the tests.
"""

from __future__ import annotations

import hashlib
import uuid as uuidlib
from dataclasses import dataclass

from agent.model import DeviceInfo, GpuSpec

MIB = 1024**2


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
    """NVML style ``00000000:18:00.0``; amdsmi style ``0000:18:00.0``."""
    bus = _BUS_NUMBERS[index] if index < len(_BUS_NUMBERS) else (0x100 - 8 + index) % 0x100
    domain = "00000000" if vendor == "nvidia" else "0000"
    return f"{domain}:{bus:02x}:00.0"


def capabilities(vendor: str, links: int) -> tuple[str, ...]:
    """What a real backend would find it can read on this model, for ``doctor``."""
    base = ("gr_active", "sm_active", "sm_occupancy", "tensor_active", "dram_active", "pipe_activity",
            "pcie", "power", "energy", "temperature", "clocks", "clock_event_reasons", "memory", "processes")
    extra = ("gpm",) if vendor == "nvidia" else ()
    fabric = ("nvlink",) if vendor == "nvidia" else ("xgmi",)
    return extra + base + (fabric if links else ())


def _pci_device_id(view: DriverView, spec: GpuSpec) -> int | None:
    """The catalogue's ID wins: real backends look specs up by it, so the two must agree."""
    if spec.pci_device_ids and view.pci_device_id not in spec.pci_device_ids:
        return spec.pci_device_ids[0]
    return view.pci_device_id


def device_info(seed: int, node: str, index: int, key: str, spec: GpuSpec) -> DeviceInfo:
    """The static identity the virtual backend's ``discover()`` returns for one GPU."""
    view = driver_view(key, spec)
    return DeviceInfo(
        gpu=str(index),
        uuid=device_uuid(seed, node, index, spec.vendor),
        vendor=spec.vendor,
        model=view.name,
        memory_total_bytes=view.memory_mib * MIB if view.memory_mib else spec.memory_bytes,
        sm_count=spec.sm_count,
        link_count=view.link_count,
        pci_device_id=_pci_device_id(view, spec),
        pci_bus_id=pci_bus_id(index, spec.vendor),
        sm_clock_max_mhz=spec.max_clock_mhz,
        spec=spec,
        capabilities=capabilities(spec.vendor, view.link_count),
    )
