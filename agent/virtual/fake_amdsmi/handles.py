"""Processor handles as libamd_smi hands them out, and what a read through one finds when its GPU is lost.

libamd_smi builds its processor list once, in amdsmi_init (``AMDSmiSystem::init``), and keeps it
until amdsmi_shut_down: ``amdsmi_get_processor_handles`` returns that list whatever happened to
the GPUs since, and a handle is checked only by looking it up in the list
(``handle_to_processor``: NOT_FOUND for a handle from an earlier init). A GPU that falls off the
bus therefore keeps its handle; what fails are the reads behind it, with the status its sysfs
files give (rocm_smi's ``ErrnoToRsmiStatus``): EIO while the reset runs (UNEXPECTED_SIZE), ENOENT
once the device node is gone (NOT_SUPPORTED). When the GPU comes back it is a new device node,
which the old handle does not point at; only a new amdsmi_init lists it again (with a new handle).

The fake plays a ``lost`` fault window that way: the first :data:`EIO_S` seconds of the window
give UNEXPECTED_SIZE, the rest NOT_SUPPORTED, and after the window the handle from before keeps
answering NOT_SUPPORTED until amdsmi is initialised again. Values and functions that the library
caches at init (the PCI address, the processor type) still answer.

Handle values are ``0x7A000000 | init epoch << 16 | gpu << 8 | partition``: every amdsmi_init after
a full shut-down is a new epoch, so its handles differ from every earlier one's.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable

from agent.virtual.backend import FaultWindow
from agent.virtual.fake_amdsmi import codes
from agent.virtual.fake_amdsmi.arguments import Fail
from agent.virtual.fake_amdsmi.device import AmdDevice, AmdSocket

HANDLE_BASE = 0x7A000000
BASE_MASK = 0xFF000000
EIO_S = 1.0
"""Seconds at the start of a lost window in which the GPU's sysfs reads fail with EIO (the reset runs)."""
CACHED_AT_INIT = frozenset({"amdsmi_get_gpu_device_bdf", "amdsmi_get_processor_type"})
"""Functions answered from what amdsmi_init stored, without touching the device."""


@dataclass(frozen=True, slots=True)
class InitState:
    """What one amdsmi_init found: its epoch and, per device listed, the device node it saw."""

    epoch: int
    nodes: dict[str, int]
    """Device id -> node generation (lost windows ended before the init) of every device listed."""


class Handles:
    """The processor list of the current amdsmi_init, and the liveness of each handle's GPU."""

    def __init__(self, sockets: list[AmdSocket], windows: Callable[[], list[FaultWindow]]) -> None:
        self._sockets = sockets
        self._windows = windows
        self._lock = threading.Lock()
        self._epoch = 0
        self._state = InitState(0, {})

    # ------------------------------------------------------------------ init

    def initialise(self, vt: float) -> None:
        """A first amdsmi_init (after a full shut-down): list the GPUs that are there now."""
        nodes = {d.gpu: self.generation(d, vt) for s in self._sockets for d in s.devices if not self.lost_now(d, vt)}
        with self._lock:
            self._epoch = (self._epoch + 1) & 0xFF
            self._state = InitState(self._epoch, nodes)

    @property
    def state(self) -> InitState:
        with self._lock:
            return self._state

    # ------------------------------------------------------------------ handle values

    def address(self, dev: AmdDevice) -> int:
        return HANDLE_BASE | self.state.epoch << 16 | dev.index << 8 | dev.partition

    def listed(self, socket: AmdSocket) -> list[int]:
        """The socket's processor handles as the current init listed them."""
        state = self.state
        return [HANDLE_BASE | state.epoch << 16 | d.index << 8 | d.partition
                for d in socket.devices if d.gpu in state.nodes]

    def decode(self, address: int) -> tuple[AmdDevice, int] | None:
        """(device, epoch) of a processor handle value, or None if it is no handle of ours."""
        if address & BASE_MASK != HANDLE_BASE:
            return None
        epoch, index, part = (address >> 16) & 0xFF, (address >> 8) & 0xFF, address & 0xFF
        socket = next((s for s in self._sockets if s.index == index), None)
        dev = next((d for d in socket.devices if d.partition == part), None) if socket else None
        return (dev, epoch) if dev is not None else None

    # ------------------------------------------------------------------ liveness

    def lost_windows(self, dev: AmdDevice) -> list[FaultWindow]:
        return [w for w in self._windows() if w.kind == "lost" and w.covers(dev.gpu)]

    def lost_now(self, dev: AmdDevice, vt: float) -> bool:
        return any(w.active(vt) for w in self.lost_windows(dev))

    def generation(self, dev: AmdDevice, vt: float) -> int:
        """The device's node generation: lost windows over it that ended by virtual time ``vt``."""
        return sum(1 for w in self.lost_windows(dev) if w.start_s + w.duration_s <= vt)

    def lost_status(self, dev: AmdDevice, vt: float) -> int | None:
        """What a sysfs read of ``dev`` fails with now: EIO during a reset, ENOENT once the node is gone."""
        for window in self.lost_windows(dev):
            if window.active(vt):
                return codes.STATUS_UNEXPECTED_SIZE if vt - window.start_s < EIO_S else codes.STATUS_NOT_SUPPORTED
        return None

    def check(self, dev: AmdDevice, epoch: int, vt: float, *, cached: bool = False) -> None:
        """Raise the status a call through handle (``dev``, ``epoch``) returns, if it fails."""
        state = self.state
        if epoch != state.epoch or dev.gpu not in state.nodes:
            raise Fail(codes.STATUS_NOT_FOUND)  # not in this init's processor list
        if cached:
            return
        status = self.lost_status(dev, vt)
        if status is not None:
            raise Fail(status)
        if self.generation(dev, vt) != state.nodes[dev.gpu]:
            raise Fail(codes.STATUS_NOT_SUPPORTED)  # the GPU came back as a new node: this one is gone
