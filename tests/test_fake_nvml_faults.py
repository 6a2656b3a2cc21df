"""The fake libnvidia-ml under the real pynvml: faults and XID events.

Lost GPUs, error windows, hangs released by close(), permission and unsupported symbols, minimal
counters; XID critical errors delivered through nvmlEventSetWait, from the scenario and injected.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from tests.agent_process import poll
from tests.fake_nvml_rig import Rig, address, scenario
from tests.fake_nvml_rig import rig  # noqa: F401 (a fixture)


# ----------------------------------------------------------------------------- faults


def test_lost_gpu_needs_a_new_handle() -> None:
    r = Rig(scenario(faults=[{"gpu": 1, "kind": "lost", "start_s": 110, "duration_s": 5}]))
    nvml = r.init()
    old = nvml.nvmlDeviceGetHandleByIndex(1)
    assert nvml.nvmlDeviceGetPowerUsage(old) > 0
    r.step(11.0)  # virtual 111 s: inside the window
    for call in (lambda: nvml.nvmlDeviceGetPowerUsage(old), lambda: nvml.nvmlDeviceGetName(old),
                 lambda: nvml.nvmlDeviceGetHandleByIndex(1)):
        with pytest.raises(nvml.NVMLError_GpuIsLost):
            call()
    assert nvml.nvmlDeviceGetPowerUsage(nvml.nvmlDeviceGetHandleByIndex(0)) > 0  # the other GPU is fine
    r.step(5.0)  # after the window: reset done
    with pytest.raises(nvml.NVMLError_GpuIsLost):
        nvml.nvmlDeviceGetPowerUsage(old)
    new = nvml.nvmlDeviceGetHandleByIndex(1)
    assert address(new) != address(old) and nvml.nvmlDeviceGetPowerUsage(new) > 0
    assert address(nvml.nvmlDeviceGetHandleByIndex(1)) == address(new)


def test_error_window_fails_readings_only(rig: Rig) -> None:
    nvml = rig.nvml
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    rig.virtual.inject_fault(0, "error", 3.0)
    with pytest.raises(nvml.NVMLError_Unknown):
        nvml.nvmlDeviceGetPowerUsage(h)
    with pytest.raises(nvml.NVMLError_Unknown):
        nvml.nvmlGpmSampleGet(h, nvml.nvmlGpmSampleAlloc())
    assert nvml.nvmlDeviceGetName(h) == "NVIDIA H100 80GB HBM3"
    rig.step(3.0)
    assert nvml.nvmlDeviceGetPowerUsage(h) > 0


def test_hang_blocks_until_close(rig: Rig) -> None:
    nvml = rig.nvml
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    rig.virtual.inject_fault(0, "hang", 10.0, hang_s=30.0)
    outcome: list[Any] = []

    def read() -> None:
        try:
            outcome.append(nvml.nvmlDeviceGetPowerUsage(h))
        except nvml.NVMLError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=read)
    thread.start()
    assert poll(lambda: rig.lib.hung_calls == 1, timeout=2.0)
    assert not outcome
    rig.lib.close()
    thread.join(2.0)
    assert len(outcome) == 1 and isinstance(outcome[0], nvml.NVMLError_Unknown)


def test_permission_and_unsupported_symbols() -> None:
    r = Rig(scenario(nvml={"no_permission": ["nvmlGpmSampleGet"], "not_supported": ["nvmlDeviceGetPowerUsage"]}))
    nvml = r.init()
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(nvml.NVMLError_NoPermission):
        nvml.nvmlGpmSampleGet(h, nvml.nvmlGpmSampleAlloc())
    with pytest.raises(nvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetPowerUsage(h)
    assert nvml.nvmlDeviceGetTotalEnergyConsumption(h) > 0


def test_minimal_counters_deny_utilisation() -> None:
    r = Rig(scenario(counters="minimal"))
    nvml = r.init()
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(nvml.NVMLError_NoPermission):
        nvml.nvmlDeviceGetUtilizationRates(h)
    with pytest.raises(nvml.NVMLError_NoPermission):
        nvml.nvmlGpmSampleGet(h, nvml.nvmlGpmSampleAlloc())
    assert nvml.nvmlDeviceGetPowerUsage(h) > 0 and nvml.nvmlDeviceGetComputeRunningProcesses(h)


# ----------------------------------------------------------------------------- events


def test_xid_events_through_event_set_wait() -> None:
    r = Rig(scenario(faults=[{"gpu": 0, "kind": "xid", "xid": 31, "start_s": 105},
                             {"gpu": 1, "kind": "lost", "start_s": 107, "duration_s": 2}]))
    nvml = r.init()
    h0, h1 = nvml.nvmlDeviceGetHandleByIndex(0), nvml.nvmlDeviceGetHandleByIndex(1)
    assert nvml.nvmlDeviceGetSupportedEventTypes(h0) & nvml.nvmlEventTypeXidCriticalError
    events = nvml.nvmlEventSetCreate()
    nvml.nvmlDeviceRegisterEvents(h0, nvml.nvmlEventTypeXidCriticalError, events)
    with pytest.raises(nvml.NVMLError_Timeout):
        nvml.nvmlEventSetWait(events, 10)
    r.step(5.0)  # virtual 105 s: the scenario's XID 31 on GPU 0
    assert r.twin.sample("0", r.clock()).power_w > 0  # an xid fault is no failure for the virtual backend
    data = nvml.nvmlEventSetWait(events, 10)
    assert (data.eventType, data.eventData) == (nvml.nvmlEventTypeXidCriticalError, 31)
    assert address(data.device) == address(h0) and data.gpuInstanceId == data.computeInstanceId == 0xFFFFFFFF
    with pytest.raises(nvml.NVMLError_Timeout):  # delivered once
        nvml.nvmlEventSetWait(events, 10)
    nvml.nvmlDeviceRegisterEvents(h1, nvml.nvmlEventTypeXidCriticalError, events)
    r.step(2.0)  # GPU 1 falls off the bus: XID 79
    data = nvml.nvmlEventSetWait(events, 10)
    assert data.eventData == 79 and address(data.device) == address(h1)

    # An injected XID wakes a waiting call: with a ten-minute timeout, only the event can end it.
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.append(nvml.nvmlEventSetWait(events, 600_000)), daemon=True)
    waiter.start()
    r.lib.inject_xid(0, 48)
    waiter.join(30.0)
    assert got and got[0].eventData == 48
    nvml.nvmlEventSetFree(events)


def test_event_wait_ends_on_close(rig: Rig) -> None:
    nvml = rig.nvml
    events = nvml.nvmlEventSetCreate()
    nvml.nvmlDeviceRegisterEvents(nvml.nvmlDeviceGetHandleByIndex(0), nvml.nvmlEventTypeXidCriticalError, events)
    errors: list[Any] = []

    def wait() -> None:
        try:
            nvml.nvmlEventSetWait(events, 600_000)  # only close() can end this wait
        except nvml.NVMLError as exc:
            errors.append(exc)

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    rig.lib.close()
    waiter.join(30.0)
    assert len(errors) == 1 and isinstance(errors[0], nvml.NVMLError_Uninitialized)
