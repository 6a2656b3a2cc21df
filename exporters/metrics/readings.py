"""Per-GPU readings from the driver: activity, power, clocks, memory, pipes, throttle reasons, energy.

Most of them are one field of the last :class:`~agent.model.GpuSample`, optionally scaled to base
units, so they are declared as a table (:data:`SAMPLE_GAUGES`) the Prometheus collector walks
instead of one hand-written block each; the families with an extra label (pipe, reason) follow
the table, the pipes with the sample fields each label value is read from.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from agent.model import GpuSample
from exporters.metrics.definition import MetricDef
from exporters.metrics.labels import GPU_LABELS

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
        "roofwatch_gpu_memory_busy_ratio", "ratio",
        "Fraction of the interval in which device memory was read or written (a busy-time duty cycle, not a share "
        "of peak bandwidth; only where no DRAM bandwidth counter is read).",
        "mem_busy", nvidia="nvmlDeviceGetUtilizationRates().memory (before Hopper); DCGM_FI_DEV_MEM_COPY_UTIL via dcgm-exporter",
        amd="—",
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
    GPU_LABELS + ("pipe",), nvidia="GPM FP64_UTIL / FP32_UTIL / FP16_UTIL (Hopper+)", amd="—", optional="pipes",
)
PIPE_FIELDS: tuple[tuple[str, str], ...] = (("fp64", "fp64_active"), ("fp32", "fp32_active"), ("fp16", "fp16_active"))

TENSOR_PIPE_ACTIVE = MetricDef(
    "roofwatch_gpu_tensor_pipe_active_ratio", "gauge", "ratio",
    "Fraction of cycles each tensor pipe was active: hmma (FP16/BF16/TF32/FP8), imma (INT8), dmma (FP64), dfma.",
    GPU_LABELS + ("pipe",), nvidia="GPM HMMA / IMMA / DMMA / DFMA_TENSOR_UTIL (Hopper+)", amd="—", optional="pipes",
)
TENSOR_PIPE_FIELDS: tuple[tuple[str, str], ...] = (
    ("hmma", "tensor_hmma_active"), ("imma", "tensor_imma_active"), ("dmma", "tensor_dmma_active"),
    ("dfma", "tensor_dfma_active"))

CLOCK_EVENT_ACTIVE = MetricDef(
    "roofwatch_gpu_clock_event_active", "gauge", "boolean",
    "1 while this clocks-event reason holds the clock down (power cap, thermal, ...); the reasons not active "
    "are absent unless optional_metrics lists one_hot_zeros (then 0).",
    GPU_LABELS + ("reason",), nvidia="nvmlDeviceGetCurrentClocksEventReasons",
    amd="ppt / socket_thm / hbm_thm / prochot residency accumulators rising during the interval",
)

CLOCK_EVENT_TIME = MetricDef(
    "roofwatch_gpu_clock_event_seconds_total", "counter", "seconds",
    "Time this throttle reason held the clock down since the driver loaded (exact, unlike sampling the mask).",
    GPU_LABELS + ("reason",), nvidia="fields CLOCKS_EVENT_REASON_* (accumulated ns)", amd="—",
)
ENERGY = MetricDef(
    "roofwatch_gpu_energy_joules_total", "counter", "joules",
    "Energy used since the agent started; a MIG instance's is an estimate: its share of its GPU's energy by "
    "activity and compute slices.",
    GPU_LABELS, nvidia="nvmlDeviceGetTotalEnergyConsumption deltas (a MIG instance: the parent GPU's, split by the "
    "collector)", amd="energy_accumulator x counter_resolution",
)
MIG_UNATTRIBUTED_ENERGY = MetricDef(
    "roofwatch_gpu_mig_unattributed_energy_joules_total", "counter", "joules",
    "Energy of a GPU in MIG mode that no instance was given since the agent started: the idle draw of slices in "
    "no instance and the split's leftovers; with its instances' roofwatch_gpu_energy_joules_total it adds up to "
    "the GPU's own energy. Labelled with the parent GPU's index and UUID; only on MIG GPUs.",
    GPU_LABELS, nvidia="nvmlDeviceGetTotalEnergyConsumption on the parent handle, less its instances' estimates",
    amd="— (not modelled for AMD partitions)",
)
