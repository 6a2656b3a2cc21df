"""The process tree behind each GPU process: who runs it, and how hard its CPU side works.

A GPU with gaps between kernels is starved by something on the host. Which thing shows in the
process tree: data-loader workers are *children* of the training process (PyTorch DataLoader,
JAX/TF input pipelines fork or spawn them), so their CPU is counted apart from the main
process. Workers at their allotted cores mean preprocessing is the bottleneck; a main process
pinned at one core while workers idle means the Python loop cannot launch work fast enough.

"Allotted" is what the process may use: its CPU affinity, capped by its cgroup's ``cpu.max``
quota (cgroup v2), since a container limited to 4 cores saturates at 4, whatever the node has.

Everything here is best effort: a process may exit between the driver listing it and us reading
/proc, or belong to another user (I/O counters then need privileges). Unreadable parts stay
``None``; nothing raises.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Callable

import psutil

COMMAND_MAX_CHARS = 256
"""Longer command lines are cut: they travel in every snapshot and trace line."""


@dataclass(frozen=True, slots=True)
class ProcessFacts:
    """What the host knows about one GPU process. ``None`` means unknown."""

    name: str | None = None
    command: str | None = None
    user: str | None = None
    cpu_cores: float | None = None
    """CPU of the process and all its live descendants, in cores (1.0 = one core busy)."""
    cpu_main_cores: float | None = None
    """CPU of the process itself (all its threads)."""
    cpu_workers_cores: float | None = None
    """CPU of its descendants: data-loader workers, compile workers, tokenizer pools."""
    workers: int | None = None
    """Live descendant processes."""
    cpu_limit_cores: float | None = None
    """Cores the process may use: CPU affinity, capped by its cgroup quota."""
    rss_bytes: int | None = None
    """Resident memory of the process itself (workers share its pages after fork, so they are not added)."""
    io_read_bytes_per_s: float | None = None
    """Storage reads of the process and its workers (bytes that reached the block layer)."""
    io_write_bytes_per_s: float | None = None

    def sample_fields(self) -> dict[str, object]:
        """These facts as :class:`agent.model.ProcessSample` keyword arguments (same names)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(slots=True)
class _Tree:
    """One process's CPU and I/O baselines, per member of the tree, and the last answer."""

    proc: psutil.Process
    t: float
    main_cpu_s: float
    workers_cpu_s: dict[int, float]
    io: dict[int, tuple[int, int]]
    facts: ProcessFacts


def _cpu_s(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def _io(proc: psutil.Process) -> tuple[int, int] | None:
    try:
        c = proc.io_counters()
    except (psutil.Error, OSError, AttributeError):  # another user's process without privileges
        return None
    return c.read_bytes, c.write_bytes


def cgroup_cpu_limit(pid: int, proc_root: Path, cgroup_root: Path) -> float | None:
    """Cores allowed by the tightest ``cpu.max`` on the process's cgroup v2 path; None if unlimited/unknown."""
    try:
        text = (proc_root / str(pid) / "cgroup").read_text()
    except OSError:
        return None
    path = next((line[3:] for line in text.splitlines() if line.startswith("0::")), None)
    if path is None:
        return None
    limit = None
    node = cgroup_root / path.strip().lstrip("/")
    while True:
        try:
            fields = (node / "cpu.max").read_text().split()
        except OSError:
            fields = []
        if len(fields) == 2 and fields[0] != "max":
            try:
                cores = int(fields[0]) / int(fields[1])
            except (ValueError, ZeroDivisionError):
                cores = None
            if cores and (limit is None or cores < limit):
                limit = cores
        if node == cgroup_root or node.parent == node:
            return limit
        node = node.parent


class ProcessTracker:
    """Per-process facts as rates over the time since the previous read of the same process.

    The first sighting of a process has no rates yet. Workers are tracked one by one: a worker
    that started since the last read counts with all its CPU time (it all fell in the interval),
    one that exited takes its time with it (under-counting one interval, never going negative).
    """

    def __init__(self, proc_root: str | Path = "/proc", *, cgroup_root: str | Path = "/sys/fs/cgroup",
                 min_refresh_s: float = 0.5, clock: Callable[[], float] = time.monotonic) -> None:
        self._proc_root = Path(proc_root)
        self._cgroup_root = Path(cgroup_root)
        self._min_refresh_s = min_refresh_s
        self._clock = clock
        self._trees: dict[int, _Tree] = {}

    def facts(self, pid: int) -> ProcessFacts:
        now = self._clock()
        tree = self._trees.get(pid)
        if tree is not None and now - tree.t < self._min_refresh_s:
            return tree.facts  # asked again within the cycle (a process on several GPUs): same answer
        try:
            proc = tree.proc if tree is not None else psutil.Process(pid)
            new = self._read(proc, pid, now, tree)
        except (psutil.Error, OSError):
            self._trees.pop(pid, None)
            return ProcessFacts()  # not visible from here (another PID namespace) or already gone
        self._trees[pid] = new
        return new.facts

    def forget(self, keep: set[int], older_than_s: float = 60.0) -> None:
        """Drop baselines of processes no GPU has listed for a while (another GPU may still hold one)."""
        now = self._clock()
        for pid in [p for p, tree in self._trees.items() if p not in keep and now - tree.t > older_than_s]:
            del self._trees[pid]

    def _read(self, proc: psutil.Process, pid: int, now: float, old: _Tree | None) -> _Tree:
        with proc.oneshot():
            name = proc.name()
            main_cpu = _cpu_s(proc)
            command = _command(proc)
            user = _user(proc)
            rss = proc.memory_info().rss
            io_main = _io(proc)
            limit = _affinity(proc)
        workers_cpu: dict[int, float] = {}
        io: dict[int, tuple[int, int]] = {pid: io_main} if io_main is not None else {}
        io_known = io_main is not None
        try:
            children = proc.children(recursive=True)
        except (psutil.Error, OSError):
            children = []
        for child in children:
            try:
                workers_cpu[child.pid] = _cpu_s(child)
            except (psutil.Error, OSError):
                continue  # exited between listing and reading
            counters = _io(child)
            if counters is not None:
                io[child.pid] = counters
            else:
                io_known = False

        quota = cgroup_cpu_limit(pid, self._proc_root, self._cgroup_root)
        if quota is not None:
            limit = min(limit, quota) if limit is not None else quota
        main_rate = workers_rate = read_rate = write_rate = None
        if old is not None and now > old.t:
            span = now - old.t
            main_rate = max(0.0, (main_cpu - old.main_cpu_s) / span)
            workers_rate = sum(max(0.0, cpu - old.workers_cpu_s.get(w, 0.0)) for w, cpu in workers_cpu.items()) / span
            if io_known:
                read_rate = sum(max(0, r - old.io.get(p, (0, 0))[0]) for p, (r, _) in io.items()) / span
                write_rate = sum(max(0, w - old.io.get(p, (0, 0))[1]) for p, (_, w) in io.items()) / span
        facts = ProcessFacts(
            name=name, command=command, user=user,
            cpu_cores=None if main_rate is None or workers_rate is None else main_rate + workers_rate,
            cpu_main_cores=main_rate, cpu_workers_cores=workers_rate, workers=len(workers_cpu),
            cpu_limit_cores=limit, rss_bytes=rss, io_read_bytes_per_s=read_rate, io_write_bytes_per_s=write_rate,
        )
        return _Tree(proc=proc, t=now, main_cpu_s=main_cpu, workers_cpu_s=workers_cpu, io=io, facts=facts)


def _command(proc: psutil.Process) -> str | None:
    try:
        parts = proc.cmdline()
    except (psutil.Error, OSError):
        return None
    text = " ".join(parts)
    return text[:COMMAND_MAX_CHARS] if text else None


def _user(proc: psutil.Process) -> str | None:
    try:
        return proc.username()
    except (psutil.Error, OSError, KeyError):  # a UID with no passwd entry (container users)
        try:
            return str(proc.uids().real)
        except (psutil.Error, OSError):
            return None


def _affinity(proc: psutil.Process) -> float | None:
    try:
        return float(len(proc.cpu_affinity()))
    except (psutil.Error, OSError, AttributeError):
        return None
