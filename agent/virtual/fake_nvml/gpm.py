"""GPM metrics: which ids the fake measures, their names and units, and how two samples become one.

A GPM sample is a snapshot of the device's counters (:class:`~agent.virtual.fake_nvml.device.Snapshot`);
``nvmlGpmMetricsGet`` returns (sample2 - sample1) / dt as a percentage or MiB/s, per metric with
its own return code. Two samples less than 100 ms apart give 0.0 with SUCCESS for every metric,
as real GPM does: a backend must space its samples, and the fake makes it visible if it doesn't.

The cumulative metrics 248-260 (:data:`CUMULATIVE`; nvml.h: "since reboot", and DCGM 4.6 stores what
``nvmlGpmMetricsGet`` returns for them unchanged as a raw monotonic counter) are running totals at the second
sample: SM cycles elapsed at :func:`cycles_per_s` (SMs x maximum SM clock: the fake keeps no clock integral, and
the ratio Δactive / Δelapsed does not depend on the factor), each pipe's active cycles that times its activity,
PCIe bytes as bytes. So Δactive / Δelapsed over two reads is exactly GPM's own ratio over the same samples.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.virtual.fake_nvml import codes
from agent.virtual.fake_nvml.device import KEY_INDEX, NvmlDevice, Snapshot

MIB = 1024.0 * 1024.0
MIN_SPAN_S = 0.1
NVLINK_PER_LINK_FIRST = 62
NVLINK_PER_LINK_LINKS = 18


@dataclass(frozen=True, slots=True)
class Metric:
    """One GPM metric: the integral it reads, its scale, and its metricInfo strings."""

    key: str
    """Integral in :data:`~agent.virtual.fake_nvml.device.TOTAL_KEYS`."""
    needs: str
    """Sample field whose absence (hidden) makes the metric NOT_SUPPORTED."""
    short: bytes
    long: bytes
    unit: bytes
    percent: bool = True
    link: int | None = None
    """Per-link NVLink metric: the link index; None for device-wide metrics."""


def _metrics() -> dict[int, Metric]:
    pct = b"%"
    out: dict[int, Metric] = {
        1: Metric("gr_active", "gr_active", b"gr_util", b"graphics engine utilization", pct),
        2: Metric("sm_active", "sm_active", b"sm_util", b"SM utilization", pct),
        3: Metric("sm_occupancy", "sm_occupancy", b"sm_occupancy", b"SM occupancy", pct),
        5: Metric("tensor_active", "tensor_active", b"any_tensor_util", b"any tensor pipe utilization", pct),
        6: Metric("tensor_dfma_active", "tensor_active", b"dfma_tensor_util", b"DFMA tensor pipe utilization", pct),
        7: Metric("tensor_hmma_active", "tensor_active", b"hmma_tensor_util", b"HMMA tensor pipe utilization", pct),
        8: Metric("tensor_dmma_active", "tensor_active", b"dmma_tensor_util", b"DMMA tensor pipe utilization", pct),
        9: Metric("tensor_imma_active", "tensor_active", b"imma_tensor_util", b"IMMA tensor pipe utilization", pct),
        10: Metric("dram_active", "dram_active", b"dram_bw_util", b"DRAM bandwidth utilization", pct),
        11: Metric("fp64_active", "fp64_active", b"fp64_util", b"FP64 pipe utilization", pct),
        12: Metric("fp32_active", "fp32_active", b"fp32_util", b"FP32 pipe utilization", pct),
        13: Metric("fp16_active", "fp16_active", b"fp16_util", b"FP16 pipe utilization", pct),
        20: Metric("pcie_tx_bytes_per_s", "pcie_tx_bytes_per_s", b"pcie_tx", b"PCIe transmit bandwidth",
                   b"MiB/s", percent=False),
        21: Metric("pcie_rx_bytes_per_s", "pcie_rx_bytes_per_s", b"pcie_rx", b"PCIe receive bandwidth",
                   b"MiB/s", percent=False),
        60: Metric("link_rx_bytes_per_s", "link_rx_bytes_per_s", b"nvlink_rx", b"NVLink total receive bandwidth",
                   b"MiB/s", percent=False),
        61: Metric("link_tx_bytes_per_s", "link_tx_bytes_per_s", b"nvlink_tx", b"NVLink total transmit bandwidth",
                   b"MiB/s", percent=False),
    }
    for link in range(NVLINK_PER_LINK_LINKS):
        for offset, direction, key in ((0, b"rx", "link_rx_bytes_per_s"), (1, b"tx", "link_tx_bytes_per_s")):
            name = b"nvlink_l%d_%s" % (link, direction)
            out[NVLINK_PER_LINK_FIRST + 2 * link + offset] = Metric(
                key, key, name, b"NVLink link %d %s bandwidth" % (link, direction), b"MiB/s", percent=False, link=link)
    return out


CUMULATIVE: dict[int, str | None] = {
    248: None, 249: "sm_active", 250: "tensor_active", 251: "tensor_dmma_active", 252: "tensor_hmma_active",
    253: "tensor_imma_active", 254: "tensor_dfma_active", 255: "pcie_tx_bytes_per_s", 256: "pcie_rx_bytes_per_s",
    257: None, 258: "fp64_active", 259: "fp32_active", 260: "fp16_active",
}
"""NVML_GPM_METRIC_SM_CYCLES_ELAPSED (248) ... FP16_CYCLES_ACTIVE (260) -> the integral each counts (None: 248 is the
elapsed cycles themselves; 257, the integer pipe, has no sample field and stays 0)."""
CUMULATIVE_ELAPSED = 248
_CUMULATIVE_NAMES = {248: b"sm_cycles_elapsed", 249: b"sm_cycles_active", 250: b"mma_cycles_active",
                     251: b"dmma_cycles_active", 252: b"hmma_cycles_active", 253: b"imma_cycles_active",
                     254: b"dfma_cycles_active", 255: b"pcie_tx", 256: b"pcie_rx", 257: b"integer_cycles_active",
                     258: b"fp64_cycles_active", 259: b"fp32_cycles_active", 260: b"fp16_cycles_active"}


def _cumulative_metrics() -> dict[int, Metric]:
    out = {}
    for metric_id, key in CUMULATIVE.items():
        rate = key is not None and key.endswith("_per_s")
        out[metric_id] = Metric(key or "sm_active", key or "gr_active", _CUMULATIVE_NAMES[metric_id],
                                b"%s since reboot" % _CUMULATIVE_NAMES[metric_id].replace(b"_", b" "),
                                b"bytes" if rate else b"cycles", percent=False)
    return out


METRICS: dict[int, Metric] = {**_metrics(), **_cumulative_metrics()}
"""Every metric id the fake measures (others below NVML_GPM_METRIC_MAX read NOT_SUPPORTED)."""
_UNKNOWN_INFO = (b"unsupported", b"metric not measured by this device", b"")


def metric_info(metric_id: int) -> tuple[bytes, bytes, bytes]:
    """(shortName, longName, unit); module-level bytes, so the C strings outlive every caller."""
    m = METRICS.get(metric_id)
    return (m.short, m.long, m.unit) if m is not None else _UNKNOWN_INFO


def supported(device: NvmlDevice, metric_id: int, link_count: int, limit: int = codes.GPM_METRIC_MAX) -> int:
    """SUCCESS, or the per-metric nvmlReturn for a metric this device cannot provide; ``limit``: the driver's
    NVML_GPM_METRIC_MAX (an id at or above it is unknown to that driver)."""
    if not 0 < metric_id < min(limit, codes.GPM_METRIC_MAX):
        return codes.ERROR_INVALID_ARGUMENT
    m = METRICS.get(metric_id)
    if m is None or device.hidden(m.needs):
        return codes.ERROR_NOT_SUPPORTED
    if m.key.startswith("link_") and (link_count == 0 or (m.link is not None and m.link >= link_count)):
        return codes.ERROR_NOT_SUPPORTED
    return codes.SUCCESS


def compute(metric_id: int, s1: Snapshot, s2: Snapshot, link_count: int) -> float:
    """The metric over [s1.t, s2.t]: percent for ratios, MiB/s for bytes (per link for link metrics)."""
    m = METRICS[metric_id]
    dt = s2.t - s1.t
    if dt < MIN_SPAN_S:
        return 0.0
    i = KEY_INDEX[m.key]
    rate = (s2.totals[i] - s1.totals[i]) / dt
    if m.percent:
        return 100.0 * rate
    if m.link is not None:
        rate /= link_count
    return rate / MIB


def cycles_per_s(device: NvmlDevice) -> float:
    """SM cycles a second the cumulative metrics count on ``device``: its SMs x its maximum SM clock."""
    info = device.info
    return float(info.sm_count or 1) * float(info.sm_clock_max_mhz or 1000.0) * 1e6


def cumulative(metric_id: int, at: Snapshot, boot: Snapshot, device: NvmlDevice) -> float:
    """Cumulative metric ``metric_id`` at snapshot ``at``, counted since ``boot`` (the GPU's start or last reset)."""
    key = CUMULATIVE[metric_id]
    if metric_id == CUMULATIVE_ELAPSED:
        return max(0.0, at.t - boot.t) * cycles_per_s(device)
    if key is None:
        return 0.0
    i = KEY_INDEX[key]
    counted = max(0.0, at.totals[i] - boot.totals[i])
    return counted if key.endswith("_per_s") else counted * cycles_per_s(device)
