"""Per-GPU process and attribution series: who holds each GPU, and what its processes do on the host.

Process series are keyed by PID, so they are capped at ``max_processes_per_gpu`` per GPU (largest
device memory first) and vanish with the process, since every scrape rebuilds them from the
snapshot. The attribution info series carry ``node, gpu, uuid`` only (never the optional
``gpu_labels``), because they *are* where those labels come from.
"""

from __future__ import annotations

from prometheus_client.core import InfoMetricFamily, Metric

from agent.model import GpuSample
from exporters import metrics as m
from exporters.families import Families, add_known


class ProcessFamilies:
    """Collects the process and attribution families over all GPUs of one snapshot."""

    def __init__(self, fam: Families, max_processes: int) -> None:
        self._max = max_processes
        self.count = fam.gauge(m.PROCESSES)
        self.memory = fam.gauge(m.PROCESS_MEMORY)
        self.sm = fam.gauge(m.PROCESS_SM)
        self.compute_units = fam.gauge(m.PROCESS_COMPUTE_UNITS)
        self.cpu = fam.gauge(m.PROCESS_CPU)
        self.workers = fam.gauge(m.PROCESS_WORKERS)
        self.cpu_limit = fam.gauge(m.PROCESS_CPU_LIMIT)
        self.rss = fam.gauge(m.PROCESS_RSS)
        self.io = fam.gauge(m.PROCESS_IO)
        self.owner = InfoMetricFamily(m.PROCESS_INFO.family_name, m.PROCESS_INFO.help, labels=fam.names(m.PROCESS_MEMORY))
        self.job = InfoMetricFamily(m.JOB_INFO.family_name, m.JOB_INFO.help, labels=m.GPU_LABELS)
        self.pod = InfoMetricFamily(m.POD_INFO.family_name, m.POD_INFO.help, labels=m.GPU_LABELS)

    def add(self, labels: list[str], sample: GpuSample) -> None:
        """Series for one GPU that is up; ``labels`` are its GPU label values (with any extras)."""
        if sample.processes is not None:
            self.count.add_metric(labels, len(sample.processes))
            largest = sorted(sample.processes, key=lambda p: p.used_memory_bytes or 0, reverse=True)
            for proc in largest[: self._max]:
                key = labels + [str(proc.pid), m.clip_label(proc.name)]
                add_known(self.memory, key, proc.used_memory_bytes)
                add_known(self.sm, key, proc.sm_util)
                add_known(self.compute_units, key, proc.compute_units)
                add_known(self.cpu, key + ["main"], proc.cpu_main_cores)
                add_known(self.cpu, key + ["workers"], proc.cpu_workers_cores)
                add_known(self.workers, key, proc.workers)
                add_known(self.cpu_limit, key, proc.cpu_limit_cores)
                add_known(self.rss, key, proc.rss_bytes)
                add_known(self.io, key + ["read"], proc.io_read_bytes_per_s)
                add_known(self.io, key + ["write"], proc.io_write_bytes_per_s)
                if proc.user:
                    self.owner.add_metric(key, {"user": m.clip_label(proc.user)})
        who = sample.attribution
        if who is None:
            return
        gpu = labels[: len(m.GPU_LABELS)]
        if who.job_id:
            self.job.add_metric(gpu, _known(job_id=who.job_id, user=who.user, partition=who.partition,
                                               account=who.account))
        if who.pod:
            self.pod.add_metric(gpu, _known(namespace=who.namespace, pod=who.pod, container=who.container))

    def families(self) -> list[Metric]:
        return [self.count, self.memory, self.sm, self.compute_units, self.cpu, self.workers, self.cpu_limit, self.rss, self.io,
                self.owner, self.job, self.pod]


def _known(**values: str | None) -> dict[str, str]:
    """Info labels that are known (an empty label is the same as no label to Prometheus; leave it out)."""
    return {key: m.clip_label(value) for key, value in values.items() if value}


