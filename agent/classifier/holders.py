"""A verdict per holder of a shared GPU, where one can be had: pure functions over the holders' shares.

The GPU's own verdict judges the whole device, so on a time-sliced GPU one busy trainer hides a pod
that holds 20 GiB and never launches a kernel: the GPU reads compute-bound, the waste is invisible.
Per holder, two cases can be judged from what the driver gives per process:

* a holder that held device memory with no SM time for the whole window is ``idle_held`` for itself,
  whatever its neighbours do (the waste a shared GPU hides);
* a holder with its own workload report (agent.context.attribution.holders.with_holder_reports) gets its
  own MFU and MBU from it, and its own class from where they put it on the roofline once divided by its SM
  share (its busy-normalised utilisation, as the GPU's own rules normalise by the duty cycle): compute-bound
  or memory-bound past the same entry roofs and lead (agent.classifier.thresholds), else latency-bound;
* the only holder with SM time takes the GPU's class, since the GPU's counters are then its own.

Every other holder gets no class (None): the GPU's counters mix them, and nothing per holder separates
them. Called once per cycle by the collector (agent.collector.holders) after the GPU verdicts.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any, Sequence

from agent.classifier.roofline import DEFAULT_DTYPE, workload_utilisation
from agent.classifier.thresholds import DEFAULT_THRESHOLDS, Thresholds
from agent.model.holders import HolderReport, HolderShare

IDLE_HELD = "idle_held"


def reported_figures(report: HolderReport | None, spec: Any) -> tuple[float | None, float | None]:
    """(MFU, MBU) of a holder's own report against the GPU's peaks: the classifier's one formula
    (agent.classifier.roofline.workload_utilisation); None where the report or the peak lacks a figure."""
    if report is None or spec is None:
        return None, None
    dtype = report.dtype or DEFAULT_DTYPE
    mfu, mbu, _ = workload_utilisation(SimpleNamespace(workload=report),  # type: ignore[arg-type]
                                       spec.peak_flops.get(dtype), spec.mem_bandwidth_bytes_per_s, dtype)
    return mfu, mbu


def reported_class(mfu: float | None, mbu: float | None, sm_share: float | None,
                   t: Thresholds = DEFAULT_THRESHOLDS) -> str | None:
    """The roofline class of a holder from its own MFU and MBU over its SM share (unknown share: over 1)."""
    if mfu is None and mbu is None:
        return None
    share = sm_share if sm_share is not None and sm_share > 0.0 else 1.0
    u_c = min(1.0, mfu / share) if mfu is not None else None
    u_m = min(1.0, mbu / share) if mbu is not None else None
    if u_c is not None and u_c >= t.dominant_roof and u_c - (u_m or 0.0) >= t.roof_margin:
        return "compute_bound"
    if u_m is not None and u_m >= t.dominant_memory_roof and u_m - (u_c or 0.0) >= t.roof_margin:
        return "memory_bound"
    return "latency_bound"


def holder_verdict(share: HolderShare, *, now: float, window_s: float, gpu_class: str | None,
                   only_busy: bool) -> str | None:
    """The class of one holder: ``idle_held`` after a whole window of memory and no SM time, the GPU's
    class for the only busy holder, else None."""
    if share.idle_since is not None and now - share.idle_since >= window_s:
        return IDLE_HELD
    if only_busy and gpu_class is not None and (share.sm_share or 0.0) > 0.0:
        return gpu_class
    return None


def judge_holders(shares: Sequence[HolderShare], *, now: float, window_s: float,
                  gpu_class: str | None, spec: Any = None) -> tuple[HolderShare, ...]:
    """``shares`` with each real holder's verdict set (``other`` and ``unattributed`` get none), and its own
    MFU where it has its own report (``spec``: the GPU's peaks, agent.model.specs)."""
    real = [s for s in shares if s.holder.kind in ("pod", "job", "process")]
    busy = [s for s in real if (s.sm_share or 0.0) > 0.0]
    out = []
    for share in shares:
        verdict = mfu = None
        if share.holder.kind in ("pod", "job", "process"):
            verdict = holder_verdict(share, now=now, window_s=window_s, gpu_class=gpu_class,
                                     only_busy=len(busy) == 1)
            mfu, mbu = reported_figures(share.holder.report, spec)
            if verdict != IDLE_HELD:  # a whole window without SM time outweighs any report
                verdict = reported_class(mfu, mbu, share.sm_share) or verdict
        out.append(dataclasses.replace(share, verdict=verdict, mfu=mfu))
    return tuple(out)
