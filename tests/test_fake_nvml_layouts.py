"""MIG layouts as a real driver places them, and a vGPU guest, through the real pynvml over the fake driver:
the A30's four compute slices, GPU instance ids the scenario states (``mig_ids``, 0 included), and a
time-sliced vGPU named and sized by its profile (``vgpu``), without power or temperature."""

from __future__ import annotations

from typing import Any

import pytest

from agent.virtual.devices import GIB, MIB
from agent.virtual.scenario import ScenarioError
from tests.fake_nvml_rig import Rig, scenario


def _rig(model: str, gpus: int, **node: Any) -> Any:
    rig = Rig(scenario(model, gpus, **node))
    rig.init()
    return rig


def _instances(nvml: Any, parent: Any) -> list[Any]:
    out = []
    for slot in range(nvml.nvmlDeviceGetMaxMigDeviceCount(parent)):
        try:
            out.append(nvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, slot))
        except nvml.NVMLError_NotFound:
            pass
    return out


def test_an_a30_has_four_compute_slices_and_the_gi_ids_the_scenario_places():
    rig = _rig("a30", 1, mig={0: ["1g.6gb"] * 4}, mig_ids={0: [3, 4, 5, 6]},
               workloads=[{"job": "a", "gpus": ["0/3"], "phases": [{"kind": "compute", "mfu": 0.5, "duration_s": 60}]}])
    nvml = rig.nvml
    parent = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceGetMigMode(parent)[0] == nvml.NVML_DEVICE_MIG_ENABLE
    assert nvml.nvmlDeviceGetMaxMigDeviceCount(parent) == 4
    with pytest.raises(nvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 4)
    migs = _instances(nvml, parent)
    assert [nvml.nvmlDeviceGetGpuInstanceId(m) for m in migs] == [3, 4, 5, 6]
    for mig in migs:
        assert nvml.nvmlDeviceGetName(mig) == "NVIDIA A30 MIG 1g.6gb"
        attrs = nvml.nvmlDeviceGetAttributes(mig)
        assert attrs.multiprocessorCount == 56 // 4  # MIG user guide: 1g.6gb has 1/4 of the SMs
        assert attrs.gpuInstanceSliceCount == 1
        assert nvml.nvmlDeviceGetMemoryInfo(mig).total < 6 * GIB
        assert nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)) == \
            nvml.nvmlDeviceGetUUID(parent)
    rig.lib.close()


def test_gpu_instance_0_is_a_mig_device_too():
    """A 7g.40gb is GPU instance 0 on a real A100: its handle must still be a MIG device's."""
    rig = _rig("a100-sxm-40gb", 1, mig={0: ["7g.40gb"]}, mig_ids={0: [0]},
               workloads=[{"job": "a", "gpus": ["0/0"], "phases": [{"kind": "compute", "mfu": 0.5, "duration_s": 60}]}])
    nvml = rig.nvml
    (mig,) = _instances(nvml, nvml.nvmlDeviceGetHandleByIndex(0))
    assert nvml.nvmlDeviceIsMigDeviceHandle(mig).value == 1  # pynvml returns the c_uint
    assert nvml.nvmlDeviceGetGpuInstanceId(mig) == 0 and nvml.nvmlDeviceGetComputeInstanceId(mig) == 0
    assert nvml.nvmlDeviceGetName(mig).endswith(" MIG 7g.40gb")
    rig.lib.close()


def test_a_vgpu_guest_sees_the_profile_name_and_frame_buffer_and_no_power():
    rig = _rig("a100-pcie-40gb", 1, vgpu="GRID A100-10C")
    nvml = rig.nvml
    rig.step(2.0)
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceGetName(handle) == "GRID A100-10C"
    assert nvml.nvmlDeviceGetMemoryInfo(handle).total == 10240 * MIB
    assert nvml.nvmlDeviceGetAttributes(handle).multiprocessorCount == 108  # time-sliced: every SM
    for call in (lambda: nvml.nvmlDeviceGetPowerUsage(handle), lambda: nvml.nvmlDeviceGetTotalEnergyConsumption(handle),
                 lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU),
                 lambda: nvml.nvmlDeviceGetMigMode(handle)):
        with pytest.raises(nvml.NVMLError_NotSupported):
            call()
    assert nvml.nvmlDeviceGetUtilizationRates(handle).gpu > 0
    rig.lib.close()


@pytest.mark.parametrize(("node", "message"), [
    ({"mig": {0: ["1g.5gb"]}, "mig_ids": {0: [13, 14]}}, "mig_ids.0: 2 ids for the 1 MIG instances"),
    ({"mig": {0: ["1g.5gb", "1g.5gb"]}, "mig_ids": {0: [13, 13]}}, "GPU instance ids must differ"),
    ({"mig": {0: ["1g.5gb"]}, "mig_ids": {0: [15]}}, "mig_ids.0.0"),
    ({"mig": {0: ["1g.5gb"]}, "mig_ids": {0: [13]},
      "workloads": [{"job": "a", "gpus": ["0/1"], "phases": [{"kind": "compute", "mfu": 0.5, "duration_s": 1}]}]},
     "MIG instance 0/1 does not exist"),
    ({"model": "a30", "mig": {0: ["4g.24gb", "1g.6gb"]}}, "instances use 5 compute slices; a GPU has 4 (a30)"),
    ({"vgpu": "GRID A100-10C", "mig": {0: ["1g.5gb"]}}, "a time-sliced vGPU has no MIG mode"),
    ({"vgpu": "GRID A100-12C"}, "no vGPU profile"),
    ({"model": "a100-sxm-40gb", "vgpu": "GRID A100-10C"}, "runs on a100-pcie-40gb, not on a100-sxm-40gb"),
    ({"vgpu": "GRID A100-2-10C"}, "MIG-backed"),
])
def test_layout_errors_name_the_field(node: dict[str, Any], message: str):
    node = {"model": "a100-pcie-40gb", "workloads": [], **node}
    with pytest.raises((ScenarioError, ValueError)) as err:
        scenario(node.pop("model"), 1, **node)
    assert message in str(err.value), str(err.value)
