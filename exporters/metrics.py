"""The one table of every metric roofwatch exports, and how each is read from a snapshot.

``docs/metrics.md`` is checked against :data:`METRICS` by a test, and the Prometheus collector
builds its families from the same table, so the documentation, the exposition and the code
cannot drift apart.

Conventions (https://prometheus.io/docs/practices/naming/): one ``roofwatch_`` namespace, base
units (seconds, bytes, watts, hertz, joules), ``_ratio`` for 0..1, ``_total`` for counters,
``_info`` for metadata. An unknown value is *absent*, never exported as 0. The label set per
GPU is fixed, so the number of series per GPU is bounded; the only open-ended label values
(per-process series) are capped by ``max_processes_per_gpu``.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Callable, Literal

from agent.model import DeviceState, GpuSample

MetricKind = Literal["gauge", "counter", "info"]

GPU_LABELS: tuple[str, ...] = ("node", "gpu", "uuid")
NODE_LABELS: tuple[str, ...] = ("node",)
NIC_LABELS: tuple[str, ...] = ("node", "device", "port")
ATTRIBUTION_LABELS: tuple[str, ...] = ("job_id", "namespace", "pod", "container")
"""Labels that may be copied onto every GPU series (opt-in, setting ``gpu_labels``): they change
whenever a job or pod changes, so each one multiplies series churn; the _info metrics below carry
them without that cost, for joins."""


@dataclasses.dataclass(frozen=True)
class MetricDef:
    """One exported metric family. ``name`` is the full exposed name (with ``_total``/``_info``)."""

    name: str
    kind: MetricKind
    unit: str
    help: str
    labels: tuple[str, ...]
    nvidia: str = "—"
    amd: str = "—"
    virtual: str = "simulated"

    @property
    def family_name(self) -> str:
        """Name handed to prometheus_client, which appends ``_total`` / ``_info`` itself."""
        for suffix in ("_total", "_info"):
            if self.kind in ("counter", "info") and self.name.endswith(suffix):
                return self.name[: -len(suffix)]
        return self.name


SampleGetter = Callable[[GpuSample], "float | int | None"]


@dataclasses.dataclass(frozen=True)
class SampleGauge:
    """A per-GPU gauge read straight from one field of the last sample, optionally scaled."""

    metric: MetricDef
    getter: SampleGetter


def _field(name: str, scale: float = 1.0) -> SampleGetter:
    def get(sample: GpuSample) -> float | None:
        value = getattr(sample, name)
        return None if value is None else value * scale

    return get


def _gpu_gauge(name: str, unit: str, help: str, field: str, *, nvidia: str, amd: str, scale: float = 1.0) -> SampleGauge:
    return SampleGauge(MetricDef(name, "gauge", unit, help, GPU_LABELS, nvidia=nvidia, amd=amd), _field(field, scale))


SAMPLE_GAUGES: tuple[SampleGauge, ...] = (
    _gpu_gauge(
        "roofwatch_gpu_engine_active_ratio", "ratio",
        "Fraction of the interval in which any kernel ran (duty cycle; not SM occupancy).", "gr_active",
        nvidia="GPM GRAPHICS_UTIL, else nvmlDeviceGetUtilizationRates().gpu",
        amd="average_gfx_activity; a partition: its xcp_stats.gfx_busy_inst",
    ),
    _gpu_gauge(
        "roofwatch_gpu_sm_active_ratio", "ratio", "Fraction of SMs with at least one resident warp, averaged over the interval.",
        "sm_active", nvidia="GPM SM_UTIL (Hopper+)", amd="— (per process: roofwatch_gpu_process_compute_units)",
    ),
    _gpu_gauge(
        "roofwatch_gpu_sm_occupancy_ratio", "ratio", "Resident warps relative to the theoretical maximum.",
        "sm_occupancy", nvidia="GPM SM_OCCUPANCY (Hopper+)", amd="—",
    ),
    _gpu_gauge(
        "roofwatch_gpu_tensor_active_ratio", "ratio", "Fraction of cycles any tensor pipe was active.",
        "tensor_active", nvidia="GPM ANY_TENSOR_UTIL (Hopper+)", amd="— (amdsmi has no tensor counter)",
    ),
    _gpu_gauge(
        "roofwatch_gpu_dram_active_ratio", "ratio", "Fraction of peak DRAM bandwidth in use.",
        "dram_active", nvidia="GPM DRAM_BW_UTIL (Hopper+)", amd="average_umc_activity (memory-controller busy, a proxy; whole GPU)",
    ),
    _gpu_gauge(
        "roofwatch_gpu_power_watts", "watts", "Instantaneous board power draw.", "power_w",
        nvidia="field POWER_INSTANT, else nvmlDeviceGetPowerUsage", amd="current_socket_power (partition 0)",
    ),
    _gpu_gauge(
        "roofwatch_gpu_power_limit_watts", "watts", "Enforced power limit; power at this limit explains clock drops.",
        "power_limit_w", nvidia="nvmlDeviceGetEnforcedPowerLimit", amd="amdsmi_get_power_cap_info power_cap (partition 0)",
    ),
    _gpu_gauge(
        "roofwatch_gpu_temperature_celsius", "celsius", "GPU die temperature.", "temperature_c",
        nvidia="nvmlDeviceGetTemperature(GPU)", amd="temperature hotspot",
    ),
    _gpu_gauge(
        "roofwatch_gpu_sm_clock_hertz", "hertz", "Current SM (AMD: gfx) clock.", "sm_clock_mhz",
        nvidia="nvmlDeviceGetClockInfo(SM)", amd="current_gfxclk (a partition: its XCCs' current_gfxclks)", scale=1e6,
    ),
    _gpu_gauge(
        "roofwatch_gpu_sm_clock_max_hertz", "hertz", "Maximum SM (AMD: gfx) clock.", "sm_clock_max_mhz",
        nvidia="nvmlDeviceGetMaxClockInfo(SM)", amd="amdsmi_get_clock_info(GFX) max_clk", scale=1e6,
    ),
    _gpu_gauge(
        "roofwatch_gpu_memory_used_bytes", "bytes", "Device memory in use.", "mem_used_bytes",
        nvidia="nvmlDeviceGetMemoryInfo().used", amd="amdsmi_get_gpu_memory_usage(VRAM)",
    ),
    _gpu_gauge(
        "roofwatch_gpu_memory_total_bytes", "bytes", "Device memory size.", "mem_total_bytes",
        nvidia="nvmlDeviceGetMemoryInfo().total", amd="amdsmi_get_gpu_memory_total(VRAM)",
    ),
    _gpu_gauge(
        "roofwatch_gpu_memory_temperature_celsius", "celsius", "HBM temperature; HBM throttles on its own limit.",
        "memory_temperature_c", nvidia="field MEMORY_TEMP", amd="temperature_mem, else hottest temperature_hbm",
    ),
    _gpu_gauge(
        "roofwatch_gpu_driver_calls_per_sample", "calls",
        "Vendor-library calls the agent made to read this GPU in its last sample (the agent's own cost).",
        "driver_calls", nvidia="counted around every pynvml call", amd="counted around every amdsmi call",
    ),
    _gpu_gauge(
        "roofwatch_gpu_pcie_bandwidth_bytes_per_second", "bytes per second",
        "PCIe traffic of both directions together, where the driver does not split it by direction.",
        "pcie_bytes_per_s", nvidia="— (by direction: roofwatch_gpu_pcie_bytes_total)",
        amd="Δpcie_bandwidth_acc / Δaccumulation_counter (GB/s; partition 0)",
    ),
)

PIPE_ACTIVE = MetricDef(
    "roofwatch_gpu_pipe_active_ratio", "gauge", "ratio", "Fraction of cycles a non-tensor math pipe was active.",
    GPU_LABELS + ("pipe",), nvidia="GPM FP64_UTIL / FP32_UTIL / FP16_UTIL (Hopper+)", amd="—",
)
PIPE_FIELDS: tuple[tuple[str, str], ...] = (("fp64", "fp64_active"), ("fp32", "fp32_active"), ("fp16", "fp16_active"))

TENSOR_PIPE_ACTIVE = MetricDef(
    "roofwatch_gpu_tensor_pipe_active_ratio", "gauge", "ratio",
    "Fraction of cycles each tensor pipe was active: hmma (FP16/BF16/TF32/FP8), imma (INT8), dmma (FP64), dfma.",
    GPU_LABELS + ("pipe",), nvidia="GPM HMMA / IMMA / DMMA / DFMA_TENSOR_UTIL (Hopper+)", amd="—",
)
TENSOR_PIPE_FIELDS: tuple[tuple[str, str], ...] = (
    ("hmma", "tensor_hmma_active"), ("imma", "tensor_imma_active"), ("dmma", "tensor_dmma_active"),
    ("dfma", "tensor_dfma_active"))

CLOCK_EVENT_ACTIVE = MetricDef(
    "roofwatch_gpu_clock_event_active", "gauge", "boolean",
    "1 while this clocks-event reason holds the clock down (power cap, thermal, ...), else 0.",
    GPU_LABELS + ("reason",), nvidia="nvmlDeviceGetCurrentClocksEventReasons",
    amd="ppt / socket_thm / hbm_thm / prochot residency accumulators rising during the interval",
)

CLOCK_EVENT_TIME = MetricDef(
    "roofwatch_gpu_clock_event_seconds_total", "counter", "seconds",
    "Time this throttle reason held the clock down since the driver loaded (exact, unlike sampling the mask).",
    GPU_LABELS + ("reason",), nvidia="fields CLOCKS_EVENT_REASON_* (accumulated ns)", amd="—",
)
ECC_ERRORS = MetricDef(
    "roofwatch_gpu_ecc_errors_total", "counter", "errors",
    "ECC errors since the driver loaded (volatile); any uncorrected error needs attention.",
    GPU_LABELS + ("type",), nvidia="fields ECC_SBE_VOL_TOTAL / ECC_DBE_VOL_TOTAL",
    amd="amdsmi_get_gpu_total_ecc_count (since boot)",
)
REMAPPED_ROWS = MetricDef(
    "roofwatch_gpu_remapped_rows", "gauge", "rows",
    "HBM rows remapped to spares, by the error type that caused it.",
    GPU_LABELS + ("type",), nvidia="fields REMAPPED_COR / REMAPPED_UNC", amd="—",
)
REMAPPED_ROWS_PENDING = MetricDef(
    "roofwatch_gpu_remapped_rows_pending", "gauge", "boolean",
    "1 when a row remap waits for the next GPU reset to take effect.", GPU_LABELS,
    nvidia="field REMAPPED_PENDING", amd="—",
)
REMAPPED_ROWS_FAILURE = MetricDef(
    "roofwatch_gpu_remapped_rows_failure", "gauge", "boolean",
    "1 when a row remap failed (no spare rows left): the GPU needs service.", GPU_LABELS,
    nvidia="field REMAPPED_FAILURE", amd="—",
)
XID_ERRORS = MetricDef(
    "roofwatch_gpu_xid_errors_total", "counter", "events",
    "XID critical-error events since the agent started, per XID code (xid 0 = codes beyond the per-GPU cap).",
    GPU_LABELS + ("xid",), nvidia="nvmlEventSetWait (nvmlEventTypeXidCriticalError)", amd="—",
)
XID_LAST_SEEN = MetricDef(
    "roofwatch_gpu_xid_last_seen_timestamp_seconds", "gauge", "seconds",
    "Unix time of the latest XID event of this code.", GPU_LABELS + ("xid",),
    nvidia="nvmlEventSetWait", amd="—",
)
DRIVER_CALLS = MetricDef(
    "roofwatch_gpu_driver_calls_total", "counter", "calls",
    "Vendor-library calls the agent made to read this GPU since it started.", GPU_LABELS,
    nvidia="counted around every pynvml call", amd="counted around every amdsmi call", virtual="—",
)

GPU_INFO = MetricDef(
    "roofwatch_gpu_info", "info", "", "Identity of each GPU and where its peak numbers come from.",
    GPU_LABELS + ("vendor", "model", "pci_bus_id", "spec", "spec_source"),
    nvidia="nvmlDeviceGetName / GetUUID / GetPciInfo", amd="amdsmi_get_gpu_asic_info / device_uuid / bdf",
)
GPU_UP = MetricDef(
    "roofwatch_gpu_up", "gauge", "boolean", "1 if the last read of this GPU succeeded, 0 if it failed or hung.",
    GPU_LABELS, nvidia="collector", amd="collector", virtual="collector",
)
GPU_LAST_SAMPLE = MetricDef(
    "roofwatch_gpu_last_sample_timestamp_seconds", "gauge", "seconds",
    "Unix time of the last good sample of this GPU; stops advancing while it is down.",
    GPU_LABELS, nvidia="collector", amd="collector", virtual="collector",
)
GPU_SAMPLE_ERRORS = MetricDef(
    "roofwatch_gpu_sample_errors_total", "counter", "errors", "Failed or timed-out reads of this GPU.",
    GPU_LABELS, nvidia="collector", amd="collector", virtual="collector",
)
GPU_PEAK_FLOPS = MetricDef(
    "roofwatch_gpu_peak_flops", "gauge", "flops", "Dense peak FLOP/s of this GPU (or slice) per math precision.",
    GPU_LABELS + ("dtype",), nvidia="spec catalogue", amd="spec catalogue", virtual="spec catalogue",
)
GPU_PEAK_BANDWIDTH = MetricDef(
    "roofwatch_gpu_peak_memory_bandwidth_bytes_per_second", "gauge", "bytes per second",
    "Peak DRAM bandwidth of this GPU (or slice).", GPU_LABELS,
    nvidia="spec catalogue, else 2 x mem clock x bus width", amd="spec catalogue, else vram_max_bandwidth",
    virtual="spec catalogue",
)
ENERGY = MetricDef(
    "roofwatch_gpu_energy_joules_total", "counter", "joules", "Energy used since the agent started.",
    GPU_LABELS, nvidia="nvmlDeviceGetTotalEnergyConsumption deltas", amd="energy_accumulator x counter_resolution",
)
PCIE_BYTES = MetricDef(
    "roofwatch_gpu_pcie_bytes_total", "counter", "bytes", "Bytes over the host PCIe link since the agent started.",
    GPU_LABELS + ("direction",), nvidia="GPM PCIE_TX/RX_PER_SEC or PCIe byte fields",
    amd="— (no direction split: roofwatch_gpu_pcie_bandwidth_bytes_per_second)",
)
PCIE_REPLAYS = MetricDef(
    "roofwatch_gpu_pcie_replays_total", "counter", "events",
    "PCIe replays (link-level retransmissions) since the driver loaded; a rising count marks a marginal link.",
    GPU_LABELS, nvidia="—", amd="pcie_replay_count_acc (partition 0)", virtual="—",
)
FABRIC_LINK_BYTES = MetricDef(
    "roofwatch_gpu_fabric_link_bytes_total", "counter", "bytes",
    "Bytes over each GPU-to-GPU link since the driver loaded (rx = read by this GPU, tx = written).",
    GPU_LABELS + ("link", "direction"), nvidia="—", amd="xgmi_read_data_acc / xgmi_write_data_acc x 1024 (partition 0)",
    virtual="—",
)
FABRIC_LINK_UP = MetricDef(
    "roofwatch_gpu_fabric_link_up", "gauge", "boolean", "1 while a GPU-to-GPU link is up, 0 when it is down.",
    GPU_LABELS + ("link",), nvidia="—", amd="xgmi_link_status (partition 0)", virtual="—",
)
LINK_BYTES = MetricDef(
    "roofwatch_gpu_link_bytes_total", "counter", "bytes",
    "Bytes over the GPU-to-GPU fabric (NVLink / XGMI, all links) since the agent started.",
    GPU_LABELS + ("direction",), nvidia="GPM NVLINK_TOTAL_TX/RX_PER_SEC or NVLink byte fields",
    amd="xgmi_read/write_data_acc",
)
NETWORK_BYTES = MetricDef(
    "roofwatch_gpu_network_bytes_total", "counter", "bytes",
    "Bytes through the InfiniBand/RoCE port nearest this GPU since the agent started.",
    GPU_LABELS + ("direction",), nvidia="sysfs infiniband counters", amd="sysfs infiniband counters",
)
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
    GPU_LABELS + ("job_id", "user", "partition"), nvidia=_SLURM, amd=_SLURM, virtual="scenario job",
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
JOB_ID_MAX_LEN = 128
"""Longer job ids are cut: a label value is held in every Prometheus series index that uses it."""


def clip_label(value: str | None) -> str:
    """An attribution or process label value as exported: "" when unknown, cut at :data:`JOB_ID_MAX_LEN`,
    and valid UTF-8: a lone surrogate (Python's, and psutil's, way of decoding the undecodable bytes of a
    process name) becomes U+FFFD, where it would otherwise make encoding the whole exposition fail."""
    text = (value or "")[:JOB_ID_MAX_LEN]
    return text if text.isascii() else _SURROGATE.sub("\ufffd", text)


_SURROGATE = re.compile("[\ud800-\udfff]")

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
_IB = "sysfs /class/infiniband/<device>/ports/<port>"
NIC_INFO = MetricDef(
    "roofwatch_nic_info", "info", "", "An InfiniBand/RoCE port on this node and its link layer.",
    NIC_LABELS + ("link_layer",), nvidia=_IB, amd=_IB, virtual="—",
)
NIC_UP = MetricDef(
    "roofwatch_nic_up", "gauge", "boolean", "1 while the port is ACTIVE, else 0.", NIC_LABELS,
    nvidia=_IB + "/state", amd=_IB + "/state", virtual="—",
)
NIC_RATE = MetricDef(
    "roofwatch_nic_link_rate_bytes_per_second", "gauge", "bytes per second", "Negotiated link rate of the port.",
    NIC_LABELS, nvidia=_IB + "/rate", amd=_IB + "/rate", virtual="—",
)
NIC_BYTES = MetricDef(
    "roofwatch_nic_bytes_total", "counter", "bytes", "Bytes through the port since the agent started.",
    NIC_LABELS + ("direction",), nvidia=_IB + "/counters/port_{xmit,rcv}_data x 4", amd=_IB + "/counters/port_{xmit,rcv}_data x 4",
    virtual="—",
)
NIC_XMIT_WAIT = MetricDef(
    "roofwatch_nic_transmit_wait_ticks_total", "counter", "ticks",
    "Ticks the port had data to send but could not (credit starvation: congestion downstream); tick length is HCA specific.",
    NIC_LABELS, nvidia=_IB + "/counters/port_xmit_wait", amd=_IB + "/counters/port_xmit_wait", virtual="—",
)
NIC_LINK_DOWNED = MetricDef(
    "roofwatch_nic_link_downed_total", "counter", "events",
    "Times the port's link went down since the agent started; each flap stalls the collectives using it.",
    NIC_LABELS, nvidia=_IB + "/counters/link_downed", amd=_IB + "/counters/link_downed", virtual="—",
)
NIC_ERRORS = MetricDef(
    "roofwatch_nic_errors_total", "counter", "events", "Port error counters since the agent started, per counter.",
    NIC_LABELS + ("counter",), nvidia=_IB + "/counters (fixed set)", amd=_IB + "/counters (fixed set)", virtual="—",
)
NIC_ROCE_EVENTS = MetricDef(
    "roofwatch_nic_roce_events_total", "counter", "events",
    "RoCE congestion (ECN marks, CNPs) and retransmit events since the agent started, per counter.",
    NIC_LABELS + ("counter",), nvidia=_IB + "/hw_counters (mlx5 names)", amd=_IB + "/hw_counters (mlx5 names)",
    virtual="—",
)
NIC_METRICS: tuple[MetricDef, ...] = (NIC_INFO, NIC_UP, NIC_RATE, NIC_BYTES, NIC_XMIT_WAIT, NIC_LINK_DOWNED, NIC_ERRORS,
                                      NIC_ROCE_EVENTS)
GPUS_EXPECTED = MetricDef(
    "roofwatch_gpus_expected", "gauge", "gpus", "GPUs this node should have (configured, else discovered at start).",
    NODE_LABELS, nvidia="collector", amd="collector", virtual="collector",
)
GPUS_VISIBLE = MetricDef(
    "roofwatch_gpus_visible", "gauge", "gpus", "GPUs whose last read succeeded; below expected means a GPU is missing.",
    NODE_LABELS, nvidia="collector", amd="collector", virtual="collector",
)
COLLECTOR_CYCLES = MetricDef(
    "roofwatch_collector_cycles_total", "counter", "cycles", "Collection cycles run since start.",
    NODE_LABELS + ("backend",), nvidia="collector", amd="collector", virtual="collector",
)
COLLECTOR_DURATION = MetricDef(
    "roofwatch_collector_last_cycle_duration_seconds", "gauge", "seconds", "Wall time the last collection cycle took.",
    NODE_LABELS + ("backend",), nvidia="collector", amd="collector", virtual="collector",
)
COLLECTOR_SUCCESS = MetricDef(
    "roofwatch_collector_last_cycle_success", "gauge", "boolean", "1 if every GPU was read in the last cycle.",
    NODE_LABELS + ("backend",), nvidia="collector", amd="collector", virtual="collector",
)
COLLECTOR_INTERVAL = MetricDef(
    "roofwatch_collector_interval_seconds", "gauge", "seconds", "Configured seconds between collection cycles.",
    NODE_LABELS + ("backend",), nvidia="collector", amd="collector", virtual="collector",
)
SNAPSHOT_TS = MetricDef(
    "roofwatch_snapshot_timestamp_seconds", "gauge", "seconds", "Unix time the served snapshot was taken.",
    NODE_LABELS, nvidia="collector", amd="collector", virtual="collector",
)
BUILD_INFO = MetricDef(
    "roofwatch_build_info", "info", "", "Agent version and runtime.", ("version", "python_version"),
    nvidia="agent", amd="agent", virtual="agent",
)

# -- classification (agent/classifier): one verdict per GPU, every evaluate_every_s -------------
_CLS = "classifier"
WORKLOAD_CLASS = MetricDef(
    "roofwatch_gpu_workload_class", "gauge", "boolean",
    "1 for the class that bounds this GPU now, 0 for the others (all seven classes always present).",
    GPU_LABELS + ("class",), nvidia=_CLS, amd=_CLS, virtual=_CLS,
)
WORKLOAD_CONFIDENCE = MetricDef(
    "roofwatch_gpu_workload_confidence_ratio", "gauge", "ratio",
    "Confidence in the published class: score margin x valid samples x evidence quality.",
    GPU_LABELS, nvidia=_CLS, amd=_CLS, virtual=_CLS,
)
WORKLOAD_SCORE = MetricDef(
    "roofwatch_gpu_workload_score_ratio", "gauge", "ratio",
    "How strongly this window matches each class (0..1), before hysteresis.",
    GPU_LABELS + ("class",), nvidia=_CLS, amd=_CLS, virtual=_CLS,
)
WORKLOAD_REASON = MetricDef(
    "roofwatch_gpu_workload_reason_info", "info", "",
    "Why: the class, a bounded detail code (e.g. dataloader, straggler, at_roof) and throttle severity.",
    GPU_LABELS + ("class", "detail", "throttle"), nvidia=_CLS, amd=_CLS, virtual=_CLS,
)
THROTTLED = MetricDef(
    "roofwatch_gpu_throttled", "gauge", "boolean",
    "1 while a throttle reason holds a busy GPU's clock below 90% of the peak's reference clock.",
    GPU_LABELS, nvidia=_CLS, amd=_CLS, virtual=_CLS,
)
DUTY_CYCLE = MetricDef(
    "roofwatch_gpu_window_duty_cycle_ratio", "gauge", "ratio",
    "Share of the classification window in which a kernel ran.", GPU_LABELS, nvidia=_CLS, amd=_CLS, virtual=_CLS,
)
COMM_WAIT = MetricDef(
    "roofwatch_gpu_comm_wait_ratio", "gauge", "ratio",
    "Share of window samples with a kernel resident but idle (typically NCCL waiting on peers).",
    GPU_LABELS, nvidia=_CLS, amd="— (needs SM and tensor counters)", virtual=_CLS,
)
STEP_TIME_CV = MetricDef(
    "roofwatch_gpu_step_time_cv", "gauge", "ratio",
    "Coefficient of variation of the job's recent step times (when the job reports steps).",
    GPU_LABELS, nvidia=_CLS, amd=_CLS, virtual=_CLS,
)
RANK_SKEW = MetricDef(
    "roofwatch_gpu_rank_skew_ratio", "gauge", "ratio",
    "1 - this rank's compute share / the busiest rank's, among its job's ranks on this node.",
    GPU_LABELS, nvidia=_CLS, amd=_CLS, virtual=_CLS,
)
ACHIEVED_FLOPS = MetricDef(
    "roofwatch_gpu_achieved_flops", "gauge", "flops",
    "Estimated FLOP/s: clock-scaled tensor and FP-pipe activity x the dtype's peaks.",
    GPU_LABELS + ("dtype",), nvidia="GPM tensor + pipe activity", amd="— (no tensor counter)", virtual=_CLS,
)
ACHIEVED_BANDWIDTH = MetricDef(
    "roofwatch_gpu_achieved_memory_bandwidth_bytes_per_second", "gauge", "bytes per second",
    "Estimated DRAM bytes/s: DRAM activity x peak bandwidth.", GPU_LABELS, nvidia=_CLS, amd=_CLS, virtual=_CLS,
)
INTENSITY = MetricDef(
    "roofwatch_gpu_arithmetic_intensity_flops_per_byte", "gauge", "FLOP per byte",
    "Estimated arithmetic intensity (achieved FLOP/s / achieved DRAM bytes/s); compare with the ridge point.",
    GPU_LABELS + ("dtype",), nvidia=_CLS, amd="— (no tensor counter)", virtual=_CLS,
)
RIDGE_POINT = MetricDef(
    "roofwatch_gpu_ridge_point_flops_per_byte", "gauge", "FLOP per byte",
    "Peak FLOP/s / peak bandwidth for the dtype: below it the memory roof binds first.",
    GPU_LABELS + ("dtype",), nvidia="spec catalogue", amd="spec catalogue", virtual="spec catalogue",
)
ROOF_HEADROOM = MetricDef(
    "roofwatch_gpu_roof_headroom_ratio", "gauge", "ratio",
    "1 - achieved / peak for each roof (compute for the dtype, memory): 0 means at the roof.",
    GPU_LABELS + ("roof",), nvidia=_CLS, amd=_CLS, virtual=_CLS,
)
MFU = MetricDef(
    "roofwatch_gpu_mfu_ratio", "gauge", "ratio",
    "Model FLOPs utilisation. source=counters: clock-scaled tensor activity (an estimate, needs a tensor "
    "counter); source=workload: tokens/s x FLOPs/token / (world size x peak), when the job reports it.",
    GPU_LABELS + ("source", "dtype"), nvidia="GPM ANY_TENSOR_UTIL x SM clock", amd="workload reports only",
    virtual=_CLS,
)
MBU = MetricDef(
    "roofwatch_gpu_mbu_ratio", "gauge", "ratio",
    "Memory-bandwidth utilisation. source=counters: DRAM activity; source=workload: model bytes per step "
    "(or per token) x rate / (world size x peak bandwidth).",
    GPU_LABELS + ("source",), nvidia=_CLS, amd="umc_activity (a proxy)", virtual=_CLS,
)
VERDICT_METRICS: tuple[MetricDef, ...] = (
    WORKLOAD_CLASS, WORKLOAD_CONFIDENCE, WORKLOAD_SCORE, WORKLOAD_REASON, THROTTLED, DUTY_CYCLE, COMM_WAIT,
    STEP_TIME_CV, RANK_SKEW, ACHIEVED_FLOPS, ACHIEVED_BANDWIDTH, INTENSITY, RIDGE_POINT, ROOF_HEADROOM, MFU, MBU,
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
    HOST_IOWAIT,
    HOST_IO_PRESSURE,
    HOST_CPU_PRESSURE,
    HOST_CPU_UTILIZATION,
    *NIC_METRICS,
    *VERDICT_METRICS,
)


def spec_source(device: DeviceState) -> str:
    """Where the GPU's peaks came from: the datasheet catalogue, a flagged estimate, or nowhere."""
    spec = device.info.spec
    if spec is None:
        return "unknown"
    return "estimated" if spec.estimated else "catalogue"
