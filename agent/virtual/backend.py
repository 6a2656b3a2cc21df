"""The virtual backend: one node of a simulated scenario, behind the real :class:`Backend` protocol.

It lives with the simulated fleet, below the backends that run over it (docs/architecture.md,
layers): the faithful fakes (agent.virtual.fake_nvml, fake_amdsmi, fake_dcgm) play this node, and
the vendor backends over those fakes (``nvml-virtual``, ``amd-virtual``) and the registry import it
from here. ``agent.backends.virtual`` is the name it is opened by as ``--backend virtual``.

It maps wall-clock time onto the engine's virtual time (``now - start_time``) and keeps, per
GPU, the time of its previous call, so each sample covers the span since the last one exactly
as NVML GPM and the cumulative counters do on real hardware.

It also fails on purpose. Scenario ``faults`` (and :meth:`VirtualBackend.inject_fault` in
tests) make ``sample`` raise :class:`DeviceError`, raise :class:`DeviceLostError`, or hang until
``hang_s`` passes or :meth:`close` is called, so the collector's isolation, back-off and
recovery paths can be exercised without a broken GPU.

The GPUs of a scenario's serving jobs take their workload reports from an attached source
(:meth:`VirtualBackend.attach_workloads`): the inference scraper of the node's fake servers
(agent.backends.virtual_serving), as a real node takes them from its scraper.

A GPU the scenario puts in MIG mode is discovered as its instances (``"0/1"``, ``"0/2"``), each
sampled on its own. A fault on the whole GPU (``0``) takes all its instances down with it; a
fault on ``"0/1"`` only that instance.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Sequence

from agent.backends.base import BackendUnavailable, DeviceError, DeviceLostError
from agent.model import DeviceInfo, GpuSample, WorkloadReport
from agent.model.specs import spec_by_key
from agent.virtual.devices import device_uuid
from agent.virtual.engine import VirtualEngine
from agent.virtual.nodes import FaultKind
from agent.virtual.scenario import Scenario, resolve_scenario

if TYPE_CHECKING:
    from agent.context.sources import WorkloadSource


@dataclass(frozen=True, slots=True)
class FaultWindow:
    """Reading ``gpu`` fails with ``kind`` during virtual time [start_s, start_s + duration_s).

    ``gpu`` is a GPU id: ``"3"`` covers GPU 3 and, if it is in MIG mode, all its instances;
    ``"3/1"`` covers one instance. Kind ``xid`` is not a failure but an instant at ``start_s``
    (XID ``xid``): sampling ignores it; the fake NVML driver delivers it as an event.
    """

    gpu: str
    kind: FaultKind
    start_s: float
    duration_s: float
    hang_s: float = 30.0
    source: str = "scenario"
    xid: int | None = None

    def active(self, t: float) -> bool:
        return self.start_s <= t < self.start_s + self.duration_s

    def covers(self, gpu: str) -> bool:
        return _covers(self.gpu, gpu)


def _covers(target: str, gpu: str) -> bool:
    """A fault on ``target`` hits device ``gpu``: the same id, or an instance of that GPU."""
    return gpu == target or gpu.startswith(target + "/")


class _GpuSlot:
    """Per-GPU mutable state: the previous call's virtual time, guarded by its own lock."""

    __slots__ = ("lock", "last_t")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.last_t: float | None = None


class VirtualBackend:
    """Samples one node of a scenario, mapping wall-clock time onto virtual time."""

    name = "virtual"

    def __init__(self, engine_or_scenario: VirtualEngine | Scenario | str | Path, *, node: str | None = None,
                 start_time: float | None = None, clock: Callable[[], float] = time.time,
                 interval_s: float = 1.0) -> None:
        """``engine_or_scenario``: an engine, a scenario, or a built-in name / YAML path.

        ``start_time`` is the wall-clock time of virtual time 0 (default: now); ``interval_s``
        is the span the very first sample of each GPU covers (the collector's nominal interval).
        """
        self.engine = _as_engine(engine_or_scenario)
        nodes = self.engine.nodes
        if node is None:
            node = nodes[0]
        elif node not in nodes:
            raise BackendUnavailable(f"virtual scenario {self.engine.scenario.name!r} has no node {node!r}; "
                                     f"nodes: {', '.join(nodes)}")
        self.node = node
        self.clock: Callable[[], float] = clock
        """The wall clock (``time.time`` unless a test passes its own); ``now`` for this backend."""
        self.start_time = clock() if start_time is None else start_time
        self.interval_s = interval_s
        self._devices = self.engine.devices(node)
        self._slots = {d.gpu: _GpuSlot() for d in self._devices}
        mig = self.engine.scenario.node(node).mig
        self._boards = {d.gpu: d.gpu.split("/")[0] for d in self._devices
                        if "/" in d.gpu and int(d.gpu.split("/")[0]) in mig}
        """MIG instance -> its GPU's index: their samples carry the board's energy counter (``parent_energy_j``)."""
        self._faults: list[FaultWindow] = [
            FaultWindow(str(f.gpu), f.kind, f.start_s, f.duration_s, f.hang_s, xid=f.xid)
            for f in self.engine.faults(node)]
        self._faults_lock = threading.Lock()
        self._closed = threading.Event()
        self._hung = 0
        self._hung_lock = threading.Lock()
        self._workloads: WorkloadSource | None = None
        self._scraped: frozenset[str] = frozenset()
        self._scraped_since: float | None = None
        self._closers: list[Callable[[], None]] = []

    # ------------------------------------------------------------------ Backend protocol

    def discover(self) -> Sequence[DeviceInfo]:
        if not self._devices:
            raise BackendUnavailable(f"virtual node {self.node!r} has no GPUs")
        return list(self._devices)

    def sample(self, gpu: str, now: float) -> GpuSample:
        slot = self._slots.get(gpu)
        if slot is None:
            raise DeviceError(f"virtual node {self.node!r} has no GPU {gpu!r}")
        if self._closed.is_set():
            raise DeviceError("virtual backend is closed")
        t1 = now - self.start_time
        fault = self._fault_at(gpu, t1)
        if fault is not None:
            self._fail(slot, gpu, fault)
        with slot.lock:
            t0 = slot.last_t if slot.last_t is not None and slot.last_t < t1 else t1 - self.interval_s
            sample = self.engine.sample(self.node, gpu, t0, t1, ts=now)
            slot.last_t = t1
        if gpu in self._boards:  # as NVML: no energy of its own, its board's counter (agent.collector.mig_energy)
            board_j = self.engine.board_energy_j(self.node, self._boards[gpu], t1)
            sample = dataclasses.replace(sample, parent_energy_j=board_j)
        if self._workloads is not None and gpu in self._scraped:
            pids = [p.pid for p in sample.processes or ()]
            report = self._workloads.report_for(gpu=gpu, uuid=sample.uuid, pids=pids, now=now)
            sample = dataclasses.replace(sample, workload=report)
        return sample

    def mig_parent(self, gpu: str) -> tuple[str, str] | None:
        """(GPU index, GPU UUID) of a MIG instance's board, None for a whole GPU (agent.collector.mig_energy)."""
        index = self._boards.get(gpu)
        if index is None:
            return None
        model = self.engine.scenario.node(self.node).model
        return index, device_uuid(self.engine.scenario.seed, self.node, int(index), spec_by_key(model).vendor)

    def attach_workloads(self, source: WorkloadSource, gpus: Iterable[str],
                         closers: Sequence[Callable[[], None]] = (), scraped_since: float | None = None) -> None:
        """Take the workload reports of ``gpus`` from ``source`` (the inference scraper of the scenario's fake
        servers, agent.backends.virtual_serving) instead of the simulation's own, as a real node takes them
        from its scraper; ``closers`` run on :meth:`close`."""
        self._workloads = source
        self._scraped = frozenset(gpus)
        self._scraped_since = scraped_since
        self._closers.extend(closers)

    def warm_samples(self, now: float, seconds: float, interval_s: float = 1.0) -> list[GpuSample]:
        """Samples of the ``seconds`` before ``now``, as if the agent had been watching already.

        Lets the demo come up with verdicts instead of a window's worth of ``unknown``. Drawn
        from a fresh engine, so the live GPUs' energy counters and temperatures are untouched.
        """
        engine = VirtualEngine(self.engine.scenario)
        t_end = now - self.start_time
        steps = int(seconds // interval_s)
        out = []
        for k in range(steps, 0, -1):
            t1 = t_end - (k - 1) * interval_s
            t0 = t1 - interval_s
            if t0 < 0.0:
                continue
            for d in self._devices:
                sample = engine.sample(self.node, d.gpu, t0, t1, ts=self.start_time + t1)
                if d.gpu in self._scraped:  # scraped reports only, from when the first rate was scraped
                    sample = dataclasses.replace(sample, workload=self._scraped_report(sample))
                out.append(sample)
        return out

    def _scraped_report(self, sample: GpuSample) -> WorkloadReport | None:
        """What the scraper held at ``sample.ts``: nothing before ``scraped_since`` (the scrape that gave the first
        rate: agent.backends.virtual_serving_warm), its report after it, so the primed classifier sees the servers
        the first scrape of ``/metrics`` shows."""
        if self._workloads is None or self._scraped_since is None or sample.ts < self._scraped_since:
            return None
        pids = [p.pid for p in sample.processes or ()]
        return self._workloads.report_for(gpu=sample.gpu, uuid=sample.uuid, pids=pids, now=sample.ts)

    def close(self) -> None:
        """Release any call hanging in a fault window, and stop attached sources; later calls fail."""
        self._closed.set()
        closers, self._closers = self._closers, []
        for close in closers:
            close()

    # ------------------------------------------------------------------ faults

    def inject_fault(self, gpu: int | str, kind: FaultKind, duration_s: float, *, hang_s: float = 30.0,
                     start_s: float | None = None) -> FaultWindow:
        """Make ``gpu`` fail for ``duration_s`` virtual seconds from ``start_s`` (default: now).

        ``gpu`` is an index or id (``3``, ``"3"``), which in MIG mode covers all the GPU's
        instances, or one instance (``"3/1"``).
        """
        gpu_id = str(gpu).strip()
        if not any(_covers(gpu_id, g) for g in self._slots):
            raise ValueError(f"virtual node {self.node!r} has no GPU {gpu!r}")
        if kind not in ("error", "lost", "hang"):
            raise ValueError(f"unknown fault kind {kind!r}; expected error, lost or hang")
        start = self.clock() - self.start_time if start_s is None else start_s
        window = FaultWindow(gpu_id, kind, start, duration_s, hang_s, source="injected")
        with self._faults_lock:
            self._faults.append(window)
        return window

    def clear_faults(self) -> None:
        with self._faults_lock:
            self._faults.clear()

    @property
    def hung_calls(self) -> int:
        """Calls currently blocked in a ``hang`` fault (lets tests wait for a hang to begin)."""
        with self._hung_lock:
            return self._hung

    @property
    def _clock(self) -> Callable[[], float]:  # the old private name, kept for callers that use it
        return self.clock

    def fault_at(self, gpu: str, now: float) -> FaultWindow | None:
        """The failure window (error, lost, hang) covering device ``gpu`` at wall-clock ``now``, if any.

        ``gpu`` is a device id (``"3"``, ``"3/1"``); xid faults are instants, never returned.
        """
        return self._fault_at(gpu, now - self.start_time)

    def fault_windows(self) -> list[FaultWindow]:
        """Every fault of this node (scenario and injected, xid included), in the order added."""
        with self._faults_lock:
            return list(self._faults)

    def _fault_at(self, gpu: str, t: float) -> FaultWindow | None:
        with self._faults_lock:
            for window in self._faults:
                if window.kind != "xid" and window.covers(gpu) and window.active(t):
                    return window
        return None

    def _fail(self, slot: _GpuSlot, gpu: str, fault: FaultWindow) -> None:
        window = f"{fault.start_s:.1f}-{fault.start_s + fault.duration_s:.1f}s"
        where = f"GPU {gpu} on {self.node} ({fault.source} {fault.kind} fault, virtual time {window})"
        if fault.kind == "lost":
            with slot.lock:
                slot.last_t = None  # a re-acquired device starts a fresh sample pair
            raise DeviceLostError(f"virtual fault: {where} fell off the bus")
        if fault.kind == "hang":
            with self._hung_lock:
                self._hung += 1
            try:
                released = self._closed.wait(fault.hang_s)
            finally:
                with self._hung_lock:
                    self._hung -= 1
            reason = "released by close()" if released else f"gave up after {fault.hang_s:g}s"
            raise DeviceError(f"virtual fault: {where} hung; {reason}")
        raise DeviceError(f"virtual fault: {where} read failed")


def _as_engine(source: VirtualEngine | Scenario | str | Path) -> VirtualEngine:
    if isinstance(source, VirtualEngine):
        return source
    if isinstance(source, Scenario):
        return VirtualEngine(source)
    return VirtualEngine(resolve_scenario(source))
