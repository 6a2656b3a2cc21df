"""Holders of a shared GPU: who they are, and each one's estimated share of SM time, memory and energy.

Exported only for a GPU with two holders or more (time-sliced pods, DRA claims of one device, MPS
clients, processes of different jobs), at most ``max_holders_per_gpu`` holders each plus ``other`` and
``unattributed``, so a whole-GPU node keeps its series count. The ``holder`` label is the holder's key:
``namespace/pod/container``, ``job:<id>``, ``pid:<n>``, ``other`` or ``unattributed``. Every value is an
estimate: no GPU counts SM time or energy per holder (docs/attribution.md, "Shared GPUs").
"""

from __future__ import annotations

from exporters.metrics.definition import MetricDef
from exporters.metrics.labels import GPU_LABELS

_HOLDER = GPU_LABELS + ("holder",)
_NV_SM = "nvmlDeviceGetProcessUtilization per process, summed per holder"
_AMD_SM = "cu_occupancy per process as a weight of the GPU's activity"
_SPLIT = "the energy counter's step: busy part by SM share, idle floor evenly (estimate)"

HOLDER_INFO = MetricDef(
    "roofwatch_gpu_holder_info", "info", "",
    "A holder of a shared GPU and how it was found (via: device-plugin, time-slicing, dra, cgroup, slurm, process, mps); "
    "user and account: a Slurm job's user and account, a process's owner (pods have neither).",
    _HOLDER + ("kind", "via", "namespace", "pod", "container", "job_id", "claim", "user", "account"),
    nvidia="kubelet pod-resources (devices, DRA claims), the process's cgroup and Slurm job",
    amd="kubelet pod-resources (devices, DRA claims), the process's cgroup and Slurm job", virtual="scenario holders",
)
HOLDER_SM = MetricDef(
    "roofwatch_gpu_holder_sm_share_ratio", "gauge", "ratio",
    "Estimated share of the shared GPU's SM time one holder's processes used over the interval.",
    _HOLDER, nvidia=_NV_SM, amd=_AMD_SM,
)
HOLDER_MEMORY = MetricDef(
    "roofwatch_gpu_holder_memory_used_bytes", "gauge", "bytes",
    "Device memory one holder's processes hold on the shared GPU (0: allocated, no context).",
    _HOLDER, nvidia="usedGpuMemory per process, summed", amd="memory_usage.vram_mem per process, summed",
)
HOLDER_POWER = MetricDef(
    "roofwatch_gpu_holder_power_watts", "gauge", "watts",
    "Estimated power of one holder over the last interval (its energy share divided by the interval).",
    _HOLDER, nvidia=_SPLIT, amd=_SPLIT,
)
HOLDER_ENERGY = MetricDef(
    "roofwatch_gpu_holder_energy_joules_total", "counter", "joules",
    "Estimated energy of one holder since the agent started; with other and unattributed it adds up to the "
    "GPU's energy over the time it was shared.",
    _HOLDER, nvidia=_SPLIT, amd=_SPLIT,
)
HOLDER_CLASS = MetricDef(
    "roofwatch_gpu_holder_class", "gauge", "",
    "A holder's own class where one can be had (1): idle_held after a window of memory and no SM time, "
    "the class its own workload report gives, or the GPU's class for its only busy holder.",
    _HOLDER + ("class",), nvidia="per-process SM time and memory over the window",
    amd="per-process CU occupancy and memory over the window",
)

HOLDER_MFU = MetricDef(
    "roofwatch_gpu_holder_mfu_ratio", "gauge", "ratio",
    "A holder's own MFU from its own workload report (tokens/s x FLOPs/token / (world size x the GPU's peak)); only "
    "for a holder with a report of its own on a GPU whose peak is known.",
    _HOLDER, nvidia="the holder's own workload report over the GPU's catalogued peak",
    amd="the holder's own workload report over the GPU's catalogued peak", virtual="scenario holders' reports",
)

HOLDER_METRICS = (HOLDER_INFO, HOLDER_SM, HOLDER_MEMORY, HOLDER_POWER, HOLDER_ENERGY, HOLDER_CLASS, HOLDER_MFU)
