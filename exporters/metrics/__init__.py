"""The one table of every metric roofwatch exports, and how each is read from a snapshot.

``docs/metrics.md`` is checked against :data:`METRICS` by a test, and the Prometheus collector
builds its families from the same table, so the documentation, the exposition and the code
cannot drift apart.

Conventions (https://prometheus.io/docs/practices/naming/): one ``roofwatch_`` namespace, base
units (seconds, bytes, watts, hertz, joules), ``_ratio`` for 0..1, ``_total`` for counters,
``_info`` for metadata. An unknown value is *absent*, never exported as 0. The label set per
GPU is fixed, so the number of series per GPU is bounded; the only open-ended label values
(per-process series) are capped by ``max_processes_per_gpu``.

The definitions live in one module per family group; this package assembles :data:`METRICS`
in its fixed order (the order of the exposition and of ``docs/metrics.md``) and re-exports
every name, so callers keep writing ``from exporters import metrics as m`` and ``m.GPU_UP``.
"""

from __future__ import annotations

from exporters.metrics.agent_self import (
    BUILD_INFO,
    COLLECTOR_CYCLES,
    COLLECTOR_DURATION,
    COLLECTOR_INTERVAL,
    COLLECTOR_SUCCESS,
    DRIVER_CALLS,
    GPUS_EXPECTED,
    GPUS_VISIBLE,
    SNAPSHOT_TS,
    SOURCE_REJECTED,
    SOURCE_UP,
)
from exporters.metrics.definition import OPTIONAL_GROUPS, MetricDef, MetricKind
from exporters.metrics.device import (
    GPU_INFO,
    GPU_LAST_SAMPLE,
    GPU_PEAK_BANDWIDTH,
    GPU_PEAK_FLOPS,
    GPU_SAMPLE_ERRORS,
    GPU_UP,
    spec_source,
)
from exporters.metrics.health import (
    ECC_ERRORS,
    REMAPPED_ROWS,
    REMAPPED_ROWS_FAILURE,
    REMAPPED_ROWS_PENDING,
    XID_ERRORS,
    XID_LAST_SEEN,
)
from exporters.metrics.holders import (
    HOLDER_CLASS,
    HOLDER_ENERGY,
    HOLDER_INFO,
    HOLDER_MEMORY,
    HOLDER_METRICS,
    HOLDER_MFU,
    HOLDER_POWER,
    HOLDER_SM,
)
from exporters.metrics.host import HOST_CPU_PRESSURE, HOST_CPU_UTILIZATION, HOST_IO_PRESSURE, HOST_IOWAIT
from exporters.metrics.interconnect import (
    FABRIC_LINK_BYTES,
    FABRIC_LINK_UP,
    LINK_BYTES,
    NETWORK_BYTES,
    NIC_BYTES,
    NIC_ERRORS,
    NIC_INFO,
    NIC_LINK_DOWNED,
    NIC_METRICS,
    NIC_RATE,
    NIC_ROCE_EVENTS,
    NIC_UP,
    NIC_XMIT_WAIT,
    PCIE_BYTES,
    PCIE_REPLAYS,
)
from exporters.metrics.labels import (
    ATTRIBUTION_LABELS,
    GPU_LABELS,
    JOB_ID_MAX_LEN,
    NIC_LABELS,
    NODE_LABELS,
    clip_label,
)
from exporters.metrics.processes import (
    JOB_INFO,
    POD_INFO,
    PROCESS_COMPUTE_UNITS,
    PROCESS_CPU,
    PROCESS_CPU_LIMIT,
    PROCESS_INFO,
    PROCESS_IO,
    PROCESS_MEMORY,
    PROCESS_RSS,
    PROCESS_SM,
    PROCESS_WORKERS,
    PROCESSES,
)
from exporters.metrics.readings import (
    CLOCK_EVENT_ACTIVE,
    CLOCK_EVENT_TIME,
    ENERGY,
    MIG_UNATTRIBUTED_ENERGY,
    PIPE_ACTIVE,
    PIPE_FIELDS,
    SAMPLE_GAUGES,
    TENSOR_PIPE_ACTIVE,
    TENSOR_PIPE_FIELDS,
    SampleGauge,
    SampleGetter,
)
from exporters.metrics.serving import (
    DECODE_FLOOR,
    FLOOR_MULTIPLE,
    KV_USAGE,
    POSSIBLE_BATCH,
    PREEMPTIONS,
    PREFILL_SHARE,
    REQUESTS,
    SERVING_INFO,
    SERVING_METRICS,
    STEP_BYTES,
    TOKENS_PER_GPU,
    TPOT,
)
from exporters.metrics.verdicts import (
    ACHIEVED_BANDWIDTH,
    ACHIEVED_FLOPS,
    COMM_WAIT,
    POWER_FABRIC_CORRELATION,
    COUNTERS_SUSPECT,
    DUTY_CYCLE,
    INTENSITY,
    MBU,
    MFU,
    RANK_SKEW,
    RIDGE_POINT,
    ROOF_HEADROOM,
    STEP_TIME,
    STEP_TIME_CV,
    THROTTLED,
    VERDICT_METRICS,
    WASTE_LOST,
    WORKLOAD_CLASS,
    WORKLOAD_CONFIDENCE,
    WORKLOAD_REASON,
    WORKLOAD_SCORE,
)

METRICS: tuple[MetricDef, ...] = (
    BUILD_INFO,
    GPUS_EXPECTED,
    GPUS_VISIBLE,
    COLLECTOR_CYCLES,
    COLLECTOR_DURATION,
    COLLECTOR_SUCCESS,
    COLLECTOR_INTERVAL,
    SNAPSHOT_TS,
    SOURCE_UP,
    SOURCE_REJECTED,
    GPU_INFO,
    GPU_UP,
    GPU_LAST_SAMPLE,
    GPU_SAMPLE_ERRORS,
    GPU_PEAK_FLOPS,
    GPU_PEAK_BANDWIDTH,
    *(g.metric for g in SAMPLE_GAUGES),
    PIPE_ACTIVE,
    TENSOR_PIPE_ACTIVE,
    CLOCK_EVENT_ACTIVE,
    CLOCK_EVENT_TIME,
    ENERGY,
    MIG_UNATTRIBUTED_ENERGY,
    PCIE_BYTES,
    PCIE_REPLAYS,
    LINK_BYTES,
    FABRIC_LINK_BYTES,
    FABRIC_LINK_UP,
    NETWORK_BYTES,
    DRIVER_CALLS,
    ECC_ERRORS,
    REMAPPED_ROWS,
    REMAPPED_ROWS_PENDING,
    REMAPPED_ROWS_FAILURE,
    XID_ERRORS,
    XID_LAST_SEEN,
    PROCESSES,
    PROCESS_MEMORY,
    PROCESS_SM,
    PROCESS_COMPUTE_UNITS,
    PROCESS_CPU,
    PROCESS_WORKERS,
    PROCESS_CPU_LIMIT,
    PROCESS_RSS,
    PROCESS_IO,
    PROCESS_INFO,
    JOB_INFO,
    POD_INFO,
    *HOLDER_METRICS,
    HOST_IOWAIT,
    HOST_IO_PRESSURE,
    HOST_CPU_PRESSURE,
    HOST_CPU_UTILIZATION,
    *NIC_METRICS,
    *VERDICT_METRICS,
    *SERVING_METRICS,
)
"""Every family, in exposition order: the agent first, then per GPU, per process, host, NICs, verdicts, serving."""

__all__ = [
    "ACHIEVED_BANDWIDTH", "ACHIEVED_FLOPS", "ATTRIBUTION_LABELS", "BUILD_INFO", "CLOCK_EVENT_ACTIVE",
    "CLOCK_EVENT_TIME", "COLLECTOR_CYCLES", "COLLECTOR_DURATION", "COLLECTOR_INTERVAL", "COLLECTOR_SUCCESS",
    "COMM_WAIT", "DRIVER_CALLS", "DUTY_CYCLE", "ECC_ERRORS", "ENERGY", "FABRIC_LINK_BYTES", "FABRIC_LINK_UP",
    "GPUS_EXPECTED", "GPUS_VISIBLE", "GPU_INFO", "GPU_LABELS", "GPU_LAST_SAMPLE", "GPU_PEAK_BANDWIDTH",
    "GPU_PEAK_FLOPS", "GPU_SAMPLE_ERRORS", "GPU_UP", "HOLDER_CLASS", "HOLDER_ENERGY", "HOLDER_INFO",
    "HOLDER_MEMORY", "HOLDER_METRICS", "HOLDER_MFU", "HOLDER_POWER", "HOLDER_SM", "HOST_CPU_PRESSURE", "HOST_CPU_UTILIZATION",
    "HOST_IOWAIT", "HOST_IO_PRESSURE", "INTENSITY", "JOB_ID_MAX_LEN", "JOB_INFO", "LINK_BYTES", "MBU",
    "METRICS", "MFU", "MIG_UNATTRIBUTED_ENERGY", "MetricDef", "MetricKind", "NETWORK_BYTES", "NIC_BYTES", "NIC_ERRORS", "NIC_INFO",
    "NIC_LABELS", "NIC_LINK_DOWNED", "NIC_METRICS", "NIC_RATE", "NIC_ROCE_EVENTS", "NIC_UP", "NIC_XMIT_WAIT",
    "NODE_LABELS", "OPTIONAL_GROUPS", "PCIE_BYTES", "PCIE_REPLAYS", "PIPE_ACTIVE", "PIPE_FIELDS", "POD_INFO", "PROCESSES",
    "PROCESS_COMPUTE_UNITS", "PROCESS_CPU", "PROCESS_CPU_LIMIT", "PROCESS_INFO", "PROCESS_IO",
    "POWER_FABRIC_CORRELATION", "PROCESS_MEMORY", "PROCESS_RSS", "PROCESS_SM", "PROCESS_WORKERS", "RANK_SKEW", "REMAPPED_ROWS",
    "REMAPPED_ROWS_FAILURE", "REMAPPED_ROWS_PENDING", "RIDGE_POINT", "ROOF_HEADROOM", "SAMPLE_GAUGES",
    "SNAPSHOT_TS", "SOURCE_REJECTED", "SOURCE_UP", "STEP_TIME", "STEP_TIME_CV", "SampleGauge", "SampleGetter", "TENSOR_PIPE_ACTIVE", "TENSOR_PIPE_FIELDS",
    "THROTTLED", "COUNTERS_SUSPECT", "VERDICT_METRICS", "WASTE_LOST", "WORKLOAD_CLASS", "WORKLOAD_CONFIDENCE", "WORKLOAD_REASON", "WORKLOAD_SCORE",
    "XID_ERRORS", "XID_LAST_SEEN", "clip_label", "spec_source",
    "DECODE_FLOOR", "FLOOR_MULTIPLE", "KV_USAGE", "POSSIBLE_BATCH", "PREEMPTIONS", "PREFILL_SHARE", "REQUESTS",
    "SERVING_INFO", "SERVING_METRICS", "STEP_BYTES", "TOKENS_PER_GPU", "TPOT",
]
