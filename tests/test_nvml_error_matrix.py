"""Every NVML call the agent makes each interval, failing with each error class, through the
real backend and collector over the fake driver: the failing GPU gets what the error means
(unknown value, down, re-initialised), the other GPU never notices, nothing escapes, and the GPU
recovers once the driver answers again."""

from __future__ import annotations

import pytest

from agent.collector import Backoff, Collector
from agent.virtual.fake_nvml import codes
from tests.nvml_harness import Rig, scenario

PER_INTERVAL = (
    "nvmlDeviceGetFieldValues", "nvmlGpmSampleGet", "nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetTemperatureV",
    "nvmlDeviceGetClockInfo", "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetProcessUtilization",
)
"""The per-GPU calls of one interval (tests/test_nvml_backend.py counts them)."""
ERRORS = {
    "NOT_SUPPORTED": codes.ERROR_NOT_SUPPORTED, "NO_PERMISSION": codes.ERROR_NO_PERMISSION,
    "GPU_IS_LOST": codes.ERROR_GPU_IS_LOST, "UNINITIALIZED": codes.ERROR_UNINITIALIZED,
    "TIMEOUT": codes.ERROR_TIMEOUT, "UNKNOWN": codes.ERROR_UNKNOWN, "INSUFFICIENT_SIZE": codes.ERROR_INSUFFICIENT_SIZE,
    "NOT_FOUND": codes.ERROR_NOT_FOUND,
}


def _cycle(rig: Rig, collector: Collector):
    rig.step(1.0)
    return {d.info.gpu: d for d in collector.collect_once().devices}


@pytest.mark.parametrize("error", ERRORS)
@pytest.mark.parametrize("symbol", PER_INTERVAL)
def test_each_call_failing_with_each_error(symbol, error):
    rig = Rig(scenario())
    collector = Collector(rig.backend(), node="n1", clock=rig.clock, monotonic=rig.clock, sample_timeout_s=60.0,
                          backoff=Backoff(initial_s=1.0, max_s=4.0))
    try:
        for _ in range(3):
            devices = _cycle(rig, collector)
        assert devices["0"].up and devices["1"].up
        rig.library.force_error(symbol, ERRORS[error], gpu="0")
        for _ in range(4):
            devices = _cycle(rig, collector)  # never raises, whatever the driver says
            other = devices["1"]
            assert other.up and other.sample is not None and other.sample.ts == rig.clock(), "GPU 1 never notices"
            failing = devices["0"]
            if error == "GPU_IS_LOST":
                assert not failing.up and "lost" in (failing.error or "").lower(), failing.error
            if not failing.up:
                assert failing.error, "a down GPU says why"
        rig.library.clear_forced_errors()
        recovered = False
        for _ in range(12):  # back-off caps at 4 s here
            devices = _cycle(rig, collector)
            if devices["0"].up and devices["0"].sample is not None and devices["0"].sample.ts == rig.clock():
                recovered = True
                break
        assert recovered, f"GPU 0 still down after the driver recovered: {devices['0'].error}"
        assert devices["1"].up
    finally:
        collector.stop()
        rig.close()


@pytest.mark.parametrize("error", ["NOT_SUPPORTED", "NO_PERMISSION"])
def test_an_absent_reading_is_unknown_not_zero_and_the_gpu_stays_up(error):
    rig = Rig(scenario())
    collector = Collector(rig.backend(), node="n1", clock=rig.clock, monotonic=rig.clock, sample_timeout_s=60.0)
    try:
        for _ in range(3):
            _cycle(rig, collector)
        rig.library.force_error("nvmlDeviceGetTemperatureV", ERRORS[error], gpu="0")
        rig.library.force_error("nvmlDeviceGetTemperature", ERRORS[error], gpu="0")  # the older name it falls back to
        devices = _cycle(rig, collector)
        assert devices["0"].up and devices["0"].sample.temperature_c is None
        assert devices["1"].sample.temperature_c is not None
    finally:
        collector.stop()
        rig.close()
