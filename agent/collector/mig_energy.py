"""Each MIG instance's share of its GPU's energy, interval by interval, and the board's unattributed remainder.

NVML counts energy per board, not per MIG instance: an instance's sample carries its parent's counter
(``GpuSample.parent_energy_j``) and no energy of its own. Once per collection cycle the instances read that cycle
are grouped by parent and the board's counter step is split over them, in whole microjoules, by the rule
docs/attribution.md states (``split_energy`` with slice fractions as idle shares):

* the *busy* part, the step x the board's activity (the sum over instances of busy ratio x the instance's
  fraction of the GPU's compute slices), to the instances in proportion to busy ratio x fraction;
* the *idle floor*, the rest, by slice fraction (a 3g instance keeps 3/7 of the board allocated);
* slices in no instance (or in an instance not read this cycle) and the integer-division leftovers to the board's
  unattributed remainder, so the instances' energy plus the remainder is the board's step, exactly.

The step has the reset and bounds handling of a GPU's own counter (agent.collector.counters.counter_step): a
counter that goes back is a restart, never negative energy; a step past what the board can draw is refused.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Mapping, Sequence

from agent.collector.counters import counter_step
from agent.collector.holders import busy_ratio
from agent.model import DeviceInfo, GpuSample
from agent.model.bounds import Rejection, energy_since, energy_step_bound_for, energy_step_rejection
from agent.model.holders import MICROJOULES_PER_JOULE, split_energy
from agent.model.mig import MigParentEnergy
from agent.model.specs.slices import mig_compute_slices, mig_total_slices

ParentOf = Callable[[str], "tuple[str, str] | None"]
"""A backend's ``mig_parent(gpu)``: (parent GPU id, parent UUID) of a MIG instance, None for a whole GPU."""


@dataclasses.dataclass(slots=True)
class _Board:
    """One MIG parent's counter between cycles and what its instances were not given."""

    gpu: str
    uuid: str
    last: GpuSample | None = None
    """The board's last counter reading, as a sample of the parent (ts, energy_j) for the bounds' helpers."""
    since: float | None = None
    """From when its next step can have accrued (agent.model.bounds.energy_since)."""
    remainder_uj: int = 0
    instances: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class MigCycle:
    """What one cycle's split changed: each split instance's energy total (J) and the board steps refused."""

    totals_j: dict[str, float]
    refused: tuple[tuple[str, Rejection, float], ...] = ()
    """(parent GPU id, the refused step, sample time) per board whose step the bounds refused."""


def slice_fraction(info: DeviceInfo) -> float | None:
    """The instance's fraction of its GPU's compute slices (``3g`` of 7: 3/7; ``1c.3g`` of 7: 1/7) from the name
    NVML (and dcgm-exporter) give a MIG device; None when the name says no profile."""
    slices = mig_compute_slices(info.model)
    if slices is None:
        return None
    return min(1.0, slices / mig_total_slices(info.spec.key if info.spec is not None else ""))


class MigEnergy:
    """The MIG boards of one node: each instance's estimated energy since start and each board's remainder."""

    def __init__(self, parents: Mapping[str, tuple[str, str]]) -> None:
        """``parents``: instance GPU id -> (parent GPU id, parent UUID), for the node's MIG instances."""
        self._parent_of = dict(parents)
        self._boards: dict[str, _Board] = {}
        self._totals_uj: dict[str, int] = {}

    @classmethod
    def of(cls, gpus: Sequence[str], parent_of: ParentOf | None) -> "MigEnergy":
        """The boards a backend names (``mig_parent``); none where it has no such method or it fails."""
        parents: dict[str, tuple[str, str]] = {}
        for gpu in gpus if parent_of is not None else ():
            try:
                parent = parent_of(gpu)
            except Exception:  # noqa: BLE001 - an extra: without it the instance simply has no energy estimate
                parent = None
            if parent is not None:
                parents[gpu] = (str(parent[0]), str(parent[1] or ""))
        return cls(parents)

    @property
    def instances(self) -> frozenset[str]:
        return frozenset(self._parent_of)

    def advance(self, fresh: Sequence[tuple[DeviceInfo, GpuSample]]) -> MigCycle:
        """Split each board's step over its instances read this cycle (``fresh``: their bounded samples)."""
        groups: dict[str, list[tuple[DeviceInfo, GpuSample]]] = {}
        for info, sample in fresh:
            parent = self._parent_of.get(info.gpu)
            if parent is not None and sample.parent_energy_j is not None:
                groups.setdefault(parent[0], []).append((info, sample))
        totals: dict[str, float] = {}
        refused: list[tuple[str, Rejection, float]] = []
        for parent_gpu, members in groups.items():
            uuid = self._parent_of[members[0][0].gpu][1]
            board = self._boards.setdefault(parent_gpu, _Board(parent_gpu, uuid))
            reading = GpuSample(ts=max(s.ts for _, s in members), gpu=parent_gpu, uuid=uuid,
                                energy_j=max(s.parent_energy_j or 0.0 for _, s in members))
            bound = energy_step_bound_for(reading, board.since, members[0][0].spec)  # an instance's TDP is the board's
            step_j, was_refused = counter_step(board.last.energy_j if board.last is not None else None,
                                               reading.energy_j or 0.0, bound)
            if was_refused:
                refused.append((parent_gpu, energy_step_rejection(board.last, reading, bound), reading.ts))
            step_uj = (_uj(reading.energy_j) - _uj(board.last.energy_j)) if step_j > 0 and board.last else 0
            board.since = energy_since(board.last, reading, board.since)
            board.last = reading
            board.instances = tuple(sorted({*board.instances, *(info.gpu for info, _ in members)}))
            fractions = [slice_fraction(info) or 0.0 for info, _ in members]
            weights = [None if (busy := busy_ratio(s)) is None else busy * f for (_, s), f in zip(members, fractions)]
            split = split_energy(step_uj, None, weights, idle_shares=fractions)
            board.remainder_uj += split.unattributed_uj
            for (info, _), part in zip(members, split.by_holder):
                self._totals_uj[info.gpu] = self._totals_uj.get(info.gpu, 0) + part
                totals[info.gpu] = self._totals_uj[info.gpu] / MICROJOULES_PER_JOULE
        return MigCycle(totals, tuple(refused))

    def parents(self) -> tuple[MigParentEnergy, ...]:
        """Every board read so far, with its remainder since start (the snapshot's ``mig_parents``)."""
        return tuple(MigParentEnergy(gpu=b.gpu, uuid=b.uuid, unattributed_j=b.remainder_uj / MICROJOULES_PER_JOULE,
                                     instances=b.instances) for b in self._boards.values())

    def totals_uj(self) -> tuple[dict[str, int], dict[str, int]]:
        """Every instance's total and every board's remainder, in µJ (for the sum check)."""
        return dict(self._totals_uj), {gpu: b.remainder_uj for gpu, b in self._boards.items()}


def _uj(joules: float | None) -> int:
    """Whole microjoules of a counter reading, so steps telescope exactly (no float drift across cycles)."""
    return round((joules or 0.0) * MICROJOULES_PER_JOULE)
