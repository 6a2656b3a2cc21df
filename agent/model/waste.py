"""What waste is: the one definition every view, rule, alert and dashboard counts by.

A GPU is **wasted** while someone holds it and it does not do the work it is held for:

- ``idle_held``: the class is ``idle`` and a process holds device memory or the scheduler has allocated
  the GPU (detail ``idle_held``): nothing runs, and nobody else can have it. The whole window is lost.
- ``input_starved``: a process lives on the GPU but no kernel ran for part of the time (the data
  pipeline or the main loop cannot feed it). The time lost is the share without a kernel, ``1 - duty``.
- ``communication_jittered``: kernels sit resident waiting on peers (a straggler, congestion, a flapping
  link). The time lost is the share spent waiting, where a counter measures it (kernels resident but
  idle, power low while fabric bytes rise), else the share this rank waits for the slowest one.

Not waste: an idle GPU that nobody holds (detail ``idle_free``) is **spare** capacity, a figure for
capacity planning, never an alert or a "needs attention"; compute-, memory- and latency-bound GPUs are
busy with their own math or memory (how well is what MFU and MBU say); ``unknown`` is unknown.

Every figure of waste is one of two **measures**, and says which:

- **whole windows** (``windows``): a wasted GPU counts for the whole verdict window it was classified in.
  GPU counts ("3 of 8 GPUs wasted"), alerts and the fleet report's wasted GPU-hours use it; it is an upper
  bound on the time lost.
- **lost time** (``lost``): the share of that time that was actually lost, the figure a verdict's reasons
  give ("no kernel ran in 46% of the time"). A headline next to such reasons uses this measure.

Lives in the model because every reader needs it: the exporters (the ``waste`` label), the views, the
fleet report, and through the exported label the recording rules, alerts and dashboards.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from agent.model.verdict import Verdict

WasteKind = Literal["idle_held", "input_starved", "communication_jittered"]
WASTE_KINDS: tuple[WasteKind, ...] = ("idle_held", "input_starved", "communication_jittered")
"""The kinds of waste, in the order views list them."""
NOT_WASTED = "none"
SPARE = "spare"
"""An idle GPU nobody holds: capacity, not waste."""
SPARE_DETAIL = "idle_free"
"""The detail code of an idle GPU nobody holds (:data:`SPARE`); an idle GPU with any other detail is held. Readers
that have only a store's series (the fleet report's PromQL) tell the two apart by it."""
WASTE_LABELS: tuple[str, ...] = (*WASTE_KINDS, SPARE, NOT_WASTED)
"""Every value the exported ``waste`` label takes: a bounded set."""
WASTED_CLASSES: tuple[str, ...] = ("idle", "input_starved", "communication_jittered")
"""The classes whose GPUs can be wasted (``idle`` only when held: :func:`waste_of` decides)."""

Measure = Literal["windows", "lost"]
MEASURES: dict[Measure, str] = {
    "windows": "whole verdict windows: a wasted GPU counts for the whole window it was classified in (an upper bound)",
    "lost": "time lost: the share of the time no kernel ran (starved) or kernels waited on peers (jittered)",
}
"""What each measure counts, as views word it beside a figure."""


@dataclass(frozen=True, slots=True)
class Waste:
    """Whether one verdict's GPU is wasted, how, and how much of its window was lost."""

    label: str
    """One of :data:`WASTE_LABELS`: a waste kind, ``spare`` or ``none``."""
    lost_fraction: float | None
    """Share of the window's time lost (0..1): 1 for a held idle GPU, ``1 - duty`` when starved, the waiting
    share when jittered; 0 when not wasted; None when jittered and no counter measures the wait."""

    @property
    def wasted(self) -> bool:
        return self.label in WASTE_KINDS


def waste_of(verdict: Verdict) -> Waste:
    """The waste of one verdict's GPU (by its published class and detail)."""
    cls, f = verdict.cls, verdict.features
    if cls == "idle":
        if verdict.detail == SPARE_DETAIL:
            return Waste(SPARE, 0.0)
        return Waste("idle_held", 1.0)
    if cls == "input_starved":
        return Waste("input_starved", _share(1.0 - f.duty) if f.duty is not None else None)
    if cls == "communication_jittered":
        return Waste("communication_jittered", _jitter_lost(verdict))
    return Waste(NOT_WASTED, 0.0)


def _jitter_lost(verdict: Verdict) -> float | None:
    """The share of time spent waiting on peers: the counters' measure of it, else the rank's skew."""
    f = verdict.features
    measured = [x for x in (f.comm_wait_fraction, f.fabric_wait_fraction) if x]
    if measured:
        return _share(max(measured))
    if verdict.detail == "straggler_victim" and verdict.rank_skew is not None:
        return _share(verdict.rank_skew)
    return None


def _share(value: float) -> float:
    return min(1.0, max(0.0, value))


def is_wasted(verdict: Verdict) -> bool:
    return waste_of(verdict).wasted
