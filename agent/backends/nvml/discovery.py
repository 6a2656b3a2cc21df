"""Find every GPU and MIG instance once at start, with identity and peak numbers.

Handle lookups are slow (milliseconds each), so this runs once and the handles are cached;
only a lost device is looked up again, by UUID. A GPU in MIG mode is reported as its MIG
devices, each read through its MIG device handle, with GPM going through the parent handle. A
MIG device handle stands for one *compute instance*: a GPU instance split into several compute
instances gives one device each, all with the same GPU instance id. They are named
``"<index>/<GPU instance id>"`` (the ids nvidia-smi and DCGM show) where a GPU instance has one
compute instance, and ``"<index>/<GPU instance id>/<compute instance id>"`` where it has several.

Only optional calls may fail here without failing the GPU. The aggregate memory of a GPU in MIG
mode is one of them: NVML gives it only to privileged callers ("In MIG mode, if device handle is
provided, the API returns aggregate information, only if the caller has appropriate privileges",
nvml.h), and the container image runs as uid 65534; the catalogue is then matched with the sum
of the GPU instances' memory, and doctor says so.
"""

from __future__ import annotations

import collections
import logging
from dataclasses import dataclass, field
from typing import Any

from agent.backends.nvml.device import Handles
from agent.backends.nvml.errors import Meaning, describe, meaning
from agent.model import DeviceInfo, GpuSpec
from agent.model.specs import mig_name_spec, resolve_spec

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
    absent: dict[str, str] = field(default_factory=dict)
    """What discovery could not read, with why (the device starts with these switched off)."""
    parent_uuid: str = ""
    """A MIG instance's physical GPU's UUID (``GPU-...``); empty for a whole GPU."""

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


def _optional(nvml: Any, name: str, *args: Any) -> Any:
    """pynvml function ``name`` called with ``args``; None when it is unsupported, refused, has no
    data, or this nvidia-ml-py lacks it. Other errors (a lost GPU) raise."""
    fn = getattr(nvml, name, None)
    if fn is None:
        return None
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
    cores = _optional(nvml, "nvmlDeviceGetNumGpuCores", handle)
    bus = _optional(nvml, "nvmlDeviceGetMemoryBusWidth", handle)
    mem_clock = _optional(nvml, "nvmlDeviceGetMaxClockInfo", handle, nvml.NVML_CLOCK_MEM)
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
    """The GPU at ``index`` as one device, or as its MIG devices when MIG is on."""
    name = _text(nvml.nvmlDeviceGetName(handle))
    uuid = _text(nvml.nvmlDeviceGetUUID(handle))
    pci = nvml.nvmlDeviceGetPciInfo(handle)
    pci_device_id = (int(pci.pciDeviceId) >> 16) or None
    bus_id = _text(pci.busId)
    memory_info = _optional(nvml, "nvmlDeviceGetMemoryInfo", handle)
    memory = int(memory_info.total) if memory_info is not None else None
    attrs = _optional(nvml, "nvmlDeviceGetAttributes", handle)
    sm_count = int(attrs.multiprocessorCount) if attrs is not None else None
    max_clock = _optional(nvml, "nvmlDeviceGetMaxClockInfo", handle, nvml.NVML_CLOCK_SM)
    max_clock = float(max_clock) if max_clock else None
    mode = _optional(nvml, "nvmlDeviceGetMigMode", handle)
    if mode is not None and mode[0] == nvml.NVML_DEVICE_MIG_ENABLE:
        migs = _mig_devices(nvml, handle)
        absent: dict[str, str] = {}
        if memory is None:
            memory = sum({m.gi: m.memory for m in migs}.values()) or None
            absent["parent_memory"] = ("no permission: NVML gives a MIG GPU's total memory only to privileged "
                                       "callers; its peaks were matched with the sum of its GPU instances' memory")
        spec = whole_gpu_spec(nvml, handle, name, pci_device_id, memory, sm_count, max_clock)
        return _instances(index, migs, handle, spec, pci_device_id, bus_id, max_clock, absent, uuid)
    spec = whole_gpu_spec(nvml, handle, name, pci_device_id, memory, sm_count, max_clock)
    info = DeviceInfo(gpu=str(index), uuid=uuid, vendor="nvidia", model=name, memory_total_bytes=memory,
                      sm_count=sm_count, link_count=link_count(nvml, handle), pci_device_id=pci_device_id,
                      pci_bus_id=bus_id, sm_clock_max_mhz=max_clock, spec=spec)
    return [Found(info, Handles(handle), index)]


@dataclass(frozen=True, slots=True)
class _Mig:
    """One MIG device handle (a compute instance) as NVML describes it."""

    handle: Any
    gi: int
    ci: int
    name: str
    uuid: str
    memory: int | None
    sm_count: int | None


def _mig_devices(nvml: Any, parent: Any) -> list[_Mig]:
    out: list[_Mig] = []
    for slot in range(nvml.nvmlDeviceGetMaxMigDeviceCount(parent)):
        mig = _optional(nvml, "nvmlDeviceGetMigDeviceHandleByIndex", parent, slot)  # NotFound: empty slot
        if mig is None:
            continue
        gi = int(nvml.nvmlDeviceGetGpuInstanceId(mig))
        ci = _optional(nvml, "nvmlDeviceGetComputeInstanceId", mig)
        if ci is None:  # cannot happen on R450+; keep the devices apart anyway
            ci = sum(1 for m in out if m.gi == gi)
        memory = _optional(nvml, "nvmlDeviceGetMemoryInfo", mig)
        attrs = _optional(nvml, "nvmlDeviceGetAttributes", mig)
        out.append(_Mig(mig, gi, int(ci), _text(nvml.nvmlDeviceGetName(mig)), _text(nvml.nvmlDeviceGetUUID(mig)),
                        int(memory.total) if memory is not None else None,
                        int(attrs.multiprocessorCount) if attrs is not None else None))
    return sorted(out, key=lambda m: (m.gi, m.ci))


def mig_device_id(index: int, gi: int, ci: int, split: bool) -> str:
    """``index/gi``, or ``index/gi/ci`` for a compute instance of a split GPU instance."""
    return f"{index}/{gi}/{ci}" if split else f"{index}/{gi}"


def _instances(index: int, migs: list[_Mig], parent: Any, parent_spec: GpuSpec | None, pci_device_id: int | None,
               bus_id: str, max_clock: float | None, absent: dict[str, str], parent_uuid: str = "") -> list[Found]:
    per_gi = collections.Counter(m.gi for m in migs)
    out = []
    for m in migs:
        spec = mig_name_spec(parent_spec, m.name) if parent_spec is not None else None
        info = DeviceInfo(
            gpu=mig_device_id(index, m.gi, m.ci, per_gi[m.gi] > 1), uuid=m.uuid, vendor="nvidia", model=m.name,
            memory_total_bytes=m.memory, sm_count=m.sm_count, link_count=0, pci_device_id=pci_device_id,
            pci_bus_id=bus_id, sm_clock_max_mhz=max_clock, spec=spec)
        handles = Handles(m.handle, parent=parent, gpu_instance_id=m.gi, compute_instance_id=m.ci)
        out.append(Found(info, handles, index, dict(absent), parent_uuid))
    return out
