"""Find every GPU and MIG instance once at start, with identity and peak numbers.

Handle lookups are slow (milliseconds each), so this runs once and the handles are cached;
only a lost device is looked up again, by UUID. A GPU in MIG mode is reported as its
instances (``"<index>/<GPU instance id>"``, the ids nvidia-smi and DCGM show), each read
through its MIG device handle, with GPM going through the parent handle.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from agent.backends.nvml.device import Handles
from agent.backends.nvml.errors import Meaning, describe, meaning
from agent.model import DeviceInfo
from agent.model.specs import mig_profile, mig_slice_spec, resolve_spec

log = logging.getLogger("roofwatch.nvml")

NVLINK_LINK_COUNT = 91
"""NVML_FI_DEV_NVLINK_LINK_COUNT."""


@dataclass(frozen=True, slots=True)
class Found:
    """One device to read: its identity, handles, and the physical GPU it sits on."""

    info: DeviceInfo
    handles: Handles | None
    """None for a GPU that was lost when the agent started: it has no handle yet."""
    index: int
    """The physical GPU's NVML index."""

    @property
    def unresolved(self) -> bool:
        return self.handles is None


def lost_at_start(index: int, reason: str) -> Found:
    """A GPU that NVML counts but cannot hand out (fallen off the bus, needs a reset) when the agent
    starts. It is listed as down under its index, so the fleet does not silently shrink and the
    other GPUs are read as usual; its identity is filled in when it comes back."""
    log.warning("GPU %d cannot be read at start (%s): listed as down, looked for again with back-off", index, reason)
    info = DeviceInfo(gpu=str(index), uuid="", vendor="nvidia", model="unknown")
    return Found(info, None, index)


def _optional(nvml: Any, fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except nvml.NVMLError as exc:
        if meaning(exc) in (Meaning.ABSENT, Meaning.NO_DATA):
            return None
        raise


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def link_count(nvml: Any, handle: Any) -> int | None:
    try:
        (entry,) = nvml.nvmlDeviceGetFieldValues(handle, [NVLINK_LINK_COUNT])
    except nvml.NVMLError:
        return None
    return int(entry.value.uiVal) if entry.nvmlReturn == 0 else 0


def whole_gpu_spec(nvml: Any, handle: Any, name: str, pci_device_id: int | None, memory: int | None,
                   sm_count: int | None, max_clock: float | None):
    """The catalogue entry, else an estimate from what the driver reports (flagged as estimated)."""
    spec = resolve_spec(vendor="nvidia", name=name, pci_device_id=pci_device_id, memory_bytes=memory,
                        sm_count=sm_count)
    if spec is not None:
        return spec
    cores = _optional(nvml, nvml.nvmlDeviceGetNumGpuCores, handle)
    bus = _optional(nvml, nvml.nvmlDeviceGetMemoryBusWidth, handle)
    mem_clock = _optional(nvml, nvml.nvmlDeviceGetMaxClockInfo, handle, nvml.NVML_CLOCK_MEM)
    return resolve_spec(vendor="nvidia", name=name, pci_device_id=pci_device_id, memory_bytes=memory,
                        sm_count=sm_count, cuda_cores=cores, max_sm_clock_mhz=max_clock,
                        mem_bus_width_bits=bus, max_mem_clock_mhz=mem_clock)


def discover(nvml: Any) -> list[Found]:
    """Every device to read, in index order. A GPU that is lost is listed unresolved
    (:func:`lost_at_start`); any other failing required call raises its pynvml error."""
    found: list[Found] = []
    for index in range(nvml.nvmlDeviceGetCount()):
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            found.extend(describe_gpu(nvml, index, handle))
        except nvml.NVMLError as exc:
            if meaning(exc) is not Meaning.DEVICE_LOST:
                raise
            found.append(lost_at_start(index, describe(exc)))
    return found


def describe_gpu(nvml: Any, index: int, handle: Any) -> list[Found]:
    """The GPU at ``index`` as one device, or as its MIG instances when MIG is on."""
    name = _text(nvml.nvmlDeviceGetName(handle))
    uuid = _text(nvml.nvmlDeviceGetUUID(handle))
    pci = nvml.nvmlDeviceGetPciInfo(handle)
    pci_device_id = (int(pci.pciDeviceId) >> 16) or None
    bus_id = _text(pci.busId)
    memory = nvml.nvmlDeviceGetMemoryInfo(handle).total
    attrs = _optional(nvml, nvml.nvmlDeviceGetAttributes, handle)
    sm_count = int(attrs.multiprocessorCount) if attrs is not None else None
    max_clock = _optional(nvml, nvml.nvmlDeviceGetMaxClockInfo, handle, nvml.NVML_CLOCK_SM)
    max_clock = float(max_clock) if max_clock else None
    spec = whole_gpu_spec(nvml, handle, name, pci_device_id, memory, sm_count, max_clock)
    mode = _optional(nvml, nvml.nvmlDeviceGetMigMode, handle)
    if mode is not None and mode[0] == nvml.NVML_DEVICE_MIG_ENABLE:
        return _instances(nvml, index, handle, spec, pci_device_id, bus_id, max_clock)
    info = DeviceInfo(gpu=str(index), uuid=uuid, vendor="nvidia", model=name, memory_total_bytes=int(memory),
                      sm_count=sm_count, link_count=link_count(nvml, handle), pci_device_id=pci_device_id,
                      pci_bus_id=bus_id, sm_clock_max_mhz=max_clock, spec=spec)
    return [Found(info, Handles(handle), index)]


def _instances(nvml: Any, index: int, parent: Any, parent_spec: Any, pci_device_id: int | None, bus_id: str,
               max_clock: float | None) -> list[Found]:
    out = []
    for slot in range(nvml.nvmlDeviceGetMaxMigDeviceCount(parent)):
        mig = _optional(nvml, nvml.nvmlDeviceGetMigDeviceHandleByIndex, parent, slot)  # NotFound: empty slot
        if mig is None:
            continue
        gi = int(nvml.nvmlDeviceGetGpuInstanceId(mig))
        name = _text(nvml.nvmlDeviceGetName(mig))
        attrs = _optional(nvml, nvml.nvmlDeviceGetAttributes, mig)
        profile = mig_profile(name)
        spec = mig_slice_spec(parent_spec, profile[1], profile[2]) if parent_spec and profile else None
        info = DeviceInfo(
            gpu=f"{index}/{gi}", uuid=_text(nvml.nvmlDeviceGetUUID(mig)), vendor="nvidia", model=name,
            memory_total_bytes=int(nvml.nvmlDeviceGetMemoryInfo(mig).total),
            sm_count=int(attrs.multiprocessorCount) if attrs is not None else None, link_count=0,
            pci_device_id=pci_device_id, pci_bus_id=bus_id, sm_clock_max_mhz=max_clock, spec=spec)
        out.append(Found(info, Handles(mig, parent=parent, gpu_instance_id=gi), index))
    return sorted(out, key=lambda f: f.handles.gpu_instance_id or 0)
