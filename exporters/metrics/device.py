"""Per-GPU identity, liveness and peak numbers: what each GPU is and whether its last read worked.

The peaks are exported beside the readings so a dashboard can draw the roofline of each GPU
(or MIG slice / partition) without its own copy of the spec catalogue, and ``spec_source`` says
whether they come from the datasheet or an estimate.
"""

from __future__ import annotations

from agent.model import DeviceState
from exporters.metrics.definition import MetricDef
from exporters.metrics.labels import GPU_LABELS

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
    "roofwatch_gpu_peak_flops", "gauge", "flops", "Dense peak FLOP/s of this GPU (or slice) for the precision its roofline is drawn for (the verdict's "
    "dtype); every precision when optional_metrics lists roofline_detail.",
    GPU_LABELS + ("dtype",), nvidia="spec catalogue", amd="spec catalogue", virtual="spec catalogue",
)
GPU_PEAK_BANDWIDTH = MetricDef(
    "roofwatch_gpu_peak_memory_bandwidth_bytes_per_second", "gauge", "bytes per second",
    "Peak DRAM bandwidth of this GPU (or slice).", GPU_LABELS,
    nvidia="spec catalogue, else 2 x mem clock x bus width", amd="spec catalogue, else vram_max_bandwidth",
    virtual="spec catalogue",
)


def spec_source(device: DeviceState) -> str:
    """Where the GPU's peaks came from: the datasheet catalogue, a flagged estimate, or nowhere."""
    spec = device.info.spec
    if spec is None:
        return "unknown"
    return "estimated" if spec.estimated else "catalogue"
