"""Node-wide host signals: CPU busy, I/O wait and PSI pressure.

A GPU starved by its input pipeline shows up here rather than on the GPU, so the classifier's
data-loader verdicts can be checked against these.
"""

from __future__ import annotations

from exporters.metrics.definition import MetricDef
from exporters.metrics.labels import NODE_LABELS

HOST_IOWAIT = MetricDef(
    "roofwatch_host_cpu_iowait_ratio", "gauge", "ratio", "Share of host CPU time spent waiting for I/O.",
    NODE_LABELS, nvidia="/proc/stat", amd="/proc/stat",
)
HOST_IO_PRESSURE = MetricDef(
    "roofwatch_host_io_pressure_ratio", "gauge", "ratio", "Share of time some task stalled on I/O (PSI some avg10).",
    NODE_LABELS, nvidia="/proc/pressure/io", amd="/proc/pressure/io",
)
HOST_CPU_PRESSURE = MetricDef(
    "roofwatch_host_cpu_pressure_ratio", "gauge", "ratio",
    "Share of time some runnable task waited for a CPU (PSI some avg10): loader workers short of cores.",
    NODE_LABELS, nvidia="/proc/pressure/cpu", amd="/proc/pressure/cpu",
)
HOST_CPU_UTILIZATION = MetricDef(
    "roofwatch_host_cpu_utilization_ratio", "gauge", "ratio", "Share of all host CPU time that was busy.",
    NODE_LABELS, nvidia="/proc/stat", amd="/proc/stat", virtual="—",
)
