"""The fake libnvidia-ml under the real pynvml: every check goes through a load_pynvml copy.

The fake is set up from a scenario and a hand-moved clock; after that the tests only use the
pynvml API (plus the library's public test hooks: inject_xid, calls, latest_sample, close) and
compare what NVML reports with the virtual backend's own samples over the same window.
"""

from __future__ import annotations

import ctypes
import math
import threading
from typing import Any

import pytest

from agent.backends.virtual import VirtualBackend
from agent.virtual.devices import MIB
from agent.virtual.fake_nvml import FakeNvmlLibrary, load_pynvml
from agent.virtual.fake_nvml import codes
from agent.virtual.scenario import ScenarioError, parse_scenario
from tests.agent_process import poll

T0 = 1_800_000_000.0
START = T0 - 100.0  # the scenario started 100 s before the test's "now"


class Clock:
    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def scenario(model: str = "h100-sxm", gpus: int = 2, **node: Any) -> Any:
    workloads = node.pop("workloads", [
        {"job": "train", "gpus": [0], "phases": [{"kind": "compute", "mfu": 0.5, "duration_s": 3600}]},
        {"job": "decode", "gpus": [1], "phases": [{"kind": "memory", "mbu": 0.6, "duration_s": 3600}]},
    ][:gpus])
    return parse_scenario({"name": "t", "seed": 11, "nodes": [
        {"name": "n1", "model": model, "gpus": gpus, "workloads": workloads, **node}]})


class Rig:
    """A fake node: the virtual backend behind the fake driver, its pynvml copy, and a twin backend
    (same scenario and clock) whose samples are the reference for what NVML must report."""

    def __init__(self, scen: Any, **lib_kw: Any) -> None:
        self.clock = Clock()
        self.virtual = VirtualBackend(scen, clock=self.clock, start_time=START)
        self.twin = VirtualBackend(scen, clock=self.clock, start_time=START)
        self.lib = FakeNvmlLibrary(self.virtual, **lib_kw)
        self.nvml = load_pynvml(self.lib)

    def init(self) -> Any:
        self.nvml.nvmlInit()
        return self.nvml

    def step(self, seconds: float) -> float:
        self.clock.t += seconds
        return self.clock.t


@pytest.fixture
def rig() -> Any:
    r = Rig(scenario())
    r.init()
    yield r
    r.lib.close()


def address(handle: Any) -> int:
    return ctypes.cast(handle, ctypes.c_void_p).value or 0


def gpm_request(nvml: Any, s1: Any, s2: Any, ids: list[int]) -> Any:
    request = nvml.c_nvmlGpmMetricsGet_t()
    request.version = nvml.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = len(ids)
    request.sample1, request.sample2 = s1, s2
    for i, metric_id in enumerate(ids):
        request.metrics[i].metricId = metric_id
    return request


def gpm_values(nvml: Any, s1: Any, s2: Any, ids: list[int]) -> dict[int, tuple[int, float]]:
    request = nvml.nvmlGpmMetricsGet(gpm_request(nvml, s1, s2, ids))
    return {request.metrics[i].metricId: (request.metrics[i].nvmlReturn, request.metrics[i].value)
            for i in range(len(ids))}


# ----------------------------------------------------------------------------- loading, init


def test_constants_agree_with_the_real_pynvml() -> None:
    nvml = load_pynvml(None)
    assert codes.GPM_METRIC_MAX == nvml.NVML_GPM_METRIC_MAX
    assert codes.MEMORY_V2 == nvml.nvmlMemory_v2 and codes.TEMPERATURE_V1 == nvml.nvmlTemperature_v1
    assert codes.PROCESSES_UTILIZATION_INFO_V1 == nvml.ProcessesUtilizationInfo_v1
    assert codes.GPM_METRICS_GET_VERSION == nvml.NVML_GPM_METRICS_GET_VERSION
    assert (codes.FI_POWER_AVERAGE, codes.FI_POWER_INSTANT, codes.FI_TOTAL_ENERGY) == (
        nvml.NVML_FI_DEV_POWER_AVERAGE, nvml.NVML_FI_DEV_POWER_INSTANT, nvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION)
    assert (codes.FI_PCIE_TX_BYTES, codes.FI_NVLINK_DATA_RX, codes.FI_REMAPPED_FAILURE) == (
        nvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
        nvml.NVML_FI_DEV_REMAPPED_FAILURE)
    assert codes.FI_CLOCKS_EVENT_SW_POWER_CAP == nvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP
    assert codes.EVENT_XID == nvml.nvmlEventTypeXidCriticalError
    assert codes.ERROR_ARGUMENT_VERSION_MISMATCH == nvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    for code, text in nvml.NVMLError._errcode_to_string.items():
        assert codes.ERROR_STRINGS[code].decode() == text


def test_copies_are_independent_and_none_means_no_library() -> None:
    bare = load_pynvml(None)
    with pytest.raises(bare.NVMLError_LibraryNotFound):
        bare.nvmlInit()
    a, b = Rig(scenario()), Rig(scenario(gpus=1))
    assert a.nvml is not b.nvml and a.nvml.NVMLError is not b.nvml.NVMLError
    a.init()
    assert a.nvml.nvmlDeviceGetCount() == 2
    with pytest.raises(b.nvml.NVMLError_Uninitialized):  # b's library was never initialised
        b.nvml.nvmlDeviceGetCount()
    with pytest.raises(b.nvml.NVMLError_FunctionNotFound):
        b.nvml.nvmlDeviceGetBoardPartNumber(a.nvml.nvmlDeviceGetHandleByIndex(0))


def test_init_shutdown_reference_counting(rig: Rig) -> None:
    nvml = rig.nvml
    nvml.nvmlInit()  # second reference
    nvml.nvmlShutdown()
    assert nvml.nvmlDeviceGetCount() == 2  # one reference left
    nvml.nvmlShutdown()
    with pytest.raises(nvml.NVMLError_Uninitialized):
        nvml.nvmlDeviceGetCount()
    with pytest.raises(nvml.NVMLError_Uninitialized):
        nvml.nvmlShutdown()
    assert nvml.nvmlErrorString(nvml.NVML_ERROR_GPU_IS_LOST) == "GPU is lost"  # works uninitialised
    nvml.nvmlInit()
    assert nvml.nvmlDeviceGetCount() == 2


def test_versions_and_driver_not_loaded() -> None:
    r = Rig(scenario(nvml={"driver_version": "550.54.15", "cuda_driver_version": 12040}))
    nvml = r.init()
    assert nvml.nvmlSystemGetDriverVersion() == "550.54.15"
    assert nvml.nvmlSystemGetNVMLVersion() == "12.550.54.15"
    assert nvml.nvmlSystemGetCudaDriverVersion() == 12040
    off = Rig(scenario(nvml={"driver_loaded": False}))
    with pytest.raises(off.nvml.NVMLError_DriverNotLoaded):
        off.nvml.nvmlInit()
    with pytest.raises(ScenarioError, match="nvml.driver_version"):
        scenario(nvml={"driver_version": "latest"})
    with pytest.raises(ScenarioError, match="nvml.no_permission.0"):
        scenario(nvml={"no_permission": ["GpmSampleGet"]})


@pytest.mark.parametrize("fault,message", [
    ({"kind": "xid", "start_s": 5}, "faults.0.xid: required for kind xid"),
    ({"kind": "error", "xid": 31, "start_s": 5, "duration_s": 1}, "faults.0.xid: only allowed with kind xid"),
    ({"kind": "error", "start_s": 5}, "faults.0.duration_s: Field required"),
])
def test_xid_fault_validation(fault: dict[str, Any], message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        scenario(faults=[{"gpu": 0, **fault}])
    assert scenario(faults=[{"gpu": 0, "kind": "xid", "xid": 79, "start_s": 5}]).nodes[0].faults[0].xid == 79


# ----------------------------------------------------------------------------- identity


def test_identity_matches_the_virtual_devices(rig: Rig) -> None:
    nvml = rig.nvml
    for info in rig.twin.discover():
        h = nvml.nvmlDeviceGetHandleByIndex(int(info.gpu))
        assert nvml.nvmlDeviceGetName(h) == info.model == "NVIDIA H100 80GB HBM3"
        assert nvml.nvmlDeviceGetUUID(h) == info.uuid
        assert address(nvml.nvmlDeviceGetHandleByUUID(info.uuid)) == address(h)
        pci = nvml.nvmlDeviceGetPciInfo(h)
        assert pci.busId == info.pci_bus_id == pci.busId.upper()  # NVML prints upper case
        assert pci.pciDeviceId == (info.pci_device_id << 16) | 0x10DE
        assert nvml.nvmlDeviceGetMemoryInfo(h).total == info.memory_total_bytes
        assert nvml.nvmlDeviceGetAttributes(h).multiprocessorCount == info.sm_count == 132
        assert nvml.nvmlDeviceGetMaxClockInfo(h, nvml.NVML_CLOCK_SM) == info.sm_clock_max_mhz
        assert nvml.nvmlDeviceGetMinorNumber(h) == int(info.gpu)
        assert nvml.nvmlDeviceGetArchitecture(h) == nvml.NVML_DEVICE_ARCH_HOPPER
        assert nvml.nvmlDeviceGetCudaComputeCapability(h) == (9, 0)
        assert nvml.nvmlDeviceGetPersistenceMode(h) == nvml.NVML_FEATURE_ENABLED
        (links,) = nvml.nvmlDeviceGetFieldValues(h, [nvml.NVML_FI_DEV_NVLINK_LINK_COUNT])
        assert links.nvmlReturn == 0 and links.value.uiVal == info.link_count == 18
    with pytest.raises(nvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetHandleByIndex(2)
    with pytest.raises(nvml.NVMLError_NotFound):
        nvml.nvmlDeviceGetHandleByUUID("GPU-00000000-0000-0000-0000-000000000000")


def test_readings_match_the_virtual_sample(rig: Rig) -> None:
    nvml = rig.nvml
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    ref = rig.twin.sample("0", rig.clock())
    assert nvml.nvmlDeviceGetPowerUsage(h) == round(ref.power_w * 1000)
    assert nvml.nvmlDeviceGetEnforcedPowerLimit(h) == round(ref.power_limit_w * 1000)
    assert nvml.nvmlDeviceGetTotalEnergyConsumption(h) == round(ref.energy_j * 1000)
    assert nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU) == round(ref.temperature_c)
    assert nvml.nvmlDeviceGetTemperatureV(h, nvml.NVML_TEMPERATURE_GPU) == round(ref.temperature_c)
    assert nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM) == round(ref.sm_clock_mhz)
    assert nvml.nvmlDeviceGetCurrentClocksEventReasons(h) == ref.clock_event_reasons
    util = nvml.nvmlDeviceGetUtilizationRates(h)
    assert (util.gpu, util.memory) == (round(100 * ref.gr_active), round(100 * ref.dram_active))
    assert rig.lib.latest_sample(0) == ref  # the clock did not move: every call read the same advance
    assert rig.lib.latest_sample(1) is None  # GPU 1 was never read
    assert rig.lib.calls[("0", "nvmlDeviceGetPowerUsage")] == 1 and rig.lib.calls[("0", "nvmlDeviceGetClockInfo")] == 1
    assert rig.lib.calls[(None, "nvmlDeviceGetHandleByIndex_v2")] == 1


def test_readings_other_tools_ask_for(rig: Rig) -> None:
    """What nvitop and other NVML clients read besides roofwatch, as an H100 SXM answers it."""
    nvml = rig.nvml
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    ref = rig.twin.sample("0", rig.clock())
    assert nvml.nvmlDeviceGetPcieThroughput(h, nvml.NVML_PCIE_UTIL_TX_BYTES) == round(ref.pcie_tx_bytes_per_s / 1024)
    assert nvml.nvmlDeviceGetPcieThroughput(h, nvml.NVML_PCIE_UTIL_RX_BYTES) == round(ref.pcie_rx_bytes_per_s / 1024)
    assert nvml.nvmlDeviceGetEncoderUtilization(h) == [0, 167_000]
    assert nvml.nvmlDeviceGetDecoderUtilization(h) == [0, 167_000]
    assert nvml.nvmlDeviceGetGraphicsRunningProcesses(h) == []
    with pytest.raises(nvml.NVMLError_NotSupported):  # passively cooled: no fan of its own
        nvml.nvmlDeviceGetFanSpeed(h)
    with pytest.raises(nvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetPcieThroughput(h, 7)


def test_memory_info_v1_and_v2(rig: Rig) -> None:
    nvml = rig.nvml
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    ref = rig.twin.sample("0", rig.clock())
    v2 = nvml.nvmlDeviceGetMemoryInfo(h, version=nvml.nvmlMemory_v2)
    assert (v2.total, v2.used, v2.reserved) == (ref.mem_total_bytes, ref.mem_used_bytes, 512 * MIB)
    assert v2.total == v2.reserved + v2.used + v2.free
    v1 = nvml.nvmlDeviceGetMemoryInfo(h)  # the legacy struct counts the driver's reservation as used
    assert (v1.total, v1.used, v1.free) == (v2.total, v2.used + v2.reserved, v2.free)
    with pytest.raises(nvml.NVMLError_ArgumentVersionMismatch):
        nvml.nvmlDeviceGetMemoryInfo(h, version=0x01000028)


# ----------------------------------------------------------------------------- GPM


GPM_RATIOS = {1: "gr_active", 2: "sm_active", 3: "sm_occupancy", 5: "tensor_active", 7: "tensor_hmma_active",
              10: "dram_active", 11: "fp64_active", 12: "fp32_active", 13: "fp16_active"}
GPM_RATES = {20: "pcie_tx_bytes_per_s", 21: "pcie_rx_bytes_per_s", 60: "link_rx_bytes_per_s", 61: "link_tx_bytes_per_s"}


def test_gpm_pair_equals_the_virtual_sample_over_the_same_window(rig: Rig) -> None:
    nvml = rig.nvml
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlGpmQueryDeviceSupport(h).isSupportedDevice == 1
    s1, s2 = nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()
    nvml.nvmlGpmSampleGet(h, s1)
    rig.twin.sample("0", rig.clock())
    rig.step(1.5)
    nvml.nvmlGpmSampleGet(h, s2)
    ref = rig.twin.sample("0", rig.clock())
    assert ref.interval_s == pytest.approx(1.5) and ref.tensor_active > 0.3
    values = gpm_values(nvml, s1, s2, [*GPM_RATIOS, *GPM_RATES, 6, 8, 9, 62, 79, 98, 4])
    for metric_id, field in GPM_RATIOS.items():
        rc, value = values[metric_id]
        assert rc == 0 and math.isclose(value, 100 * getattr(ref, field), rel_tol=1e-9, abs_tol=1e-9), metric_id
    for metric_id, field in GPM_RATES.items():
        rc, value = values[metric_id]
        assert rc == 0 and math.isclose(value * MIB, getattr(ref, field), rel_tol=1e-9, abs_tol=1e-6), metric_id
    assert values[8] == (0, 0.0) and values[6] == (0, 0.0) and values[9] == (0, 0.0)  # bf16: no DMMA/DFMA/IMMA
    assert values[62][0] == 0 and values[79][0] == 0  # links 0 and 8 of 18
    assert values[98][0] == nvml.NVML_ERROR_NOT_SUPPORTED and values[4][0] == nvml.NVML_ERROR_NOT_SUPPORTED
    nvml.nvmlGpmSampleFree(s1)
    with pytest.raises(nvml.NVMLError_InvalidArgument):
        nvml.nvmlGpmSampleGet(h, s1)


def test_gpm_samples_under_100_ms_apart_read_zero(rig: Rig) -> None:
    nvml = rig.nvml
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    s1, s2 = nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()
    nvml.nvmlGpmSampleGet(h, s1)
    rig.step(0.05)
    nvml.nvmlGpmSampleGet(h, s2)
    values = gpm_values(nvml, s1, s2, list(GPM_RATIOS))
    assert set(values.values()) == {(0, 0.0)}


def test_gpm_metrics_struct_version_is_checked(rig: Rig) -> None:
    nvml = rig.nvml
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    s1, s2 = nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()
    nvml.nvmlGpmSampleGet(h, s1)
    rig.step(1.0)
    nvml.nvmlGpmSampleGet(h, s2)
    request = gpm_request(nvml, s1, s2, [2])
    request.version = 2
    with pytest.raises(nvml.NVMLError_ArgumentVersionMismatch) as err:
        nvml.nvmlGpmMetricsGet(request)
    assert "version" in str(err.value)  # pynvml asks nvmlErrorString for codes it has no text for
    other = nvml.nvmlGpmSampleAlloc()
    nvml.nvmlGpmSampleGet(nvml.nvmlDeviceGetHandleByIndex(1), other)
    with pytest.raises(nvml.NVMLError_InvalidArgument):  # samples of two different GPUs
        nvml.nvmlGpmMetricsGet(gpm_request(nvml, s1, other, [2]))


@pytest.mark.parametrize("model,nvml_profile", [("a100-sxm-80gb", {}), ("h100-sxm", {"gpm": False})])
def test_gpm_unsupported_before_hopper_or_when_disabled(model: str, nvml_profile: dict[str, Any]) -> None:
    r = Rig(scenario(model, nvml=nvml_profile))
    nvml = r.init()
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlGpmQueryDeviceSupport(h).isSupportedDevice == 0
    with pytest.raises(nvml.NVMLError_NotSupported):
        nvml.nvmlGpmSampleGet(h, nvml.nvmlGpmSampleAlloc())
    assert nvml.nvmlDeviceGetUtilizationRates(h).gpu > 0  # NVML basics still work


def test_old_driver_lacks_symbols_and_fields() -> None:
    r = Rig(scenario(nvml={"driver_version": "470.57.02"}))
    nvml = r.init()
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(nvml.NVMLError_FunctionNotFound):
        nvml.nvmlGpmSampleAlloc()
    with pytest.raises(nvml.NVMLError_FunctionNotFound):
        nvml.nvmlDeviceGetCurrentClocksEventReasons(h)
    with pytest.raises(nvml.NVMLError_FunctionNotFound):
        nvml.nvmlDeviceGetProcessesUtilizationInfo(h, 0)
    assert nvml.nvmlDeviceGetCurrentClocksThrottleReasons(h) >= 0
    # pynvml's default asks for _v3 (R510+) and turns FunctionNotFound into a non-NVMLError exception.
    with pytest.raises(nvml.NVMLLibraryMismatchError):
        nvml.nvmlDeviceGetComputeRunningProcesses(h)
    assert len(nvml.nvmlDeviceGetComputeRunningProcesses_v2(h)) == 1
    with pytest.raises(nvml.NVMLError_FunctionNotFound):  # R565+
        nvml.nvmlDeviceGetTemperatureV(h, nvml.NVML_TEMPERATURE_GPU)
    assert nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU) > 20
    pcie, energy = nvml.nvmlDeviceGetFieldValues(h, [nvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES,
                                                     nvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION])
    assert pcie.nvmlReturn == nvml.NVML_ERROR_NOT_SUPPORTED and energy.nvmlReturn == 0


def test_h100_pcie_has_no_nvlink() -> None:
    r = Rig(scenario("h100-pcie", gpus=1))
    nvml = r.init()
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    fields = nvml.nvmlDeviceGetFieldValues(h, [nvml.NVML_FI_DEV_NVLINK_LINK_COUNT,
                                               (nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 0xFFFFFFFF)])
    assert [f.nvmlReturn for f in fields] == [nvml.NVML_ERROR_NOT_SUPPORTED] * 2
    s1, s2 = nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()
    nvml.nvmlGpmSampleGet(h, s1)
    r.step(1.0)
    nvml.nvmlGpmSampleGet(h, s2)
    values = gpm_values(nvml, s1, s2, [2, 60, 61, 62])
    assert values[2][0] == 0 and {values[m][0] for m in (60, 61, 62)} == {nvml.NVML_ERROR_NOT_SUPPORTED}


# ----------------------------------------------------------------------------- fields


def test_field_batch_with_a_failing_field() -> None:
    r = Rig(scenario(nvml={"failing_fields": [186]}))
    nvml = r.init()
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    ids = [nvml.NVML_FI_DEV_POWER_AVERAGE, nvml.NVML_FI_DEV_POWER_INSTANT, nvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION,
           nvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES, (nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 0xFFFFFFFF), 9999]
    first = nvml.nvmlDeviceGetFieldValues(h, ids)
    ref = r.twin.sample("0", r.clock())
    assert [f.nvmlReturn for f in first] == [0, nvml.NVML_ERROR_NOT_SUPPORTED, 0, 0, 0, nvml.NVML_ERROR_NOT_SUPPORTED]
    assert first[0].valueType == nvml.NVML_VALUE_TYPE_UNSIGNED_INT and first[0].value.uiVal == round(ref.power_w * 1000)
    assert first[2].value.ullVal == nvml.nvmlDeviceGetTotalEnergyConsumption(h)
    assert first[0].timestamp == int(r.clock() * 1e6) and first[0].scopeId == 0
    r.step(2.0)
    second = nvml.nvmlDeviceGetFieldValues(h, ids)
    ref = r.twin.sample("0", r.clock())
    assert second[3].value.ullVal - first[3].value.ullVal == pytest.approx(ref.pcie_rx_bytes_per_s * 2.0, abs=2)
    assert second[4].value.ullVal - first[4].value.ullVal == pytest.approx(ref.link_tx_bytes_per_s * 2.0 / 1024, abs=2)
    assert second[2].value.ullVal - first[2].value.ullVal == pytest.approx(ref.power_w * 2000, abs=2)


def test_clock_event_time_accumulates_while_capped() -> None:
    r = Rig(scenario(gpus=1, workloads=[{"job": "gemm", "gpus": [0], "phases": [
        {"kind": "compute", "mfu": 0.9, "power_cap_w": 350, "duration_s": 3600}]}]))
    nvml = r.init()
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    ids = [nvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP, nvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN]
    before = [f.value.ullVal for f in nvml.nvmlDeviceGetFieldValues(h, ids)]
    r.step(2.0)
    after = [f.value.ullVal for f in nvml.nvmlDeviceGetFieldValues(h, ids)]
    assert nvml.nvmlDeviceGetCurrentClocksEventReasons(h) & nvml.nvmlClocksEventReasonSwPowerCap
    assert after[0] - before[0] == pytest.approx(2e9) and after[1] == before[1] == 0


def test_xid_leaves_ecc_and_row_remap_state(rig: Rig) -> None:
    nvml = rig.nvml
    h = nvml.nvmlDeviceGetHandleByIndex(1)
    ids = [nvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL, nvml.NVML_FI_DEV_REMAPPED_COR, nvml.NVML_FI_DEV_REMAPPED_PENDING,
           nvml.NVML_FI_DEV_REMAPPED_FAILURE]

    def read() -> list[int]:
        return [f.value.ullVal if f.valueType == nvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG else f.value.uiVal
                for f in nvml.nvmlDeviceGetFieldValues(h, ids)]

    assert read() == [0, 0, 0, 0]
    rig.lib.inject_xid(1, 48)
    rig.lib.inject_xid(1, 63)
    assert read() == [1, 1, 1, 0]
    rig.lib.inject_xid(1, 64)
    assert read() == [1, 1, 1, 1]
    assert nvml.nvmlDeviceGetFieldValues(nvml.nvmlDeviceGetHandleByIndex(0), ids[:1])[0].value.ullVal == 0


# ----------------------------------------------------------------------------- processes


def test_processes_and_process_utilization(rig: Rig) -> None:
    nvml = rig.nvml
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    (proc,) = nvml.nvmlDeviceGetComputeRunningProcesses(h)
    ref = rig.twin.sample("0", rig.clock())
    (vproc,) = ref.processes
    assert (proc.pid, proc.usedGpuMemory) == (vproc.pid, vproc.used_memory_bytes)
    assert (proc.gpuInstanceId, proc.computeInstanceId) == (0xFFFFFFFF, 0xFFFFFFFF)
    (util,) = nvml.nvmlDeviceGetProcessUtilization(h, 0)
    assert util.pid == vproc.pid and util.smUtil == round(100 * ref.sm_active)
    assert util.timeStamp == int(rig.clock() * 1e6)
    with pytest.raises(nvml.NVMLError_NotFound):  # nothing newer than what was seen
        nvml.nvmlDeviceGetProcessUtilization(h, util.timeStamp)
    rig.step(1.0)
    (newer,) = nvml.nvmlDeviceGetProcessUtilization(h, util.timeStamp)
    assert newer.timeStamp > util.timeStamp
    (info,) = nvml.nvmlDeviceGetProcessesUtilizationInfo(h, util.timeStamp)
    assert (info.pid, info.timeStamp, info.smUtil) == (newer.pid, newer.timeStamp, newer.smUtil)


def test_idle_gpu_has_no_processes() -> None:
    r = Rig(scenario(workloads=[]))
    nvml = r.init()
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceGetComputeRunningProcesses(h) == []
    with pytest.raises(nvml.NVMLError_NotFound):
        nvml.nvmlDeviceGetProcessUtilization(h, 0)


# ----------------------------------------------------------------------------- MIG


def test_mig_enumeration_and_mig_gpm() -> None:
    r = Rig(scenario(mig={0: ["3g.40gb", "1g.10gb"]}, workloads=[
        {"job": "train", "gpus": ["0/1"], "phases": [{"kind": "compute", "mfu": 0.6, "duration_s": 3600}]}]))
    nvml = r.init()
    assert nvml.nvmlDeviceGetCount() == 2
    parent, plain = nvml.nvmlDeviceGetHandleByIndex(0), nvml.nvmlDeviceGetHandleByIndex(1)
    assert nvml.nvmlDeviceGetMigMode(parent) == [1, 1] and nvml.nvmlDeviceGetMigMode(plain) == [0, 0]
    assert nvml.nvmlDeviceGetMaxMigDeviceCount(parent) == 7
    virtual = {d.gpu: d for d in r.twin.discover()}
    migs = [nvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, i) for i in range(2)]
    with pytest.raises(nvml.NVMLError_NotFound):
        nvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 2)
    for j, mig in enumerate(migs, start=1):
        info = virtual[f"0/{j}"]
        assert nvml.nvmlDeviceIsMigDeviceHandle(mig).value == 1  # pynvml returns the c_uint itself
        assert nvml.nvmlDeviceGetGpuInstanceId(mig) == j and nvml.nvmlDeviceGetComputeInstanceId(mig) == 0
        assert address(nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)) == address(parent)
        assert nvml.nvmlDeviceGetName(mig) == info.model and nvml.nvmlDeviceGetUUID(mig) == info.uuid
        assert address(nvml.nvmlDeviceGetHandleByUUID(info.uuid)) == address(mig)
        assert nvml.nvmlDeviceGetMemoryInfo(mig).total == info.memory_total_bytes
        assert nvml.nvmlDeviceGetAttributes(mig).multiprocessorCount == info.sm_count
        with pytest.raises(nvml.NVMLError_NotSupported):
            nvml.nvmlDeviceGetUtilizationRates(mig)
        with pytest.raises(nvml.NVMLError_NotSupported):
            nvml.nvmlDeviceGetPowerUsage(mig)
    assert nvml.nvmlDeviceIsMigDeviceHandle(parent).value == 0
    with pytest.raises(nvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetUtilizationRates(parent)
    with pytest.raises(nvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetProcessUtilization(parent, 0)
    (proc,) = nvml.nvmlDeviceGetComputeRunningProcesses(parent)
    assert (proc.gpuInstanceId, proc.computeInstanceId) == (1, 0)

    s1, s2 = nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()
    nvml.nvmlGpmMigSampleGet(parent, 1, s1)
    r.twin.sample("0/1", r.clock())
    r.step(1.0)
    nvml.nvmlGpmMigSampleGet(parent, 1, s2)
    ref = r.twin.sample("0/1", r.clock())
    values = gpm_values(nvml, s1, s2, [2, 5, 20, 60])
    assert values[2][0] == 0 and math.isclose(values[2][1], 100 * ref.sm_active, rel_tol=1e-9)
    assert values[5][0] == 0 and math.isclose(values[5][1], 100 * ref.tensor_active, rel_tol=1e-9)
    assert values[20][0] == values[60][0] == nvml.NVML_ERROR_NOT_SUPPORTED  # whole-GPU counters
    with pytest.raises(nvml.NVMLError_NotFound):
        nvml.nvmlGpmMigSampleGet(parent, 5, s1)
    with pytest.raises(nvml.NVMLError_NotSupported):  # a MIG device is sampled through its parent
        nvml.nvmlGpmSampleGet(migs[0], s1)


def test_mig_mode_not_supported_on_ada() -> None:
    r = Rig(scenario("l40s", gpus=1))
    nvml = r.init()
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceGetArchitecture(h) == nvml.NVML_DEVICE_ARCH_ADA
    with pytest.raises(nvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetMigMode(h)


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
