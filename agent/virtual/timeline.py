"""When things happen: phase schedules and the training-step clock of each job.

Everything here is a pure function of (scenario, seed, time), so any interval can be sampled in
any order and gives the same answer. The only state is a cache of step tables, which are
themselves deterministic; it is shared by all ranks of a job (possibly on several nodes) and
guarded by a lock because the backend samples GPUs from several threads.
"""

from __future__ import annotations

import math
import threading
from bisect import bisect_left, bisect_right
from collections import OrderedDict
from typing import NamedTuple, Sequence

from agent.virtual.physics import unit_hash
from agent.virtual.workloads import CommJitterPhase, ComputePhase, InputStarvedPhase


class Occurrence(NamedTuple):
    """One run of one phase: ``index`` into the phase list, a unique ``occ_id``, its span."""

    index: int
    occ_id: int
    start: float
    end: float


class Schedule:
    """Phase durations laid out in time: looping when ``repeat``, else the last phase holds."""

    def __init__(self, durations: Sequence[float], repeat: bool) -> None:
        self.durations = tuple(float(d) for d in durations)
        self.repeat = repeat
        self.starts = tuple(math.fsum(self.durations[:i]) for i in range(len(self.durations)))
        self.cycle_s = math.fsum(self.durations)
        self.count = len(self.durations)

    def locate(self, t: float) -> Occurrence:
        """The phase occurrence containing virtual time ``t`` (t >= 0)."""
        n = self.count
        if not self.repeat:
            idx = min(n - 1, max(0, bisect_right(self.starts, t) - 1))
            end = math.inf if idx == n - 1 else self.starts[idx] + self.durations[idx]
            return Occurrence(idx, idx, self.starts[idx], end)
        cycle = math.floor(t / self.cycle_s)
        within = t - cycle * self.cycle_s
        idx = min(n - 1, max(0, bisect_right(self.starts, within) - 1))
        start = cycle * self.cycle_s + self.starts[idx]
        end = start + self.durations[idx]
        if end <= t:  # rounding put t at the very end of a phase: it belongs to the next one
            idx += 1
            if idx == n:
                idx, cycle = 0, cycle + 1
            start = end
            end = start + self.durations[idx]
        return Occurrence(idx, cycle * n + idx, start, end)

    def index_of(self, occ_id: int) -> int:
        return occ_id % self.count if self.repeat else occ_id


class StepTable:
    """The synchronous steps of one ``comm_jitter`` occurrence, generated lazily.

    Step ``k`` lasts ``compute x slowdown + comm + stall``: every rank waits for the slowest
    one, so the step time is shared by the whole job. Jitter and stalls are drawn from
    (seed, job, occurrence, k), which is what makes all ranks see the same stalls.

    Steps are generated in blocks of :data:`_BLOCK`; only the start time of every block and a
    few recent blocks are kept, so a phase that holds for weeks costs kilobytes, not gigabytes.
    """

    _BLOCK = 64
    _KEEP = 8

    def __init__(self, phase: CommJitterPhase, key: bytes, occ_id: int) -> None:
        self.phase = phase
        self.key = key
        self.occ_id = occ_id
        self.slow = phase.straggler_slowdown if phase.straggler_rank is not None else 1.0
        self._origins: list[float] = [0.0]
        self._blocks: OrderedDict[int, tuple[list[float], list[float]]] = OrderedDict()

    def _draw(self, k: int) -> tuple[float, float]:
        """(compute time of a normal rank, stall) of step ``k``."""
        p = self.phase
        jitter = p.step_jitter * (2.0 * unit_hash(self.key, self.occ_id, k, "jitter") - 1.0)
        stalled = unit_hash(self.key, self.occ_id, k, "stall") < p.stall_prob
        stall = p.stall_s * (0.5 + unit_hash(self.key, self.occ_id, k, "len")) if stalled else 0.0
        return p.compute_s * (1.0 + jitter), stall

    def _make(self, b: int) -> tuple[list[float], list[float]]:
        starts, compute = [self._origins[b]], []
        for k in range(b * self._BLOCK, (b + 1) * self._BLOCK):
            c, stall = self._draw(k)
            compute.append(c)
            starts.append(starts[-1] + c * self.slow + self.phase.comm_s + stall)
        if len(self._origins) == b + 1:
            self._origins.append(starts[-1])
        self._blocks[b] = (starts, compute)
        if len(self._blocks) > self._KEEP:
            self._blocks.popitem(last=False)
        return starts, compute

    def _block(self, b: int) -> tuple[list[float], list[float]]:
        """Step starts (one more than steps) and compute times of block ``b``."""
        cached = self._blocks.get(b)
        if cached is not None:
            self._blocks.move_to_end(b)
            return cached
        while len(self._origins) <= b:
            self._make(len(self._origins) - 1)
        return self._make(b)

    def _block_at(self, t: float) -> int:
        while self._origins[-1] <= t:
            self._make(len(self._origins) - 1)
        return max(0, bisect_right(self._origins, t) - 1)

    def start(self, k: int) -> float:
        return self._block(k // self._BLOCK)[0][k % self._BLOCK]

    def duration(self, k: int) -> float:
        starts = self._block(k // self._BLOCK)[0]
        i = k % self._BLOCK
        return starts[i + 1] - starts[i]

    def step_at(self, t: float) -> int:
        """Index of the step running at phase-local time ``t``."""
        b = self._block_at(t)
        return b * self._BLOCK + max(0, bisect_right(self._block(b)[0], t) - 1)

    def count_started(self, d: float) -> int:
        """Steps that start before phase-local time ``d`` (the steps of a phase of length d)."""
        b = self._block_at(d)
        return b * self._BLOCK + bisect_left(self._block(b)[0], d)

    def weights(self, a: float, b: float, rank: int) -> tuple[float, float, float]:
        """Seconds of (compute, wait, transfer) for ``rank`` within phase-local [a, b)."""
        p = self.phase
        own_slow = p.straggler_slowdown if rank == p.straggler_rank else 1.0
        compute = wait = transfer = 0.0
        k = self.step_at(a)
        while True:
            starts, comp = self._block(k // self._BLOCK)
            i = k % self._BLOCK
            s, e = starts[i], starts[i + 1]
            if s >= b:
                break
            c_end = s + comp[i] * own_slow
            x_start = e - p.comm_s
            compute += _overlap(a, b, s, c_end)
            wait += _overlap(a, b, c_end, x_start)
            transfer += _overlap(a, b, x_start, e)
            k += 1
        return compute, wait, transfer


def _overlap(a: float, b: float, lo: float, hi: float) -> float:
    return max(0.0, min(b, hi) - max(a, lo))


def periodic_on_time(a: float, b: float, period: float, on_start: float, on_len: float) -> float:
    """Exact time in [a, b) covered by the windows [k*period + on_start, ... + on_len), all k.

    Closed form rather than stepping through periods, so a 0.1 s sample and a 10 s sample of
    the same pattern agree exactly on average.
    """
    if on_len <= 0.0:
        return 0.0

    def cumulative(x: float) -> float:
        y = x - on_start
        k = math.floor(y / period)
        return k * on_len + min(max(y - k * period, 0.0), on_len)

    return cumulative(b) - cumulative(a)


class JobClock:
    """Step numbering and step tables for one job, shared by all its ranks."""

    _CACHE = 32

    def __init__(self, schedule: Schedule, phases: Sequence[object], key: bytes) -> None:
        self.schedule = schedule
        self.phases = tuple(phases)
        self.key = key
        self.lock = threading.Lock()
        self._tables: OrderedDict[int, StepTable] = OrderedDict()
        self._cumulative: list[int] = [0]

    def table(self, occ_id: int) -> StepTable:
        """The (cached) step table of a ``comm_jitter`` occurrence. Call with :attr:`lock` held."""
        table = self._tables.get(occ_id)
        if table is None:
            phase = self.phases[self.schedule.index_of(occ_id)]
            assert isinstance(phase, CommJitterPhase)
            table = self._tables[occ_id] = StepTable(phase, self.key, occ_id)
            if len(self._tables) > self._CACHE:
                self._tables.popitem(last=False)
        else:
            self._tables.move_to_end(occ_id)
        return table

    def steps_before(self, occ_id: int) -> int:
        """Training steps completed in all earlier occurrences. Call with :attr:`lock` held."""
        while len(self._cumulative) <= occ_id:
            o = len(self._cumulative) - 1
            self._cumulative.append(self._cumulative[-1] + self._steps_in(o))
        return self._cumulative[max(0, occ_id)]

    def _steps_in(self, occ_id: int) -> int:
        idx = self.schedule.index_of(occ_id)
        phase, d = self.phases[idx], self.schedule.durations[idx]
        if isinstance(phase, CommJitterPhase):
            return StepTable(phase, self.key, occ_id).count_started(d)
        if isinstance(phase, InputStarvedPhase):
            return math.ceil(d / phase.period_s)
        if isinstance(phase, ComputePhase):
            return math.ceil(d / phase.step_s)
        return 0
