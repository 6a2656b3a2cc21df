"""The AMD backend: amdsmi, behind the agent's small :class:`Backend` protocol.

Like the NVML backend it takes the library *module* as a parameter: in production the real
``amdsmi`` package over ROCm's ``libamd_smi.so``; in tests and ``roofwatch demo --backend
amd-virtual`` a private copy of the same real package over a fake library driven by the virtual
fleet (:mod:`agent.virtual.fake_amdsmi`). Every line here runs unchanged in both.

Start-up is the probe: devices and partitions are found once, then each is read twice so that
every optional capability has been tried and the counters have a baseline.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Any, Callable, Sequence

from agent.backends.amd.device import AmdDevice, SocketTable
from agent.backends.amd.discovery import Found, discover
from agent.backends.amd.errors import Meaning, describe, meaning
from agent.backends.amd.library import init_message
from agent.backends.base import BackendUnavailable, DeviceError, DeviceLostError
from agent.backends.nvml.calls import CountingNvml
from agent.backends.readings import LibraryError
from agent.context.local_host import LocalHost
from agent.context.sources import HostSource
from agent.model import DeviceInfo, GpuSample, NicPort

log = logging.getLogger("roofwatch.amd")

PROBE_SPAN_S = 0.12
"""Pause between the two probe reads, so rates have a span."""


class AmdBackend:
    """Samples AMD GPUs and their compute partitions through amdsmi."""

    name = "amd"

    def __init__(self, amdsmi: Any, *, node: str = "local", host: HostSource | None = None,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.module = amdsmi
        self.node = node
        self.amdsmi = CountingNvml(amdsmi, prefix="amdsmi_")
        self._host = host if host is not None else LocalHost()
        self._clock, self._wall, self._sleep = clock, wall, sleep
        self._lock = threading.Lock()
        self._devices: dict[str, AmdDevice] = {}
        self._found: dict[str, Found] = {}
        self._sockets: dict[str, SocketTable] = {}
        self._stale: set[str] = set()
        """Lost devices: re-acquired with a fresh handle and fresh counter baselines."""
        self._rebound: set[str] = set()
        """Devices whose handle predates a re-initialisation: re-acquired, their counters continue."""
        self._closed = False
        self._generation = 0
        try:
            self.amdsmi.amdsmi_init(amdsmi.AmdSmiInitFlags.INIT_AMD_GPUS)
        except amdsmi.AmdSmiException as exc:
            raise BackendUnavailable(init_message(exc)) from None
        self.library_version = self._optional_text(self.amdsmi.amdsmi_get_lib_version)
        self.driver_version: str | None = None
        self.rocm_version = self._optional_text(getattr(self.amdsmi, "amdsmi_get_rocm_version", None))

    def _optional_text(self, fn: Callable[..., Any] | None, *args: Any) -> str | None:
        if fn is None:
            return None
        try:
            value = fn(*args)
        except self.module.AmdSmiException:
            return None
        except TypeError:  # an older package with a different signature
            return None
        if isinstance(value, dict):
            parts = [str(value[k]) for k in ("major", "minor", "release") if k in value]
            return ".".join(parts) if parts else str(value.get("build") or value)
        if isinstance(value, tuple) and value and value[0] is True:
            return str(value[1])
        return str(value) if value not in (None, "N/A") else None

    # ------------------------------------------------------------------ Backend protocol

    def discover(self) -> Sequence[DeviceInfo]:
        try:
            found = discover(self.amdsmi)
        except self.module.AmdSmiException as exc:
            raise BackendUnavailable(f"amdsmi: listing GPUs failed: {describe(exc)}") from None
        if not found:
            raise BackendUnavailable("amdsmi: the library loaded, but it reports no AMD GPUs "
                                     "(is the amdgpu driver loaded? `ls /dev/kfd /dev/dri`)")
        for f in found:
            socket = self._sockets.setdefault(f.socket, SocketTable())
            self._found[f.info.gpu] = f
            self._devices[f.info.gpu] = AmdDevice(self.amdsmi, f.info, f.handle, socket, partition=f.partition,
                                                  partitions=f.partitions, host=self._host, clock=self._clock,
                                                  node=self.node)
        driver = self._driver_version(found[0].handle)
        self.driver_version = driver
        self._probe()
        return [d.info for d in self._devices.values()]

    def _driver_version(self, handle: Any) -> str | None:
        try:
            info = self.amdsmi.amdsmi_get_gpu_driver_info(handle)
        except self.module.AmdSmiException:
            return None
        version = info.get("driver_version") if isinstance(info, dict) else None
        return str(version) if version not in (None, "N/A") else None

    def _probe(self) -> None:
        for step in range(2):
            if step:
                self._sleep(PROBE_SPAN_S)
            now = self._wall()
            for gpu, device in self._devices.items():
                try:
                    device.read(now)
                except DeviceLostError as exc:
                    log.warning("%s", exc)
                    self._stale.add(gpu)
                except DeviceError as exc:
                    log.warning("probe of GPU %s: %s", gpu, exc)
        for device in self._devices.values():
            links = len(device._state.links) if device.primary else 0
            device.info = dataclasses.replace(device.info, capabilities=device.capabilities(), link_count=links)

    def sample(self, gpu: str, now: float) -> GpuSample:
        device = self._devices.get(gpu)
        if device is None:
            raise DeviceError(f"amdsmi: no GPU {gpu!r}")
        if self._closed:
            raise DeviceError("amd backend is closed")
        self.amdsmi.reset()
        if gpu in self._stale or gpu in self._rebound:
            self._reacquire(device)
        try:
            sample = device.read(now)
        except DeviceLostError:
            self._stale.add(gpu)
            raise
        except LibraryError:
            self._reinit()
            raise
        return dataclasses.replace(sample, driver_calls=self.amdsmi.count)

    def nic_ports(self) -> tuple[NicPort, ...]:
        ports = getattr(self._host, "nic_ports", None)
        return ports() if ports is not None else ()

    def close(self) -> None:
        self._closed = True
        host_close = getattr(self._host, "close", None)
        if host_close is not None:
            host_close()
        try:
            self.amdsmi.amdsmi_shut_down()
        except self.module.AmdSmiException:
            pass

    # ------------------------------------------------------------------ recovery

    def _reacquire(self, device: AmdDevice) -> None:
        """Find a lost device again by UUID among fresh handles; DeviceLostError while it is gone.

        A device only re-bound after a re-initialisation keeps its counter baselines (see
        :meth:`_reinit`); one that cannot be found is treated as lost from then on.
        """
        try:
            for handle in self.amdsmi.amdsmi_get_processor_handles():
                try:
                    uuid = self.amdsmi.amdsmi_get_gpu_device_uuid(handle)
                except self.module.AmdSmiException:
                    continue
                if uuid == device.info.uuid:
                    break
            else:
                self._stale.add(device.gpu)
                raise DeviceLostError(f"amdsmi: GPU {device.gpu} ({device.info.uuid}) still unavailable")
        except self.module.AmdSmiException as exc:
            self._stale.add(device.gpu)
            if meaning(exc) is Meaning.LIBRARY:
                self._reinit()
            raise DeviceLostError(f"amdsmi: GPU {device.gpu} ({device.info.uuid}) still unavailable: "
                                  f"{describe(exc)}") from None
        log.info("GPU %s is back (new handle)", device.gpu)
        self._found[device.gpu] = dataclasses.replace(self._found[device.gpu], handle=handle)
        if device.gpu in self._stale:
            device.reset(handle)
        else:
            device.rebind(handle)
        self._stale.discard(device.gpu)
        self._rebound.discard(device.gpu)

    def _reinit(self) -> None:
        """amdsmi itself broke: shut down, initialise again, and re-acquire every device.

        Only the library restarted, not the GPUs: their handles are re-acquired, but their counter
        baselines are kept (the error matrix found every other GPU losing a whole interval of rates,
        and all of them for as long as one GPU kept failing with NOT_INIT).
        """
        with self._lock:
            try:
                self.amdsmi.amdsmi_shut_down()
            except self.module.AmdSmiException:
                pass
            try:
                self.amdsmi.amdsmi_init(self.module.AmdSmiInitFlags.INIT_AMD_GPUS)
            except self.module.AmdSmiException as exc:
                log.warning("amdsmi re-initialisation failed: %s", describe(exc))
                return
            self._generation += 1
            self._rebound.update(self._devices)
            log.warning("amdsmi re-initialised; re-acquiring every GPU")

    # ------------------------------------------------------------------ introspection (doctor)

    @property
    def devices(self) -> dict[str, AmdDevice]:
        return dict(self._devices)
