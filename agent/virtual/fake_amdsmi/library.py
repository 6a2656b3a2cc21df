"""FakeAmdSmiLibrary: libamd_smi.so's C interface, in Python, driven by one virtual node.

Load the real amdsmi package on top of it with :func:`agent.virtual.fake_amdsmi.load_amdsmi`.
This module holds what every C function shares: the init reference count, socket and processor
handles, fault windows and per-symbol bookkeeping; the functions themselves live in the
``api_*`` mixins, one module per area.

Every ``amdsmi_*`` name resolves: the implemented ones, and a stub returning
AMDSMI_STATUS_NOT_SUPPORTED for everything else the wrapper binds. Names in the profile's
``missing_symbols`` raise AttributeError "undefined symbol", as ctypes does for a libamd_smi.so
older than the wrapper.

Processor handles and what a lost GPU does to them follow the real library
(:mod:`agent.virtual.fake_amdsmi.handles`): the list is taken at amdsmi_init and kept, a lost GPU
keeps its handle and its reads fail with UNEXPECTED_SIZE / NOT_SUPPORTED. Socket handles are
``0x50000000 | gpu << 8`` and never change.

The library plays one amdsmi release (:mod:`agent.virtual.fake_amdsmi.release`), set by
:func:`~agent.virtual.fake_amdsmi.load_amdsmi` from the wrapper it loads: it exports exactly the C
symbols that release's libamd_smi.so had, and fills the structures that release's wrapper defines.

:meth:`FakeAmdSmiLibrary.force_error` makes one function fail with a chosen amdsmi_status_t, on
one GPU or all: the C function returns that status and the real package raises for it exactly as
it would over libamd_smi.so (``_check_res``: AmdSmiRetryException for RETRY, AmdSmiTimeoutException
for TIMEOUT, AmdSmiLibraryException carrying the code for everything else).
"""

from __future__ import annotations

import collections
import ctypes
import threading
from typing import Any

from agent.model import GpuSample
from agent.model.specs import spec_by_key
from agent.virtual.backend import VirtualBackend
from agent.virtual.devices import HIDDEN_FIELDS, default_counters, driver_view
from agent.virtual.fake_amdsmi import codes
from agent.virtual.fake_amdsmi.api_bus import BusFunctions
from agent.virtual.fake_amdsmi.api_identity import IdentityFunctions
from agent.virtual.fake_amdsmi.api_memory import MemoryFunctions
from agent.virtual.fake_amdsmi.api_metrics import MetricsFunctions
from agent.virtual.fake_amdsmi.api_power import PowerFunctions
from agent.virtual.fake_amdsmi.api_process import ProcessFunctions
from agent.virtual.fake_amdsmi.api_system import SystemFunctions
from agent.virtual.fake_amdsmi.asic import asic_traits
from agent.virtual.fake_amdsmi.device import AmdDevice, AmdSocket
from agent.virtual.fake_amdsmi.arguments import Fail, pointer_value
from agent.virtual.fake_amdsmi.handles import CACHED_AT_INIT, Handles
from agent.virtual.fake_amdsmi.metrics_table import UPTIME_AT_START_S, Table, TableContext, build_table, validate_na
from agent.virtual.fake_amdsmi.release import NEWEST, Release
from agent.virtual.fake_nvml.symbols import CFunction, collect
from agent.virtual.profiles import AmdProfile

SOCKET_BASE = 0x50000000
_BASE_MASK = 0xFF000000
SOCKET_SYMBOLS = frozenset({"amdsmi_get_processor_handles", "amdsmi_get_socket_info"})
"""Symbols whose first argument is a socket handle (their calls are counted per GPU too)."""


class FakeAmdSmiLibrary(SystemFunctions, IdentityFunctions, MetricsFunctions, PowerFunctions, MemoryFunctions,
                        BusFunctions, ProcessFunctions):
    """The C functions of libamd_smi for one node of a :class:`VirtualBackend`.

    ``backend`` is owned by the fake from now on (its per-GPU sample spans must not be consumed
    by anyone else). ``profile`` overrides the node's ``amd`` profile. Attributes are the C
    symbols (``lib.amdsmi_init``).
    """

    def __init__(self, backend: VirtualBackend, *, profile: AmdProfile | None = None) -> None:
        self.backend = backend
        node = backend.engine.scenario.node(backend.node)
        self.node = node
        self.profile: AmdProfile = profile if profile is not None else (getattr(node, "amd", None) or AmdProfile())
        spec = spec_by_key(node.model)
        self.spec = spec
        self.is_amd = spec.vendor == "amd"
        self.traits = asic_traits(node.model)
        self.view = driver_view(node.model, spec)
        self.na = validate_na(self.profile.na_metrics)
        self.path = f"/opt/rocm-{self.profile.rocm_version}/lib/libamd_smi.so"
        preset = node.counters or default_counters(node.model, spec.vendor)
        self.calls: collections.Counter[tuple[str | None, str]] = collections.Counter()
        """C calls made, by (virtual GPU id of the handle's device, the socket's GPU index, or None; symbol)."""

        self._lock = threading.Lock()
        self._refcount = 0
        """amdsmi_init calls not yet shut down (before 6.4: 0 or 1, a flag)."""
        self._closed = threading.Event()
        self._hung = 0
        self._strings: dict[bytes, Any] = {}
        self._forced: dict[tuple[str, str | None], int] = {}
        self.unreadable_pids: set[int] = set()
        """PIDs whose /proc entry libamd_smi cannot read (another user's process, to an unprivileged caller):
        amdsmi_get_gpu_process_list fills them in with no name and answers NO_PERM (api_process.py)."""
        self.sockets: list[AmdSocket] = self._build_sockets(frozenset(HIDDEN_FIELDS[preset]))
        self.devices: list[AmdDevice] = [d for s in self.sockets for d in s.devices]
        self._by_gpu = {d.gpu: d for d in self.devices}
        self.handles = Handles(self.sockets, self.backend.fault_windows)
        self.release: Release = NEWEST
        self._export()

    def _export(self) -> None:
        """The C functions this library offers: the release's symbols, less the profile's missing ones."""
        exported = self.release.symbols
        self._missing = frozenset(self.profile.missing_symbols)
        self._functions: dict[str, CFunction] = {
            name: CFunction(self, name, impl, handle=handle, needs_init=needs_init)
            for name, (impl, handle, needs_init) in collect(self).items()
            if name not in self._missing and (exported is None or name in exported)}
        self._implemented = frozenset(self._functions)

    def play(self, release: Release) -> None:
        """Be the libamd_smi.so of ``release`` (called by the loader with the wrapper's release).

        One library is one .so: a second wrapper of another release over it is refused.
        """
        if release == self.release:
            return
        if self.release != NEWEST:
            raise ValueError(f"this fake libamd_smi already plays amdsmi {self.release.text}, "
                             f"not {release.text}")
        self.release = release
        self._export()

    # ------------------------------------------------------------------ public API

    def __getattr__(self, name: str) -> CFunction:
        if name.startswith("_"):
            raise AttributeError(name)
        state = self.__dict__
        functions = state.get("_functions")
        if functions is None:  # still being constructed
            raise AttributeError(name)
        fn = functions.get(name)
        if fn is not None:
            return fn
        exported = state["release"].symbols
        if name in state["_missing"] or not name.startswith("amdsmi_") or (exported is not None and name not in exported):
            raise AttributeError(f"{state['path']}: undefined symbol: {name}")
        with state["_lock"]:
            return functions.setdefault(name, CFunction(self, name, _not_supported, handle=False, needs_init=True))

    @property
    def symbols(self) -> list[str]:
        """The C symbols this fake implements for its release (the release's others return NOT_SUPPORTED)."""
        return sorted(self._implemented)

    @property
    def present(self) -> bool:
        """False when the profile says libamd_smi.so is not installed (loading amdsmi then fails)."""
        return self.profile.library

    def latest_sample(self, gpu: int | str) -> GpuSample | None:
        """The last virtual sample behind processor ``gpu`` (``3`` or a partition ``"3/1"``)."""
        dev = self._by_gpu.get(str(gpu).strip())
        if dev is None:
            raise ValueError(f"node {self.backend.node!r} has no GPU {gpu!r}")
        return dev.latest

    def force_error(self, symbol: str, status: int, gpu: Any = None) -> None:
        """Make every call of ``symbol`` (on ``gpu``, or on any) return ``status`` until
        :meth:`clear_forced_errors`: the fault matrix's "each call failing with each status".

        ``symbol`` is the amdsmi function's public name (``amdsmi_get_gpu_metrics_info``): each
        per-device function of the amdsmi package calls the C function of the same name once and
        raises what ``_check_res`` makes of its status. ``status`` is an amdsmi_status_t value
        (``amdsmi_wrapper.AMDSMI_STATUS_*``), taken as the C ``uint32`` it is. ``gpu`` is a virtual
        id (``1``, ``"0/3"``) or a processor handle; functions that take a socket handle
        (``amdsmi_get_processor_handles``) are matched by the socket's GPU index. A forced status
        comes before every other check (init, handle validity, profile), as a failing library's would.
        """
        if not isinstance(symbol, str) or not symbol.startswith("amdsmi_"):
            raise ValueError(f"not an amdsmi function: {symbol!r}")
        exported = self.release.symbols
        if symbol in self._missing or (exported is not None and symbol not in exported):
            raise ValueError(f"{symbol} is missing from this library (amdsmi {self.release.text}, "
                             "or the profile's missing_symbols)")
        code = int(status) & 0xFFFFFFFF
        if code == codes.STATUS_SUCCESS:
            raise ValueError("force_error needs a failing status, not AMDSMI_STATUS_SUCCESS")
        key = None if gpu is None else self._gpu_key(gpu)
        with self._lock:
            self._forced[(symbol, key)] = code

    def clear_forced_errors(self) -> None:
        with self._lock:
            self._forced.clear()

    def _gpu_key(self, gpu: Any) -> str:
        """The virtual GPU id named by ``gpu``: an id (``1``, ``"0/3"``) or one of our processor handles."""
        if isinstance(gpu, (int, str)) and not isinstance(gpu, bool):
            key = str(gpu).strip()
            if key in self._by_gpu or any(str(s.index) == key for s in self.sockets):
                return key
        else:
            try:
                ref = self.handles.decode(pointer_value(gpu))
            except (TypeError, ctypes.ArgumentError):
                ref = None
            if ref is not None:
                return ref[0].gpu
        raise ValueError(f"node {self.backend.node!r} has no GPU {gpu!r}")

    @property
    def hung_calls(self) -> int:
        """Calls blocked in a ``hang`` fault right now."""
        with self._lock:
            return self._hung

    def close(self) -> None:
        """Release hung calls (they return AMDSMI_STATUS_TIMEOUT), now and later."""
        self._closed.set()

    # ------------------------------------------------------------------ devices and handles

    def _build_sockets(self, hidden: frozenset[str]) -> list[AmdSocket]:
        groups: dict[int, list[AmdDevice]] = {}
        for info in self.backend.discover():
            index, _, part = info.gpu.partition("/")
            groups.setdefault(int(index), []).append(AmdDevice(int(index), int(part or 0), info, hidden))
        sockets = []
        for index in sorted(groups):
            devices = sorted(groups[index], key=lambda d: d.partition)
            links = devices[0].info.link_count if devices[0].info.link_count is not None else self.view.link_count
            sockets.append(AmdSocket(index, devices, links))
        return sockets

    def _socket_of(self, dev: AmdDevice) -> AmdSocket:
        return next(s for s in self.sockets if s.index == dev.index)

    def _decode_socket(self, address: int) -> AmdSocket | None:
        if address & _BASE_MASK != SOCKET_BASE or address & 0xFF:
            return None
        index = (address >> 8) & 0xFFFF
        return next((s for s in self.sockets if s.index == index), None)

    @staticmethod
    def _socket_address(socket: AmdSocket) -> int:
        return SOCKET_BASE | socket.index << 8

    def _ordinal(self, dev: AmdDevice) -> int:
        """Position in the flat processor list (the HIP / DRM index of the device)."""
        return self.devices.index(dev)

    def _static_string(self, text: bytes) -> Any:
        """A NUL-terminated buffer that lives as long as the library (for ``char *`` results)."""
        with self._lock:
            return self._strings.setdefault(text, ctypes.create_string_buffer(text))

    # ------------------------------------------------------------------ time, faults, fresh data

    def _now(self) -> float:
        return self.backend.clock()

    def _vt(self) -> float:
        return self.backend.clock() - self.backend.start_time

    def _apply_fault(self, gpu: str, now: float) -> None:
        """A reading call on ``gpu`` inside a fault window: API_FAILED, the lost status, or a hang then TIMEOUT."""
        window = self.backend.fault_at(gpu, now)
        if window is None:
            return
        if window.kind == "lost":
            status = self.handles.lost_status(self._by_gpu[gpu], now - self.backend.start_time)
            raise Fail(status if status is not None else codes.STATUS_NOT_SUPPORTED)
        if window.kind == "hang":
            with self._lock:
                self._hung += 1
            try:
                self._closed.wait(window.hang_s)
            finally:
                with self._lock:
                    self._hung -= 1
            raise Fail(codes.STATUS_TIMEOUT)
        raise Fail(codes.STATUS_API_FAILED)

    def _fresh(self, dev: AmdDevice) -> float:
        """Fault checks, then bring ``dev`` and its socket's other partitions up to now; returns now.

        Socket readings aggregate the partitions, so all are advanced (one at a time, never holding
        two device locks); a partition inside a fault window of its own keeps its last reading.
        """
        now = self._now()
        self._apply_fault(dev.gpu, now)
        dev.advance(self.backend, now)
        for other in self._socket_of(dev).devices:
            if other is not dev and self.backend.fault_at(other.gpu, now) is None:
                try:
                    other.advance(self.backend, now)
                except Fail:
                    pass
        return now

    def _sample(self, dev: AmdDevice) -> GpuSample:
        """The latest sample of ``dev`` (after :meth:`_fresh`)."""
        s = dev.latest
        if s is None:
            raise Fail(codes.STATUS_API_FAILED)
        return s

    def _table(self, dev: AmdDevice) -> Table:
        """The socket's gpu_metrics table as ``dev`` reads it now (after :meth:`_fresh`)."""
        socket = self._socket_of(dev)
        uptime = max(0.0, socket.as_of() - self.backend.start_time) + UPTIME_AT_START_S
        return build_table(socket, TableContext(self.traits, dev.partition, uptime, self.na))

    # ------------------------------------------------------------------ dispatch

    def _initialised(self) -> bool:
        with self._lock:
            return self._refcount > 0

    def _dispatch(self, fn: CFunction, args: tuple[Any, ...]) -> Any:
        ref: tuple[AmdDevice, int] | None = None
        key: str | None = None
        if fn.handle and args:
            ref = self.handles.decode(pointer_value(args[0]))
            key = ref[0].gpu if ref else None
        elif fn.name in SOCKET_SYMBOLS and args:
            socket = self._decode_socket(pointer_value(args[0]))
            key = str(socket.index) if socket else None
        with self._lock:
            self.calls[(key, fn.name)] += 1
            forced = None
            if self._forced:
                forced = self._forced.get((fn.name, key)) if key is not None else None
                if forced is None:
                    forced = self._forced.get((fn.name, None))
        if forced is not None:
            return forced
        try:
            if fn.needs_init and not self._initialised():
                raise Fail(codes.STATUS_NOT_INIT)
            if fn.handle:
                if ref is None:
                    raise Fail(codes.STATUS_INVAL)
                self.handles.check(*ref, self._vt(), cached=fn.name in CACHED_AT_INIT)
            if fn.name in self.profile.not_supported:
                raise Fail(codes.STATUS_NOT_SUPPORTED)
            if fn.name in self.profile.no_permission:
                raise Fail(codes.STATUS_NO_PERM)
            rc = fn.impl(ref[0], *args[1:]) if fn.handle and ref else fn.impl(*args)
        except Fail as failure:
            return failure.code
        return codes.STATUS_SUCCESS if rc is None else rc


def _not_supported(*args: Any) -> int:
    """Every libamd_smi function this fake does not model."""
    return codes.STATUS_NOT_SUPPORTED
