"""Who holds each GPU: its processes (memory, SM share, host CPU, I/O) and the job and pod they belong to.

The per-process series are the only open-ended ones (capped by ``max_processes_per_gpu``); the job
and pod ``_info`` families carry attribution for joins, so it need not be copied onto every series.
"""

from __future__ import annotations

from exporters.metrics.definition import MetricDef
from exporters.metrics.labels import GPU_LABELS

PROCESSES = MetricDef(
    "roofwatch_gpu_processes", "gauge", "processes", "Processes holding a context on this GPU.",
    GPU_LABELS, nvidia="nvmlDeviceGetComputeRunningProcesses", amd="amdsmi_get_gpu_process_list",
)
PROCESS_MEMORY = MetricDef(
    "roofwatch_gpu_process_memory_used_bytes", "gauge", "bytes",
    "Device memory held by one process (largest max_processes_per_gpu per GPU).",
    GPU_LABELS + ("pid", "process"), nvidia="usedGpuMemory", amd="memory_usage.vram_mem",
)
PROCESS_COMPUTE_UNITS = MetricDef(
    "roofwatch_gpu_process_compute_units", "gauge", "compute units",
    "Compute units one process's queues occupied at the read (AMD; same processes as the memory series).",
    GPU_LABELS + ("pid", "process"), nvidia="—", amd="cu_occupancy", virtual="—",
)
PROCESS_SM = MetricDef(
    "roofwatch_gpu_process_sm_utilization_ratio", "gauge", "ratio",
    "Share of SM time one process used over the interval (same processes as the memory series).",
    GPU_LABELS + ("pid", "process"), nvidia="nvmlDeviceGetProcessUtilization (last-seen timestamp)", amd="—",
)
_SLURM = ("Slurm job of the GPU's processes (cgroup path, else SLURM_JOB_*), the job whose SLURM_JOB_GPUS or "
          "*_VISIBLE_DEVICES names the GPU, else the job the workload reported")
JOB_INFO = MetricDef(
    "roofwatch_gpu_job_info", "info", "",
    "The job holding this GPU, busy or not; join on node, gpu, uuid to group any GPU series by job_id.",
    GPU_LABELS + ("job_id", "user", "partition", "account"), nvidia=_SLURM, amd=_SLURM, virtual="scenario job",
)
_KUBE = "kubelet pod-resources List (device id = GPU UUID / PCI address), else the process's cgroup"
POD_INFO = MetricDef(
    "roofwatch_gpu_pod_info", "info", "",
    "The Kubernetes pod and container this GPU is allocated to; join on node, gpu, uuid.",
    GPU_LABELS + ("namespace", "pod", "container"), nvidia=_KUBE, amd=_KUBE, virtual="—",
)
_PROC = "psutil over /proc"
PROCESS_CPU = MetricDef(
    "roofwatch_gpu_process_cpu_cores", "gauge", "cores",
    "CPU used by a GPU process (role=main) and by its child processes, e.g. data-loader workers (role=workers).",
    GPU_LABELS + ("pid", "process", "role"), nvidia=_PROC, amd=_PROC, virtual="simulated",
)
PROCESS_WORKERS = MetricDef(
    "roofwatch_gpu_process_workers", "gauge", "processes", "Live child processes of a GPU process (loader workers and helpers).",
    GPU_LABELS + ("pid", "process"), nvidia=_PROC, amd=_PROC, virtual="simulated",
)
PROCESS_CPU_LIMIT = MetricDef(
    "roofwatch_gpu_process_cpu_limit_cores", "gauge", "cores",
    "Cores a GPU process may use: its CPU affinity, capped by its cgroup cpu.max quota.",
    GPU_LABELS + ("pid", "process"), nvidia=_PROC + " and cgroup v2", amd=_PROC + " and cgroup v2", virtual="—",
)
PROCESS_RSS = MetricDef(
    "roofwatch_gpu_process_resident_memory_bytes", "gauge", "bytes", "Host memory resident for a GPU process (not its workers).",
    GPU_LABELS + ("pid", "process"), nvidia=_PROC, amd=_PROC, virtual="—",
)
PROCESS_IO = MetricDef(
    "roofwatch_gpu_process_io_bytes_per_second", "gauge", "bytes per second",
    "Storage reads and writes of a GPU process and its workers (needs privileges for other users' processes).",
    GPU_LABELS + ("pid", "process", "direction"), nvidia=_PROC, amd=_PROC, virtual="—",
)
PROCESS_INFO = MetricDef(
    "roofwatch_gpu_process_info", "info", "", "Owner of a GPU process.",
    GPU_LABELS + ("pid", "process", "user"), nvidia=_PROC, amd=_PROC, virtual="—",
)
