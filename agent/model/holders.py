"""Who holds a shared GPU, and each holder's share of it: the vendor-neutral types and the arithmetic.

A GPU is *shared* when more than one holder is on it: pods given time-sliced replicas of it
(``GPU-…::n``, ``<pci>-slice-n``, ``…/vgpuN``) or the same device through a DRA claim, MPS clients,
or plain processes of different jobs. No GPU has a per-holder energy or SM counter, so every share
here is an **estimate** from what the driver does give per process (SM time, memory) and the
GPU's own energy counter; docs/attribution.md says how each is computed and how wrong it can be.

The energy split is exact by construction: it works in whole microjoules, each holder gets the
floor of its part, and what is left is the ``unattributed`` remainder, so the holders' energy plus
the remainder equals the GPU's energy counter step to the microjoule (a test holds it over every
virtual scenario).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

HolderKind = Literal["pod", "job", "process", "other", "unattributed"]
"""``pod``: a Kubernetes pod/container; ``job``: a Slurm (or reported) job; ``process``: a process that is
neither (an MPS client, a plain process); ``other``: the holders past the largest N, summed;
``unattributed``: what no holder gets (the busy energy no holder's SM time explains, and the idle
floor of a GPU nobody holds)."""

HolderVia = Literal["device-plugin", "time-slicing", "dra", "cgroup", "slurm", "process", "mps"]
"""How the holder was found: a device-plugin device, a time-sliced replica of one, a DRA claim, a
process's cgroup, its Slurm job, only as a process the driver lists, or as a process the driver lists as
an MPS client (NVML's MPS compute-process list)."""

MICROJOULES_PER_JOULE = 1_000_000


@dataclass(frozen=True, slots=True, kw_only=True)
class HolderReport:
    """The figures of a holder's own workload report that its MFU and MBU need (agent.model.WorkloadReport's,
    copied: that module imports this one). Set only on a shared GPU, for a holder whose own PIDs a report
    was matched to (agent.context.attribution.holders.with_holder_reports)."""

    job: str | None = None
    world_size: int | None = None
    step_time_s: float | None = None
    tokens_per_s: float | None = None
    flops_per_token: float | None = None
    model_bytes: float | None = None
    dtype: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Holder:
    """One holder of a GPU with the host PIDs of its processes on that GPU (none: allocated, no context)."""

    kind: HolderKind
    via: HolderVia | None = None
    namespace: str | None = None
    pod: str | None = None
    container: str | None = None
    job_id: str | None = None
    claim: str | None = None
    """The DRA claim as ``namespace/name``, for a holder found through one."""
    user: str | None = None
    """Who is billed for it: a job holder's Slurm job user, a process holder's owner. None for a pod: Kubernetes
    has no user per pod (its namespace is what a pod is billed to)."""
    account: str | None = None
    """A job holder's Slurm account (``SLURM_JOB_ACCOUNT``); None for every other holder."""
    pids: tuple[int, ...] = ()
    report: HolderReport | None = None
    """Its own workload report, on a shared GPU, where one was matched to its PIDs."""

    @property
    def key(self) -> str:
        """A stable identity, also the ``holder`` label: ``ns/pod/container``, ``job:<id>``, ``pid:<n>``."""
        if self.kind == "pod":
            return "/".join(part or "" for part in (self.namespace, self.pod, self.container))
        if self.kind == "job":
            return f"job:{self.job_id or ''}"
        if self.kind == "process":
            return f"pid:{self.pids[0]}" if self.pids else "pid:"
        return self.kind


@dataclass(frozen=True, slots=True, kw_only=True)
class HolderShare:
    """One holder's share of a shared GPU over the last interval, and its energy since the agent started.

    Every figure is an estimate (no GPU counts energy or SM time per holder): ``sm_share`` is the sum of
    its processes' SM-time shares (NVML process utilisation; AMD compute-unit occupancy as a weight),
    ``energy_j_total`` its busy energy by SM share plus its even part of the idle floor.
    """

    holder: Holder
    sm_share: float | None = None
    """Share of the GPU's SM time this holder's processes used (None: the driver gave no per-process figure)."""
    memory_bytes: int | None = None
    """Device memory its processes hold (None: unknown; 0: allocated, no context)."""
    power_w: float | None = None
    """Its estimated energy over the last interval divided by the interval."""
    energy_j_total: float = 0.0
    """Estimated energy since the agent started, while it was among the GPU's largest holders."""
    idle_since: float | None = None
    """Since when (sample time) it has held memory with no SM time; None while it computes or holds nothing."""
    verdict: str | None = None
    """Its own class where one can be had: ``idle_held``; from its own workload report; or the GPU's class
    when it is the only busy holder (agent.classifier.holders)."""
    mfu: float | None = None
    """Its own MFU, from its own workload report (tokens/s x FLOPs/token / (world size x peak)); None without one."""


@dataclass(frozen=True, slots=True, kw_only=True)
class EnergySplit:
    """One interval's energy of one GPU split over its holders, in whole microjoules."""

    total_uj: int
    by_holder: tuple[int, ...]
    """In the order of the holders given."""
    unattributed_uj: int


def holder_weights(sm_shares: Sequence[float | None]) -> tuple[float, ...] | None:
    """Each holder's weight in the busy energy: its SM-time share; None when no holder has a figure."""
    if all(share is None for share in sm_shares):
        return None
    return tuple(max(0.0, share or 0.0) for share in sm_shares)


def split_energy(total_uj: int, busy_ratio: float | None, sm_shares: Sequence[float | None],
                 idle_shares: Sequence[float] | None = None) -> EnergySplit:
    """Split ``total_uj`` (the GPU's energy-counter step) over holders with ``sm_shares``.

    The busy part (``busy_ratio`` of the step, the GPU's graphics-engine activity; without one, the sum
    of the holders' SM shares) goes to the holders in proportion to their SM share; the idle floor (the
    rest) evenly to every holder, since each keeps the GPU allocated, or, given ``idle_shares``, by those
    shares of the whole floor (MIG instances: each its fraction of the GPU's compute slices, so the
    unconfigured slices' part stays unattributed; agent.collector.mig_energy). What the floors of integer
    division leave, and the busy part when no holder has an SM figure, is the unattributed remainder:
    ``sum(by_holder) + unattributed_uj == total_uj`` always.
    """
    total_uj = max(0, int(total_uj))
    count = len(sm_shares)
    if count == 0 or total_uj == 0:
        return EnergySplit(total_uj=total_uj, by_holder=(0,) * count, unattributed_uj=total_uj)
    weights = holder_weights(sm_shares)
    weight_sum = sum(weights) if weights is not None else 0.0
    busy = busy_ratio if busy_ratio is not None else min(1.0, weight_sum)
    busy = min(1.0, max(0.0, busy))
    busy_uj = round(total_uj * busy)  # at most total_uj; round: 7 x 1/7 busy is the whole step, not 1 µJ short

    def floors(amount: int, shares: Sequence[float]) -> list[int]:
        """Each share of ``amount`` in whole µJ, never more than ``amount`` in all: floored after a 1e-6 nudge
        (1/7 x 7 µJ is 0.99999... in floats), any excess of the nudge taken back from the largest part."""
        out = [int(amount * share + 1e-6) for share in shares]
        excess = sum(out) - amount
        if excess > 0:
            out[out.index(max(out))] -= excess
        return out

    if idle_shares is None:
        idle_parts = [(total_uj - busy_uj) // count] * count
    else:  # each its share of the floor: shares past 1 in all are scaled down, so the parts never exceed it
        shares = [min(1.0, max(0.0, share)) for share in idle_shares]
        scale = max(1.0, sum(shares))
        idle_parts = floors(total_uj - busy_uj, [share / scale for share in shares])
    busy_parts = (floors(busy_uj, [weight / weight_sum for weight in weights])
                  if weights is not None and weight_sum > 0.0 else [0] * count)
    parts = [idle + busy_part for idle, busy_part in zip(idle_parts, busy_parts)]
    attributed = sum(parts)
    return EnergySplit(total_uj=total_uj, by_holder=tuple(parts), unattributed_uj=total_uj - attributed)
