"""Each holder's share of a shared GPU, interval by interval, and its energy since the agent started.

One :class:`HolderLedger` per device, advanced by the collection loop with each good sample and the
GPU's energy-counter step (the same step its ``energy_joules_total`` counts). Only a *shared* GPU (two
holders or more) is split; a whole GPU costs one length check. The largest ``max_holders`` holders keep
their own totals; the rest of the interval's energy is counted as ``other``, and what no holder gets as
``unattributed``, so that every exported total only grows and, in whole microjoules,
``sum(holders) + other + unattributed`` equals the GPU's energy over the intervals it was shared.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Sequence

from agent.classifier.holders import judge_holders
from agent.model import DeviceState, GpuSample, ProcessSample, Verdict
from agent.model.holders import MICROJOULES_PER_JOULE, Holder, HolderShare, split_energy

MAX_HOLDERS = 4
"""Default of the ``max_holders_per_gpu`` setting: the holders of one GPU with series of their own."""
MAX_REMEMBERED = 256
"""Holders whose totals one GPU remembers; past it the oldest is folded into ``other`` (still counted)."""

OTHER = Holder(kind="other")
UNATTRIBUTED = Holder(kind="unattributed")


def holders_of(sample: GpuSample) -> tuple[Holder, ...]:
    """The host's holders (agent.context.attribution.holders), else one per process when no job owns them
    all (MPS clients and plain processes share a GPU; one job's ranks do not)."""
    who = sample.attribution
    if who is not None and who.holders:
        return who.holders
    processes = sample.processes or ()
    if who is not None and (who.job_id or who.pod):
        return ()
    return tuple(Holder(kind="process", via="process", pids=(p.pid,)) for p in processes)


def busy_ratio(sample: GpuSample) -> float | None:
    """The GPU's busy share of the interval: graphics-engine activity, else the driver's utilisation."""
    for value in (sample.gr_active, sample.util_gpu, sample.sm_active):
        if value is not None:
            return value
    return None


def _sm_shares(holders: Sequence[Holder], processes: dict[int, ProcessSample], busy: float | None
               ) -> list[float | None]:
    """SM-time share per holder: its processes' NVML shares; on AMD, compute-unit occupancy as a weight of
    the GPU's busy share; None where the driver gives neither."""
    if any(p.sm_util is not None for p in processes.values()):
        shares: list[float | None] = [sum(processes[pid].sm_util or 0.0 for pid in h.pids if pid in processes)
                                      if any(pid in processes for pid in h.pids) else 0.0 for h in holders]
        if not any(processes[pid].sm_util is not None for h in holders if h.via == "mps" for pid in h.pids
                   if pid in processes):
            # Under MPS the driver may time the server's shared context, not its clients' (docs/attribution.md,
            # unverified on a real driver): clients no sample names are unknown, never idle for want of a sample.
            shares = [None if h.via == "mps" else share for h, share in zip(holders, shares)]
        return shares
    units = {pid: p.compute_units for pid, p in processes.items() if p.compute_units is not None}
    total = sum(units.values())
    if not units or busy is None:
        return [None] * len(holders)
    return [busy * sum(units.get(pid, 0) for pid in h.pids) / total if total else 0.0 for h in holders]


def _memory(holder: Holder, processes: dict[int, ProcessSample]) -> int | None:
    known = [processes[pid].used_memory_bytes for pid in holder.pids if pid in processes]
    if not known:
        return 0
    values = [v for v in known if v is not None]
    return sum(values) if values else None


class HolderLedger:
    """The holders of one device: their shares of the last interval and their energy totals."""

    def __init__(self, max_holders: int = MAX_HOLDERS) -> None:
        self._max = max(1, max_holders)
        self._totals: dict[str, int] = {}  # µJ of each holder while among the largest
        self._other = 0
        self._unattributed = 0
        self._idle_since: dict[str, float] = {}
        self._current: tuple[HolderShare, ...] = ()

    @property
    def shares(self) -> tuple[HolderShare, ...]:
        """The last shared interval's holders (largest first), ``other`` and ``unattributed``; () unshared."""
        return self._current

    def advance(self, sample: GpuSample, energy_step_j: float | None) -> tuple[HolderShare, ...]:
        holders = holders_of(sample)
        if len(holders) < 2:
            self._current, self._idle_since = (), {}
            return ()
        processes = {p.pid: p for p in sample.processes or ()}
        busy = busy_ratio(sample)
        sm = _sm_shares(holders, processes, busy)
        memory = [_memory(h, processes) for h in holders]
        step_uj = round(energy_step_j * MICROJOULES_PER_JOULE) if energy_step_j is not None else None
        split = split_energy(step_uj or 0, busy, sm)
        dt = sample.interval_s or 0.0
        held = sum(m or 0 for m in memory)
        # Largest by SM share or by share of the memory held, whichever is larger: a holder that holds
        # 20 GiB and computes nothing is the waste a shared GPU hides, so it must not fall into `other`.
        size = [max(sm[i] or 0.0, (memory[i] or 0) / held if held else 0.0) for i in range(len(holders))]
        order = sorted(range(len(holders)), key=lambda i: (-size[i], holders[i].key))
        top, rest = order[: self._max], order[self._max:]
        for i in top:
            self._totals[holders[i].key] = self._totals.get(holders[i].key, 0) + split.by_holder[i]
        self._other += sum(split.by_holder[i] for i in rest)
        self._unattributed += split.unattributed_uj
        self._forget_oldest(holders[i].key for i in top)

        def power(uj: int) -> float | None:
            return uj / MICROJOULES_PER_JOULE / dt if step_uj is not None and dt > 0 else None

        idle = {}
        out = []
        for i in top:
            key = holders[i].key
            if (memory[i] or 0) > 0 and sm[i] == 0.0:
                idle[key] = self._idle_since.get(key, sample.ts - dt)
            out.append(HolderShare(holder=holders[i], sm_share=sm[i], memory_bytes=memory[i],
                                   power_w=power(split.by_holder[i]),
                                   energy_j_total=self._totals[key] / MICROJOULES_PER_JOULE, idle_since=idle.get(key)))
        self._idle_since = idle
        if rest or self._other:
            rest_sm = [sm[i] for i in rest if sm[i] is not None]
            rest_mem = [memory[i] for i in rest if memory[i] is not None]
            out.append(HolderShare(holder=OTHER, sm_share=sum(rest_sm) if rest_sm else None,
                                   memory_bytes=sum(rest_mem) if rest else None,
                                   power_w=power(sum(split.by_holder[i] for i in rest)),
                                   energy_j_total=self._other / MICROJOULES_PER_JOULE))
        out.append(HolderShare(holder=UNATTRIBUTED, power_w=power(split.unattributed_uj),
                               energy_j_total=self._unattributed / MICROJOULES_PER_JOULE))
        self._current = tuple(out)
        return self._current

    def totals_uj(self) -> tuple[dict[str, int], int, int]:
        """Every remembered holder's total, ``other`` and ``unattributed``, in µJ (for the sum check)."""
        return dict(self._totals), self._other, self._unattributed

    def judged(self, *, now: float, window_s: float, gpu_class: str | None, spec: object = None
               ) -> tuple[HolderShare, ...]:
        """The last shares with each holder's own verdict and MFU (agent.classifier.holders)."""
        if not self._current:
            return ()
        return judge_holders(self._current, now=now, window_s=window_s, gpu_class=gpu_class, spec=spec)

    def _forget_oldest(self, seen: Iterable[str]) -> None:
        """Fold the least recently seen totals past :data:`MAX_REMEMBERED` into ``other`` (still counted)."""
        keep = set(seen)
        for key in keep:  # most recently seen last, so the oldest is the first met below
            self._totals[key] = self._totals.pop(key)
        while len(self._totals) > MAX_REMEMBERED:
            key = next(iter(self._totals))
            self._other += self._totals.pop(key)


def with_holder_verdicts(states: Sequence[DeviceState], ledgers: dict[str, HolderLedger],
                         verdicts: Sequence[Verdict], default_window_s: float) -> tuple[DeviceState, ...]:
    """Device states with each shared GPU's holders judged against its verdict (one place, once per cycle)."""
    by_gpu = {v.gpu: v for v in verdicts}
    out = []
    for state in states:
        ledger = ledgers.get(state.info.gpu)
        if ledger is None or not ledger.shares or state.sample is None or not state.up:
            out.append(state)
            continue
        verdict = by_gpu.get(state.info.gpu)
        window = (verdict.window_end - verdict.window_start) if verdict is not None else default_window_s
        shares = ledger.judged(now=state.sample.ts, window_s=max(window, default_window_s),
                               gpu_class=verdict.cls if verdict is not None else None, spec=state.info.spec)
        out.append(dataclasses.replace(state, holders=shares))
    return tuple(out)
