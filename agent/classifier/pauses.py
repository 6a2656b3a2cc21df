"""Stretches without a kernel, and what they mean: a GPU gone quiet, or a job pausing on a schedule.

Two situations look alike in a window's duty cycle and mean opposite things (roofwatch issue 44):

* **Quiet after a burst.** A notebook runs a cell for a few seconds and then idles for minutes; an
  inference server's queue drains. The window holds a burst and a flat 0% tail, and nothing on the host
  asks for work: the process spends no CPU, nothing is read from disk, nothing crosses PCIe. That is an
  idle GPU, not a starved one: starvation needs a pipeline trying to feed it. :class:`QuietTail` measures
  the tail and what the host does during it.
* **A periodic stall.** Training ranks all stop every checkpoint: a copy of the state to the host (PCIe
  from the GPU at tens of GB/s, no kernel), then the host writes it (iowait up). The stop is a minority of
  the job's time inside an otherwise busy job, and it recurs. :class:`Stalls` finds the stops in the long
  window, says whether they recur at a regular period or carry a checkpoint's copy, and which of the
  short window's samples they cover, so the job keeps its class on the samples it works.

Pure functions over samples, like the rest of the classifier; computed once per evaluation into the
evidence record (agent.classifier.evidence).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from agent.classifier.thresholds import Thresholds
from agent.model import CLOCK_EVENT_REASONS, GpuSample

_GPU_IDLE = CLOCK_EVENT_REASONS["gpu_idle"]


def _quiet(s: GpuSample, t: Thresholds) -> bool | None:
    """No kernel ran and memory stayed quiet in this read (None when the duty counter is unreadable)."""
    if s.gr_active is None:
        return None
    memory = s.dram_active if s.dram_active is not None else s.mem_busy
    return s.gr_active < t.idle_duty and (memory is None or memory < t.idle_dram)


def pcie_bytes(s: GpuSample) -> float | None:
    """Bytes per second crossing PCIe in either direction (the larger; amdsmi reads both together)."""
    known = [v for v in (s.pcie_tx_bytes_per_s, s.pcie_rx_bytes_per_s, s.pcie_bytes_per_s) if v is not None]
    return max(known) if known else None


def _copy_off(s: GpuSample) -> float | None:
    """Bytes per second leaving the GPU over PCIe (a copy to the host); both directions where unsplit."""
    return s.pcie_tx_bytes_per_s if s.pcie_tx_bytes_per_s is not None else s.pcie_bytes_per_s


def _interval(samples: Sequence[GpuSample]) -> float:
    stated = [s.interval_s for s in samples[-10:] if s.interval_s]
    if stated:
        return sorted(stated)[len(stated) // 2]
    gaps = [b.ts - a.ts for a, b in zip(samples[-11:], samples[-10:]) if b.ts > a.ts]
    return sorted(gaps)[len(gaps) // 2] if gaps else 1.0


def _cpu(s: GpuSample) -> float | None:
    cores = [p.cpu_cores for p in s.processes or () if p.cpu_cores is not None]
    return max(cores) if cores else None


def _mean(values: Sequence[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None


# ------------------------------------------------------------------------------ quiet after a burst


@dataclass(frozen=True, slots=True)
class QuietTail:
    """The stretch without a kernel that ends the window, and what the host does meanwhile."""

    seconds: float
    """How long the window has been quiet at its end (0 when its last read saw a kernel)."""
    cpu_cores: float | None = None
    """The busiest GPU process's CPU at most, over the quiet reads."""
    iowait: float | None = None
    io_pressure: float | None = None
    pcie_bytes: float | None = None
    """The most PCIe bytes per second (either direction) of a quiet read."""
    gpu_idle_reason: bool = False
    """The driver set its GPU-idle clock-event reason during the quiet (NVML: nothing runs, clocks drop)."""
    after_burst: bool = False
    """A read before the quiet saw a kernel: the window holds a burst, then the quiet."""


def quiet_tail(window: Sequence[GpuSample], t: Thresholds) -> QuietTail:
    """The quiet stretch that ends ``window`` (the whole short window, before any cut at a phase change)."""
    tail: list[GpuSample] = []
    for s in reversed(window):
        if not _quiet(s, t):
            break
        tail.append(s)
    if not tail:
        return QuietTail(0.0)
    interval = _interval(window)
    before = window[len(window) - len(tail) - 1].ts if len(tail) < len(window) else tail[-1].ts - interval
    cpu = [c for s in tail if (c := _cpu(s)) is not None]
    hosts = [s.host for s in tail if s.host is not None]
    pcie = [b for s in tail if (b := pcie_bytes(s)) is not None]
    return QuietTail(
        seconds=tail[0].ts - before,
        cpu_cores=max(cpu) if cpu else None,
        iowait=_mean([h.cpu_iowait_ratio for h in hosts if h.cpu_iowait_ratio is not None]),
        io_pressure=_mean([h.io_pressure_ratio for h in hosts if h.io_pressure_ratio is not None]),
        pcie_bytes=max(pcie) if pcie else None,
        gpu_idle_reason=any((s.clock_event_reasons or 0) & _GPU_IDLE for s in tail),
        after_burst=len(tail) < len(window),
    )


# ------------------------------------------------------------------------------ periodic stalls


@dataclass(frozen=True, slots=True)
class Stop:
    """A run of reads without a kernel inside the long window."""

    first: int
    """Index of its first read in the long window."""
    last: int
    start: float
    end: float
    copy_bytes: float | None
    """The most bytes per second leaving the GPU over PCIe during the stop (a copy to the host)."""
    iowait: float | None
    """The most host iowait of a read during the stop."""
    complete: bool
    """Work resumed after it (False for a stop still going at the evaluation)."""

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class Stalls:
    """The job's stops in the long window: whether they are pauses inside a working job, and which reads of
    the short window they cover."""

    count: int = 0
    """Complete stops seen inside a busy job."""
    period_s: float | None = None
    """Median interval between the starts of consecutive stops."""
    length_s: float | None = None
    """Median length of a stop."""
    regularity: float | None = None
    """CV of the intervals between starts: low when the stops come on a schedule."""
    share: float = 0.0
    """Share of the long window the stops took (the job's time they cost)."""
    periodic: bool = False
    """The stops recur at a regular period and each is a minority of it."""
    checkpoint: bool = False
    """A copy off the GPU over PCIe opens the stops (the checkpoint's snapshot), not a data read."""
    copy_bytes: float | None = None
    iowait: float | None = None
    window_share: float = 0.0
    """Share of the short window's reads inside a recognised stall (periodic, or a lone checkpoint)."""
    working_duty: float | None = None
    """The duty cycle over the short window's other reads: how busy the job is when it is not stopped."""

    @property
    def recognised(self) -> bool:
        """Whether the short window holds a stall to set apart (or the job stops on a schedule)."""
        return self.periodic or self.window_share > 0.0


def _stops(long_window: Sequence[GpuSample], stopped: list[bool], interval: float) -> list[Stop]:
    """The runs of reads flagged ``stopped`` in ``long_window``."""
    out: list[Stop] = []
    i, n = 0, len(long_window)
    while i < n:
        if not stopped[i]:
            try:
                i = stopped.index(True, i)
            except ValueError:
                break
        j = i
        while j + 1 < n and stopped[j + 1]:
            j += 1
        run = long_window[i:j + 1]
        copies = [b for s in run if (b := _copy_off(s)) is not None]
        waits = [h.cpu_iowait_ratio for s in run if (h := s.host) is not None and h.cpu_iowait_ratio is not None]
        start = long_window[i - 1].ts if i > 0 else run[0].ts - interval
        out.append(Stop(i, j, start, run[-1].ts, max(copies) if copies else None, max(waits) if waits else None,
                        complete=i > 0 and j + 1 < n))
        i = j + 1
    return out


def stalls(window: Sequence[GpuSample], long_window: Sequence[GpuSample], t: Thresholds) -> Stalls:
    """The stops of the job in ``long_window`` (``window`` is the short window's reads, a suffix of it)."""
    if not long_window:
        return Stalls()
    # A stop: no kernel ran in the read, whatever memory or PCIe do meanwhile. This runs for every GPU at every
    # evaluation over the whole long window, so the flags are taken in one pass and the runs built only for a
    # busy job.
    stopped = [s.gr_active is not None and s.gr_active < t.idle_duty for s in long_window]
    if not any(stopped):
        return Stalls()
    working = [s.gr_active for s, stop in zip(long_window, stopped) if not stop and s.gr_active is not None]
    if not working or (_mean(working) or 0.0) < t.busy_duty:
        return Stalls()  # not a busy job that pauses: a starved or idle GPU's gaps are its own state
    interval = _interval(long_window)
    stops = _stops(long_window, stopped, interval)
    complete = [s for s in stops if s.complete]
    span = max(long_window[-1].ts - long_window[0].ts + interval, interval)
    share = min(1.0, math.fsum(s.seconds for s in stops) / span)
    period = length = regularity = None
    periodic = False
    if len(complete) >= t.stall_count:
        gaps = [b.start - a.start for a, b in zip(complete, complete[1:])]
        period = sorted(gaps)[len(gaps) // 2]
        length = sorted(s.seconds for s in complete)[len(complete) // 2]
        mean = math.fsum(gaps) / len(gaps)
        regularity = math.sqrt(math.fsum((g - mean) ** 2 for g in gaps) / len(gaps)) / mean if mean > 0 else None
        # Stops that recur within every window are the job's steady state (a starved loop's gaps each
        # step), not a pause in it: a periodic stall comes less often than once per short window.
        periodic = (regularity is not None and regularity <= t.stall_period_cv and period >= t.window_s
                    and length <= t.stall_max_share * period)
    copies = [s.copy_bytes for s in stops if s.copy_bytes is not None]
    waits = [s.iowait for s in stops if s.iowait is not None]
    checkpoint_of = [s for s in stops if _opens_with_copy(long_window, s, t)]
    lone = [s for s in checkpoint_of if s.iowait is not None and s.iowait >= t.io_wait]
    first_in_window = len(long_window) - len(window)
    covered: set[int] = set()
    for s in stops:
        if s.last < first_in_window:
            continue
        if _is_stall(s, periodic, length, s in lone, t):
            covered.update(range(max(s.first, first_in_window), s.last + 1))
    rest = [long_window[k].gr_active for k in range(first_in_window, len(long_window))
            if k not in covered and long_window[k].gr_active is not None]
    return Stalls(
        count=len(complete), period_s=period, length_s=length, regularity=regularity, share=share, periodic=periodic,
        checkpoint=bool(checkpoint_of) and len(checkpoint_of) * 2 >= len(stops),
        copy_bytes=max(copies) if copies else None, iowait=max(waits) if waits else None,
        window_share=len(covered) / len(window) if window else 0.0,
        working_duty=_mean(rest) if covered and len(rest) >= 3 else None,  # type: ignore[arg-type]
    )


def _opens_with_copy(long_window: Sequence[GpuSample], stop: Stop, t: Thresholds) -> bool:
    """A copy off the GPU in the stop's first reads: the checkpoint's snapshot to host memory."""
    first = long_window[stop.first:min(stop.last, stop.first + 2) + 1]
    return any((b := _copy_off(s)) is not None and b >= t.pcie_active_bytes for s in first)


def _is_stall(stop: Stop, periodic: bool, length: float | None, checkpoint: bool, t: Thresholds) -> bool:
    """Whether this stop is a pause inside the working job: one of a regular series (a stop still going may
    last up to twice the usual length), or a lone checkpoint (a copy off the GPU, then the host's iowait) no
    longer than half the short window."""
    if periodic and length is not None and stop.seconds <= 2.0 * length:
        return True
    return checkpoint and stop.seconds <= t.window_s / 2.0
