"""The collection loop: every device sampled on a fixed schedule, one immutable snapshot published per cycle.

The promises it keeps per device are in the package docstring (agent/collector/__init__.py).
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import dataclasses
import functools
import logging
import threading
import time
from typing import Callable, Deque, Sequence

from agent.backends.base import Backend, DeviceLostError
from agent.collector.counters import accumulate_counters
from agent.collector.holders import MAX_HOLDERS, HolderLedger, with_holder_verdicts
from agent.collector.mig_energy import MigEnergy
from agent.collector.pool import MAX_WORKERS, Backoff, WorkerPool
from agent.model import (
    CollectorHealth,
    DeviceCounters,
    DeviceInfo,
    DeviceState,
    GpuSample,
    NodeSnapshot,
    Verdict,
    XidCount,
)
from agent.model.bounds import Rejection, RejectionTally, bound_records, bound_sample, energy_since
from agent.model.bounds import energy_step_bound_for, energy_step_rejection
from agent.model.counter_source import MIG_SHARE
from agent.model.redact import hide

log = logging.getLogger("roofwatch.collector")

SnapshotListener = Callable[[NodeSnapshot], None]
Analyzer = Callable[[NodeSnapshot], Sequence[Verdict]]
"""Turns a fresh snapshot into verdicts (the classifier); its result is published with the snapshot."""


MAX_DEVICES = 128
"""Default bound on devices (setting ``max_devices``): a node has at most 16 GPUs x 7 MIG instances."""
HOLDER_WINDOW_S = 20.0
"""The least time a holder must hold memory with no SM time to be ``idle_held`` for itself: the
classifier's default window (a GPU's own verdict window, when longer, is used instead)."""
LOG_EACH = 8
"""Devices going down (or back up) in one cycle logged a line each; more make one summary line."""


@dataclasses.dataclass
class _DeviceSlot:
    """Mutable per-device bookkeeping, private to the collector thread."""

    info: DeviceInfo
    up: bool = False
    sample: GpuSample | None = None
    last_success_ts: float | None = None
    error: str | None = "not sampled yet"
    consecutive_failures: int = 0
    sample_errors_total: int = 0
    next_attempt_mono: float = 0.0
    in_flight: cf.Future[GpuSample] | None = None
    counters: DeviceCounters = dataclasses.field(default_factory=DeviceCounters)
    history: Deque[GpuSample] = dataclasses.field(default_factory=collections.deque)
    energy_since: float | None = None
    """From when the energy counter's next step can have accrued (agent.model.bounds.energy_since)."""
    xids_refused: tuple[XidCount, ...] = ()
    counter_sources: dict[str, str] = dataclasses.field(default_factory=dict)
    """Which source gave each field of ``sample``, as the backend names it (agent.model.counter_source)."""
    holders: HolderLedger = dataclasses.field(default_factory=HolderLedger)
    """Each holder's share of the device when it is shared (agent.collector.holders)."""

    def state(self, xid_errors: tuple[XidCount, ...] = ()) -> DeviceState:
        return DeviceState(info=self.info, up=self.up, sample=self.sample, last_success_ts=self.last_success_ts,
                           error=self.error, consecutive_failures=self.consecutive_failures,
                           sample_errors_total=self.sample_errors_total, counters=self.counters, xid_errors=xid_errors,
                           counter_sources=self.counter_sources)


class Collector:
    """Samples a backend on its own schedule and publishes a :class:`NodeSnapshot` per cycle."""

    def __init__(
        self,
        backend: Backend,
        *,
        node: str,
        interval_s: float = 1.0,
        sample_timeout_s: float | None = None,
        history_len: int = 600,
        expected_devices: int | None = None,
        backoff: Backoff | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        analyzer: Analyzer | None = None,
        max_devices: int = MAX_DEVICES,
        max_workers: int = MAX_WORKERS,
        max_holders: int = MAX_HOLDERS,
    ) -> None:
        self.backend = backend
        self.node = node
        self.interval_s = interval_s
        self.sample_timeout_s = sample_timeout_s if sample_timeout_s is not None else max(0.05, 0.8 * interval_s)
        self.history_len = history_len
        self.backoff = backoff or Backoff(initial_s=interval_s)
        self._clock = clock
        self._monotonic = monotonic
        self._listeners: list[SnapshotListener] = []
        self._analyzer = analyzer
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._cycles = 0
        self._sequence = 0
        self._rejected = RejectionTally()

        devices: Sequence[DeviceInfo] = backend.discover()
        self.refused_devices = tuple(d.gpu for d in devices[max_devices:])
        if self.refused_devices:
            log.warning("backend %s lists %d devices, more than max_devices (%d): sampling the first, refusing %s",
                        backend.name, len(devices), max_devices, _first_names([(g, 0) for g in self.refused_devices]))
        self._slots: dict[str, _DeviceSlot] = {
            d.gpu: _DeviceSlot(info=d, history=collections.deque(maxlen=history_len), holders=HolderLedger(max_holders))
            for d in devices[:max_devices]
        }
        self.expected_devices = expected_devices if expected_devices is not None else len(self._slots)
        self._mig = MigEnergy.of(list(self._slots), getattr(backend, "mig_parent", None))
        # A device never has two calls in flight, so a hung call holds one worker, and the pool's
        # threads stay bounded by max_workers even when every device hangs.
        self._workers = WorkerPool(max(1, min(max_workers, len(self._slots))), "roofwatch-sample")
        self._snapshot = self._build_snapshot(self._clock(), CollectorHealth(backend=backend.name, interval_s=interval_s))

    # -- reading -----------------------------------------------------------------------------

    @property
    def snapshot(self) -> NodeSnapshot:
        """The last published snapshot (an atomic reference read; never blocks on a GPU)."""
        return self._snapshot

    @property
    def devices(self) -> list[DeviceInfo]:
        return [slot.info for slot in self._slots.values()]

    def history(self, gpu: str) -> tuple[GpuSample, ...]:
        """Recent good samples of one device, oldest first (bounded by ``history_len``)."""
        slot = self._slots.get(gpu)
        return tuple(slot.history) if slot else ()

    def prime_holders(self, samples: Sequence[GpuSample]) -> None:
        """Play samples from before the start (the virtual demo's head start) into the holders' ledgers, so a
        holder idle since before the start is ``idle_held`` from the first scrape; no energy is counted."""
        for sample in samples:
            slot = self._slots.get(sample.gpu)
            if slot is not None:
                slot.holders.advance(sample, None)

    def add_listener(self, listener: SnapshotListener) -> None:
        """Call ``listener(snapshot)`` after every cycle, on the collector thread."""
        self._listeners.append(listener)

    # -- running -----------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="roofwatch-collector", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        """Stop the loop and release the backend; hung device calls are abandoned, not awaited."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self._workers.stop()
        try:
            self.backend.close()
        except Exception:  # noqa: BLE001 - shutdown must not fail on a broken driver
            log.warning("backend close failed", exc_info=True)

    def wait_for_cycles(self, count: int, timeout: float) -> bool:
        """Block until ``count`` cycles have completed (for tests and one-shot commands)."""
        deadline = self._monotonic() + timeout
        while self._cycles < count:
            if self._monotonic() > deadline or self._stop.wait(0.01):
                return self._cycles >= count
        return True

    def _run(self) -> None:
        next_tick = self._monotonic()
        while not self._stop.is_set():
            try:
                self.collect_once()
            except Exception:  # noqa: BLE001 - the loop must survive anything a cycle throws
                log.exception("collection cycle failed")
            next_tick += self.interval_s
            now = self._monotonic()
            if next_tick < now:  # fell behind (slow cycle, suspended host): skip missed ticks
                next_tick = now + self.interval_s - ((now - next_tick) % self.interval_s)
            self._stop.wait(max(0.0, next_tick - now))

    def collect_once(self) -> NodeSnapshot:
        """Run one cycle synchronously and publish its snapshot."""
        started = self._monotonic()
        now = self._clock()
        submitted: dict[cf.Future[GpuSample], _DeviceSlot] = {}
        fresh: list[_DeviceSlot] = []
        went_down: list[tuple[str, str]] = []
        came_up: list[tuple[str, int]] = []
        for slot in self._slots.values():
            if slot.in_flight is not None:
                if not slot.in_flight.done():
                    continue  # still hung from an earlier cycle: stays down, no second call
                slot.in_flight = None
            if started < slot.next_attempt_mono:
                continue
            future = self._workers.submit(functools.partial(self.backend.sample, slot.info.gpu, now))
            slot.in_flight = future
            submitted[future] = slot

        done = cf.wait(submitted, timeout=self.sample_timeout_s).done if submitted else set()
        for future, slot in submitted.items():  # in device order, so the log names devices in order
            if future in done:
                slot.in_flight = None
                error = future.exception()
                if error is None:
                    self._record_success(slot, future.result(), came_up)
                    fresh.append(slot)
                else:
                    self._record_failure(slot, error, started, went_down)
                continue
            if future.running() or future.done():
                error = TimeoutError(f"no answer within {self.sample_timeout_s:.2f}s")
            else:  # still queued behind busy (hung) workers: it stays queued, one call per device at most
                error = TimeoutError(f"not started within {self.sample_timeout_s:.2f}s: all "
                                     f"{self._workers.threads} sampling workers busy")
            self._record_failure(slot, error, started, went_down)
        _log_changes(went_down, came_up)
        if self._mig.instances:
            self._split_mig_energy(fresh)

        self._cycles += 1
        duration = self._monotonic() - started
        health = CollectorHealth(backend=self.backend.name, cycles_total=self._cycles, last_cycle_duration_s=duration,
                                 last_cycle_success=all(slot.up for slot in self._slots.values()) and bool(self._slots),
                                 last_cycle_ts=now, interval_s=self.interval_s)
        snapshot = self._build_snapshot(now, health)
        if self._analyzer is not None:
            try:
                snapshot = dataclasses.replace(snapshot, verdicts=tuple(self._analyzer(snapshot)))
            except Exception:  # noqa: BLE001 - a classifier bug must not stop the raw metrics
                log.exception("classification failed")
                snapshot = dataclasses.replace(snapshot, verdicts=self._snapshot.verdicts)
        ledgers = {gpu: slot.holders for gpu, slot in self._slots.items()}
        snapshot = dataclasses.replace(snapshot, devices=with_holder_verdicts(
            snapshot.devices, ledgers, snapshot.verdicts, HOLDER_WINDOW_S))
        self._snapshot = snapshot
        for listener in self._listeners:
            try:
                listener(snapshot)
            except Exception:  # noqa: BLE001 - a broken sink must not stop collection
                log.exception("snapshot listener failed")
        return snapshot

    # -- bookkeeping -------------------------------------------------------------------------

    def _record_success(self, slot: _DeviceSlot, sample: GpuSample, came_up: list[tuple[str, int]]) -> None:
        if not slot.up and slot.consecutive_failures:
            came_up.append((slot.info.gpu, slot.consecutive_failures))
        if not slot.up:  # a device the backend could not identify at start (lost then) has an identity now
            current = getattr(self.backend, "device_info", None)
            if current is not None:
                slot.info = current(slot.info.gpu)
        sample, rejected = bound_sample(sample, slot.info.spec)  # before anything reads it (agent.model.bounds)
        for rejection in rejected:
            self._refused(slot.info.gpu, rejection.field.split(".")[0], rejection, sample.ts)
        energy = energy_step_bound_for(sample, slot.energy_since, slot.info.spec)
        counters = accumulate_counters(slot.counters, slot.sample, sample, energy_bound=energy)
        if counters.energy_steps_refused > slot.counters.energy_steps_refused:
            self._refused(slot.info.gpu, "energy_j", energy_step_rejection(slot.sample, sample, energy), sample.ts)
        slot.energy_since = energy_since(slot.sample, sample, slot.energy_since)
        step = (counters.energy_j - (slot.counters.energy_j or 0.0)) if counters.energy_j is not None else None
        if slot.info.gpu not in self._mig.instances:  # a MIG instance's holders wait for its share of its board
            slot.holders.advance(sample, step)
        slot.counters = counters
        slot.sample = sample
        slot.counter_sources = self._counter_sources(slot.info.gpu)
        slot.history.append(sample)
        slot.up = True
        slot.error = None
        slot.consecutive_failures = 0
        slot.last_success_ts = sample.ts
        slot.next_attempt_mono = 0.0

    def _split_mig_energy(self, fresh: list[_DeviceSlot]) -> None:
        """Each MIG instance read this cycle gets its estimated share of its board's energy step as its energy
        total (agent.collector.mig_energy), marked an estimate in its counter sources; the holders of a shared
        instance then split that share as a whole GPU's holders split its counter's step."""
        read = [slot for slot in fresh if slot.sample is not None and slot.info.gpu in self._mig.instances]
        cycle = self._mig.advance([(slot.info, slot.sample) for slot in read])
        for slot in read:
            total_j = cycle.totals_j.get(slot.info.gpu)
            step = total_j - (slot.counters.energy_j or 0.0) if total_j is not None else None
            if total_j is not None:
                slot.counters = dataclasses.replace(slot.counters, energy_j=total_j)
                slot.counter_sources = {**slot.counter_sources, "energy_j": MIG_SHARE}
            assert slot.sample is not None
            slot.holders.advance(slot.sample, step)  # the holders of a shared instance split its share, as a GPU's
        for parent, rejection, ts in cycle.refused:
            self._refused(parent, "parent_energy_j", rejection, ts)

    def _counter_sources(self, gpu: str) -> dict[str, str]:
        """Which source gave each field of the GPU's latest sample, where the backend says (a join does); an extra
        that never costs the sample: {} without one or when asking fails."""
        call = getattr(self.backend, "counter_sources", None)
        try:
            return dict(call(gpu)) if call is not None else {}
        except Exception:  # noqa: BLE001 - which source is an extra; the vendor library's own stands in
            log.debug("counter sources of GPU %s unreadable", gpu, exc_info=True)
            return {}

    def _refused(self, gpu: str, field: str, rejection: Rejection, ts: float) -> None:
        """Count a dropped reading under the source that gave ``field``; log the first of an episode."""
        try:
            source = getattr(self.backend, "counter_sources", lambda _: {})(gpu).get(field) or self.backend.name
        except Exception:  # noqa: BLE001 - which source is an extra; the backend's name stands in
            source = self.backend.name
        if self._rejected.note(source, gpu, rejection, ts):
            log.warning("reading outside its physical bounds dropped (unknown, not 0); logged once while it lasts",
                        extra={"source": source, "gpu": gpu, "field": rejection.field,
                               "value": f"{rejection.value:.6g}", "bound": rejection.bound})

    def _record_failure(self, slot: _DeviceSlot, error: BaseException, started: float,
                        went_down: list[tuple[str, str]]) -> None:
        kind = "lost" if isinstance(error, DeviceLostError) else type(error).__name__
        message = hide(f"{kind}: {error}")  # shown in /api/v1/snapshot: no credential a source quoted back
        if slot.up or not slot.consecutive_failures:  # a change of state (or the first try failing), not a new text
            went_down.append((slot.info.gpu, message))
        else:
            log.debug("device still down", extra={"gpu": slot.info.gpu, "error": message})
        slot.consecutive_failures += 1
        slot.sample_errors_total += 1
        slot.up = False
        slot.error = message
        slot.next_attempt_mono = started + self.backoff.delay(slot.consecutive_failures)

    def _extra(self, method: str, *args: object) -> tuple:
        """``backend.<method>(*args)`` as a tuple, () where the backend has none or it fails: device events (XIDs),
        NIC port totals, side sources' states; read from memory, and extras that must never cost the snapshot."""
        call = getattr(self.backend, method, None)
        try:
            return tuple(call(*args)) if call is not None else ()
        except Exception:  # noqa: BLE001 - an extra; never lose the snapshot over it
            log.warning("reading %s failed", method.replace("_", " "), exc_info=True)
            return ()

    def _events_of(self, slot: _DeviceSlot, now: float) -> tuple[XidCount, ...]:
        """The device's XID counts within the bounds; a refused entry is counted once, when it is new."""
        kept, dropped = [], []
        for entry in self._extra("device_events", slot.info.gpu):
            ok, rejected = bound_records((entry,), "xid_errors")
            (kept if ok else dropped).append(entry)
            if not ok and entry not in slot.xids_refused:
                self._refused(slot.info.gpu, "xid_errors", rejected[0], now)
        slot.xids_refused = tuple(dropped)
        return tuple(kept)

    def _build_snapshot(self, now: float, health: CollectorHealth) -> NodeSnapshot:
        self._sequence += 1
        states = tuple(slot.state(self._events_of(slot, now)) for slot in self._slots.values())
        host = next((s.sample.host for s in states if s.sample is not None and s.sample.host), None)
        return NodeSnapshot(nics=self._extra("nic_ports"), ts=now, node=self.node, devices=states, health=health,
                            expected_devices=self.expected_devices, host=host, sequence=self._sequence,
                            sources=self._extra("source_states", now), rejected=self._rejected.entries(),
                            mig_parents=self._mig.parents())


def _log_changes(went_down: list[tuple[str, str]], came_up: list[tuple[str, int]]) -> None:
    """A line per device that went down or came back this cycle; past :data:`LOG_EACH`, one line in
    all with the count, the first devices and the commonest reasons (an exporter with 128 GPUs that
    goes away is one event, not 128 lines)."""
    if len(went_down) <= LOG_EACH:
        for gpu, message in went_down:
            log.warning("device down", extra={"gpu": gpu, "error": message})
    else:
        reasons = collections.Counter(message for _, message in went_down).most_common(3)
        log.warning("devices down", extra={"count": len(went_down), "gpus": _first_names(went_down),
                                           "errors": "; ".join(f"{n} x {m[:200]}" for m, n in reasons)})
    if len(came_up) <= LOG_EACH:
        for gpu, failures in came_up:
            log.info("device back up", extra={"gpu": gpu, "after_failures": failures})
    else:
        log.info("devices back up", extra={"count": len(came_up), "gpus": _first_names(came_up)})


def _first_names(changes: Sequence[tuple[str, object]], most: int = 8) -> str:
    names = ", ".join(gpu for gpu, _ in changes[:most])
    return names + (f" and {len(changes) - most} more" if len(changes) > most else "")
