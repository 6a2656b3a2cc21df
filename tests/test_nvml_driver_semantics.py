"""What a real driver does that the fake used to make easy, through the real backend over the fake.

Each case is a way libnvidia-ml behaves on real nodes (docs/nvidia.md, "What the fake used to
assume"): PCIe byte counters that wrap, GPU instances split into compute instances, MIG as an
unprivileged user, field ids an older driver does not know, and field ids that changed meaning
between driver releases. Each runs under every nvidia-ml-py release we accept.
"""

from __future__ import annotations

import logging

import pytest

from agent.backends.base import DeviceLostError
from agent.classifier.peaks import spec_for_sample
from agent.diagnostics.nvidia import nvml_findings
from agent.model.specs import spec_by_key
from agent.virtual.fake_nvml.profile import PCIE_COUNTER_WRAP
from tests.agent_process import poll
from tests.nvml_harness import NVIDIA_ML_PY, Rig, release_pynvml, scenario

COMPUTE = [{"job": "a", "gpus": [0], "phases": [{"kind": "compute", "mfu": 0.5, "duration_s": 3600}]}]
HOT = [{"job": "a", "gpus": [0], "phases": [{"kind": "compute", "mfu": 0.5, "duration_s": 3600, "thermal": True}]}]
"""A GPU held back by temperature: the SW thermal time counter runs."""


@pytest.fixture(params=NVIDIA_ML_PY)
def rig(request):
    """A fake node under each nvidia-ml-py release we accept."""
    path = release_pynvml(request.param)
    made = []

    def make(scen, **kwargs):
        r = Rig(scen, pynvml=path, **kwargs)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()


def raw_pcie_rx(r: Rig) -> int:
    """The fake driver's PCIe RX byte counter now (field 198), read beside the backend."""
    nvml = r.nvml
    (entry,) = nvml.nvmlDeviceGetFieldValues(nvml.nvmlDeviceGetHandleByIndex(0), [198])
    return int(entry.value.ullVal)


# ----------------------------------------------------------------------------- PCIe byte counters


def test_pcie_rate_is_derived_across_a_32_bit_counter_wrap(rig):
    """NVML_FI_DEV_PCIE_COUNT_RX_BYTES "can be wrapped": the interval that crosses the wrap still
    has its rate (an A100 has no GPM, so the counter is the only PCIe source)."""
    r = rig(scenario("a100-sxm-80gb", gpus=1, workloads=COMPUTE,
                     nvml={"pcie_counter_start": PCIE_COUNTER_WRAP - 700_000_000}))
    backend = r.backend()
    backend.discover()
    wrapped = False
    for _ in range(6):
        before = raw_pcie_rx(r)
        sample = backend.sample("0", r.step(1.0))
        after = raw_pcie_rx(r)
        wrapped |= after < before
        truth = r.library.latest_sample("0")
        assert sample.pcie_rx_bytes_per_s == pytest.approx(truth.pcie_rx_bytes_per_s, rel=1e-3), (before, after)
        assert sample.pcie_tx_bytes_per_s == pytest.approx(truth.pcie_tx_bytes_per_s, rel=1e-3)
    assert wrapped, "the counter never wrapped: the test did not test anything"


def test_gpm_pcie_rate_wins_over_the_byte_counters(rig):
    """Over a 20 s interval a 32-bit byte counter wraps more than once at 256 MB/s and cannot tell;
    GPM's own PCIe rate is right, and a counter-derived rate must never replace it."""
    r = rig(scenario("h100-sxm", gpus=1, workloads=COMPUTE))
    backend = r.backend()
    backend.discover()
    backend.sample("0", r.step(1.0))
    sample = backend.sample("0", r.step(20.0))
    truth = r.library.latest_sample("0")
    assert truth.pcie_rx_bytes_per_s * 20.0 > PCIE_COUNTER_WRAP  # the counter lost at least one wrap
    assert sample.pcie_rx_bytes_per_s == pytest.approx(truth.pcie_rx_bytes_per_s, rel=1e-3)


# ----------------------------------------------------------------------------- MIG compute instances


SPLIT = {"mig": {0: ["3g.40gb", "4g.40gb"]}, "nvml": {"mig_compute_instances": {"0/1": [1, 2]}},
         "workloads": [{"job": "a", "gpus": ["0/1"], "phases": [{"kind": "compute", "mfu": 0.5, "duration_s": 3600}]}]}
"""One H100 whose 3g GPU instance is split into a 1-slice and a 2-slice compute instance."""


def test_compute_instances_of_one_gpu_instance_are_separate_devices_with_their_share_of_the_peaks(rig):
    r = rig(scenario("h100-sxm", gpus=1, **SPLIT))
    backend = r.backend()
    devices = {d.gpu: d for d in backend.discover()}
    assert list(devices) == ["0/1/0", "0/1/1", "0/2"]  # index/gi/ci where a GI is split; index/gi otherwise
    assert devices["0/1/0"].model == "NVIDIA H100 80GB HBM3 MIG 1c.3g.40gb"
    assert len({d.uuid for d in devices.values()}) == 3
    whole = spec_by_key("h100-sxm")
    for gpu, c in (("0/1/0", 1), ("0/1/1", 2), ("0/2", 4)):
        spec = devices[gpu].spec
        assert spec is not None, gpu
        assert spec.peak_flops["bf16"] == pytest.approx(whole.peak_flops["bf16"] * c / 7), gpu
    assert devices["0/1/0"].spec.key == "h100-sxm-mig-1c.3g.40gb"
    assert devices["0/1/0"].sm_count == 19 and devices["0/1/1"].sm_count == 38
    now = r.step(1.0)
    samples = {gpu: backend.sample(gpu, now) for gpu in devices}
    truth = r.library.latest_sample("0/1")
    for gpu in ("0/1/0", "0/1/1"):  # GPM samples a GPU instance: both compute instances read its activity
        assert samples[gpu].tensor_active == pytest.approx(truth.tensor_active, abs=1e-6)
        assert samples[gpu].mem_total_bytes == devices[gpu].memory_total_bytes
    assert [p.pid for p in samples["0/1/0"].processes] == [p.pid for p in truth.processes]
    for gpu in devices:  # roofwatch classify resolves a trace line's peaks from its name: the same ones
        assert spec_for_sample(samples[gpu]).key == devices[gpu].spec.key, gpu


def test_a_lost_split_gpu_instance_comes_back_with_each_compute_instance_on_its_own_handle(rig):
    r = rig(scenario("h100-sxm", gpus=1, **SPLIT))
    backend = r.backend()
    backend.discover()
    backend.sample("0/1/1", r.step())
    r.virtual.inject_fault("0/1", "lost", duration_s=3.0)
    now = r.step()
    for gpu in ("0/1/0", "0/1/1"):
        with pytest.raises(DeviceLostError):
            backend.sample(gpu, now)
    assert backend.sample("0/2", now).tensor_active is not None  # the other GPU instance keeps going
    r.step(5.0)
    now = r.step()
    nvml = r.nvml
    for gpu, ci in (("0/1/0", 0), ("0/1/1", 1)):
        assert backend.sample(gpu, now).mem_total_bytes is not None
        handle = backend.devices[gpu].handles.handle
        assert (nvml.nvmlDeviceGetGpuInstanceId(handle), nvml.nvmlDeviceGetComputeInstanceId(handle)) == (1, ci)


def test_an_xid_on_a_split_gpu_instance_counts_on_each_of_its_compute_instances(rig):
    r = rig(scenario("h100-sxm", gpus=1, **SPLIT), events=True)
    backend = r.backend()
    backend.discover()
    poll(lambda: backend.watching_events("0"), timeout=10, what="GPU 0 registered for XID events")
    r.library.inject_xid("0/1", 31)
    poll(lambda: all(backend.device_events(g) for g in ("0/1/0", "0/1/1")), timeout=10, what="XID 31 on both")
    assert [(x.xid, x.count) for x in backend.device_events("0/1/1")] == [(31, 1)]
    assert backend.device_events("0/2") == ()


# ----------------------------------------------------------------------------- MIG as non-root


def test_mig_as_an_unprivileged_user_is_discovered_and_doctor_says_what_it_cost(rig):
    """NVML gives the aggregate memory of a GPU in MIG mode only to privileged callers; the
    container image runs as uid 65534. One refused call must not fail the node."""
    layout = {0: ["3g.40gb", "4g.40gb"]}
    work = [{"job": "a", "gpus": ["0/1"], "phases": [{"kind": "compute", "mfu": 0.5, "duration_s": 3600}]}]
    privileged = rig(scenario("h100-sxm", gpus=2, mig=layout, workloads=work))
    expected = {d.gpu: d.spec.key for d in privileged.backend().discover()}
    r = rig(scenario("h100-sxm", gpus=2, mig=layout, workloads=work, nvml={"privileged": False}))
    backend = r.backend()
    devices = {d.gpu: d for d in backend.discover()}
    assert {gpu: d.spec.key for gpu, d in devices.items()} == expected  # same peaks, matched another way
    assert backend.sample("0/1", r.step()).mem_total_bytes is not None  # instances answer as non-root
    findings, gpus = nvml_findings(backend)
    assert gpus == 3
    notes = [f for f in findings if f.gpu == "0" and "permission" in f.detail]
    assert notes and "privileged" in notes[0].detail, [f.detail for f in findings]


# ----------------------------------------------------------------------------- field ids by driver


def test_field_ids_an_older_driver_does_not_know_are_switched_off_for_good(rig, caplog):
    """R550 has no PCIe byte fields: each entry answers INVALID_ARGUMENT. That is an absent
    capability (listed by doctor), not a transient failure retried and logged every interval."""
    r = rig(scenario("h100-sxm", gpus=1, workloads=COMPUTE, nvml={"driver_version": "550.144.03"}))
    backend = r.backend()
    backend.discover()
    device = backend.devices["0"]
    assert device.absent["field:pcie_tx_bytes"] == "field id 197 unknown to this driver"
    assert device.absent["field:pcie_rx_bytes"] == "field id 198 unknown to this driver"
    caplog.set_level(logging.DEBUG)
    for _ in range(3):
        sample = backend.sample("0", r.step())
        assert not device.failed, device.failed
        assert sample.pcie_rx_bytes_per_s is not None  # GPM still gives the rate
    assert not [rec for rec in caplog.records if "pcie" in rec.getMessage()]
    findings, _ = nvml_findings(backend)
    assert any("pcie_tx_bytes (field id 197 unknown to this driver)" in f.detail for f in findings if f.gpu == "0")


@pytest.mark.parametrize("driver, ids", [("575.64.05", (251, 252, 253)), ("580.76.05", (251, 252, 253)),
                                         ("580.95.05", (269, 270, 271))])
def test_clock_event_time_fields_follow_the_drivers_numbering(rig, driver, ids):
    """R575 to R580.76 number the SW/HW thermal and power-brake time fields 251-253 and use
    269-271 for power smoothing; R580.82 moved them to 269-271. Reading the wrong ids reads
    power-smoothing settings (small integers) as nanoseconds."""
    r = rig(scenario("b200", gpus=1, workloads=HOT, nvml={"driver_version": driver}))
    backend = r.backend()
    backend.discover()
    sample = backend.sample("0", r.step(5.0))
    nvml = r.nvml
    entries = nvml.nvmlDeviceGetFieldValues(nvml.nvmlDeviceGetHandleByIndex(0), list(ids))
    expected = [int(e.value.ullVal) / 1e9 for e in entries]
    assert expected[0] > 1.0  # throttled for every second the driver has counted
    got = sample.clock_event_time_s
    assert got is not None
    assert [got["sw_thermal_slowdown"], got["hw_thermal_slowdown"], got["hw_power_brake_slowdown"]] == \
        pytest.approx(expected, rel=1e-6)


def test_a_driver_without_clock_event_time_fields_does_not_ask_for_them(rig):
    """R570: ids 251-268 are power smoothing, 269+ unknown: no clocks-event time but the power cap's."""
    r = rig(scenario("b200", gpus=1, workloads=COMPUTE, nvml={"driver_version": "570.211.01"}))
    backend = r.backend()
    backend.discover()
    sample = backend.sample("0", r.step())
    assert set(sample.clock_event_time_s or {}) <= {"sw_power_cap"}
    device = backend.devices["0"]
    assert "R575" in device.absent["field:throttle_sw_thermal_ns"]
