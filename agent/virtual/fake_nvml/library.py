"""FakeNvmlLibrary: libnvidia-ml.so's C interface, in Python, driven by one virtual node.

Load the real pynvml on top of it with :func:`agent.virtual.fake_nvml.load_pynvml`; the NVML
backend then runs unchanged in tests and the demo. This module holds what every C function
shares: the init reference count, device handles, fault windows and per-symbol bookkeeping.
The functions themselves live in the ``api_*`` mixins, one module per NVML area.

Handles are fixed pointer values: ``0x1D000000 | generation << 16 | index << 8 | ci << 4 | gi``
(gi: GPU instance, ci: compute instance). A ``lost`` fault window bumps a device's generation
when it ends, so the handle taken before it stays lost for good and a fresh
nvmlDeviceGetHandleByIndex returns a new value, as after a reset.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from typing import Any

from agent.model import DeviceInfo, GpuSample
from agent.model.specs import mig_slice_spec, spec_by_key
from agent.virtual.backend import FaultWindow, VirtualBackend
from agent.virtual.devices import (
    HIDDEN_FIELDS,
    MIG_HIDDEN_FIELDS,
    VGPU_HIDDEN_FIELDS,
    default_counters,
    device_info,
    driver_view,
    mig_capable,
    mig_slices,
    mig_uuid,
    parse_mig_profile,
)
from agent.virtual.fake_nvml import codes
from agent.virtual.fake_nvml.api_device import DeviceFunctions
from agent.virtual.fake_nvml.api_events import EventFunctions
from agent.virtual.fake_nvml.api_fields import FieldFunctions
from agent.virtual.fake_nvml.api_gpm import GpmFunctions
from agent.virtual.fake_nvml.api_mig import MigFunctions
from agent.virtual.fake_nvml.api_system import SystemFunctions
from agent.virtual.fake_nvml.ctypes_io import Fail, pointer_value
from agent.virtual.fake_nvml.device import Counters, NvmlDevice
from agent.virtual.fake_nvml.events import Injected, XidEvent, window_events
from agent.virtual.fake_nvml.profile import missing_symbols, model_traits
from agent.virtual.fake_nvml.symbols import CFunction, collect
from agent.virtual.profiles import NvmlProfile

GIB = 1024**3
HANDLE_BASE = 0x1D000000
_HANDLE_MASK = 0xFF000000


class FakeNvmlLibrary(SystemFunctions, DeviceFunctions, MigFunctions, FieldFunctions, GpmFunctions, EventFunctions):
    """The C functions of libnvidia-ml for one node of a :class:`VirtualBackend`.

    ``backend`` is owned by the fake from now on (its per-GPU sample spans must not be consumed
    by anyone else). ``profile`` overrides the node's ``nvml`` profile. Attributes are the C
    symbols (``lib.nvmlDeviceGetCount_v2``); symbols the driver version lacks, or that the fake
    does not implement, raise AttributeError, which pynvml turns into NVMLError_FunctionNotFound.
    """

    def __init__(self, backend: VirtualBackend, *, profile: NvmlProfile | None = None) -> None:
        self.backend = backend
        node = backend.engine.scenario.node(backend.node)
        self.node = node
        self.profile = profile if profile is not None else node.nvml
        spec = spec_by_key(node.model)
        self.spec = spec
        self.is_nvidia = spec.vendor == "nvidia"
        self.traits = model_traits(node.model)
        self.view = driver_view(node.model, spec)
        self.mig_capable = mig_capable(node.model, spec.vendor) and node.vgpu is None
        self.mig_slices = mig_slices(node.model)
        """Compute slices of the whole GPU (4 on the A30, else 7): also the most MIG devices it can have."""
        preset = node.counters or default_counters(node.model, spec.vendor)
        self.blind = preset == "minimal"
        """No utilisation counters readable: utilisation and GPM calls fail with NO_PERMISSION."""
        self.calls: collections.Counter[tuple[str | None, str]] = collections.Counter()
        """C calls made, by (virtual GPU id of the handle's device or None, symbol)."""

        self._lock = threading.Lock()
        self._refcount = 0
        self._closed = threading.Event()
        self._hung = 0
        self._wake = threading.Condition(self._lock)
        self._injected = Injected()
        self._forced: dict[tuple[str, str | None], int] = {}
        self.physical: list[NvmlDevice] = self._build_devices(preset)
        self._by_gpu: dict[str, NvmlDevice] = {}
        for dev in self.physical:
            self._by_gpu[dev.gpu] = dev
            for child in dev.children:
                self._by_gpu.setdefault(child.gpu, child)  # a split GPU instance: its first compute instance
                self._by_gpu[child.nvml_id] = child
        self._by_uuid = {d.info.uuid: d for d in self._by_gpu.values()}
        self._gpm_samples: dict[int, Any] = {}
        self._gpm_boots: dict[tuple[str, int], Any] = {}
        """(GPU, resets so far) -> the snapshot its cumulative GPM metrics count from (api_gpm)."""
        self._event_sets: dict[int, Any] = {}
        self._next_address = 0x5A000000

        missing = missing_symbols(self.profile)
        self._functions: dict[str, CFunction] = {
            name: CFunction(self, name, impl, handle=handle, needs_init=needs_init)
            for name, (impl, handle, needs_init) in collect(self).items() if name not in missing}

    # ------------------------------------------------------------------ public API

    def __getattr__(self, name: str) -> CFunction:
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self.__dict__["_functions"][name]
        except KeyError:
            driver = self.profile.driver_version
            raise AttributeError(f"libnvidia-ml (fake, driver {driver}) has no symbol {name}") from None

    @property
    def symbols(self) -> list[str]:
        """Every C symbol this library exports (after the driver-version gates)."""
        return sorted(self._functions)

    def latest_sample(self, gpu: int | str) -> GpuSample | None:
        """The last virtual sample behind ``gpu``'s counters (None before its first reading).

        ``gpu`` is a virtual id (``3``, ``"3"``, ``"3/1"``) or a compute instance's (``"3/1/0"``: the
        GPU instance's sample); a GPU in MIG mode has none (its instances do).
        """
        dev = self._by_gpu.get(str(gpu).strip())
        if dev is None:
            raise ValueError(f"node {self.backend.node!r} has no GPU {gpu!r}")
        return dev.counters.latest if dev.counters is not None else None

    def force_error(self, symbol: str, code: int, gpu: int | str | None = None) -> None:
        """Make every call of ``symbol`` (on ``gpu``'s handle, or on any) return ``code`` until
        :meth:`clear_forced_errors`: the fault matrix's "each call raising each error class"."""
        with self._lock:
            self._forced[(symbol, None if gpu is None else str(gpu))] = code

    def clear_forced_errors(self) -> None:
        with self._lock:
            self._forced.clear()

    def inject_xid(self, gpu: int | str, code: int) -> None:
        """Make ``gpu`` (``3`` or a MIG instance ``"3/1"``) raise XID ``code`` now."""
        gpu_id = str(gpu).strip()
        if gpu_id not in self._by_gpu:
            raise ValueError(f"node {self.backend.node!r} has no GPU {gpu!r}")
        self._injected.add(gpu_id, int(code), self._vt())
        with self._wake:
            self._wake.notify_all()

    @property
    def hung_calls(self) -> int:
        """Calls blocked in a ``hang`` fault right now."""
        with self._lock:
            return self._hung

    def close(self) -> None:
        """Release hung calls (they return UNKNOWN) and event waits (UNINITIALIZED), now and later."""
        self._closed.set()
        with self._wake:
            self._wake.notify_all()

    # ------------------------------------------------------------------ devices and handles

    def _build_devices(self, preset: str) -> list[NvmlDevice]:
        node, spec, backend = self.node, self.spec, self.backend
        seed = backend.engine.scenario.seed
        infos = {d.gpu: d for d in backend.discover()}
        base_hidden = frozenset(HIDDEN_FIELDS[preset]) | frozenset(VGPU_HIDDEN_FIELDS if node.vgpu else ())
        mig_hidden = base_hidden | frozenset(MIG_HIDDEN_FIELDS)
        self.board_hidden = base_hidden
        """What a GPU in MIG mode cannot read as a board either (the preset's; api_device._board_energy_j)."""
        parent_gb = spec.memory_bytes / GIB if spec.memory_bytes else None
        out = []
        for k in range(node.gpus):
            profiles = node.mig.get(k)
            if not profiles:
                out.append(NvmlDevice(k, 0, str(k), infos[str(k)], Counters(str(k), base_hidden),
                                      slices=self.mig_slices))
                continue
            parent = NvmlDevice(k, 0, str(k), device_info(seed, node.name, k, node.model, spec, preset), None,
                                slices=self.mig_slices)
            for j, profile in node.mig_instances(k):
                parsed = parse_mig_profile(profile)
                assert parsed is not None
                gpu = f"{k}/{j}"
                share = min(1.0, parsed[1] / parent_gb) if parent_gb else 1.0
                counters = Counters(gpu, mig_hidden)
                splits = self._compute_instances(gpu, parsed[0])
                for ci, c in enumerate(splits or [None]):
                    info = infos[gpu] if c is None else self._compute_instance_info(infos[gpu], profile, ci, c, parsed)
                    parent.children.append(NvmlDevice(k, j, gpu, info, counters, parent=parent, slices=parsed[0],
                                                      mem_share=share, ci=ci, ci_slices=c))
            out.append(parent)
        unknown = set(self.profile.mig_compute_instances) - {c.gpu for d in out for c in d.children}
        if unknown:
            raise ValueError(f"nvml.mig_compute_instances: no MIG instance {sorted(unknown)[0]!r} on this node")
        return out

    def _compute_instances(self, gpu: str, g: int) -> list[int]:
        """The compute instances' slice counts the profile splits GPU instance ``gpu`` into ([] = not split)."""
        splits = self.profile.mig_compute_instances.get(gpu, [])
        if sum(splits) > g:
            raise ValueError(f"nvml.mig_compute_instances[{gpu!r}]: {splits} needs more than the {g} slices "
                             "of its GPU instance")
        return splits

    def _compute_instance_info(self, gi_info: DeviceInfo, profile: str, ci: int, c: int,
                               parsed: tuple[int, int]) -> DeviceInfo:
        """Compute instance ``ci`` (``c`` slices) of a GPU instance, as its MIG device handle describes it:
        named ``<c>c.<profile>``, its own UUID and share of the SMs, the GPU instance's memory."""
        g, gb = parsed
        gpu = f"{gi_info.gpu}/{ci}"
        sm = max(1, round(gi_info.sm_count * c / g)) if gi_info.sm_count else None
        return dataclasses.replace(
            gi_info, gpu=gpu, uuid=mig_uuid(self.backend.engine.scenario.seed, self.node.name, gpu),
            model=gi_info.model.replace(f" MIG {profile}", f" MIG {c}c.{profile}"), sm_count=sm,
            spec=mig_slice_spec(self.spec, g, gb, c))

    def _decode(self, address: int) -> tuple[NvmlDevice, int] | None:
        """(device, generation) of a handle value, or None if it is no handle of ours."""
        if address & _HANDLE_MASK != HANDLE_BASE:
            return None
        gen, index, ci, gi = (address >> 16) & 0xFF, (address >> 8) & 0xFF, (address >> 4) & 0xF, address & 0xF
        if index >= len(self.physical):
            return None
        dev = self.physical[index]
        if gi:  # a MIG device: its GPU instance id + 1 (GPU instance 0 is a 7g.80gb's, say)
            dev = next((c for c in dev.children if c.gi == gi - 1 and c.ci == ci), None)  # type: ignore[assignment]
            if dev is None:
                return None
        return dev, gen

    def _handle_address(self, dev: NvmlDevice) -> int:
        """The handle nvmlDeviceGetHandleBy* gives now; GPU_IS_LOST while a lost window is active."""
        vt = self._vt()
        if self._lost_now(dev, vt):
            raise Fail(codes.ERROR_GPU_IS_LOST)
        return HANDLE_BASE | (self._generation(dev, vt) << 16) | (dev.index << 8) | (dev.ci << 4) | (dev.gi + 1 if dev.is_mig else 0)

    def _lost_windows(self, dev: NvmlDevice) -> list[FaultWindow]:
        return [w for w in self.backend.fault_windows() if w.kind == "lost" and w.covers(dev.gpu)]

    def _lost_now(self, dev: NvmlDevice, vt: float) -> bool:
        return any(w.active(vt) for w in self._lost_windows(dev))

    def _generation(self, dev: NvmlDevice, vt: float) -> int:
        """Resets so far: lost windows over ``dev`` that have ended by virtual time ``vt``."""
        return sum(1 for w in self._lost_windows(dev) if w.start_s + w.duration_s <= vt) & 0xFF

    def _check_alive(self, dev: NvmlDevice, gen: int) -> None:
        vt = self._vt()
        if self._lost_now(dev, vt) or gen != self._generation(dev, vt):
            raise Fail(codes.ERROR_GPU_IS_LOST)

    def _last_reset(self, index: int, vt: float) -> float | None:
        ends = [w.start_s + w.duration_s for w in self.backend.fault_windows()
                if w.kind == "lost" and w.covers(str(index)) and w.start_s + w.duration_s <= vt]
        return max(ends) if ends else None

    def _link_count(self, dev: NvmlDevice) -> int:
        return 0 if dev.is_mig else self.view.link_count

    def _new_address(self) -> int:
        with self._lock:
            self._next_address += 0x10
            return self._next_address

    # ------------------------------------------------------------------ time, faults, fresh data

    def _now(self) -> float:
        return self.backend.clock()

    def _vt(self) -> float:
        return self.backend.clock() - self.backend.start_time

    def _xid_events(self) -> list[XidEvent]:
        return window_events(self.backend.fault_windows()) + self._injected.events()

    def _apply_fault(self, gpu: str, now: float) -> None:
        """A reading call on ``gpu`` inside a fault window: UNKNOWN, GPU_IS_LOST, or a hang."""
        window = self.backend.fault_at(gpu, now)
        if window is None:
            return
        if window.kind == "lost":
            raise Fail(codes.ERROR_GPU_IS_LOST)
        if window.kind == "hang":
            with self._lock:
                self._hung += 1
            try:
                self._closed.wait(window.hang_s)
            finally:
                with self._lock:
                    self._hung -= 1
        raise Fail(codes.ERROR_UNKNOWN)

    def _fresh(self, dev: NvmlDevice) -> float:
        """Fault checks, then bring the device's counters up to now; returns now (wall clock)."""
        now = self._now()
        self._apply_fault(dev.gpu, now)
        if dev.counters is not None:
            dev.counters.advance(self.backend, now)
            return now
        for child in dev.children:  # a GPU in MIG mode: its instances, skipping failing ones
            assert child.counters is not None
            if self.backend.fault_at(child.gpu, now) is None:
                child.counters.advance(self.backend, now)  # compute instances of one GI: advanced once
        return now

    def _sample(self, dev: NvmlDevice) -> GpuSample:
        """The latest sample of a device with its own counters (after :meth:`_fresh`)."""
        assert dev.counters is not None and dev.counters.latest is not None
        return dev.counters.latest

    # ------------------------------------------------------------------ dispatch

    def _initialised(self) -> bool:
        with self._lock:
            return self._refcount > 0

    def _dispatch(self, fn: CFunction, args: tuple[Any, ...]) -> Any:
        ref = self._decode(pointer_value(args[0])) if fn.handle and args else None
        gpu = ref[0].nvml_id if ref else None
        with self._lock:
            self.calls[(gpu, fn.name)] += 1
            forced = self._forced.get((fn.name, gpu)) or self._forced.get((fn.name, None)) if self._forced else None
        if forced is not None:
            return forced
        try:
            if fn.needs_init and not self._initialised():
                raise Fail(codes.ERROR_UNINITIALIZED)
            if fn.name in self.profile.not_supported:
                raise Fail(codes.ERROR_NOT_SUPPORTED)
            if fn.name in self.profile.no_permission:
                raise Fail(codes.ERROR_NO_PERMISSION)
            if fn.handle:
                if ref is None:
                    raise Fail(codes.ERROR_INVALID_ARGUMENT)
                self._check_alive(*ref)
                rc = fn.impl(ref[0], *args[1:])
            else:
                rc = fn.impl(*args)
        except Fail as failure:
            return failure.code
        return codes.SUCCESS if rc is None else rc
