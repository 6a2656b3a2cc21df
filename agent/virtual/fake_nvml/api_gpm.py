"""GPM C functions: sample buffers, snapshots of a device or MIG instance, metrics from a pair.

A sample buffer (nvmlGpmSample_t) is an opaque pointer the fake maps to the snapshot last
written into it; nvmlGpmMetricsGet then checks the struct version, that both samples belong to
one device, and fills each requested metric with its own return code.

The cumulative metrics (248-260) exist from the driver the profile gates them on (R590 here, an assumption;
:func:`~agent.virtual.fake_nvml.profile.gpm_metric_limit`); an older driver fails each of them alone with
INVALID_ARGUMENT. Where they exist, the profile's ``gpm_cumulative`` says how they are answered: running totals
since the GPU's start or its last reset (a lost window that ended, or :meth:`GpmFunctions.reset_gpm_counters`),
the change between the two samples, or a whole call that fails.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agent.virtual.fake_nvml import codes, gpm
from agent.virtual.fake_nvml.ctypes_io import Fail, pointer_value, target, value, write_pointer
from agent.virtual.fake_nvml.device import NvmlDevice, Snapshot
from agent.virtual.fake_nvml.profile import gpm_metric_limit
from agent.virtual.fake_nvml.symbols import c_function


@dataclass(slots=True)
class GpmSample:
    """What one nvmlGpmSample_t holds: nothing yet, or a snapshot of one device."""

    device: NvmlDevice | None = None
    snapshot: Snapshot | None = None


class GpmFunctions:
    """Mixin of :class:`~agent.virtual.fake_nvml.library.FakeNvmlLibrary`: uses its state and helpers."""

    def reset_gpm_counters(self, gpu: int | str) -> None:
        """Start ``gpu``'s cumulative GPM metrics again (a GPU reset): they count from the next pair's first
        sample, so the next reading is below the previous one."""
        dev = self._by_gpu.get(str(gpu).strip())
        if dev is None:
            raise ValueError(f"node {self.backend.node!r} has no GPU {gpu!r}")
        with self._lock:
            self._gpm_boots[(dev.gpu, self._generation(dev.physical, self._vt()))] = None

    def _gpm_boot(self, dev: NvmlDevice, first: Snapshot) -> Snapshot:
        """What ``dev``'s cumulative metrics count from ("since reboot"): the first sample of the first pair asked
        for them since the fake started or the GPU was last reset. (The simulation's start would not do: the
        device's integrals begin at its first reading, so active and elapsed cycles would not count alike.)"""
        key = (dev.gpu, self._generation(dev.physical, self._vt()))
        with self._lock:
            boot = self._gpm_boots.get(key)
            if boot is None:
                boot = self._gpm_boots[key] = first
            return boot

    def _gpm_supported(self, dev: NvmlDevice) -> bool:
        return self.traits.gpm_capable and self.profile.gpm

    def _gpm_buffer(self, sample: Any) -> GpmSample:
        buffer = self._gpm_samples.get(pointer_value(sample))
        if buffer is None:
            raise Fail(codes.ERROR_INVALID_ARGUMENT)
        return buffer

    def _take(self, dev: NvmlDevice, buffer: GpmSample) -> None:
        if not self._gpm_supported(dev):
            raise Fail(codes.ERROR_NOT_SUPPORTED)
        if self.blind:
            raise Fail(codes.ERROR_NO_PERMISSION)
        self._fresh(dev)
        buffer.device, buffer.snapshot = dev, dev.snapshot(self._now)

    @c_function("nvmlGpmQueryDeviceSupport", handle=True)
    def _c_gpm_query_support(self, dev: NvmlDevice, out: Any) -> None:
        support = target(out)
        if support is None:
            raise Fail(codes.ERROR_INVALID_ARGUMENT)
        if support.version != codes.GPM_SUPPORT_VERSION:
            raise Fail(codes.ERROR_ARGUMENT_VERSION_MISMATCH)
        support.isSupportedDevice = 1 if self._gpm_supported(dev) else 0

    @c_function("nvmlGpmSampleAlloc")
    def _c_gpm_alloc(self, out: Any) -> None:
        if target(out) is None:
            raise Fail(codes.ERROR_INVALID_ARGUMENT)
        address = self._new_address()
        with self._lock:
            self._gpm_samples[address] = GpmSample()
        write_pointer(out, address)

    @c_function("nvmlGpmSampleFree")
    def _c_gpm_free(self, sample: Any) -> None:
        with self._lock:
            if self._gpm_samples.pop(pointer_value(sample), None) is None:
                raise Fail(codes.ERROR_INVALID_ARGUMENT)

    @c_function("nvmlGpmSampleGet", handle=True)
    def _c_gpm_sample_get(self, dev: NvmlDevice, sample: Any) -> None:
        buffer = self._gpm_buffer(sample)
        if dev.is_mig:  # MIG devices are sampled through their parent: nvmlGpmMigSampleGet
            raise Fail(codes.ERROR_NOT_SUPPORTED)
        self._take(dev, buffer)

    @c_function("nvmlGpmMigSampleGet", handle=True)
    def _c_gpm_mig_sample_get(self, dev: NvmlDevice, gpu_instance_id: Any, sample: Any) -> None:
        buffer = self._gpm_buffer(sample)
        if dev.is_mig:
            raise Fail(codes.ERROR_INVALID_ARGUMENT)
        if not self._gpm_supported(dev):
            raise Fail(codes.ERROR_NOT_SUPPORTED)
        gi = value(gpu_instance_id)
        child = next((c for c in dev.children if c.gi == gi), None)
        if child is None:
            raise Fail(codes.ERROR_NOT_FOUND if dev.mig_enabled else codes.ERROR_INVALID_ARGUMENT)
        if self._lost_now(child, self._vt()):
            raise Fail(codes.ERROR_GPU_IS_LOST)
        self._take(child, buffer)

    @c_function("nvmlGpmMetricsGet")
    def _c_gpm_metrics_get(self, out: Any) -> None:
        request = target(out)
        if request is None:
            raise Fail(codes.ERROR_INVALID_ARGUMENT)
        if request.version != codes.GPM_METRICS_GET_VERSION:
            raise Fail(codes.ERROR_ARGUMENT_VERSION_MISMATCH)
        n = int(request.numMetrics)
        if n > codes.GPM_METRIC_MAX:
            raise Fail(codes.ERROR_INVALID_ARGUMENT)
        first, second = self._gpm_buffer(request.sample1), self._gpm_buffer(request.sample2)
        s1, s2, dev = first.snapshot, second.snapshot, second.device
        if s1 is None or s2 is None or dev is None or first.device is not dev or s2.t < s1.t:
            raise Fail(codes.ERROR_INVALID_ARGUMENT)
        links = self._link_count(dev)
        metrics = request.metrics
        limit, mode = gpm_metric_limit(self.profile), self.profile.gpm_cumulative
        if mode == "call_fails" and any(int(metrics[i].metricId) in gpm.CUMULATIVE and int(metrics[i].metricId) < limit
                                        for i in range(n)):
            raise Fail(codes.ERROR_INVALID_ARGUMENT)
        for i in range(n):
            metric = metrics[i]
            metric_id = int(metric.metricId)
            code = gpm.supported(dev, metric_id, links, limit)
            metric.nvmlReturn = code
            if code != codes.SUCCESS:
                metric.value = 0.0
            elif metric_id in gpm.CUMULATIVE:
                boot = self._gpm_boot(dev, s1)
                total = gpm.cumulative(metric_id, s2, boot, dev)
                metric.value = total - gpm.cumulative(metric_id, s1, boot, dev) if mode == "differences" else total
            else:
                metric.value = gpm.compute(metric_id, s1, s2, links)
            short, long, unit = gpm.metric_info(metric_id)
            info = metric.metricInfo
            info.shortName, info.longName, info.unit = short, long, unit
