"""What one GPU did at one moment: the per-GPU sample and the small records it carries.

The sample mirrors docs/trace-format.md field for field, so a trace line and a live sample
are the same object. The few fields beyond that contract (cumulative counters) are optional
additions, which the contract allows.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Annotated, Literal

from pydantic import Field

from agent.model.holders import Holder
from agent.model.serving import ServingReport
from agent.model.terms import Dtype, NonNegative, NonNegativeInt, Ratio, Vendor, WorkloadClass


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcessSample:
    """One process holding a GPU context. PIDs are host PIDs (the drivers are not namespace aware)."""

    pid: NonNegativeInt
    name: str | None = None
    used_memory_bytes: NonNegativeInt | None = None
    cpu_cores: NonNegative | None = None
    """CPU used by the process and its children, in cores (1.0 = one core busy)."""
    sm_util: Ratio | None = None
    """This process's share of SM time over the interval (NVML per-process utilisation)."""
    command: str | None = None
    user: str | None = None
    cpu_main_cores: NonNegative | None = None
    """CPU of the process itself; ``cpu_cores`` minus this is its workers' (children's) CPU."""
    cpu_workers_cores: NonNegative | None = None
    """CPU of its child processes: data-loader workers and other helpers."""
    workers: NonNegativeInt | None = None
    """Live child processes."""
    cpu_limit_cores: NonNegative | None = None
    """Cores the process may use (CPU affinity, capped by its cgroup quota)."""
    rss_bytes: NonNegativeInt | None = None
    io_read_bytes_per_s: NonNegative | None = None
    """Storage reads of the process and its workers."""
    io_write_bytes_per_s: NonNegative | None = None
    compute_units: NonNegativeInt | None = None
    """Compute units the process's queues occupied at the read (amdsmi ``cu_occupancy``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class HostSample:
    """Node-wide host signals that separate data-loading stalls from GPU-side limits."""

    cpu_iowait_ratio: Ratio | None = None
    io_pressure_ratio: Ratio | None = None
    cpu_pressure_ratio: Ratio | None = None
    """Share of time some runnable task waited for a CPU (PSI ``cpu`` some avg10): too few cores."""
    cpu_utilization_ratio: Ratio | None = None
    """Share of all host CPU time that was busy (not idle or iowait)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadReport:
    """What the job itself reported. ``tokens_per_s`` is the whole job's throughput."""

    job: str | None = None
    rank: NonNegativeInt | None = None
    world_size: Annotated[int, Field(ge=1)] | None = None
    step: NonNegativeInt | None = None
    step_time_s: NonNegative | None = None
    tokens_per_s: NonNegative | None = None
    flops_per_token: NonNegative | None = None
    model_bytes: NonNegative | None = None
    dtype: Dtype | None = None
    """Math precision the job runs its matrix math in (picks the peak its MFU is measured against)."""
    source: Literal["client", "vllm", "sglang", "tgi", "llamacpp", "triton"] | None = None
    """Where the report came from: the job's own client calls, or an inference server's metrics."""
    serving: ServingReport | None = None
    """An inference server's batch, queue, KV-cache and latency figures (agent.model.serving)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Attribution:
    """Who holds this GPU according to the scheduler, whether or not anything runs on it.

    Separate from :class:`WorkloadReport` because allocation outlives activity: a job that holds
    a GPU through a checkpoint pause, or a notebook pod that never launches a kernel, is exactly
    the idle-but-allocated waste the alert rules look for.
    """

    job_id: str | None = None
    """Scheduler job (Slurm job id, training job name); joins GPUs of one job across nodes."""
    user: str | None = None
    """Who the job belongs to (Slurm job user, else the owner of the GPU's process)."""
    partition: str | None = None
    """Slurm partition."""
    account: str | None = None
    """The Slurm account the job is billed to (``SLURM_JOB_ACCOUNT``); None outside Slurm. Optional: traces
    written before it read as unknown."""
    namespace: str | None = None
    """Kubernetes namespace of the pod holding the GPU."""
    pod: str | None = None
    container: str | None = None
    holders: tuple[Holder, ...] | None = None
    """Every holder of the GPU when the host knows them (agent.model.holders): pods given it through a
    device plugin, a time-sliced replica or a DRA claim, and its processes grouped by pod, job or PID.
    The fields above name the first of them, as before."""


@dataclass(frozen=True, slots=True, kw_only=True)
class XidCount:
    """One kind of XID (NVIDIA critical error event) seen on a GPU since the agent started."""

    xid: NonNegativeInt
    count: Annotated[int, Field(ge=1)]
    last_ts: float
    """Unix time of the latest occurrence."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RemappedRows:
    """HBM row remapping state (NVML, Ampere and newer): spare rows used, and whether it is healthy."""

    correctable: NonNegativeInt
    uncorrectable: NonNegativeInt
    pending: bool
    """A remap waits for the next GPU reset to take effect."""
    failure: bool
    """A remap failed: the GPU has run out of spare rows and should be serviced."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkTraffic:
    """One GPU-to-GPU fabric link (an XGMI link) with the driver's cumulative byte counters.

    The totals are the driver's own (since driver load), so exporters publish them as counters
    that survive agent restarts, and per-link imbalance (one slow or down link) stays visible.
    """

    link: NonNegativeInt
    read_bytes: NonNegative | None = None
    """Bytes this GPU read over the link (received)."""
    write_bytes: NonNegative | None = None
    """Bytes this GPU wrote over the link (sent)."""
    up: bool | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuSample:
    """One GPU (or MIG instance / AMD partition) over one sampling interval.

    Ratios average over ``interval_s``; rates are bytes per second over the same interval.
    """

    ts: float
    gpu: str
    node: str = "local"
    uuid: str | None = None
    vendor: Vendor | None = None
    model: str | None = None
    interval_s: Annotated[float, Field(gt=0.0)] | None = None

    gr_active: Ratio | None = None
    sm_active: Ratio | None = None
    sm_occupancy: Ratio | None = None
    tensor_active: Ratio | None = None
    fp64_active: Ratio | None = None
    fp32_active: Ratio | None = None
    fp16_active: Ratio | None = None
    dram_active: Ratio | None = None
    mem_busy: Ratio | None = None
    """Share of the interval in which device memory was read or written (NVML utilization.memory,
    DCGM MEM_COPY_UTIL): a busy-time ratio, not a fraction of peak bandwidth like ``dram_active``.
    A memory-bound kernel keeps it near 100% and so does a GEMM streaming its tiles, so it is weak
    evidence on its own (see docs/classification.md)."""
    util_gpu: Ratio | None = None
    """Kernel duty as the driver's utilisation counter reads it (NVML ``utilization.gpu``, DCGM
    ``GPU_UTIL``), set only beside a ``gr_active`` a profiling counter (DCGM PROF) gave, never as a copy
    of it: the two measure the same thing, so a wide gap between them says one is not counting."""

    pcie_tx_bytes_per_s: NonNegative | None = None
    pcie_rx_bytes_per_s: NonNegative | None = None
    link_tx_bytes_per_s: NonNegative | None = None
    link_rx_bytes_per_s: NonNegative | None = None
    net_tx_bytes_per_s: NonNegative | None = None
    net_rx_bytes_per_s: NonNegative | None = None

    power_w: NonNegative | None = None
    temperature_c: float | None = None
    sm_clock_mhz: NonNegative | None = None
    sm_clock_max_mhz: NonNegative | None = None
    mem_used_bytes: NonNegativeInt | None = None
    mem_total_bytes: NonNegativeInt | None = None
    clock_event_reasons: NonNegativeInt | None = None
    dtype: Dtype | None = None

    processes: tuple[ProcessSample, ...] | None = None
    host: HostSample | None = None
    workload: WorkloadReport | None = None
    label: WorkloadClass | None = None

    # Optional additions to the trace contract: cumulative counters as the driver keeps them
    # (since driver load), so exporters can publish exact totals instead of integrated rates.
    energy_j: NonNegative | None = None
    """Cumulative energy counter in joules (NVML total energy, amdsmi energy accumulator)."""
    power_limit_w: NonNegative | None = None
    """Enforced power limit in watts; power near it explains clock drops."""
    memory_temperature_c: float | None = None
    """HBM temperature (NVML field MEMORY_TEMP); HBM throttles on its own limit."""
    tensor_hmma_active: Ratio | None = None
    """Tensor pipe split (GPM): HMMA runs FP16/BF16/TF32/FP8 matrix math."""
    tensor_imma_active: Ratio | None = None
    """IMMA: integer (INT8) matrix math."""
    tensor_dmma_active: Ratio | None = None
    """DMMA: FP64 matrix math."""
    tensor_dfma_active: Ratio | None = None
    """DFMA tensor operations (GPM metric 6)."""
    clock_event_time_s: dict[str, NonNegative] | None = None
    """Cumulative seconds (since driver load) each throttle reason held the clock, keyed as
    :data:`CLOCK_EVENT_REASONS`; more exact than sampling the reason bitmask once per interval."""
    ecc_corrected_errors: NonNegativeInt | None = None
    """Corrected (single-bit) ECC errors since the driver loaded (volatile count)."""
    ecc_uncorrected_errors: NonNegativeInt | None = None
    """Uncorrected (double-bit) ECC errors since the driver loaded (volatile count)."""
    remapped_rows: RemappedRows | None = None
    xid_errors: tuple[XidCount, ...] | None = None
    """XID events seen since the agent started, one entry per XID code (cumulative)."""
    driver_calls: NonNegativeInt | None = None
    """Vendor-library calls it took to read this sample: the agent's own cost on the GPU driver."""
    attribution: Attribution | None = None
    """Which job holds this GPU: the Slurm job of its processes on a real node, the scenario's job
    in the virtual fleet."""
    net_congestion_per_s: NonNegative | None = None
    """Congestion notifications on the nearest RoCE port (ECN-marked packets + CNPs handled) per second."""
    net_retransmits_per_s: NonNegative | None = None
    """Out-of-sequence packets, sequence errors, ACK timeouts and adaptive retransmits per second."""
    net_link_downs: NonNegativeInt | None = None
    """Times the nearest port's link went down during the interval (a flap stalls collectives for seconds)."""
    pcie_bytes_per_s: NonNegative | None = None
    """PCIe traffic of both directions together, from drivers that do not split it (amdsmi)."""
    pcie_replays: NonNegativeInt | None = None
    """PCIe replays since the driver loaded: link-level retransmissions of a marginal link."""
    links: tuple[LinkTraffic, ...] | None = None
    """Per-link fabric counters (AMD XGMI); the link_* rates above are their sum over the interval."""
    parent_energy_j: NonNegative | None = field(default=None, metadata={"trace": False})
    """A MIG instance's *parent* GPU's cumulative energy counter in joules (NVML
    ``nvmlDeviceGetTotalEnergyConsumption`` on the parent handle): NVML gives no energy per MIG instance, so the
    collector splits the board's step over its instances (agent.collector.mig_energy). Not written to traces
    (``metadata["trace"]``): no replay needs it, and the trace contract stays as it is."""


SAMPLE_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(GpuSample) if f.metadata.get("trace", True))
"""The fields a trace line carries: every field of :class:`GpuSample` but the live-only ones
(``metadata={"trace": False}``: ``parent_energy_j``), which the writer leaves out."""
