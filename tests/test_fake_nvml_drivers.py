"""The fake libnvidia-ml per driver branch, at the C level through the real pynvml: what each
release's nvml.h declares (symbols, field ids), wrapping PCIe counters, compute instances, and
what an unprivileged caller is refused."""

from __future__ import annotations

import pytest

from agent.virtual.fake_nvml.profile import PCIE_COUNTER_WRAP
from tests.fake_nvml_rig import Rig, scenario

INVALID, UNSUPPORTED = 2, 3


def field_codes(r: Rig, ids: list[int]) -> list[int]:
    nvml = r.init()
    return [e.nvmlReturn for e in nvml.nvmlDeviceGetFieldValues(nvml.nvmlDeviceGetHandleByIndex(0), ids)]


@pytest.mark.parametrize("driver, pcie, trio, smoothing_at_269", [
    ("535.104.05", INVALID, None, INVALID),
    ("550.144.03", INVALID, None, INVALID),
    ("555.58.02", 0, None, INVALID),
    ("570.211.01", 0, None, INVALID),  # 251-268 are power smoothing; 269 is past NVML_FI_MAX
    ("575.64.05", 0, (251, 252, 253), 0),  # 256-273 power smoothing: 269 answers on Blackwell
    ("580.76.05", 0, (251, 252, 253), 0),
    ("580.95.05", 0, (269, 270, 271), None),
])
def test_field_ids_are_those_of_each_drivers_nvml_h(driver, pcie, trio, smoothing_at_269):
    r = Rig(scenario("b200", gpus=1, nvml={"driver_version": driver}))
    try:
        codes = field_codes(r, [197, 198, 251, 269])
        assert codes[:2] == [pcie, pcie]
        if trio is None:
            assert codes[2] == (0 if driver >= "570" else INVALID)  # power smoothing on Blackwell from R570
        else:
            nvml = r.nvml
            entries = nvml.nvmlDeviceGetFieldValues(nvml.nvmlDeviceGetHandleByIndex(0), list(trio))
            assert [e.nvmlReturn for e in entries] == [0, 0, 0]
            assert all(e.valueType == nvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG for e in entries)
        if smoothing_at_269 is not None:
            assert codes[3] == smoothing_at_269
    finally:
        r.lib.close()


def test_power_smoothing_fields_are_unsupported_before_blackwell():
    r = Rig(scenario("h100-sxm", gpus=1, nvml={"driver_version": "575.64.05"}))
    try:
        assert field_codes(r, [256, 269, 251]) == [UNSUPPORTED, UNSUPPORTED, 0]  # 251: SW thermal time on R575
    finally:
        r.lib.close()


def test_pcie_byte_counters_wrap_at_32_bits():
    r = Rig(scenario("h100-sxm", gpus=1, nvml={"pcie_counter_start": PCIE_COUNTER_WRAP - 300_000_000}))
    nvml = r.init()
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    values = []
    for _ in range(4):
        r.step(1.0)
        (entry,) = nvml.nvmlDeviceGetFieldValues(h, [198])
        values.append(int(entry.value.ullVal))
    assert all(v < PCIE_COUNTER_WRAP for v in values)
    assert any(b < a for a, b in zip(values, values[1:])), values  # it wrapped
    rate = r.lib.latest_sample("0").pcie_rx_bytes_per_s  # over the last second
    assert (values[-1] - values[-2]) % PCIE_COUNTER_WRAP == pytest.approx(rate, rel=1e-6, abs=2)
    r.lib.close()


def test_a_split_gpu_instance_has_a_mig_device_per_compute_instance():
    r = Rig(scenario("h100-sxm", gpus=1, mig={0: ["3g.40gb", "4g.40gb"]},
                     nvml={"mig_compute_instances": {"0/1": [1, 2]}},
                     workloads=[{"job": "a", "gpus": ["0/1"], "phases": [
                         {"kind": "compute", "mfu": 0.5, "duration_s": 3600}]}]))
    nvml = r.init()
    parent = nvml.nvmlDeviceGetHandleByIndex(0)
    migs = [nvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, i) for i in range(3)]
    with pytest.raises(nvml.NVMLError_NotFound):
        nvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 3)
    ids = [(nvml.nvmlDeviceGetGpuInstanceId(m), nvml.nvmlDeviceGetComputeInstanceId(m)) for m in migs]
    assert ids == [(1, 0), (1, 1), (2, 0)]
    names = [nvml.nvmlDeviceGetName(m) for m in migs]
    assert names == ["NVIDIA H100 80GB HBM3 MIG 1c.3g.40gb", "NVIDIA H100 80GB HBM3 MIG 2c.3g.40gb",
                     "NVIDIA H100 80GB HBM3 MIG 4g.40gb"]
    gi_sms = r.twin.discover()[0].sm_count
    attrs = [nvml.nvmlDeviceGetAttributes(m) for m in migs[:2]]
    assert [a.multiprocessorCount for a in attrs] == [round(gi_sms / 3), round(gi_sms * 2 / 3)]
    assert [(a.gpuInstanceSliceCount, a.computeInstanceSliceCount) for a in attrs] == [(3, 1), (3, 2)]
    totals = {nvml.nvmlDeviceGetMemoryInfo(m).total for m in migs[:2]}
    assert len(totals) == 1  # compute instances share their GPU instance's memory
    assert len({nvml.nvmlDeviceGetUUID(m) for m in migs}) == 3
    listed = [[(p.gpuInstanceId, p.computeInstanceId) for p in nvml.nvmlDeviceGetComputeRunningProcesses(m)]
              for m in migs[:2]]
    assert listed == [[(1, 0)], []]  # the GPU instance's process, once
    v2 = nvml.nvmlMemory_v2  # used without the driver's reserve: the processes' memory, counted once per GI
    used = nvml.nvmlDeviceGetMemoryInfo(parent, v2).used
    assert used == sum(nvml.nvmlDeviceGetMemoryInfo(m, v2).used for m in (migs[0], migs[2])) > 0
    r.lib.close()


def test_an_unprivileged_caller_gets_no_aggregate_memory_of_a_mig_gpu():
    r = Rig(scenario("h100-sxm", gpus=2, mig={0: ["3g.40gb"]}, nvml={"privileged": False},
                     workloads=[{"job": "a", "gpus": ["0/1"], "phases": [
                         {"kind": "compute", "mfu": 0.5, "duration_s": 3600}]}]))
    nvml = r.init()
    parent, whole = nvml.nvmlDeviceGetHandleByIndex(0), nvml.nvmlDeviceGetHandleByIndex(1)
    with pytest.raises(nvml.NVMLError_NoPermission):
        nvml.nvmlDeviceGetMemoryInfo(parent)
    with pytest.raises(nvml.NVMLError_NoPermission):
        nvml.nvmlDeviceGetMemoryInfo(parent, nvml.nvmlMemory_v2)
    assert nvml.nvmlDeviceGetMemoryInfo(nvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 0)).total > 0
    assert nvml.nvmlDeviceGetMemoryInfo(whole).total > 0  # a GPU not in MIG mode answers anyone
    r.lib.close()


def test_compute_instances_must_fit_their_gpu_instance():
    with pytest.raises(ValueError, match="more than the 3 slices"):
        Rig(scenario("h100-sxm", gpus=1, mig={0: ["3g.40gb"]}, nvml={"mig_compute_instances": {"0/1": [2, 2]}},
                     workloads=[]))
    with pytest.raises(ValueError, match="no MIG instance '0/5'"):
        Rig(scenario("h100-sxm", gpus=1, mig={0: ["3g.40gb"]}, nvml={"mig_compute_instances": {"0/5": [1]}},
                     workloads=[]))
