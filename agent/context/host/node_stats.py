"""Node-wide CPU and I/O signals: iowait, CPU busy share, and pressure-stall information (PSI).

These separate the two ways a data pipeline starves a GPU: the storage cannot deliver (iowait,
I/O pressure) or the CPUs cannot transform fast enough (runnable tasks waiting for a CPU: CPU
pressure). PSI (``/proc/pressure/{io,cpu}``, Linux 4.20+) is the direct measure; kernels
without it (or with ``psi=0``) leave those ratios unknown rather than zero.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Callable

import psutil

from agent.model import HostSample


def read_pressure(path: Path) -> float | None:
    """PSI ``some avg10`` of a /proc/pressure file as a ratio; None where the kernel has no PSI."""
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


class NodeStats:
    """Computes the node's :class:`HostSample` at most once per ``min_refresh_s``.

    iowait and CPU busy are deltas of the kernel's CPU time counters between two calls, so the
    first call has neither; PSI is already an average and is known from the first call.
    """

    def __init__(self, proc_root: str | Path = "/proc", *, min_refresh_s: float = 0.5,
                 clock: Callable[[], float] = time.monotonic,
                 cpu_times: Callable[[], object] = psutil.cpu_times) -> None:
        self._pressure = Path(proc_root) / "pressure"
        self._min_refresh_s = min_refresh_s
        self._clock = clock
        self._cpu_times = cpu_times
        self._lock = threading.Lock()
        self._last: HostSample | None = None
        self._last_t = -1e18
        self._previous: tuple[float, float, float] | None = None
        """(total, iowait, idle) CPU seconds at the previous computation."""

    def sample(self) -> HostSample:
        with self._lock:
            now = self._clock()
            if self._last is not None and now - self._last_t < self._min_refresh_s:
                return self._last
            self._last_t = now
            iowait, busy = self._cpu_shares()
            self._last = HostSample(
                cpu_iowait_ratio=iowait, io_pressure_ratio=read_pressure(self._pressure / "io"),
                cpu_pressure_ratio=read_pressure(self._pressure / "cpu"), cpu_utilization_ratio=busy,
            )
            return self._last

    def _cpu_shares(self) -> tuple[float | None, float | None]:
        times = self._cpu_times()
        total = float(sum(times))  # type: ignore[arg-type]
        wait = getattr(times, "iowait", None)
        idle = float(getattr(times, "idle", 0.0))
        previous, self._previous = self._previous, (total, float(wait or 0.0), idle)
        if previous is None or total <= previous[0]:
            return None, None
        span = total - previous[0]
        waited = float(wait or 0.0) - previous[1]
        iowait = min(1.0, max(0.0, waited / span)) if wait is not None else None
        busy = min(1.0, max(0.0, 1.0 - (idle - previous[2] + max(0.0, waited)) / span))
        return iowait, busy
