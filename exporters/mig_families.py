"""The MIG boards' own series: each parent GPU's energy its instances were not given.

A GPU in MIG mode is exported as its instances, each with its estimated share of the board's energy as its
``roofwatch_gpu_energy_joules_total``; what no instance was given (agent.model.mig) is one series per parent,
labelled like a GPU with the parent's index and UUID, so instances + remainder is the board's energy. A node
without MIG has none of these series.
"""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily

from agent.model.mig import MigParentEnergy
from exporters import metrics as m
from exporters.families import Families


def mig_unattributed_family(fam: Families, node: str, parents: tuple[MigParentEnergy, ...]) -> CounterMetricFamily:
    """``roofwatch_gpu_mig_unattributed_energy_joules_total`` per MIG parent (the extra ``gpu_labels`` empty: a
    board held by several pods has no one pod)."""
    family = fam.counter(m.MIG_UNATTRIBUTED_ENERGY)
    for parent in parents:
        family.add_metric([node, parent.gpu, parent.uuid] + [""] * len(fam.extra), parent.unattributed_j)
    return family
