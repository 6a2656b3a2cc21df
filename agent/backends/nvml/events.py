"""XID and other critical events, waited for in their own thread.

``nvmlEventSetWait`` blocks in the driver until an event arrives or the timeout passes, so it
cannot share the collector's schedule. The watcher keeps, per GPU and XID code, a count and the
time of the latest occurrence; samples carry that as a cumulative table, which the exporter turns
into a counter per code (``increase()`` shows new errors; nothing stays stuck at 1 forever).

The number of distinct codes kept per GPU is capped, so a misbehaving GPU cannot grow the
label set without bound: codes beyond the cap are folded into XID 0 ("other").
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from typing import Any, Callable

from agent.backends.nvml.errors import TIMEOUT, Meaning, code_of, describe, meaning
from agent.model import XidCount

log = logging.getLogger("roofwatch.nvml.events")

XID_EVENT = 0x8
"""nvmlEventTypeXidCriticalError: eventData is the XID number."""
NO_INSTANCE = 0xFFFFFFFF
MAX_CODES_PER_GPU = 32
OTHER_XID = 0


def pointer_value(handle: Any) -> int | None:
    """The address a pynvml handle points to: how an event's ``device`` is matched to a GPU."""
    return ctypes.cast(handle, ctypes.c_void_p).value


class XidWatcher:
    """Registers every physical GPU for XID events and counts what arrives."""

    def __init__(self, nvml: Any, *, wait_ms: int = 500, clock: Callable[[], float] = time.time) -> None:
        self._nvml = nvml
        self._wait_ms = wait_ms
        self._clock = clock
        self._lock = threading.Lock()
        self._counts: dict[str, dict[int, list[float]]] = {}
        self._targets: dict[int, tuple[str, dict[tuple[int, int], str]]] = {}
        """Handle address -> (whole-GPU id, {(GPU instance, compute instance): device id}) for attribution."""
        self._pending: list[tuple[Any, str, dict[tuple[int, int], str]]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.unavailable: str | None = None
        """Why events cannot be watched (None while they can)."""
        self.events_seen = 0

    def watch(self, handle: Any, gpu: str, instances: dict[tuple[int, int], str] | None = None) -> None:
        """Register (or, after a re-acquired handle, re-register) one physical GPU; ``instances`` maps
        its MIG devices' (GPU instance id, compute instance id) to their device ids."""
        with self._lock:
            self._pending.append((handle, gpu, dict(instances or {})))

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="roofwatch-nvml-events", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def counts(self, gpu: str) -> tuple[XidCount, ...]:
        with self._lock:
            table = self._counts.get(gpu)
            if not table:
                return ()
            return tuple(XidCount(xid=code, count=int(c), last_ts=t) for code, (c, t) in sorted(table.items()))

    def registered(self, gpu: str) -> bool:
        """Whether XIDs of physical GPU ``gpu`` are delivered yet. Registration happens on the watcher's
        thread, and NVML (like the fake) never delivers an event raised before it."""
        with self._lock:
            return any(whole == gpu for whole, _ in self._targets.values())

    def record(self, gpu: str, xid: int, ts: float) -> None:
        with self._lock:
            table = self._counts.setdefault(gpu, {})
            if xid not in table and len(table) >= MAX_CODES_PER_GPU:
                xid = OTHER_XID
            entry = table.setdefault(xid, [0, ts])
            entry[0] += 1
            entry[1] = ts
            self.events_seen += 1

    # ------------------------------------------------------------------ thread

    def _register_pending(self, event_set: Any) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        nvml = self._nvml
        for handle, gpu, instances in pending:
            try:
                supported = nvml.nvmlDeviceGetSupportedEventTypes(handle)
                if supported & XID_EVENT:
                    nvml.nvmlDeviceRegisterEvents(handle, XID_EVENT, event_set)
                    with self._lock:
                        self._targets[pointer_value(handle) or 0] = (gpu, instances)
                else:
                    log.info("GPU %s does not report XID events", gpu)
            except nvml.NVMLError as exc:
                log.info("GPU %s: cannot watch XID events (%s)", gpu, describe(exc))

    def _run(self) -> None:
        nvml = self._nvml
        try:
            event_set = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as exc:
            self.unavailable = describe(exc)
            log.info("XID events unavailable: %s", self.unavailable)
            return
        failures = 0
        try:
            while not self._stop.is_set():
                if self._pending:
                    self._register_pending(event_set)
                try:
                    data = nvml.nvmlEventSetWait(event_set, self._wait_ms)
                except nvml.NVMLError as exc:
                    if code_of(exc) == TIMEOUT:
                        failures = 0
                        continue
                    if meaning(exc) is Meaning.ABSENT:
                        self.unavailable = describe(exc)
                        log.info("XID events unavailable: %s", self.unavailable)
                        return
                    failures += 1
                    self._stop.wait(min(30.0, 0.5 * 2 ** min(failures, 6)))  # e.g. GPU lost: back off
                    continue
                failures = 0
                if data.eventType & XID_EVENT:
                    self._attribute(data)
        finally:
            try:
                nvml.nvmlEventSetFree(event_set)
            except nvml.NVMLError:
                pass

    def _attribute(self, data: Any) -> None:
        with self._lock:
            target = self._targets.get(pointer_value(data.device) or 0)
        if target is None:
            return
        gpu, instances = target
        now = self._clock()
        code = int(data.eventData)
        gi, ci = int(data.gpuInstanceId), int(data.computeInstanceId)
        log.warning("XID %d on GPU %s%s", code, gpu, f" (GPU instance {gi})" if gi != NO_INSTANCE else "")
        if not instances:
            self.record(gpu, code, now)
        elif (gi, ci) in instances:
            self.record(instances[(gi, ci)], code, now)
        else:  # a GPU instance's error hits its compute instances; a whole-GPU error every instance
            hit = [device for (g, _), device in instances.items() if g == gi] or list(instances.values())
            for device in hit:
                self.record(device, code, now)
