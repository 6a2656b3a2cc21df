"""The fake libnvidia-ml under the real pynvml: GPM samples and metrics, and MIG devices.

GPM pairs are compared with the twin virtual backend's sample over the same window; GPM is checked
absent where a real driver lacks it (pre-Hopper, disabled, an R470 driver, no NVLink on H100 PCIe).
MIG: enumeration through the parent, MIG handles, and GPM of a GPU instance.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from agent.virtual.devices import MIB
from tests.fake_nvml_rig import Rig, address, scenario
from tests.fake_nvml_rig import rig  # noqa: F401 (a fixture)


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
    assert pcie.nvmlReturn == nvml.NVML_ERROR_INVALID_ARGUMENT and energy.nvmlReturn == 0  # 197 is R555+


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
