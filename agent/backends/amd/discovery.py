"""Finding AMD devices once at start: handles, identity, partitions and the peaks each is held to.

Every compute partition (XCP) is its own amdsmi processor handle; the partitions of one GPU share
its PCI domain, bus and device (the function number carries the partition) and its socket. A GPU
in CPX mode is therefore eight devices ``"<gpu>/<partition id>"``, each held to 1/8 of the GPU's
peaks; in SPX it is one device ``"<gpu>"``. MI250X is two GCDs, which amdsmi already lists as two
devices with their own bus addresses; the catalogue's MI250X entry is per GCD.

Only UUID, PCI address, ASIC info and VRAM size are required; everything else is optional and
may be missing from an older amdsmi (:mod:`agent.backends.amd.bindings`): without
``amdsmi_get_gpu_kfd_info`` (amdsmi 6.2) a partition's id is its PCI function number, which is
how amdgpu numbers a GPU's partitions; without ``num_compute_units`` (6.2) the spec is matched
without it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

from agent.backends.amd import values as v
from agent.backends.amd.bindings import Bindings
from agent.backends.amd.values import parent_bdf, partition_count
from agent.model import DeviceInfo, GpuSpec
from agent.model.specs import partition_slice_spec, resolve_spec

log = logging.getLogger("roofwatch.amd")


@dataclass(frozen=True, slots=True)
class Found:
    """One device to read: its identity, its handle and the physical GPU it belongs to."""

    info: DeviceInfo
    handle: Any
    socket: str
    """Parent PCI address (domain:bus:device): partitions of one GPU share it, and one lock."""
    partition: int
    """KFD partition id (0 = primary, the only one that sees socket power and energy)."""
    partitions: int


def _optional(amdsmi: Any, bindings: Bindings, name: str, *args: Any) -> Any:
    """``amdsmi.<name>(*args)``, or None when this amdsmi lacks it or the call fails."""
    fn: Callable[..., Any] | None = getattr(amdsmi, name, None) if bindings.has(name) else None
    if fn is None:
        return None
    try:
        return fn(*args)
    except amdsmi.AmdSmiException:
        return None


def pci_function(bdf: str) -> int | None:
    """``0000:18:00.3`` -> 3: the partition's id when KFD cannot be asked."""
    try:
        return int(bdf.rsplit(".", 1)[1], 16) if "." in bdf else None
    except ValueError:
        return None


def _text(value: Any) -> str | None:
    return value.strip() if isinstance(value, str) and value.strip() and value != "N/A" else None


def _device_id(value: Any) -> int | None:
    """asic_info's device_id: a hex string ("0x74a1") in amdsmi 6.x/7.x, an int in some builds."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        try:
            return int(value, 16)
        except ValueError:
            return None
    return None


def describe_handle(amdsmi: Any, handle: Any, bindings: Bindings | None = None) -> dict[str, Any]:
    """Everything discovery needs about one processor handle (raises on the required calls)."""
    b = bindings if bindings is not None else Bindings()
    asic = amdsmi.amdsmi_get_gpu_asic_info(handle)
    kfd = _optional(amdsmi, b, "amdsmi_get_gpu_kfd_info", handle) or {}
    mode = _optional(amdsmi, b, "amdsmi_get_gpu_compute_partition", handle)
    memory_mode = _optional(amdsmi, b, "amdsmi_get_gpu_memory_partition", handle)
    gfx = getattr(getattr(amdsmi, "AmdSmiClkType", None), "GFX", None)
    clock = _optional(amdsmi, b, "amdsmi_get_clock_info", handle, gfx) if gfx is not None else None
    vram = _optional(amdsmi, b, "amdsmi_get_gpu_vram_info", handle) or {}
    bdf = amdsmi.amdsmi_get_gpu_device_bdf(handle)
    partition_id = v.bounded(kfd.get("current_partition_id"), 0, 63)
    return {
        "uuid": amdsmi.amdsmi_get_gpu_device_uuid(handle),
        "bdf": bdf,
        "name": _text(asic.get("market_name")) or "AMD GPU",
        "device_id": _device_id(asic.get("device_id")),
        "cus": v.bounded(asic.get("num_compute_units"), 1, v.MAX_COMPUTE_UNITS),  # amdsmi 6.3+
        "memory": v.bounded(amdsmi.amdsmi_get_gpu_memory_total(handle, amdsmi.AmdSmiMemoryType.VRAM), 1, v.MAX_BYTES),
        "partition_id": partition_id if partition_id is not None else pci_function(bdf),
        "mode": _text(mode),
        "memory_mode": _text(memory_mode),
        "max_clock": v.mhz((clock or {}).get("max_clk")),
        "vram_bandwidth": v.bounded(vram.get("vram_max_bandwidth"), 1, 100_000),  # GB/s, amdsmi 6.4+
    }


def gpu_spec(d: dict[str, Any], partitions: int) -> GpuSpec | None:
    """Peaks of the whole GPU from the catalogue (else a flagged estimate), scaled to one partition."""
    cus = int(d["cus"] * partitions) if d["cus"] else None
    memory = int(d["memory"] * partitions) if d["memory"] else None
    bandwidth = d["vram_bandwidth"] * 1e9 if d["vram_bandwidth"] else None  # GB/s
    spec = resolve_spec(vendor="amd", name=d["name"], pci_device_id=d["device_id"], memory_bytes=memory,
                        sm_count=cus, max_sm_clock_mhz=d["max_clock"], reported_mem_bandwidth_bytes_per_s=bandwidth)
    if spec is None or partitions == 1:
        return spec
    return partition_slice_spec(spec, partitions, d["mode"] or f"{partitions}x")


def discover(amdsmi: Any, bindings: Bindings | None = None) -> list[Found]:
    """Every device to read, grouped into physical GPUs in PCI order. Raises amdsmi's exception
    when a required call fails."""
    described = [(h, describe_handle(amdsmi, h, bindings)) for h in amdsmi.amdsmi_get_processor_handles()]
    sockets = sorted({parent_bdf(d["bdf"]) for _, d in described})
    found: list[Found] = []
    for index, socket in enumerate(sockets):
        members = sorted(((h, d) for h, d in described if parent_bdf(d["bdf"]) == socket),
                         key=lambda hd: (hd[1]["partition_id"] if hd[1]["partition_id"] is not None else 0, hd[1]["bdf"]))
        count = max(len(members), partition_count(members[0][1]["mode"]))
        for position, (handle, d) in enumerate(members):
            pid = int(d["partition_id"]) if d["partition_id"] is not None else position
            gpu = str(index) if count == 1 else f"{index}/{pid}"
            modes = "/".join(m for m in (d["mode"], d["memory_mode"]) if m) or None
            info = DeviceInfo(
                gpu=gpu, uuid=d["uuid"], vendor="amd", model=d["name"],
                memory_total_bytes=int(d["memory"]) if d["memory"] else None,
                sm_count=int(d["cus"]) if d["cus"] else None, pci_device_id=d["device_id"], pci_bus_id=d["bdf"],
                sm_clock_max_mhz=d["max_clock"], spec=gpu_spec(d, count), partition=modes)
            found.append(Found(info, handle, socket, pid, count))
    return found
