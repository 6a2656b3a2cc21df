"""Event C functions: event sets, registration, and nvmlEventSetWait blocking in real time.

nvmlEventSetWait blocks up to ``timeout_ms`` of wall-clock time. Virtual time may be a test's
hand-moved clock, so the wait polls it every few milliseconds and is also woken at once by
:meth:`FakeNvmlLibrary.inject_xid`, the last nvmlShutdown and :meth:`FakeNvmlLibrary.close`.
"""

from __future__ import annotations

import time
from typing import Any

from agent.virtual.fake_nvml import codes
from agent.virtual.fake_nvml.ctypes_io import Fail, pointer_value, set_value, target, value, write_pointer
from agent.virtual.fake_nvml.ctypes_io import write_pointer_field
from agent.virtual.fake_nvml.device import NvmlDevice
from agent.virtual.fake_nvml.events import EventSet, next_for
from agent.virtual.fake_nvml.symbols import c_function

POLL_S = 0.01
"""How often a waiting call looks at virtual time (a hand-moved test clock cannot notify)."""


class EventFunctions:
    """Mixin of :class:`~agent.virtual.fake_nvml.library.FakeNvmlLibrary`: uses its state and helpers."""

    def _event_set(self, arg: Any) -> EventSet:
        event_set = self._event_sets.get(pointer_value(arg))
        if event_set is None:
            raise Fail(codes.ERROR_INVALID_ARGUMENT)
        return event_set

    @c_function("nvmlEventSetCreate")
    def _c_event_set_create(self, out: Any) -> None:
        if target(out) is None:
            raise Fail(codes.ERROR_INVALID_ARGUMENT)
        address = self._new_address()
        with self._lock:
            self._event_sets[address] = EventSet(address)
        write_pointer(out, address)

    @c_function("nvmlEventSetFree")
    def _c_event_set_free(self, event_set: Any) -> None:
        with self._wake:
            if self._event_sets.pop(pointer_value(event_set), None) is None:
                raise Fail(codes.ERROR_INVALID_ARGUMENT)
            self._wake.notify_all()

    @c_function("nvmlDeviceGetSupportedEventTypes", handle=True)
    def _c_supported_event_types(self, dev: NvmlDevice, out: Any) -> None:
        if dev.is_mig:
            raise Fail(codes.ERROR_NOT_SUPPORTED)
        set_value(out, codes.SUPPORTED_EVENTS)

    @c_function("nvmlDeviceRegisterEvents", handle=True)
    def _c_register_events(self, dev: NvmlDevice, event_types: Any, event_set: Any) -> None:
        es = self._event_set(event_set)
        mask = value(event_types)
        if dev.is_mig or mask & ~codes.SUPPORTED_EVENTS:
            raise Fail(codes.ERROR_NOT_SUPPORTED)
        handle = self._handle_address(dev)
        vt, seq = self._vt(), self._injected.current_seq()
        with self._lock:
            old = es.registrations.get(dev.index)
            if old is not None:
                es.registrations[dev.index] = (old[0], old[1] | mask, old[2], old[3])
            else:
                es.registrations[dev.index] = (handle, mask, vt, seq)

    @c_function("nvmlEventSetWait_v2")
    def _c_event_set_wait(self, event_set: Any, out: Any, timeout_ms: Any) -> None:
        data = target(out)
        if data is None:
            raise Fail(codes.ERROR_INVALID_ARGUMENT)
        address = pointer_value(event_set)
        deadline = time.monotonic() + value(timeout_ms) / 1000.0
        while True:
            with self._wake:
                es = self._event_sets.get(address)
                if es is None:
                    raise Fail(codes.ERROR_INVALID_ARGUMENT)
                if self._closed.is_set() or self._refcount == 0:
                    raise Fail(codes.ERROR_UNINITIALIZED)
                found = next_for(es, self._xid_events(), self._vt())
                if found is None:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0.0:
                        raise Fail(codes.ERROR_TIMEOUT)
                    self._wake.wait(min(remaining, POLL_S))
                    continue
            event, kind, handle = found
            write_pointer_field(data, "device", handle)
            data.eventType = kind
            data.eventData = event.xid if kind == codes.EVENT_XID else 0
            mig = event.gi is not None
            data.gpuInstanceId = event.gi if mig else codes.UINT_MAX
            data.computeInstanceId = codes.UINT_MAX  # events name a GPU instance, never one compute instance
            return
