"""The AMD backend: amdsmi, behind the agent's small :class:`Backend` protocol.

Like the NVML backend it takes the library *module* as a parameter: in production the real
``amdsmi`` package over ROCm's ``libamd_smi.so``; in tests and ``roofwatch demo --backend
amd-virtual`` a private copy of the same real package over a fake library driven by the virtual
fleet (:mod:`agent.virtual.fake_amdsmi`). Every line here runs unchanged in both, and with every
amdsmi release from 6.2: what a release lacks is found once (:mod:`agent.backends.amd.bindings`).

Start-up is the probe: devices and partitions are found once, then each is read twice so that
every optional capability has been tried and the counters have a baseline.

Recovery follows how amdsmi keeps its handles (docs/amd.md): a lost GPU keeps its handle, which
stays dead even once the GPU is back as a new device node; only a new amdsmi_init lists it again.
So a lost device is first looked for among the current handles (after a plain reset the old one
reads again), and if it cannot be read there amdsmi is re-initialised and every device re-bound.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any, Callable, Sequence

from agent.backends.amd import values as v
from agent.backends.amd.bindings import Bindings, detect
from agent.backends.amd.device import AmdDevice, SocketTable
from agent.backends.amd.discovery import Found, discover
from agent.backends.amd.errors import Meaning, describe, meaning
from agent.backends.gate import LibraryGate
from agent.backends.amd.library import init_message, rocm_version
from agent.backends.base import BackendUnavailable, DeviceError, DeviceLostError
from agent.backends.nvml.calls import CountingNvml
from agent.backends.readings import LibraryError
from agent.context.local_host import LocalHost
from agent.context.sources import HostSource
from agent.model import DeviceInfo, GpuSample, NicPort, SourceState

log = logging.getLogger("roofwatch.amd")

PROBE_SPAN_S = 0.12
"""Pause between the two probe reads, so rates have a span."""
RESTART_WAIT_S = 5.0
"""How long a re-initialisation waits for the other devices' reads in flight before giving up."""


class _Restart(Exception):
    """amdsmi answered NOT_INIT while a device was being re-bound: re-initialise, outside the gate."""


class AmdBackend:
    """Samples AMD GPUs and their compute partitions through amdsmi."""

    name = "amd"

    def __init__(self, amdsmi: Any, *, node: str = "local", host: HostSource | None = None,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.module = amdsmi
        self.node = node
        self.bindings: Bindings = detect(amdsmi)
        self.amdsmi = CountingNvml(amdsmi, prefix="amdsmi_")
        self._host = host if host is not None else LocalHost()
        self._clock, self._wall, self._sleep = clock, wall, sleep
        self._gate = LibraryGate()
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
        self.library_version = self._optional_text("amdsmi_get_lib_version")
        self.driver_version: str | None = None
        self.rocm_version, self.rocm_version_note = rocm_version(self._optional_text("amdsmi_get_rocm_version"),
                                                                 self._rocm_refusal())

    def _rocm_refusal(self) -> str | None:
        """What ``amdsmi_get_rocm_version`` said when it could not tell (it loads librocm-core.so itself)."""
        fn = getattr(self.amdsmi, "amdsmi_get_rocm_version", None) if self.bindings.has("amdsmi_get_rocm_version") else None
        if fn is None:
            return "amdsmi before 6.4 has no amdsmi_get_rocm_version"
        try:
            found = fn()
        except Exception as exc:  # noqa: BLE001 - a version is an extra
            return f"amdsmi_get_rocm_version failed: {type(exc).__name__}"
        return str(found[1])[:160] if isinstance(found, tuple) and len(found) == 2 and found[0] is not True else None

    def _optional_text(self, name: str) -> str | None:
        """A version from amdsmi as text, or None: absent function, failed call, or "N/A"."""
        fn = getattr(self.amdsmi, name, None) if self.bindings.has(name) else None
        if fn is None:
            return None
        try:
            value = fn()
        except (self.module.AmdSmiException, TypeError):  # TypeError: an older signature
            return None
        if isinstance(value, dict):  # lib version: {year (until 6.3), major, minor, release, build}
            parts = [str(value[k]) for k in ("year", "major", "minor", "release") if isinstance(value.get(k), int)]
            return ".".join(parts) if parts else None
        if isinstance(value, tuple):  # rocm version: (found?, version or why not)
            return str(value[1]) if len(value) == 2 and value[0] is True else None
        return str(value) if value not in (None, "N/A") else None

    # ------------------------------------------------------------------ Backend protocol

    def discover(self) -> Sequence[DeviceInfo]:
        try:
            found = discover(self.amdsmi, self.bindings)
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
                                                  node=self.node, bindings=self.bindings)
        self.driver_version = self._driver_version(found[0].handle)
        self._probe()
        return [d.info for d in self._devices.values()]

    def _driver_version(self, handle: Any) -> str | None:
        if not self.bindings.has("amdsmi_get_gpu_driver_info"):
            return None
        try:
            info = self.amdsmi.amdsmi_get_gpu_driver_info(handle)
        except self.module.AmdSmiException:
            return None
        version = info.get("driver_version") if isinstance(info, dict) else None
        return str(version) if version not in (None, "", "N/A") else None

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
            links = len(device._state.table.links) if device.primary else 0
            device.info = dataclasses.replace(device.info, capabilities=device.capabilities(), link_count=links)

    def sample(self, gpu: str, now: float) -> GpuSample:
        device = self._devices.get(gpu)
        if device is None:
            raise DeviceError(f"amdsmi: no GPU {gpu!r}")
        if self._closed:
            raise DeviceError("amd backend is closed")
        self.amdsmi.reset()
        if gpu in self._stale:
            self._recover(device)
        broken: LibraryError | None = None
        try:
            with self._gate.reading():
                if gpu in self._rebound:
                    self._rebind(device)
                sample = device.read(now)
        except DeviceLostError:
            self._stale.add(gpu)
            raise
        except _Restart:
            self._reinit()
            raise DeviceLostError(f"amdsmi: GPU {gpu} not re-bound: amdsmi was not initialised") from None
        except LibraryError as exc:
            broken = exc
        if broken is not None:
            self._reinit()
            raise broken
        return dataclasses.replace(sample, driver_calls=self.amdsmi.count)

    def source_states(self, now: float) -> tuple[SourceState, ...]:
        """The node side's sources (inference servers), as the host last saw them."""
        states = getattr(self._host, "source_states", None)
        return tuple(states(now)) if states is not None else ()

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

    def _find(self, device: AmdDevice, *, readable: bool) -> Any | None:
        """The handle amdsmi now lists for ``device`` (by UUID), or None; with ``readable`` only one
        whose core reading answers (a lost GPU's old handle is still listed). Raises
        DeviceLostError when the enumeration fails, :class:`_Restart` when amdsmi is not initialised."""
        try:
            handles = self.amdsmi.amdsmi_get_processor_handles()
        except self.module.AmdSmiException as exc:
            if meaning(exc) is Meaning.LIBRARY:
                raise _Restart() from None
            raise DeviceLostError(f"amdsmi: GPU {device.gpu} ({device.info.uuid}) still unavailable: "
                                  f"{describe(exc)}") from None
        for handle in handles:
            try:
                if self.amdsmi.amdsmi_get_gpu_device_uuid(handle) != device.info.uuid:
                    continue
                if readable:
                    used = self.amdsmi.amdsmi_get_gpu_memory_usage(handle, self.module.AmdSmiMemoryType.VRAM)
                    return handle if v.nbytes(used) is not None else None
            except self.module.AmdSmiException:
                continue
            return handle
        return None

    def _recover(self, device: AmdDevice) -> None:
        """Bring a lost device back, or raise DeviceLostError while it is still gone.

        First among the current handles (a GPU reset in place reads again under its old handle);
        failing that, amdsmi is re-initialised, which lists the GPUs there are now.
        """
        gpu = device.gpu
        try:
            with self._gate.reading():
                handle = self._find(device, readable=True)
            if handle is None and self._reinit(f"GPU {gpu} is not readable under any handle"):
                with self._gate.reading():
                    handle = self._find(device, readable=True)
        except _Restart:
            self._reinit()
            handle = None
        if handle is None:
            raise DeviceLostError(f"amdsmi: GPU {gpu} ({device.info.uuid}) still unavailable")
        log.info("GPU %s is back (handle %s)", gpu, handle)
        self._found[gpu] = dataclasses.replace(self._found[gpu], handle=handle)
        device.reset(handle)
        self._stale.discard(gpu)
        self._rebound.discard(gpu)

    def _rebind(self, device: AmdDevice) -> None:
        """After a re-initialisation: the same GPU under its new handle, counters continuing."""
        handle = self._find(device, readable=False)
        if handle is None:
            raise DeviceLostError(f"amdsmi: GPU {device.gpu} ({device.info.uuid}) not listed after "
                                  "amdsmi was re-initialised")
        self._found[device.gpu] = dataclasses.replace(self._found[device.gpu], handle=handle)
        device.rebind(handle)
        self._rebound.discard(device.gpu)

    def _reinit(self, why: str = "amdsmi itself failed") -> bool:
        """Shut amdsmi down and initialise it again; every device is re-bound before its next read.

        Only the library restarts, not the GPUs: their counter baselines are kept (the error matrix
        found every other GPU losing a whole interval of rates, and all of them for as long as one
        GPU kept failing with NOT_INIT). Returns False when it could not be done now.
        """
        with self._gate.restarting(RESTART_WAIT_S) as alone:
            if not alone:
                log.warning("amdsmi re-initialisation (%s) skipped: reads still in flight", why)
                return False
            try:
                self.amdsmi.amdsmi_shut_down()
            except self.module.AmdSmiException:
                pass
            try:
                self.amdsmi.amdsmi_init(self.module.AmdSmiInitFlags.INIT_AMD_GPUS)
            except self.module.AmdSmiException as exc:
                log.warning("amdsmi re-initialisation failed: %s", describe(exc))
                return False
            self._generation += 1
            self._rebound.update(self._devices)
            log.warning("amdsmi re-initialised (%s); re-acquiring every GPU", why)
            return True

    # ------------------------------------------------------------------ introspection (doctor)

    @property
    def devices(self) -> dict[str, AmdDevice]:
        return dict(self._devices)
