"""The NVIDIA backend: NVML through pynvml, behind the agent's small :class:`Backend` protocol.

It takes the pynvml *module* as a parameter. In production that is the real ``pynvml`` over
``libnvidia-ml.so.1``; in tests and ``roofwatch demo --backend nvml-virtual`` it is an
independent copy of the same real module over a fake driver library driven by the virtual
fleet (:mod:`agent.virtual.fake_nvml`). Either way every line here runs unchanged.

Start-up is the probe: what this nvidia-ml-py offers is detected once
(:mod:`agent.backends.nvml.bindings`), the field ids to ask for are chosen for the driver that
answers (:func:`agent.backends.nvml.fields.fields_for`), devices and MIG instances are discovered
once and their handles cached; each device is then read twice, at least 100 ms apart, so GPM
gets a real two-sample read and every optional capability has been tried once. Whatever failed
as unsupported is switched off and listed (``doctor``), and never asked for again. Nothing a
binding or driver lacks stops discovery: it costs a reading, never the agent.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any, Callable, Sequence

from agent.backends.base import BackendUnavailable, DeviceError, DeviceLostError
from agent.backends.gate import LibraryGate
from agent.backends.nvml.bindings import Bindings
from agent.backends.nvml.calls import CountingNvml
from agent.backends.nvml.device import Handles, NvmlDevice
from agent.backends.nvml.discovery import Found, describe_gpu, discover
from agent.backends.nvml.errors import Meaning, describe, meaning
from agent.backends.nvml.events import XidWatcher
from agent.backends.nvml.fields import fields_for
from agent.backends.nvml.gpm import MIN_SPAN_S
from agent.backends.nvml.gpm_totals import SOURCE as GPM_TOTALS
from agent.backends.nvml.parent_energy import ParentEnergy
from agent.backends.readings import LibraryError
from agent.context.local_host import LocalHost
from agent.context.sources import HostSource
from agent.model import DeviceInfo, GpuSample, NicPort, SourceState, XidCount

log = logging.getLogger("roofwatch.nvml")

PROBE_SPAN_S = 0.12
"""Pause between the two probe reads: just over GPM's 100 ms minimum."""
RESTART_WAIT_S = 5.0
"""How long a re-initialisation waits for other GPUs' reads in flight before it gives up for now."""


def init_message(nvml: Any, exc: BaseException) -> str:
    """What to tell a person when NVML cannot start, without a traceback."""
    code = getattr(exc, "value", None)
    if code == nvml.NVML_ERROR_LIBRARY_NOT_FOUND:
        return ("NVML: libnvidia-ml.so.1 not found: no NVIDIA driver is installed here, or (in a container) "
                "the NVIDIA container toolkit did not mount it")
    if code == nvml.NVML_ERROR_DRIVER_NOT_LOADED:
        return "NVML: the NVIDIA kernel driver is not loaded (check `nvidia-smi` and `lsmod | grep nvidia`)"
    if code == nvml.NVML_ERROR_NO_PERMISSION:
        return "NVML: no permission to open /dev/nvidia* (run as a user in the video group, or give the container the devices)"
    if code == nvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH:
        return "NVML: the NVML library and the loaded kernel driver differ (driver upgraded without a reboot?)"
    return f"NVML: initialisation failed: {describe(exc)}"


def load_pynvml() -> Any:
    try:
        import pynvml
    except ImportError:
        raise BackendUnavailable("NVML: the nvidia-ml-py package is not installed (pip install nvidia-ml-py)") from None
    return pynvml


class NvmlBackend:
    """Samples NVIDIA GPUs and MIG instances through NVML."""

    name = "nvml"

    def __init__(self, nvml: Any | None = None, *, node: str = "local", host: HostSource | None = None,
                 events: bool = True,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        """``clock`` times GPM spans, ``wall`` stamps the probe reads, ``sleep`` waits between them;
        tests replace all three with a virtual clock."""
        self.module = nvml if nvml is not None else load_pynvml()
        self.node = node
        self.bindings = Bindings.detect(self.module)
        self.nvml = CountingNvml(self.module)
        self._host = host if host is not None else LocalHost()
        self._clock = clock
        self._wall = wall
        self._sleep = sleep
        self._devices: dict[str, NvmlDevice] = {}
        self._found: dict[str, Found] = {}
        self._boards: dict[int, ParentEnergy] = {}
        """One per MIG parent GPU: its energy counter, read once a cycle for all its instances."""
        self._stale: set[str] = set()
        self._closed = False
        self._generation = 0
        self._gate = LibraryGate()
        self._reinit_wanted = False
        self.driver_version: str | None = None
        self.nvml_version: str | None = None
        self._events = XidWatcher(self.nvml) if events else None
        try:
            self.nvml.nvmlInit()
        except self.module.NVMLError as exc:
            raise BackendUnavailable(init_message(self.module, exc)) from None
        self.driver_version = self._version(self.nvml.nvmlSystemGetDriverVersion)
        self.nvml_version = self._version(self.nvml.nvmlSystemGetNVMLVersion)
        self.fields, self.skipped_fields = fields_for(self.driver_version)

    def _version(self, fn: Callable[[], Any]) -> str | None:
        try:
            value = fn()
        except self.module.NVMLError:
            return None
        return value.decode() if isinstance(value, bytes) else str(value)

    # ------------------------------------------------------------------ Backend protocol

    def discover(self) -> Sequence[DeviceInfo]:
        try:
            found = discover(self.nvml)
        except self.module.NVMLError as exc:
            raise BackendUnavailable(f"NVML: listing GPUs failed: {describe(exc)}") from None
        if not found:
            raise BackendUnavailable(f"NVML: driver {self.driver_version} is loaded but reports no GPUs")
        xids = self._events.counts if self._events else None
        for f in found:
            self._found[f.info.gpu] = f
            parent = f.handles.parent if f.handles is not None else None
            board = self._boards.setdefault(f.index, ParentEnergy(self.nvml, parent)) if parent is not None else None
            device = NvmlDevice(self.nvml, f.info, f.handles or Handles(None), self._host, xids=xids, clock=self._clock,
                                node=self.node, bindings=self.bindings, fields=self.fields,
                                skipped_fields=self.skipped_fields, parent_energy=board)
            device.absent.update(f.absent)
            self._devices[f.info.gpu] = device
            if f.unresolved:
                self._stale.add(f.info.gpu)
        self._probe()
        if self._events is not None:
            self._watch_all()
            self._events.start()
        return [d.info for d in self._devices.values()]

    def _probe(self) -> None:
        """Two reads per device, a GPM span apart: settles capabilities and primes the sample pairs."""
        for step in range(2):
            if step:
                self._sleep(max(PROBE_SPAN_S, MIN_SPAN_S))
            now = self._wall()
            for gpu, device in self._devices.items():
                if self._found[gpu].unresolved:
                    continue
                try:
                    device.read(now)
                except DeviceLostError as exc:
                    log.warning("%s", exc)
                    self._stale.add(gpu)
                except DeviceError as exc:
                    log.warning("probe of GPU %s: %s", gpu, exc)
                except (AttributeError, TypeError) as exc:  # a pynvml that differs from every release tested
                    log.error("probe of GPU %s: nvidia-ml-py %s does not match what roofwatch expects (%s); "
                              "the GPU is retried every interval", gpu, self.bindings.version or "(copy)", exc)
        for device in self._devices.values():
            device.info = dataclasses.replace(device.info, capabilities=device.capabilities())

    def _watch_all(self) -> None:
        assert self._events is not None
        by_index: dict[int, tuple[Any, dict[tuple[int, int], str]]] = {}
        for gpu, f in self._found.items():
            if f.handles is None:
                continue  # watched once it is found (_reacquire)
            if f.handles.parent is not None:
                entry = by_index.setdefault(f.index, (f.handles.parent, {}))
                entry[1][_instance_key(f.handles)] = gpu
            else:
                by_index[f.index] = (f.handles.handle, {})
        for index, (handle, instances) in by_index.items():
            self._events.watch(handle, str(index), instances)

    def sample(self, gpu: str, now: float) -> GpuSample:
        device = self._devices.get(gpu)
        if device is None:
            raise DeviceError(f"NVML: no GPU {gpu!r}")
        if self._closed:
            raise DeviceError("NVML backend is closed")
        self.nvml.reset()
        try:
            with self._gate.reading():
                if gpu in self._stale:
                    self._reacquire(device)
                sample = device.read(now)
        except DeviceLostError:
            self._stale.add(gpu)
            if self._reinit_wanted:  # re-acquiring found NVML itself broken
                self._reinit()
            raise
        except LibraryError:
            self._reinit()
            raise
        return dataclasses.replace(sample, driver_calls=self.nvml.count)

    def source_states(self, now: float) -> tuple[SourceState, ...]:
        """The node side's sources (inference servers), as the host last saw them."""
        states = getattr(self._host, "source_states", None)
        return tuple(states(now)) if states is not None else ()

    def nic_ports(self) -> tuple[NicPort, ...]:
        """The node's InfiniBand/RoCE ports as the host side last read them (none without such a host)."""
        ports = getattr(self._host, "nic_ports", None)
        return ports() if ports is not None else ()

    def close(self) -> None:
        self._closed = True
        host_close = getattr(self._host, "close", None)
        if host_close is not None:
            host_close()
        if self._events is not None:
            self._events.stop()
        for device in self._devices.values():
            device.close()
        try:
            self.nvml.nvmlShutdown()
        except self.module.NVMLError:
            pass

    def device_events(self, gpu: str) -> tuple[XidCount, ...]:
        return self._events.counts(gpu) if self._events is not None else ()

    def counter_sources(self, gpu: str) -> dict[str, str]:
        """The fields of GPU ``gpu``'s latest sample that GPM's cumulative metrics gave (``gpm-totals``,
        agent.backends.nvml.gpm_totals); every other field is the library's own (GPM where the device reads it)."""
        device = self._devices.get(gpu)
        totals = device.gpm_totals if device is not None else None
        return {name: GPM_TOTALS for name in totals.used} if totals is not None else {}

    def watching_events(self, gpu: str) -> bool:
        """Whether physical GPU ``gpu`` is registered for XID events yet (shortly after discovery)."""
        return self._events is not None and self._events.registered(gpu)

    # ------------------------------------------------------------------ recovery

    def _reacquire(self, device: NvmlDevice) -> None:
        """Look a lost device up again by UUID; raises DeviceLostError while it is still gone."""
        f = self._found[device.gpu]
        nvml = self.nvml
        if f.unresolved:
            self._resolve(device, f)
            return
        try:
            if f.handles.parent is None:
                handles = Handles(nvml.nvmlDeviceGetHandleByUUID(device.info.uuid.encode()))
                parent = handles.handle
            else:
                parent = nvml.nvmlDeviceGetHandleByIndex(f.index)
                handles = Handles(self._find_instance(parent, f.handles), parent=parent,
                                  gpu_instance_id=f.handles.gpu_instance_id,
                                  compute_instance_id=f.handles.compute_instance_id)
        except self.module.NVMLError as exc:
            if meaning(exc) is Meaning.LIBRARY:
                self._reinit_wanted = True  # done by sample(), outside the read gate
            raise DeviceLostError(f"NVML: GPU {device.gpu} ({device.info.uuid}) still unavailable: {describe(exc)}") from None
        log.info("GPU %s is back (new handle)", device.gpu)
        if f.index in self._boards and f.handles.parent is not None:
            self._boards[f.index].reset(parent)
        self._found[device.gpu] = dataclasses.replace(f, handles=handles)
        device.reset(handles)
        self._stale.discard(device.gpu)
        if self._events is not None:
            instances = {_instance_key(g.handles): gpu for gpu, g in self._found.items()
                         if g.index == f.index and g.handles is not None and g.handles.parent is not None}
            self._events.watch(parent, str(f.index), instances)

    def _resolve(self, device: NvmlDevice, f: Found) -> None:
        """First contact with a GPU that was lost when the agent started: describe it now."""
        try:
            handle = self.nvml.nvmlDeviceGetHandleByIndex(f.index)
            described = describe_gpu(self.nvml, f.index, handle)
        except self.module.NVMLError as exc:
            if meaning(exc) is Meaning.LIBRARY:
                self._reinit_wanted = True  # done by sample(), outside the read gate
            raise DeviceLostError(f"NVML: GPU {device.gpu} still unavailable: {describe(exc)}") from None
        if len(described) != 1 or described[0].info.gpu != device.gpu:
            raise DeviceLostError(f"NVML: GPU {device.gpu} came back with MIG enabled; restart the agent to read "
                                  "its instances")
        (found,) = described
        log.info("GPU %s found (%s, %s)", device.gpu, found.info.model, found.info.uuid)
        self._found[device.gpu] = found
        device.info = found.info
        device.reset(found.handles)
        self._stale.discard(device.gpu)
        if self._events is not None:
            self._events.watch(handle, str(f.index), {})

    def mig_parent(self, gpu: str) -> tuple[str, str] | None:
        """(parent GPU id, parent UUID) of a MIG instance, None for a whole GPU: the board its energy is split
        from (agent.collector.mig_energy)."""
        f = self._found.get(gpu)
        if f is None or f.handles is None or f.handles.parent is None:
            return None
        return str(f.index), f.parent_uuid

    def device_info(self, gpu: str) -> DeviceInfo:
        """The device's identity now: it changes when a GPU lost at start is found."""
        return self._devices[gpu].info

    def _find_instance(self, parent: Any, handles: Handles) -> Any:
        """The MIG device handle of the same GPU instance and compute instance as ``handles``."""
        nvml = self.nvml
        for slot in range(nvml.nvmlDeviceGetMaxMigDeviceCount(parent)):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, slot)
                if int(nvml.nvmlDeviceGetGpuInstanceId(mig)) != handles.gpu_instance_id:
                    continue
                if handles.compute_instance_id in (None, int(nvml.nvmlDeviceGetComputeInstanceId(mig))):
                    return mig
            except self.module.NVMLError:
                continue
        raise self.module.NVMLError(self.module.NVML_ERROR_NOT_FOUND)

    def _reinit(self) -> None:
        """NVML itself broke (driver reloaded underneath): shut down, initialise again, re-acquire all.

        Done with the library to itself (agent.backends.gate): the other GPUs' reads in flight end
        first, and none starts until NVML answers again. Given up for now if they do not end in time.
        """
        with self._gate.restarting(RESTART_WAIT_S) as alone:
            if not alone:
                log.warning("NVML re-initialisation skipped: reads still in flight")
                return
            self._reinit_wanted = False
            generation = self._generation
            try:
                self.nvml.nvmlShutdown()
            except self.module.NVMLError:
                pass
            try:
                self.nvml.nvmlInit()
            except self.module.NVMLError as exc:
                log.warning("NVML re-initialisation failed: %s", describe(exc))
                return
            if generation == self._generation:
                self._generation += 1
                self._stale.update(self._devices)
                log.warning("NVML re-initialised; re-acquiring every GPU")

    # ------------------------------------------------------------------ introspection (doctor)

    @property
    def devices(self) -> dict[str, NvmlDevice]:
        return dict(self._devices)

    @property
    def events(self) -> XidWatcher | None:
        return self._events


def _instance_key(handles: Handles) -> tuple[int, int]:
    """(GPU instance, compute instance) of a MIG device, as XID events name them."""
    return handles.gpu_instance_id or 0, handles.compute_instance_id or 0
