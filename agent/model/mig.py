"""A GPU in MIG mode as one board: the energy its instances' estimates leave unattributed.

NVML counts energy per board, never per MIG instance. The collector splits the parent's counter step over its
instances by activity and compute slices (agent.collector.mig_energy); what no instance gets (the idle draw of
slices in no instance, integer-division leftovers, the slices of an instance that was not read) is kept here, per
parent, so that the instances' energy plus this remainder is the board's energy to the microjoule.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class MigParentEnergy:
    """One MIG parent GPU's energy no instance was given, since the agent started."""

    gpu: str
    """The parent GPU's index as a GPU id (``"3"`` for instances ``"3/1"``, ``"3/2"``...)."""
    uuid: str
    """The parent GPU's UUID (``GPU-...``); empty where the source does not name it."""
    unattributed_j: float
    """Joules of the board's counter given to no instance (only grows)."""
    instances: tuple[str, ...] = ()
    """The instances the board's energy is split over (GPU ids), for the views."""
