"""What a node tells us outside the GPU driver: who the GPU processes are and how the host is doing.

Vendor backends read the GPU; the classifier also needs the host side (process trees, the CPU
their data loaders burn, I/O and CPU pressure, the NIC, the job's own reports) to tell a starved
GPU from a slow one, and the exporters need to know whose GPU it is. That side comes from a
:class:`HostSource`, so that the same backend code runs on a real node (:class:`LocalHost`)
and on the virtual fleet (a source that reads the simulation).

:class:`LocalHost` only composes; each signal has its own module: process trees
(agent.context.host.processes), node CPU/PSI (agent.context.host.node_stats), Slurm and visible devices
(agent.context.attribution.slurm), Kubernetes (agent.context.attribution.kubelet), NIC counters (agent.context.host.infiniband), and workload
reports (agent.context.workload.report_store, agent.context.workload.inference.scraper) behind :class:`WorkloadSource`.
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable, Sequence

from agent.context.attribution.dra import DraNames
from agent.context.attribution.holders import gpu_holders, with_holder_reports
from agent.context.attribution.slurm import ProcessJob, process_job
from agent.context.host.infiniband import CONGESTION_COUNTERS, RETRANSMIT_COUNTERS, PortMonitor, PortTotals
from agent.context.host.node_stats import NodeStats
from agent.context.host.processes import ProcessTracker
from agent.context.sources import HostFacts, PodFromPid, PodLookup, WorkloadSource
from agent.model import Attribution, NicPort, SourceState, WorkloadReport
from agent.model.redact import safe_url

__all__ = ["LocalHost"]

PROCESS_MEMORY_S = 60.0
"""How long a process's job lookup and baselines are kept after no GPU lists it any more."""


class LocalHost:
    """The real host. Figures shared by all GPUs (node stats, NIC ports) are read at most once per
    ``min_refresh_s``; per-process rates are deltas since the previous read of that process."""

    def __init__(self, proc_root: str | Path = "/proc", min_refresh_s: float = 0.5, *,
                 sysfs_root: str | Path = "/sys", workloads: Sequence[WorkloadSource] = (),
                 pods: PodLookup | None = None, pod_from_pid: PodFromPid | None = None,
                 clock: Callable[[], float] = time.monotonic, node_stats: NodeStats | None = None) -> None:
        """``node_stats`` replaces the node's CPU and PSI reader over ``proc_root``: a test of real
        processes gives the node a known load this way, whatever else the machine it runs on runs."""
        self._proc_root = Path(proc_root)
        self._clock = clock
        self._ports = PortMonitor(sysfs_root, min_refresh_s)
        self._stats = node_stats or NodeStats(proc_root, min_refresh_s=min_refresh_s, clock=clock)
        self._tracker = ProcessTracker(proc_root, cgroup_root=Path(sysfs_root) / "fs" / "cgroup",
                                       min_refresh_s=min_refresh_s, clock=clock)
        self._workloads = tuple(workloads)
        self._pods = pods
        self._pod_from_pid = pod_from_pid
        self._lock = threading.Lock()
        self._jobs: dict[int, tuple[ProcessJob, float]] = {}
        """pid -> (its job, last asked): read once per process, misses included, since a process
        never changes job and an invisible one (another PID namespace) stays invisible."""
        self._pod_of_pid: dict[int, object | None] = {}
        self._dra = DraNames(proc_root, sysfs_root)

    def facts(self, gpu: str, pids: Sequence[int], now: float, *, bus_id: str | None = None,
              uuid: str | None = None) -> HostFacts:
        with self._lock:
            processes = {pid: self._tracker.facts(pid) for pid in pids}
            self._tracker.forget(set(pids), PROCESS_MEMORY_S)
            attribution = self._attribution(gpu, uuid, bus_id, pids)
        host = self._stats.sample()
        self._ports.refresh()
        port = self._ports.port_for_gpu(bus_id)
        workload = self._workload(gpu, uuid, pids, now)
        if workload is not None and workload.job and (attribution is None or attribution.job_id is None):
            attribution = replace(attribution or Attribution(), job_id=workload.job)
        # a shared GPU's holders each with the report matched to their own PIDs (issue 47)
        attribution = with_holder_reports(attribution, lambda ids: self._workload(gpu, uuid, ids, now))
        return HostFacts(processes=processes, host=host, attribution=attribution, workload=workload,
                         dtype=workload.dtype if workload is not None else None, **_port_facts(port))

    def close(self) -> None:
        """Stop the background sources this host was given (kubelet cache, inference scraper)."""
        for source in (*self._workloads, self._pods):
            close = getattr(source, "close", None)
            if close is not None:
                try:
                    close()
                except Exception:  # noqa: BLE001 - shutting down; nothing to recover
                    pass

    def source_states(self, now: float) -> tuple[SourceState, ...]:
        """Each inference endpoint's state (``inference <url>``): up while its last scrape worked."""
        out: list[SourceState] = []
        for source in self._workloads:
            status = getattr(source, "status", None)  # the inference scraper's; report stores have none
            if not callable(status):
                continue
            try:
                endpoints = status()
            except Exception:  # noqa: BLE001 - a state is an extra
                continue
            for endpoint in endpoints if isinstance(endpoints, tuple) else ():
                url = getattr(endpoint, "url", None)
                if url is not None:
                    # Up, the detail also says how many lines of the body were unreadable (and the first).
                    notes = (endpoint.error, getattr(endpoint, "skipped_note", None) if endpoint.up else None)
                    out.append(SourceState(f"inference {safe_url(url)}", "up" if endpoint.up else "down",
                                           "; ".join(n for n in notes if n) or None))
        return tuple(out)

    def nic_ports(self) -> tuple[NicPort, ...]:
        """Every port's totals as of the last refresh (the GPUs' reads refresh them)."""
        return tuple(
            NicPort(device=p.device, port=p.port, link_layer=p.link_layer, active=p.active,
                    rate_bytes_per_s=p.rate_gbps * 1e9 / 8 if p.rate_gbps is not None else None,
                    tx_bytes=p.tx_bytes, rx_bytes=p.rx_bytes, events=dict(p.events))
            for p in self._ports.refresh())

    def _workload(self, gpu: str, uuid: str | None, pids: Sequence[int], now: float) -> WorkloadReport | None:
        for source in self._workloads:
            try:
                report = source.report_for(gpu=gpu, uuid=uuid, pids=pids, now=now)
            except Exception:  # noqa: BLE001 - a report is an extra; never lose a GPU sample over it
                report = None
            if report is not None:
                return report
        return None

    # -- attribution ----------------------------------------------------------------------------

    def _job(self, pid: int, t: float) -> ProcessJob:
        cached = self._jobs.get(pid)
        job = cached[0] if cached is not None else process_job(pid, self._proc_root)
        self._jobs[pid] = (job, t)
        return job

    def _attribution(self, gpu: str, uuid: str | None, bus_id: str | None, pids: Sequence[int]) -> Attribution | None:
        """The job of the GPU's first process that has one; else the job whose environment names this
        GPU (allocated but unused); plus its pod from the kubelet, else from the process's cgroup."""
        t = self._clock()
        jobs = [self._job(pid, t) for pid in pids]
        for pid in [p for p, (_, seen) in self._jobs.items() if t - seen > PROCESS_MEMORY_S]:
            del self._jobs[pid]  # not reported by any GPU for a minute: gone (or its PID reused later)
            self._pod_of_pid.pop(pid, None)
        job = next((j for j in jobs if j.job_id is not None), None)
        if job is None:
            refs = {f"index:{gpu}"} | ({f"uuid:{uuid.upper()}"} if uuid else set())
            job = next((j for j, _ in self._jobs.values() if refs & set(j.gpus)), None)
        pod_refs = self._pod_refs(gpu, uuid, bus_id)
        pod = pod_refs[0] if pod_refs else None
        if pod is None and self._pod_from_pid is not None:
            pod = next((p for pid in pids if (p := self._pod_from(pid)) is not None), None)
        holders = gpu_holders(pod_refs, pids, pod_of=self._pod_from, job_of=lambda pid: self._job(pid, t))
        if job is None and pod is None and len(holders) < 2:
            return None
        return Attribution(
            job_id=job.job_id if job else None, user=job.user if job else None,
            partition=job.partition if job else None, account=job.account if job else None,
            namespace=getattr(pod, "namespace", None),
            pod=getattr(pod, "pod", None), container=getattr(pod, "container", None), holders=holders or None)

    def _pod_refs(self, gpu: str, uuid: str | None, bus_id: str | None) -> tuple[object, ...]:
        """Every pod the kubelet gave this GPU to: by UUID or PCI address, then by the names DRA drivers give a
        whole GPU (a MIG instance or partition shares its parent's PCI address, so it is asked by UUID only)."""
        if self._pods is None:
            return ()
        ids = (uuid, bus_id, *(() if "/" in gpu else self._dra.names(bus_id)))
        pods_for = getattr(self._pods, "pods_for", None)
        if pods_for is not None:
            return tuple(pods_for(*ids))
        pod = self._pods.pod_for(*ids)
        return (pod,) if pod is not None else ()

    def _pod_from(self, pid: int) -> object | None:
        if pid not in self._pod_of_pid:
            try:
                self._pod_of_pid[pid] = self._pod_from_pid(pid) if self._pod_from_pid else None
            except Exception:  # noqa: BLE001 - a fallback; unknown is fine
                self._pod_of_pid[pid] = None
        return self._pod_of_pid[pid]


def _port_facts(port: PortTotals | None) -> dict[str, float | int | None]:
    if port is None:
        return {}
    rates = port.event_rates
    congestion = [rates[n] for n in CONGESTION_COUNTERS if n in rates]
    retransmits = [rates[n] for n in RETRANSMIT_COUNTERS if n in rates]
    return {
        "net_tx_bytes_per_s": port.tx_bytes_per_s, "net_rx_bytes_per_s": port.rx_bytes_per_s,
        "net_congestion_per_s": sum(congestion) if congestion else None,
        "net_retransmits_per_s": sum(retransmits) if retransmits else None,
        "net_link_downs": int(port.event_deltas["link_downed"]) if "link_downed" in port.event_deltas else None,
    }
