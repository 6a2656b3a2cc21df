"""Step 1 of an evaluation: one GPU's window reduced, once, to the record every rule reads.

The window (:func:`select_window`: the short window, cut at a phase change), its features
(agent.classifier.features), its communication evidence from power and fabric bytes
(agent.classifier.fabric) and the stand-ins for a missing compute counter (the job's own MFU, the
power the GPU draws between waits) are computed here and nowhere else; the job context joins once
every GPU of the evaluation has its features (agent.classifier.jobs). The rules
(agent.classifier.rules) score this :class:`Evidence`, the decision (agent.classifier.decision) picks
a class from the scores, and the explanation (agent.classifier.explain) words the evidence behind it:
no later step goes back to the samples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol, Sequence

from agent.classifier.fabric import fabric_evidence
from agent.classifier.features import features_with
from agent.classifier.jobs import JobContext, RankFigures, job_contexts
from agent.classifier.pauses import QuietTail, Stalls, quiet_tail, stalls
from agent.classifier.roofline import measure
from agent.classifier.thresholds import Thresholds
from agent.model import GpuSample, GpuSpec, Roofline, WindowFeatures
from agent.model.verdict import Reason

MIN_INTERVAL_S = 1e-3
"""Shortest sampling interval the windows are sized by: a replayed trace may claim 5e-324 s, which
made the expected sample count infinite (the reader refuses such traces too; this keeps the engine
whole whatever it is fed)."""
_MIN_DUTY = 0.05
"""Floor of the duty cycle when normalising by it (classification.md §7.2: max(d, 0.05))."""


class Track(Protocol):
    """One GPU as the engine keeps it: its identity, spec and long window of samples."""

    node: str
    gpu: str
    spec: GpuSpec | None
    samples: Sequence[GpuSample]


@dataclass(frozen=True, slots=True)
class Window:
    """The samples one evaluation reads for one GPU."""

    samples: list[GpuSample]
    """The short window (its recent half after a phase change)."""
    long: list[GpuSample]
    """Every sample of the long window up to the evaluation time (step statistics, power blocks)."""
    expected: int
    """Samples the short window should hold at the sampling interval."""
    start: float
    whole: list[GpuSample]
    """The whole short window, before any cut at a phase change (what a quiet tail is measured on)."""


def select_window(samples: Sequence[GpuSample], now: float, t: Thresholds) -> Window:
    """The short window before ``now`` out of a GPU's long window, halved at a phase change."""
    long_window = [s for s in samples if s.ts <= now]
    interval = min(max(_interval(long_window), MIN_INTERVAL_S), t.long_window_s)
    span = max(t.window_s, 3.0 * interval)
    window = [s for s in long_window if s.ts > now - span]
    expected = max(1, round(span / interval))
    start = now - span
    whole = window
    recent = split_at_change(window, t.phase_change_jump)
    if len(recent) < len(window):
        window, expected = list(recent), max(1, expected - expected // 2)
        start = window[0].ts - interval
    return Window(window, long_window, expected, start, whole)


def split_at_change(window: Sequence[GpuSample], jump: float) -> Sequence[GpuSample]:
    """The recent half of the window if the workload visibly changed between the halves.

    A window that straddles a phase change averages two workloads into one that never ran
    (idle + GEMM reads as a starved GEMM). When duty, tensor or DRAM activity differ by more
    than ``jump`` between the halves, only the recent half describes the GPU now.
    """
    half = len(window) // 2
    if half < 2:
        return window
    old, new = window[:half], window[half:]
    for name in ("gr_active", "tensor_active", "dram_active", "mem_busy"):
        a, b = _mean_of(old, name), _mean_of(new, name)
        if a is not None and b is not None and abs(a - b) > jump:
            return new
    return window


def _mean_of(samples: Sequence[GpuSample], name: str) -> float | None:
    values = [v for s in samples if (v := getattr(s, name)) is not None]
    return math.fsum(values) / len(values) if values else None


def _interval(samples: list[GpuSample]) -> float:
    """The sampling interval: what the samples say, else the median gap between them."""
    stated = [s.interval_s for s in samples[-10:] if s.interval_s]
    if stated:
        return sorted(stated)[len(stated) // 2]
    gaps = [b.ts - a.ts for a, b in zip(samples[-11:], samples[-10:]) if b.ts > a.ts]
    return sorted(gaps)[len(gaps) // 2] if gaps else 1.0


def gather(tracks: Sequence[Track], now: float, t: Thresholds,
           dtype: str | None = None) -> list[tuple[Track, Window, Evidence]]:
    """The evidence of every GPU at ``now``: each window and its features first, then the job contexts
    that compare the ranks of one job, then one record per GPU."""
    featured = []
    for track in tracks:
        window = select_window(track.samples, now, t)
        fabric = fabric_evidence(window.samples, window.long, track.spec, t)
        features = features_with(window.samples, window.long, track.spec, t, fabric)
        pauses = (quiet_tail(window.whole, t), stalls(window.samples, window.long, t))
        featured.append((track, window, pauses, *measure(features, track.spec, dtype)))
    contexts = job_contexts([RankFigures(track, window.samples, f, stall.window_share)
                             for track, window, (_, stall), f, _, _ in featured], t)
    return [(track, window, evidence_of(f, roofline, contexts.get((track.node, track.gpu), JobContext()),
                                        window.expected, t, notes, quiet, stall))
            for track, window, (quiet, stall), f, roofline, notes in featured]


@dataclass(frozen=True, slots=True)
class Evidence:
    """Everything one evaluation knows about one GPU's window, computed once: what the rules score and
    the explanation words."""

    features: WindowFeatures
    roofline: Roofline
    """Where the window sits on the GPU's roofline, its MFU and MBU (agent.classifier.roofline)."""
    job: JobContext
    expected: int
    """Samples the window should hold."""
    valid: float
    """Share of the expected samples whose duty counter was readable (scales the confidence)."""
    waiting: float | None
    """Share of the window spent waiting on peers: the larger of the comm-wait counters' share and the
    fabric waits seen by power and fabric bytes (None when neither is known)."""
    multi_gpu: bool
    """The GPU is a rank of a multi-GPU job: ranks seen beside it, a world size over 1, or a busy fabric."""
    communicating: bool
    """Its fabric (NVLink/XGMI, its NIC) carries collectives in this window (busier than 100 MB/s): its
    time-averaged tensor activity and whole-step MFU include the collectives' time (MoE all-to-alls run
    between every layer's experts), so neither alone says its kernels are small."""
    reported_compute: float | None
    """The job's MFU as a busy-normalised share of the compute roof (comparable with ``u_compute``)."""
    power_between_waits: float | None
    """What a communicating rank's compute draws: power over the samples that are not fabric waits, else
    its mean power (against its limit or TDP)."""
    proxy_power: float | None
    """The power that stands in for a compute counter: the power between waits where the GPU is seen
    waiting on the fabric (the spin is evidence of neither math nor small kernels), else the mean power."""
    proxy_power_between_waits: bool = False
    """Whether ``proxy_power`` is the power between fabric waits."""
    notes: tuple[Reason, ...] = ()
    """Why a figure the job reported is unknown (a unit error in its report), said with any class."""
    quiet: QuietTail = QuietTail(0.0)
    """The stretch without a kernel that ends the window, and what the host does meanwhile
    (agent.classifier.pauses): a burst followed by silence nothing asks to end is idle."""
    stalls: Stalls = Stalls()
    """The job's stops in the long window (a checkpoint every 30 s): those the short window holds are set
    apart, so the job keeps its class on the samples it works."""

    @property
    def working_duty(self) -> float | None:
        """The duty cycle the roofline and starvation rules read: over the reads outside a recognised stall,
        else the window's."""
        return self.stalls.working_duty if self.stalls.working_duty is not None else self.features.duty


def evidence_of(f: WindowFeatures, roofline: Roofline, job: JobContext, expected: int, t: Thresholds,
                notes: tuple[Reason, ...] = (), quiet: QuietTail = QuietTail(0.0),
                stalled: Stalls = Stalls()) -> Evidence:
    """The evidence record of one GPU's window, its job's context known."""
    expected = max(f.samples, expected)
    known_waits = [x for x in (f.comm_wait_fraction, f.fabric_wait_fraction, f.spin_wait_fraction) if x is not None]
    multi = (job.ranks_seen > 1 or job.lockstep > 1 or (f.workload is not None and (f.workload.world_size or 1) > 1)
             or f.link_active)
    reported = None
    if f.mfu_reported is not None and f.duty is not None:
        reported = f.mfu_reported / max(f.duty, _MIN_DUTY) / t.tensor_saturation
    fabric_waits = bool(f.fabric_wait_fraction) and f.working_power_ratio is not None
    return Evidence(
        features=f, roofline=roofline, job=job, expected=expected,
        valid=f.valid_fraction * f.samples / expected if expected else 0.0,
        waiting=max(known_waits) if known_waits else None,
        multi_gpu=multi,
        communicating=f.link_active,
        reported_compute=reported,
        power_between_waits=f.working_power_ratio or f.power_ratio,
        proxy_power=f.working_power_ratio if fabric_waits else f.power_ratio,
        proxy_power_between_waits=fabric_waits,
        notes=notes,
        quiet=quiet,
        stalls=stalled,
    )
