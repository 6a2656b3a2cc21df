"""The fake libnvidia-ml under the real pynvml: loading, init, identity, readings, fields, processes.

Every check goes through a load_pynvml copy. The fake is set up from a scenario and a hand-moved
clock (tests/fake_nvml_rig.py); after that the tests only use the pynvml API (plus the library's
public test hooks: inject_xid, calls, latest_sample, close) and compare what NVML reports with the
virtual backend's own samples over the same window. GPM and MIG are in test_fake_nvml_gpm.py,
faults and XID events in test_fake_nvml_faults.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from agent.virtual.devices import MIB
from agent.virtual.fake_nvml import codes, load_pynvml
from agent.virtual.sampling import mem_busy_share
from agent.virtual.scenario import ScenarioError
from tests.fake_nvml_rig import Rig, address, scenario
from tests.fake_nvml_rig import rig  # noqa: F401 (a fixture)


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
    # utilization.memory is busy time, which reads higher than the bandwidth share (virtual.sampling).
    assert (util.gpu, util.memory) == (round(100 * ref.gr_active), round(100 * mem_busy_share(ref.dram_active)))
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


# ----------------------------------------------------------------------------- fields


def test_field_batch_with_a_failing_field() -> None:
    r = Rig(scenario(nvml={"failing_fields": [186]}))
    nvml = r.init()
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    ids = [nvml.NVML_FI_DEV_POWER_AVERAGE, nvml.NVML_FI_DEV_POWER_INSTANT, nvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION,
           nvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES, (nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 0xFFFFFFFF), 9999]
    first = nvml.nvmlDeviceGetFieldValues(h, ids)
    ref = r.twin.sample("0", r.clock())
    # 186 fails alone (failing_fields); 9999 is an id no driver declares: INVALID_ARGUMENT for that entry only
    assert [f.nvmlReturn for f in first] == [0, nvml.NVML_ERROR_NOT_SUPPORTED, 0, 0, 0, nvml.NVML_ERROR_INVALID_ARGUMENT]
    assert first[0].valueType == nvml.NVML_VALUE_TYPE_UNSIGNED_INT and first[0].value.uiVal == round(ref.power_w * 1000)
    assert first[2].value.ullVal == nvml.nvmlDeviceGetTotalEnergyConsumption(h)
    assert first[0].timestamp == int(r.clock() * 1e6) and first[0].scopeId == 0
    r.step(2.0)
    second = nvml.nvmlDeviceGetFieldValues(h, ids)
    ref = r.twin.sample("0", r.clock())
    pcie_delta = (second[3].value.ullVal - first[3].value.ullVal) % 2**32  # a 32-bit counter that wraps
    assert second[3].value.ullVal < 2**32 and pcie_delta == pytest.approx(ref.pcie_rx_bytes_per_s * 2.0, abs=2)
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
