"""What a node tells us outside the GPU driver: who the GPU processes are and how the host is doing.

Vendor backends read the GPU; the classifier also needs the host side (process names, the CPU
their data loaders burn, I/O wait) to tell a starved GPU from a slow one. That side comes from
a :class:`HostSource`, so that the same backend code runs on a real node (:class:`LocalHost`,
psutil and /proc) and on the virtual fleet (a source that reads the simulation).

This is deliberately small: full process trees and Kubernetes attribution are separate
collectors; Slurm jobs come from agent.attribution and NIC counters from agent.infiniband.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, Sequence

import psutil

from agent.attribution import process_job_id
from agent.infiniband import PortMonitor
from agent.model import Attribution, Dtype, HostSample, WorkloadReport


@dataclass(frozen=True, slots=True)
class ProcessFacts:
    name: str | None = None
    cpu_cores: float | None = None


@dataclass(frozen=True, slots=True)
class HostFacts:
    """Everything the host adds to one GPU's sample. ``None`` means unknown."""

    processes: dict[int, ProcessFacts]
    host: HostSample | None = None
    net_tx_bytes_per_s: float | None = None
    net_rx_bytes_per_s: float | None = None
    workload: WorkloadReport | None = None
    dtype: Dtype | None = None
    attribution: Attribution | None = None
    """Which job holds the GPU: scheduler knowledge lives on the host side, not in the driver."""


@dataclass(slots=True)
class _Seen:
    """A process's CPU-time baseline and the answer computed from it."""

    proc: psutil.Process
    cpu_s: float
    t: float
    facts: ProcessFacts


class HostSource(Protocol):
    def facts(self, gpu: str, pids: Sequence[int], now: float, *, bus_id: str | None = None,
              uuid: str | None = None) -> HostFacts:
        """Host-side facts for GPU ``gpu`` (PCI ``bus_id``, ``uuid``) whose processes are ``pids``.

        Must be cheap and never raise."""
        ...


class WorkloadSource(Protocol):
    """Where a GPU's workload report comes from: the job's client calls, or an inference server.

    Answers from memory (whatever was received or scraped in the background), so a collection
    cycle never waits on a job or a server.
    """

    def report_for(self, *, gpu: str, uuid: str | None, pids: Sequence[int], now: float) -> WorkloadReport | None:
        """The latest fresh report for GPU ``gpu`` (``uuid``) whose processes are ``pids`` (host PIDs),
        or None; ``now`` is wall-clock time. Must be cheap and never raise."""
        ...


class LocalHost:
    """The real host: process names and CPU from psutil, iowait from /proc/stat, PSI from /proc/pressure,
    network traffic from the InfiniBand/RoCE port nearest each GPU (sysfs).

    CPU per process is the delta of its (and its children's) CPU time since the previous call,
    so the first sighting of a process has no CPU figure yet. Host figures are computed at most
    once per ``min_refresh_s`` and shared by all GPUs of the cycle.
    """

    def __init__(self, proc_root: str | Path = "/proc", min_refresh_s: float = 0.5, *,
                 sysfs_root: str | Path = "/sys") -> None:
        self._proc_root = Path(proc_root)
        self._ports = PortMonitor(sysfs_root, min_refresh_s)
        self._pressure = Path(proc_root) / "pressure" / "io"
        self._min_refresh_s = min_refresh_s
        self._lock = threading.Lock()
        self._procs: dict[int, _Seen] = {}
        self._jobs: dict[int, tuple[str | None, float]] = {}
        """pid -> (job id or None, last asked): read once per process, misses included, since a
        process never changes job and an invisible one (another PID namespace) stays invisible."""
        self._host: HostSample | None = None
        self._host_t = -1e18
        self._cpu_prev: tuple[float, float] | None = None

    def facts(self, gpu: str, pids: Sequence[int], now: float, *, bus_id: str | None = None,
              uuid: str | None = None) -> HostFacts:
        with self._lock:
            processes = {pid: self._process(pid) for pid in pids}
            for gone in set(self._procs) - set(pids):
                if not self._still_wanted(gone):
                    del self._procs[gone]
            host, attribution = self._host_sample(), self._attribution(pids)
        self._ports.refresh()
        port = self._ports.port_for_gpu(bus_id)
        return HostFacts(processes=processes, host=host, attribution=attribution,
                         net_tx_bytes_per_s=port.tx_bytes_per_s if port else None,
                         net_rx_bytes_per_s=port.rx_bytes_per_s if port else None)

    def _attribution(self, pids: Sequence[int]) -> Attribution | None:
        """The job of the GPU's first process that has one (processes of one GPU share a job)."""
        now = time.monotonic()
        found = None
        for pid in pids:
            cached = self._jobs.get(pid)
            job = cached[0] if cached is not None else process_job_id(pid, self._proc_root)
            self._jobs[pid] = (job, now)
            if job is not None and found is None:
                found = job
        for pid in [p for p, (_, t) in self._jobs.items() if now - t > 60.0]:
            del self._jobs[pid]  # not reported by any GPU for a minute: gone (or its PID reused later)
        return Attribution(job_id=found) if found is not None else None

    def _still_wanted(self, pid: int) -> bool:
        # Another GPU may hold the same process; keep its baseline for a little while.
        entry = self._procs.get(pid)
        return entry is not None and time.monotonic() - entry.t < 60.0

    def _process(self, pid: int) -> ProcessFacts:
        now = time.monotonic()
        entry = self._procs.get(pid)
        if entry is not None and now - entry.t < self._min_refresh_s:
            return entry.facts  # asked again within the cycle (a process on several GPUs): same answer
        try:
            proc = entry.proc if entry else psutil.Process(pid)
            with proc.oneshot():
                name = proc.name()
                cpu = _cpu_seconds(proc)
        except (psutil.Error, OSError):
            self._procs.pop(pid, None)
            return ProcessFacts()  # not visible from here (another PID namespace) or already gone
        cores = None
        if entry is not None:
            cores = max(0.0, (cpu - entry.cpu_s) / (now - entry.t))
        facts = ProcessFacts(name=name, cpu_cores=cores)
        self._procs[pid] = _Seen(proc, cpu, now, facts)
        return facts

    def _host_sample(self) -> HostSample | None:
        now = time.monotonic()
        if now - self._host_t < self._min_refresh_s:
            return self._host
        self._host_t = now
        iowait = None
        times = psutil.cpu_times()
        total = sum(times)
        wait = getattr(times, "iowait", None)
        if wait is not None and self._cpu_prev is not None and total > self._cpu_prev[0]:
            iowait = min(1.0, max(0.0, (wait - self._cpu_prev[1]) / (total - self._cpu_prev[0])))
        if wait is not None:
            self._cpu_prev = (total, wait)
        self._host = HostSample(cpu_iowait_ratio=iowait, io_pressure_ratio=read_io_pressure(self._pressure))
        return self._host


def _cpu_seconds(proc: psutil.Process) -> float:
    """CPU seconds of the process and its live children (data-loader workers are children)."""
    t = proc.cpu_times()
    total = t.user + t.system
    for child in proc.children(recursive=True):
        try:
            c = child.cpu_times()
        except (psutil.Error, OSError):
            continue
        total += c.user + c.system
    return total


def read_io_pressure(path: Path) -> float | None:
    """PSI ``some avg10`` of /proc/pressure/io as a ratio; None where the kernel has no PSI."""
    try:
        text = path.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("some "):
            for item in line.split()[1:]:
                key, _, value = item.partition("=")
                if key == "avg10":
                    try:
                        return min(1.0, max(0.0, float(value) / 100.0))
                    except ValueError:
                        return None
    return None
