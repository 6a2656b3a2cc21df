"""GPM (GPU Performance Monitoring, Hopper and newer): per-pipe activity from two samples.

A GPM sample is a snapshot of the device's hardware counters; a metric is the difference
between two snapshots divided by the time between them. So per device this module keeps two
sample buffers and swaps them every interval (ping-pong), and one ``c_nvmlGpmMetricsGet_t``
(19 kB with its 477 metric slots) allocated once and refilled, instead of allocating per read.

Two snapshots closer than :data:`MIN_SPAN_S` read as zero or stale (NVML's internal refresh),
so a read that comes too early keeps the older snapshot and returns nothing; the next read
then covers the longer span. Every metric carries its own return code: an id the device cannot
measure fails alone and is dropped at the probe, never read as 0.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable

from agent.backends.nvml.structs import plain

MIN_SPAN_S = 0.1
"""NVML: samples must be more than 100 ms apart."""

# NVML_GPM_METRIC_* ids (stable across pynvml releases) and what we call them.
GRAPHICS_UTIL, SM_UTIL, SM_OCCUPANCY = 1, 2, 3
ANY_TENSOR, DFMA_TENSOR, HMMA_TENSOR, DMMA_TENSOR, IMMA_TENSOR = 5, 6, 7, 8, 9
DRAM_BW_UTIL, FP64_UTIL, FP32_UTIL, FP16_UTIL = 10, 11, 12, 13
PCIE_TX, PCIE_RX = 20, 21
NVLINK_TOTAL_RX, NVLINK_TOTAL_TX = 60, 61

WANTED: dict[int, str] = {
    GRAPHICS_UTIL: "gr_active", SM_UTIL: "sm_active", SM_OCCUPANCY: "sm_occupancy",
    ANY_TENSOR: "tensor_active", DFMA_TENSOR: "tensor_dfma_active", HMMA_TENSOR: "tensor_hmma_active",
    DMMA_TENSOR: "tensor_dmma_active", IMMA_TENSOR: "tensor_imma_active",
    DRAM_BW_UTIL: "dram_active", FP64_UTIL: "fp64_active", FP32_UTIL: "fp32_active", FP16_UTIL: "fp16_active",
    PCIE_TX: "pcie_tx_bytes_per_s", PCIE_RX: "pcie_rx_bytes_per_s",
    NVLINK_TOTAL_TX: "link_tx_bytes_per_s", NVLINK_TOTAL_RX: "link_rx_bytes_per_s",
}
"""GPM metric id -> GpuSample field."""

RATES = frozenset({PCIE_TX, PCIE_RX, NVLINK_TOTAL_TX, NVLINK_TOTAL_RX})
"""Metrics in MiB/s; all others are percentages 0..100."""
MIB = 1024 * 1024


def to_sample_value(metric_id: int, value: float) -> float:
    """A GPM value in the sample's units: bytes/s for rates, 0..1 for percentages."""
    if metric_id in RATES:
        return max(0.0, value) * MIB
    return min(1.0, max(0.0, value / 100.0))


class GpmReader:
    """Reads one device (or one MIG GPU instance) with a reused pair of GPM samples."""

    def __init__(self, nvml: Any, handle: Any, gpu_instance_id: int | None = None,
                 metric_ids: tuple[int, ...] = tuple(WANTED), clock: Callable[[], float] = time.monotonic) -> None:
        self._nvml = nvml
        self._handle = handle
        self._gi = gpu_instance_id
        self._clock = clock
        self._samples = [nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()]
        self._prev_t: float | None = None
        self.last_pair: tuple[Any, Any, float, float] | None = None
        """(sample1, sample2, t1, t2) of the latest read that computed metrics, until the next read: what GPM's
        cumulative metrics are read over, so they cover exactly the ratios' span (agent.backends.nvml.gpm_totals)."""
        self._request = nvml.c_nvmlGpmMetricsGet_t()
        self.metric_ids = metric_ids
        self._set_metrics(metric_ids)

    def _set_metrics(self, metric_ids: tuple[int, ...]) -> None:
        self.metric_ids = metric_ids
        self._request.version = self._nvml.NVML_GPM_METRICS_GET_VERSION
        self._request.numMetrics = len(metric_ids)
        for i, metric_id in enumerate(metric_ids):
            self._request.metrics[i].metricId = metric_id

    def keep_only(self, metric_ids: tuple[int, ...]) -> None:
        """Stop asking for metrics the device cannot measure."""
        self._set_metrics(tuple(m for m in self.metric_ids if m in metric_ids))

    def _take(self, sample: Any) -> None:
        if self._gi is None:
            self._nvml.nvmlGpmSampleGet(self._handle, sample)
        else:
            self._nvml.nvmlGpmMigSampleGet(self._handle, self._gi, sample)

    def restart(self) -> None:
        """Forget the previous snapshot (after a failed read or a re-acquired handle)."""
        self._prev_t = None

    def read(self) -> tuple[dict[int, float], dict[int, int]] | None:
        """Take a snapshot; with a previous one far enough back, return (values, failed codes).

        Values are raw GPM units (percent, MiB/s) by metric id; failed maps metric id -> its own
        nvmlReturn. Returns None on the first call and when called again within MIN_SPAN_S.
        Raises the pynvml error of the sample or metrics call itself.
        """
        self.last_pair = None
        current = self._samples[1]
        self._take(current)
        now = self._clock()
        if self._prev_t is None:
            self._samples.reverse()
            self._prev_t = now
            return None
        if now - self._prev_t < MIN_SPAN_S:
            return None  # keep the older snapshot: the next read covers a long enough span
        request = self._request
        request.sample1, request.sample2 = self._samples[0], current
        self._nvml.nvmlGpmMetricsGet(request)
        self.last_pair = (self._samples[0], current, self._prev_t, now)
        self._samples.reverse()
        self._prev_t = now
        values: dict[int, float] = {}
        failed: dict[int, int] = {}
        metrics = plain(request, "metrics")
        for i in range(plain(request, "numMetrics")):
            metric = metrics[i]
            metric_id, code = plain(metric, "metricId"), plain(metric, "nvmlReturn")
            if code != 0:
                failed[metric_id] = code
            elif math.isfinite(value := plain(metric, "value")):
                values[metric_id] = value
        return values, failed

    def close(self) -> None:
        for sample in self._samples:
            try:
                self._nvml.nvmlGpmSampleFree(sample)
            except Exception:  # noqa: BLE001 - freeing after a lost GPU or shutdown may fail; nothing to do
                pass
        self._samples = []
