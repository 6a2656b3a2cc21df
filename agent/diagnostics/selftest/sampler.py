"""Reading the GPU under test through the agent's own backend while a phase runs.

On a real node a background thread calls ``backend.sample`` every interval, exactly as the
collector's worker does, and times each call. With the virtual runner on a hand-driven clock
(``nvml-virtual`` without ``--real-time``) there is no thread: :meth:`Sampler.wait` moves the clock
and takes each sample when it falls due, so a two-minute selftest plays in about a second.

:class:`PhaseReports` is the selftest's workload source: the stream-wait phase reports its steps
through it, and it reaches the sample the way a job's own reports do on a node.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

from agent.backends.base import Backend, DeviceError
from agent.context.sources import HostFacts
from agent.diagnostics.selftest.phases import SELFTEST_JOB, STREAM_WAIT_WORLD
from agent.model import GpuSample, WorkloadReport


@dataclass(frozen=True, slots=True)
class Reading:
    """One sample and what it cost to read (seconds of wall time in ``backend.sample``)."""

    sample: GpuSample
    cost_s: float


class PhaseReports:
    """A :class:`~agent.context.sources.WorkloadSource` holding the running phase's latest report."""

    def __init__(self, gpu: str) -> None:
        self.gpu = gpu
        self._report: WorkloadReport | None = None
        self._lock = threading.Lock()

    def step(self, step: int, step_time_s: float) -> None:
        report = WorkloadReport(job=SELFTEST_JOB, rank=0, world_size=STREAM_WAIT_WORLD, step=step,
                                step_time_s=step_time_s, source="client")
        with self._lock:
            self._report = report

    def clear(self) -> None:
        with self._lock:
            self._report = None

    def report_for(self, *, gpu: str, uuid: str | None, pids: Sequence[int], now: float) -> WorkloadReport | None:
        if gpu != self.gpu:
            return None
        with self._lock:
            return self._report


class ReportingHost:
    """A host source whose workload report is :class:`PhaseReports`' alone, over another's other facts.

    On a real node ``LocalHost`` takes the reports as one of its workload sources, and the
    selftest's process is the only one reporting. The simulated host would add the simulation's
    own reports (step counters of its phase kinds), so they are replaced here by the selftest's,
    which is what a real node would show.
    """

    def __init__(self, reports: PhaseReports, inner: Any = None) -> None:
        self.reports = reports
        self.inner = inner

    def facts(self, gpu: str, pids: Sequence[int], now: float, *, bus_id: str | None = None,
              uuid: str | None = None) -> HostFacts:
        facts = self.inner.facts(gpu, pids, now, bus_id=bus_id, uuid=uuid) if self.inner else HostFacts(processes={})
        report = self.reports.report_for(gpu=gpu, uuid=uuid, pids=pids, now=now)
        return replace(facts, workload=report, dtype=report.dtype if report is not None else None)


class Sampler:
    """Samples one GPU every ``interval_s``: from a thread on the wall clock, or stepped on a manual one."""

    def __init__(self, backend: Backend, gpu: str, interval_s: float, *, clock: Callable[[], float] = time.time,
                 advance: Callable[[float], None] | None = None) -> None:
        self.backend = backend
        self.gpu = gpu
        self.interval_s = interval_s
        self.clock = clock
        self._advance = advance
        self.readings: list[Reading] = []
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._due = 0.0

    @property
    def stepped(self) -> bool:
        return self._advance is not None

    def start(self) -> None:
        self._due = self.clock() + self.interval_s
        if self.stepped:
            return
        self._thread = threading.Thread(target=self._loop, name="selftest-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10.0)

    def now(self) -> float:
        return self.clock()

    def wait(self, seconds: float) -> None:
        """Let ``seconds`` pass; on a manual clock, take every sample that falls due on the way."""
        if seconds <= 0:
            return
        if not self.stepped:
            time.sleep(seconds)
            return
        assert self._advance is not None
        target = self.clock() + seconds
        while self._due <= target:
            self._advance(self._due - self.clock())
            self._read()
            self._due += self.interval_s
        self._advance(target - self.clock())

    def between(self, begin: float, end: float) -> list[Reading]:
        """Readings whose whole interval lies in [begin, end] (a little slack for timer jitter)."""
        slack = 0.02 * self.interval_s
        with self._lock:
            return [r for r in self.readings
                    if r.sample.ts - (r.sample.interval_s or self.interval_s) >= begin - slack and r.sample.ts <= end + slack]

    def _loop(self) -> None:
        while not self._stop.is_set():
            delay = self._due - self.clock()
            if delay > 0 and self._stop.wait(delay):
                return
            self._read()
            self._due += self.interval_s
            if self._due < self.clock():  # fell behind (a slow read): skip ahead, never burst
                self._due = self.clock() + self.interval_s

    def _read(self) -> None:
        started = time.perf_counter()
        try:
            sample = self.backend.sample(self.gpu, self.clock())
        except DeviceError as exc:
            with self._lock:
                self.errors.append(str(exc))
            return
        cost = time.perf_counter() - started
        with self._lock:
            self.readings.append(Reading(sample, cost))


class Window:
    """The :class:`~agent.diagnostics.selftest.runner.PhaseWindow` a runner gets for one phase."""

    def __init__(self, sampler: Sampler, reports: PhaseReports) -> None:
        self.sampler = sampler
        self.reports = reports
        self.began: float | None = None
        self.ended: float | None = None

    def now(self) -> float:
        return self.sampler.now()

    def wait(self, seconds: float) -> None:
        self.sampler.wait(seconds)

    def begin(self) -> None:
        self.began = self.sampler.now()

    def end(self) -> None:
        self.ended = self.sampler.now()
        self.reports.clear()

    def report(self, *, step: int, step_time_s: float) -> None:
        self.reports.step(step, step_time_s)
