"""Where each GPU stands among the ranks of its job: the :class:`JobContext` the rules read.

Ranks are found three ways. A job that reports names itself, and a job the scheduler placed (its Slurm
job id in the attribution) is named by it: its ranks' compute shares give the rank skew (who waits for
whom), and their reported step times the step spread. A job that reports nothing still shows itself on
the node: the ranks of one synchronous job wait in the same collectives, so their power rises and falls
together (lockstep), and that is what tells a collective's wait from one GPU's own stall.

A rank's compute share comes from its tensor or SM activity. Without either (NVML alone, amdsmi) it
comes from the time the rank does not spend waiting with a kernel resident (memory activity below its
working level, ``memory_gap``), and only where one rank of the job differs from the others in what NVML
does show: a clock held down, a throttle reason. That is the straggler; the ranks waiting for it dip
together. Without such a rank the waits are the job's own rhythm and no rank is blamed. Stops that all
ranks make together (a checkpoint) are left out of every rank's share: ranks that stop together are not
stragglers.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import NamedTuple, Protocol, Sequence

from agent.classifier.fabric import pearson
from agent.classifier.thresholds import DEFAULT_THRESHOLDS, Thresholds
from agent.model import THROTTLE_REASON_MASK, GpuSample, WindowFeatures

@dataclass(frozen=True, slots=True)
class JobContext:
    """Where this GPU stands among the ranks of its job (from peers visible in the same window)."""

    job: str | None = None
    ranks_seen: int = 1
    rank_skew: float | None = None
    """1 - this rank's compute share / the busiest rank's share."""
    peer_skew: float | None = None
    """Largest skew among the *other* ranks: high when this rank is the one they wait for."""
    is_busiest: bool = False
    step_spread: float | None = None
    """(slowest - fastest) / mean of the job's ranks' mean reported step times in the window."""
    lockstep: int = 1
    """GPUs of this node (itself included) whose power rises and falls with this one's: one synchronous
    job's ranks, even when none of them reports."""
    skew_from_waits: bool = False
    """The skew compares the ranks' time out of resident waits (no compute counter), not their compute
    counters: the job has one rank whose clock or throttle differs, and its peers wait for it."""
    clock_vs_job: float | None = None
    """This rank's clock over the median clock of its job's other ranks (where the skew rests on waits)."""


LOCKSTEP_R = 0.6
"""Power correlation between two GPUs of a node, over the window, that makes them one job's ranks."""
MAX_LOCKSTEP_GPUS = 16
"""Most GPUs of one node compared pairwise: a node holds at most 16; a larger group (a virtual
fleet under one node name) is not a node, and the pairwise cost grows with its square."""


class _Track(Protocol):
    node: str
    gpu: str


class RankFigures(NamedTuple):
    """One GPU's part in the job comparison: its window and features, and the share of the window it spent
    in a stall the whole job makes (agent.classifier.pauses)."""

    track: _Track
    window: Sequence[GpuSample]
    features: WindowFeatures
    stalled: float = 0.0


def compute_share(f: WindowFeatures, stalled: float = 0.0) -> float | None:
    """How much of the window a rank spent computing (tensor activity, else SM, else duty), over the part of
    the window it was not stopped with the whole job."""
    working = max(1.0 - stalled, 0.05)
    if f.tensor_mean is not None:
        return f.tensor_mean / working
    if f.sm_busy is not None and f.duty is not None:
        return f.sm_busy * f.duty / working
    return None


def waiting_share(f: WindowFeatures) -> float | None:
    """Without compute counters: the share of the window a rank spent with a kernel resident and not waiting
    (memory activity at its working level, ``memory_gap``)."""
    if f.u_compute is not None or f.duty is None or f.memory_gap is None:
        return None
    return f.duty * (1.0 - f.memory_gap)


def _held_down(f: WindowFeatures, t: Thresholds) -> bool:
    """The rank's clock is held down by a throttle reason in most busy samples (the throttled flag's test)."""
    return (f.throttle_known and bool(f.throttle_bits & THROTTLE_REASON_MASK) and f.throttle_fraction >= t.throttle_fraction
            and f.clock_ratio is not None and f.clock_ratio < t.throttle_clock)


def _mean(values: Sequence[float]) -> float:
    """The mean of positive ``values`` without an intermediate overflow (scaled by the largest first):
    a report can hold 1e308."""
    top = max(values)
    return top * (math.fsum(v / top for v in values) / len(values))


def _mean_step_time(window: Sequence[GpuSample]) -> float | None:
    times = [t for s in window if (w := s.workload) is not None and (t := w.step_time_s) and math.isfinite(t) and t > 0]
    return _mean(times) if times else None


def _job_of(figures: RankFigures) -> str | None:
    """The job a GPU's rank belongs to: the name its job reports, else the scheduler's job id."""
    f = figures.features
    if f.workload is not None and f.workload.job:
        return f.workload.job
    latest = figures.window[-1] if figures.window else None
    attribution = latest.attribution if latest is not None else None
    return f"{attribution.job_id}" if attribution is not None and attribution.job_id else None


def _shares(ranks: list[RankFigures], t: Thresholds) -> tuple[list[float | None], bool, list[float | None]]:
    """Each rank's compute share, whether they rest on resident waits, and (then) each rank's clock over the
    median clock of the others."""
    counters = [compute_share(r.features, r.stalled) for r in ranks]
    if any(c is not None for c in counters):
        return counters, False, [None] * len(ranks)
    waits = [waiting_share(r.features) for r in ranks]
    known = [w for w in waits if w is not None]
    if len(known) < 2:
        return [None] * len(ranks), False, [None] * len(ranks)
    clocks = [r.features.clock_ratio for r in ranks]
    relative: list[float | None] = []
    for i, c in enumerate(clocks):
        others = sorted(o for j, o in enumerate(clocks) if j != i and o is not None)
        relative.append(c / others[len(others) // 2] if c is not None and others and others[len(others) // 2] > 0 else None)
    busiest = max((i for i, w in enumerate(waits) if w is not None), key=lambda i: waits[i])  # type: ignore[arg-type, return-value]
    f = ranks[busiest].features
    differs = _held_down(f, t) or (relative[busiest] is not None and relative[busiest] < t.throttle_clock)  # type: ignore[operator]
    others_held = any(_held_down(r.features, t) for i, r in enumerate(ranks) if i != busiest)
    if not differs or others_held:
        return [None] * len(ranks), False, [None] * len(ranks)  # the waits are the job's rhythm: nobody to blame
    return waits, True, relative


def job_contexts(items: Sequence[RankFigures | tuple], t: Thresholds = DEFAULT_THRESHOLDS) -> dict[tuple[str, str], JobContext]:
    """A context for every GPU that has ranks beside it: by job name or scheduler job (cross-node in a
    trace), else by lockstep."""
    figures = [i if isinstance(i, RankFigures) else RankFigures(*i) for i in items]
    out: dict[tuple[str, str], JobContext] = {}
    jobs: dict[str, list[RankFigures]] = {}
    for r in figures:
        job = _job_of(r)
        if job is not None:
            jobs.setdefault(job, []).append(r)
    for job, ranks in jobs.items():
        if len(ranks) < 2:
            continue
        times = [st for r in ranks if (st := _mean_step_time(r.window)) is not None]
        spread = (max(times) - min(times)) / _mean(times) if len(times) >= 2 else None
        shares, from_waits, clocks = _shares(ranks, t)
        top = max((s for s in shares if s is not None), default=0.0)
        for i, r in enumerate(ranks):
            share = shares[i]
            skew = 1.0 - share / top if share is not None and top > 0.0 else None
            peers = [1.0 - other / top for j, other in enumerate(shares) if j != i and other is not None and top > 0.0]
            out[(r.track.node, r.track.gpu)] = JobContext(
                job=job, ranks_seen=len(ranks), rank_skew=skew, peer_skew=max(peers, default=None) if skew is not None else None,
                is_busiest=skew == 0.0, step_spread=spread, skew_from_waits=from_waits and skew is not None,
                clock_vs_job=clocks[i] if from_waits else None)
    for key, count in _lockstep([(r.track, r.window, r.features) for r in figures]).items():
        context = out.get(key)
        out[key] = JobContext(lockstep=count) if context is None else _with_lockstep(context, count)
    return out


def _with_lockstep(context: JobContext, count: int) -> JobContext:
    return dataclasses.replace(context, lockstep=count)


def _lockstep(items: list[tuple[_Track, Sequence[GpuSample], WindowFeatures]]) -> dict[tuple[str, str], int]:
    """For each GPU with fabric evidence, how many GPUs of its node (itself included) move with it."""
    by_node: dict[str, list[tuple[_Track, dict[int, float]]]] = {}
    for track, window, f in items:
        if f.fabric_wait_fraction is None:
            continue
        series = {round(s.ts): s.power_w for s in window if s.power_w is not None}
        by_node.setdefault(track.node, []).append((track, series))
    out: dict[tuple[str, str], int] = {}
    for members in by_node.values():
        if not 2 <= len(members) <= MAX_LOCKSTEP_GPUS:
            continue
        for track, series in members:
            together = 1
            for other, other_series in members:
                if other is track:
                    continue
                common = sorted(series.keys() & other_series.keys())
                r = pearson([series[k] for k in common], [other_series[k] for k in common])
                if r is not None and r >= LOCKSTEP_R:
                    together += 1
            if together > 1:
                out[(track.node, track.gpu)] = together
    return out
