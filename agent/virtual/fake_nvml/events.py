"""XID events: when they happen, what they leave behind, and which event set gets them.

XIDs come from three places: ``xid`` faults of the scenario (or injected into the backend),
``lost`` fault windows (XID 79 at their start) and :meth:`FakeNvmlLibrary.inject_xid`. Scenario
ones happen when virtual time reaches ``start_s``; injected ones at once. An event set receives
each event that happens after it registered the device, once, through ``nvmlEventSetWait``.

An XID also leaves state the NVML backend can read later: XID 48 (double-bit ECC) counts in the
volatile DBE total, XID 63 counts a correctable row remap (pending until the next reset, i.e.
the end of a ``lost`` window), XID 64 marks a row-remap failure.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field

from agent.virtual.backend import FaultWindow
from agent.virtual.fake_nvml import codes


@dataclass(frozen=True, slots=True)
class XidEvent:
    """One XID on physical GPU ``index`` (``gi`` set when it names one MIG instance)."""

    key: tuple[object, ...]
    index: int
    gi: int | None
    t: float
    """Virtual time it happens."""
    xid: int
    seq: int = 0
    """Order of injection (0 for scenario events, which are ordered by time)."""


@dataclass(eq=False)
class EventSet:
    """One nvmlEventSet_t: the devices registered (mask, virtual time, sequence), what it got."""

    address: int
    registrations: dict[int, tuple[int, int, float, int]] = field(default_factory=dict)
    """physical index -> (handle address, event mask, registered at virtual t, registered at seq)."""
    delivered: set[tuple[object, ...]] = field(default_factory=set)


def _target(gpu: str) -> tuple[int, int | None]:
    index, _, instance = gpu.partition("/")
    return int(index), int(instance) if instance else None


def window_events(windows: list[FaultWindow]) -> list[XidEvent]:
    """The XIDs a backend's fault list causes: its xid faults, and XID 79 for each lost window."""
    out = []
    for i, w in enumerate(windows):
        if w.kind == "xid" and w.xid is not None:
            xid = w.xid
        elif w.kind == "lost":
            xid = codes.XID_GPU_LOST
        else:
            continue
        index, gi = _target(w.gpu)
        out.append(XidEvent(("fault", i, w), index, gi, w.start_s, xid))
    return out


class Injected:
    """XIDs injected by tests, stamped with virtual time and a sequence number."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: list[XidEvent] = []
        self._seq = itertools.count(1)

    def add(self, gpu: str, xid: int, t: float) -> XidEvent:
        index, gi = _target(gpu)
        with self._lock:
            seq = next(self._seq)
            event = XidEvent(("injected", seq), index, gi, t, xid, seq)
            self._events.append(event)
            return event

    def current_seq(self) -> int:
        """The sequence number of the last injection (events after it are newer than now)."""
        with self._lock:
            return len(self._events)

    def events(self) -> list[XidEvent]:
        with self._lock:
            return list(self._events)


def happened(event: XidEvent, t: float) -> bool:
    return event.seq > 0 or event.t <= t


def next_for(event_set: EventSet, events: list[XidEvent], t: float) -> tuple[XidEvent, int, int] | None:
    """The oldest undelivered event due for ``event_set`` at virtual time ``t``: (event, type, handle).

    An XID is sent as nvmlEventTypeXidCriticalError; XID 48 also as nvmlEventTypeDoubleBitEccError.
    """
    best: tuple[tuple[float, int], XidEvent, int, int] | None = None
    for event in events:
        reg = event_set.registrations.get(event.index)
        if reg is None or not happened(event, t):
            continue
        handle, mask, reg_t, reg_seq = reg
        newer = event.seq > reg_seq if event.seq else event.t >= reg_t
        if not newer:
            continue
        kinds = [codes.EVENT_XID] + ([codes.EVENT_DOUBLE_BIT_ECC] if event.xid == codes.XID_DBE else [])
        for kind in kinds:
            if not mask & kind or (event.key, kind) in event_set.delivered:
                continue
            order = (event.t, event.seq)
            if best is None or order < best[0]:
                best = (order, event, kind, handle)
    if best is None:
        return None
    _, event, kind, handle = best
    event_set.delivered.add((event.key, kind))
    return event, kind, handle


@dataclass(frozen=True, slots=True)
class EccState:
    """What past XIDs left on one GPU."""

    dbe_volatile: int = 0
    remapped_correctable: int = 0
    remap_pending: bool = False
    remap_failure: bool = False


def ecc_state(index: int, events: list[XidEvent], t: float, last_reset_t: float | None) -> EccState:
    """ECC / row-remap state of GPU ``index`` at virtual time ``t`` (volatile counts since last reset)."""
    dbe = remapped = 0
    pending = failure = False
    for e in events:
        if e.index != index or not happened(e, t):
            continue
        since_reset = last_reset_t is None or e.t >= last_reset_t
        if e.xid == codes.XID_DBE and since_reset:
            dbe += 1
        elif e.xid == codes.XID_ROW_REMAP:
            remapped += 1
            pending = pending or since_reset
        elif e.xid == codes.XID_ROW_REMAP_FAILURE:
            failure = True
    return EccState(dbe, remapped, pending, failure)
