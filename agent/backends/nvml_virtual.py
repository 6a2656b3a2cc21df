"""``nvml-virtual``: the real NVML backend over a fake NVIDIA driver that plays the virtual fleet.

This is how the NVML code path runs without a GPU, in ``roofwatch demo --backend nvml-virtual``
and in the tests: an independent copy of the real ``pynvml`` module calls a Python
implementation of libnvidia-ml's C functions (:mod:`agent.virtual.fake_nvml`), which reads the
same simulation the ``virtual`` backend serves. So both backends show the same GPUs doing the
same things, one of them through every NVML call, unit and error code a real node would see.

What NVML cannot know (process names and CPU, host I/O wait, NIC traffic, the job's own
reports) comes from the simulation's host side, as it would come from /proc and the workload
client on a real node.
"""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any, Sequence

from agent.backends.nvml.backend import NvmlBackend
from agent.context.attribution.holders import with_kubelet_holders
from agent.context.attribution.kubelet.devices import dra_key
from agent.context.host.processes import ProcessFacts
from agent.context.sources import HostFacts
from agent.model import GpuSample
from agent.virtual.backend import VirtualBackend

_PROCESS_FACTS = tuple(f.name for f in fields(ProcessFacts))


class SimulatedHost:
    """The host side of a simulated node: what /proc and the workload client would report."""

    def __init__(self, library: Any, pods: Any = None) -> None:
        """``pods``: a kubelet pod-resources cache (agent.context.attribution.kubelet), when the agent was given
        a kubelet socket: its pods join the simulated holders, as a real node's kubelet would name them."""
        self._library = library
        self._pods = pods

    def facts(self, gpu: str, pids: Sequence[int], now: float, *, bus_id: str | None = None,
              uuid: str | None = None) -> HostFacts:
        sample = self._library.latest_sample(gpu)
        if sample is None:
            return HostFacts(processes={})
        known = {p.pid: p for p in sample.processes or ()}
        processes = {pid: ProcessFacts(**{name: getattr(known[pid], name) for name in _PROCESS_FACTS})
                     for pid in pids if pid in known}
        return HostFacts(processes=processes, host=sample.host, net_tx_bytes_per_s=sample.net_tx_bytes_per_s,
                         net_rx_bytes_per_s=sample.net_rx_bytes_per_s, net_congestion_per_s=sample.net_congestion_per_s,
                         net_retransmits_per_s=sample.net_retransmits_per_s, net_link_downs=sample.net_link_downs,
                         workload=sample.workload, dtype=sample.dtype,
                         attribution=self._attribution(gpu, uuid, bus_id, sample.attribution))

    def _attribution(self, gpu: str, uuid: str | None, bus_id: str | None, own: Any) -> Any:
        """The scenario's holders as /proc knows them, completed by the kubelet's pods for this GPU (by UUID, PCI
        address, or the name NVIDIA's DRA driver gives it: ``gpu-<minor>``, the simulated node's minor being the
        index). An MPS client is a plain process here: only the driver's MPS list marks it (the NVML backend)."""
        own = without_mps_marks(own)
        if self._pods is None:
            return own
        try:
            refs = self._pods.pods_for(uuid, bus_id, *(() if "/" in gpu else (dra_key("gpu.nvidia.com", f"gpu-{gpu}"),)))
        except Exception:  # noqa: BLE001 - attribution is an extra; never lose the sample over it
            return own
        return with_kubelet_holders(own, refs)


def without_mps_marks(attribution: Any) -> Any:
    """``attribution`` with each ``via="mps"`` holder a plain process, as the host side sees it."""
    holders = getattr(attribution, "holders", None)
    if not holders or not any(h.via == "mps" for h in holders):
        return attribution
    return replace(attribution, holders=tuple(replace(h, via="process") if h.via == "mps" else h for h in holders))


class VirtualNvmlBackend(NvmlBackend):
    """:class:`NvmlBackend` on a fake driver; also offers the virtual backend's demo head start."""

    name = "nvml-virtual"

    def __init__(self, virtual: VirtualBackend, *, pods: Any = None, **kwargs: Any) -> None:
        from agent.virtual.fake_nvml import FakeNvmlLibrary, load_pynvml

        self.virtual = virtual
        self.node = virtual.node
        self.library = FakeNvmlLibrary(virtual)
        self._pods = pods
        kwargs.setdefault("host", SimulatedHost(self.library, pods))
        kwargs.setdefault("node", virtual.node)
        super().__init__(load_pynvml(self.library), **kwargs)

    def warm_samples(self, now: float, seconds: float, interval_s: float = 1.0) -> list[GpuSample]:
        return self.virtual.warm_samples(now, seconds, interval_s)

    def close(self) -> None:
        super().close()
        if self._pods is not None:
            self._pods.close()
        self.library.close()
        self.virtual.close()
