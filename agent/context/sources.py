"""The interfaces between the GPU side and the host side: what a backend asks the host, and what it gets.

Vendor backends read the GPU; everything else about a GPU (its processes' host side, the node's
CPU and I/O pressure, the NIC, the job's own reports, who owns it) comes through a
:class:`HostSource`. The real node implements it in agent.context.local_host, the virtual fleet
in agent.backends.nvml_virtual, so the same backend code runs on both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

from agent.context.host.processes import ProcessFacts
from agent.model import Attribution, Dtype, HostSample, WorkloadReport


@dataclass(frozen=True, slots=True)
class HostFacts:
    """Everything the host adds to one GPU's sample. ``None`` means unknown."""

    processes: dict[int, ProcessFacts]
    host: HostSample | None = None
    net_tx_bytes_per_s: float | None = None
    net_rx_bytes_per_s: float | None = None
    net_congestion_per_s: float | None = None
    net_retransmits_per_s: float | None = None
    net_link_downs: int | None = None
    workload: WorkloadReport | None = None
    dtype: Dtype | None = None
    attribution: Attribution | None = None
    """Which job holds the GPU: scheduler knowledge lives on the host side, not in the driver."""


class HostSource(Protocol):
    def facts(self, gpu: str, pids: Sequence[int], now: float, *, bus_id: str | None = None,
              uuid: str | None = None) -> HostFacts:
        """Host-side facts for GPU ``gpu`` (PCI ``bus_id``, ``uuid``) whose processes are ``pids``.

        Must be cheap and never raise."""
        ...


class WorkloadSource(Protocol):
    """Where a GPU's workload report comes from: the job's client calls, or an inference server.

    Answers from memory (whatever was received or scraped in the background), so a collection
    cycle never waits on a job or a server.
    """

    def report_for(self, *, gpu: str, uuid: str | None, pids: Sequence[int], now: float) -> WorkloadReport | None:
        """The latest fresh report for GPU ``gpu`` (``uuid``) whose processes are ``pids`` (host PIDs),
        or None; ``now`` is wall-clock time. Must be cheap and never raise."""
        ...


class PodLookup(Protocol):
    """Kubernetes pods by device id (agent.context.attribution.kubelet.PodResourcesCache): answers from memory."""

    def pod_for(self, *device_ids: str | None) -> object | None:
        """A PodRef-like object with ``namespace``, ``pod`` and ``container``, or None."""
        ...


PodFromPid = Callable[[int], object | None]
"""Fallback pod lookup by a process's cgroup (agent.context.attribution.kubelet.pod_from_cgroup bound to a /proc root)."""
