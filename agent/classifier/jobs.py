"""Where each GPU stands among the ranks of its job: the :class:`JobContext` the rules read.

Ranks are found two ways. A job that reports names itself: its ranks' compute shares give the rank
skew (who waits for whom), and their reported step times the step spread. A job that reports
nothing still shows itself on the node: the ranks of one synchronous job wait in the same
collectives, so their power rises and falls together (lockstep), and that is what tells a
collective's wait from one GPU's own stall.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol, Sequence

from agent.classifier.fabric import pearson
from agent.model import GpuSample, WindowFeatures

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


LOCKSTEP_R = 0.6
"""Power correlation between two GPUs of a node, over the window, that makes them one job's ranks."""
MAX_LOCKSTEP_GPUS = 16
"""Most GPUs of one node compared pairwise: a node holds at most 16; a larger group (a virtual
fleet under one node name) is not a node, and the pairwise cost grows with its square."""


class _Track(Protocol):
    node: str
    gpu: str


def compute_share(f: WindowFeatures) -> float | None:
    """How much of the window a rank spent computing (tensor activity, else SM, else duty)."""
    if f.tensor_mean is not None:
        return f.tensor_mean
    if f.sm_busy is not None and f.duty is not None:
        return f.sm_busy * f.duty
    return None


def _mean(values: Sequence[float]) -> float:
    """The mean of positive ``values`` without an intermediate overflow (scaled by the largest first):
    a report can hold 1e308."""
    top = max(values)
    return top * (math.fsum(v / top for v in values) / len(values))


def _mean_step_time(window: Sequence[GpuSample]) -> float | None:
    times = [t for s in window if (w := s.workload) is not None and (t := w.step_time_s) and math.isfinite(t) and t > 0]
    return _mean(times) if times else None


def job_contexts(items: list[tuple[_Track, Sequence[GpuSample], WindowFeatures]]) -> dict[tuple[str, str], JobContext]:
    """A context for every GPU that has ranks beside it: by job name (cross-node in a trace), else by lockstep."""
    out: dict[tuple[str, str], JobContext] = {}
    jobs: dict[str, list[tuple[_Track, float | None, float | None]]] = {}
    for track, window, f in items:
        if f.workload is not None and f.workload.job:
            jobs.setdefault(f.workload.job, []).append((track, compute_share(f), _mean_step_time(window)))
    for job, ranks in jobs.items():
        if len(ranks) < 2:
            continue
        times = [st for _, _, st in ranks if st is not None]
        spread = (max(times) - min(times)) / _mean(times) if len(times) >= 2 else None
        shares = [share for _, share, _ in ranks if share is not None]
        top = max(shares, default=0.0)
        for track, share, _ in ranks:
            skew = 1.0 - share / top if share is not None and top > 0.0 else None
            peers = [1.0 - other / top for t2, other, _ in ranks if t2 is not track and other is not None and top > 0.0]
            out[(track.node, track.gpu)] = JobContext(
                job=job, ranks_seen=len(ranks), rank_skew=skew, peer_skew=max(peers, default=None) if skew is not None else None,
                is_busiest=skew == 0.0, step_spread=spread)
    for key, count in _lockstep(items).items():
        context = out.get(key)
        out[key] = JobContext(lockstep=count) if context is None else _with_lockstep(context, count)
    return out


def _with_lockstep(context: JobContext, count: int) -> JobContext:
    return JobContext(job=context.job, ranks_seen=context.ranks_seen, rank_skew=context.rank_skew,
                      peer_skew=context.peer_skew, is_busiest=context.is_busiest, step_spread=context.step_spread,
                      lockstep=count)


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
