"""The NVML backend, run unchanged over the fake NVIDIA driver (real pynvml, fake libnvidia-ml).

Every test runs once per nvidia-ml-py release we accept (tests/wheels.py NVIDIA_ML_PY): the
binding code differs between them, the backend must not."""

from __future__ import annotations

import math

import pytest

from agent.backends.base import BackendUnavailable, DeviceError, DeviceLostError
from agent.backends.nvml import NvmlBackend
from agent.virtual.fake_nvml import load_pynvml
from tests.nvml_harness import NVIDIA_ML_PY, Rig, release_pynvml, scenario
from tests.agent_process import poll

RATIO_FIELDS = ("gr_active", "sm_active", "sm_occupancy", "tensor_active", "fp64_active", "fp32_active",
                "fp16_active", "dram_active", "tensor_hmma_active", "tensor_dmma_active")
RATE_FIELDS = ("pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s", "link_tx_bytes_per_s", "link_rx_bytes_per_s")


@pytest.fixture(params=NVIDIA_ML_PY)
def rig(request):
    path = release_pynvml(request.param)
    made = []

    def make(scen=None, **kwargs):
        r = Rig(scen if scen is not None else scenario(), pynvml=path, **kwargs)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()


def read_cycles(r: Rig, cycles: int = 3, step: float = 1.0):
    backend = r.backend()
    devices = backend.discover()
    out = []
    for _ in range(cycles):
        now = r.step(step)
        out.append({d.gpu: backend.sample(d.gpu, now) for d in devices})
    return devices, out


def test_samples_reproduce_the_simulation_through_every_nvml_unit(rig):
    """GPM percent, MiB/s, mW, mJ, KiB and byte counters all land back on the simulated values."""
    r = rig()
    devices, cycles = read_cycles(r, 4)
    for gpu in ("0", "1"):
        got = cycles[-1][gpu]
        truth = r.library.latest_sample(gpu)
        assert truth is not None and got.ts == truth.ts
        for name in RATIO_FIELDS:
            assert getattr(got, name) == pytest.approx(getattr(truth, name), abs=1e-6), name
        for name in RATE_FIELDS:
            assert getattr(got, name) == pytest.approx(getattr(truth, name), rel=1e-3, abs=1024), name
        assert got.power_w == pytest.approx(truth.power_w, abs=1e-3)  # mW integers
        assert got.energy_j == pytest.approx(truth.energy_j, abs=1e-3)  # mJ integers
        assert got.power_limit_w == pytest.approx(truth.power_limit_w, abs=1e-3)
        assert abs(got.temperature_c - truth.temperature_c) <= 1.0  # whole degrees
        assert abs(got.sm_clock_mhz - truth.sm_clock_mhz) <= 1.0  # whole MHz
        assert got.mem_total_bytes == truth.mem_total_bytes and got.mem_used_bytes == truth.mem_used_bytes
        assert got.clock_event_reasons == truth.clock_event_reasons
        assert [(p.pid, p.name, p.used_memory_bytes) for p in got.processes] == \
            [(p.pid, p.name, p.used_memory_bytes) for p in truth.processes]
        assert got.interval_s == pytest.approx(1.0)
    train, decode = cycles[-1]["0"], cycles[-1]["1"]
    assert train.tensor_active > 0.3 > decode.tensor_active  # and the workloads are the ones simulated
    assert decode.dram_active > train.dram_active


def test_identity_and_peaks_match_the_virtual_backend(rig):
    r = rig()
    nvml_devices = r.backend().discover()
    virtual_devices = r.virtual.discover()
    for got, want in zip(nvml_devices, virtual_devices, strict=True):
        assert (got.gpu, got.uuid, got.model, got.pci_bus_id, got.pci_device_id, got.memory_total_bytes,
                got.sm_count, got.link_count) == \
            (want.gpu, want.uuid, want.model, want.pci_bus_id, want.pci_device_id, want.memory_total_bytes,
             want.sm_count, want.link_count)
        assert got.spec is not None and got.spec.key == want.spec.key
        assert "gpm" in got.capabilities and "tensor_active" in got.capabilities


def test_each_interval_costs_a_handful_of_calls_and_they_are_reported(rig):
    r = rig()
    _, cycles = read_cycles(r, 3)
    calls = [c["0"].driver_calls for c in cycles]
    assert all(calls) and max(calls) <= 10, calls
    before = dict(r.library.calls)
    reported = r.backend().sample("0", r.step()).driver_calls
    c_calls = sum(n for (gpu, _), n in r.library.calls.items() if gpu == "0") - \
        sum(n for (gpu, _), n in before.items() if gpu == "0")
    metrics_gets = r.library.calls[(None, "nvmlGpmMetricsGet")] - before.get((None, "nvmlGpmMetricsGet"), 0)
    # The C-level view agrees with what is reported: no hidden size probes (the one GPM metrics
    # call takes no device handle, so the fake files it under no GPU).
    assert reported == c_calls + metrics_gets and metrics_gets == 1


def test_a100_without_gpm_falls_back_to_utilization_and_says_what_is_missing(rig):
    r = rig(scenario("a100-sxm-80gb"))
    devices, cycles = read_cycles(r, 2)
    assert "gpm" not in devices[0].capabilities and "gr_active" in devices[0].capabilities
    sample = cycles[-1]["0"]
    truth = r.library.latest_sample("0")
    assert sample.sm_active is None and sample.tensor_active is None  # unknown, never 0
    assert sample.gr_active == pytest.approx(round(truth.gr_active * 100) / 100)
    device = r.backend().devices["0"]
    assert "device not supported" in device.absent["gpm"]


def test_old_driver_has_no_gpm_symbols_nor_clocks_event_reasons(rig):
    r = rig(scenario("a100-sxm-80gb", nvml={"driver_version": "470.82.01"}))
    devices, cycles = read_cycles(r, 2)
    device = r.backend().devices["0"]
    assert "function not found" in device.absent["gpm"]
    assert "clock_event_reasons" in device.absent and "clock_throttle_reasons" not in device.absent
    assert cycles[-1]["0"].clock_event_reasons is not None  # the older name answered
    assert "field:pcie_tx_bytes" in device.absent  # byte counters need driver 555+
    before = r.library.calls.get(("0", "nvmlGpmQueryDeviceSupport"), 0)
    r.backend().sample("0", r.step())
    assert r.library.calls.get(("0", "nvmlGpmQueryDeviceSupport"), 0) == before  # not asked again


def test_gpm_switched_off_on_hopper(rig):
    r = rig(scenario(nvml={"gpm": False}))
    devices, cycles = read_cycles(r, 2)
    assert "gpm" not in devices[0].capabilities
    assert cycles[-1]["0"].tensor_active is None and cycles[-1]["0"].gr_active is not None


def test_h100_pcie_has_no_nvlink_and_asks_no_more(rig):
    r = rig(scenario("h100-pcie"))
    devices, cycles = read_cycles(r, 2)
    assert "nvlink" not in devices[0].capabilities and devices[0].link_count == 0
    assert cycles[-1]["0"].link_tx_bytes_per_s is None and cycles[-1]["0"].pcie_tx_bytes_per_s is not None
    assert cycles[-1]["0"].tensor_active is not None  # GPM still works on the PCIe card


def test_permission_denied_is_an_absent_capability_not_a_down_gpu(rig):
    r = rig(scenario(nvml={"no_permission": ["nvmlDeviceGetProcessUtilization", "nvmlGpmSampleGet"]}))
    devices, cycles = read_cycles(r, 2)
    device = r.backend().devices["0"]
    assert device.absent["gpm"] == "no permission" and device.absent["process_utilization"] == "no permission"
    sample = cycles[-1]["0"]
    assert sample.gr_active is not None and sample.processes and sample.processes[0].sm_util is None


def test_a_field_that_fails_alone_leaves_the_rest_of_the_batch(rig):
    r = rig(scenario(nvml={"failing_fields": [186]}))
    devices, cycles = read_cycles(r, 2)
    device = r.backend().devices["0"]
    assert "field:power_instant_mw" in device.absent
    sample = cycles[-1]["0"]
    assert sample.energy_j is not None and sample.ecc_uncorrected_errors == 0
    assert sample.power_w is not None  # fell back to nvmlDeviceGetPowerUsage


def test_mig_instances_are_read_through_the_parent_gpm(rig):
    r = rig(scenario(gpus=1, mig={0: ["3g.40gb", "4g.40gb"]}, workloads=[
        {"job": "a", "gpus": ["0/1"], "phases": [{"kind": "compute", "mfu": 0.5, "duration_s": 3600}]},
        {"job": "b", "gpus": ["0/2"], "phases": [{"kind": "memory", "mbu": 0.6, "duration_s": 3600}]}]))
    devices, cycles = read_cycles(r, 3)
    assert [d.gpu for d in devices] == [d.gpu for d in r.virtual.discover()]
    for d in devices:
        truth = r.library.latest_sample(d.gpu)
        got = cycles[-1][d.gpu]
        assert got.tensor_active == pytest.approx(truth.tensor_active, abs=1e-6)
        assert got.power_w is None and got.temperature_c is None  # whole-GPU readings
        assert d.spec is not None and "mig" in d.spec.key
    assert cycles[-1][devices[0].gpu].tensor_active > cycles[-1][devices[1].gpu].tensor_active


def test_lost_gpu_goes_down_alone_and_comes_back_with_a_new_handle(rig):
    r = rig()
    backend = r.backend()
    backend.discover()
    backend.sample("0", r.step())
    r.virtual.inject_fault("0", "lost", duration_s=3.0)
    with pytest.raises(DeviceLostError):
        backend.sample("0", r.step())
    assert backend.sample("1", r.clock()).gr_active is not None  # the other GPU keeps going
    with pytest.raises(DeviceLostError, match="still unavailable"):
        backend.sample("0", r.step())
    r.step(5.0)
    back = backend.sample("0", r.step())
    assert back.mem_total_bytes is not None and back.power_w is not None
    assert backend.sample("0", r.step()).tensor_active is not None  # GPM pairs restart on the new handle


def test_error_fault_fails_the_sample_but_not_the_device(rig):
    r = rig()
    backend = r.backend()
    backend.discover()
    r.virtual.inject_fault("1", "error", duration_s=1.5)
    with pytest.raises(DeviceError) as err:
        backend.sample("1", r.step())
    assert not isinstance(err.value, DeviceLostError)
    r.step(2.0)
    assert backend.sample("1", r.step()).gr_active is not None


def test_xid_events_are_counted_per_code_with_last_seen_time(rig):
    r = rig(events=True)
    backend = r.backend()
    backend.discover()
    poll(lambda: backend.watching_events("1"), timeout=10, what="GPU 1 registered for XID events")
    r.library.inject_xid("1", 48)
    r.library.inject_xid("1", 48)
    r.library.inject_xid("1", 13)
    poll(lambda: sum(x.count for x in backend.device_events("1")) == 3, timeout=10, what="3 XID events")
    counts = {x.xid: x.count for x in backend.device_events("1")}
    assert counts == {13: 1, 48: 2} and backend.device_events("0") == ()
    sample = backend.sample("1", r.step())
    assert sample.ecc_uncorrected_errors == 2  # XID 48 is a double-bit ECC error
    assert {x.xid for x in sample.xid_errors} == {13, 48}


def test_library_not_found_and_driver_not_loaded_are_clear_messages(rig):
    with pytest.raises(BackendUnavailable, match="libnvidia-ml.so.1 not found"):
        NvmlBackend(load_pynvml(None))
    r = rig(scenario(nvml={"driver_loaded": False}))
    with pytest.raises(BackendUnavailable, match="kernel driver is not loaded"):
        r.backend()


def test_gpm_pairs_closer_than_100ms_are_not_used(rig):
    r = rig()
    backend = r.backend()
    backend.discover()
    backend.sample("0", r.step(1.0))
    quick = backend.sample("0", r.step(0.05))  # GPM would read 0 here: the backend must not trust it
    assert quick.tensor_active is None or quick.tensor_active > 0.3
    later = backend.sample("0", r.step(1.0))
    assert later.tensor_active == pytest.approx(r.library.latest_sample("0").tensor_active, abs=0.05)


def test_values_are_finite(rig):
    _, cycles = read_cycles(rig(), 2)
    for sample in cycles[-1].values():
        for name in RATIO_FIELDS + RATE_FIELDS:
            value = getattr(sample, name)
            assert value is None or math.isfinite(value)


def test_nvml_shut_down_underneath_is_reinitialised_and_devices_reacquired(rig):
    r = rig()
    backend = r.backend()
    backend.discover()
    backend.sample("0", r.step())
    r.nvml.nvmlShutdown()  # drops the library's last reference: every call now says Uninitialized
    with pytest.raises(DeviceError, match="not initialised"):
        backend.sample("0", r.step())
    assert backend.sample("0", r.step()).mem_total_bytes is not None  # re-initialised and re-acquired
    assert backend.sample("1", r.step()).mem_total_bytes is not None


def test_lost_gpu_through_the_collector_exports_xid_79_while_down_and_recovers(rig):
    """End to end in one process: fake driver, NVML backend, collector, exposition."""
    from prometheus_client.exposition import generate_latest

    from agent.collector import Backoff, Collector
    from exporters.prometheus import ExpositionCache

    r = rig(events=True)
    collector = Collector(r.backend(), node="n1", interval_s=1.0, clock=r.clock, monotonic=r.clock,
                          backoff=Backoff(initial_s=1.0, max_s=2.0))
    try:
        collector.collect_once()
        r.virtual.inject_fault("0", "lost", duration_s=4.0, start_s=r.clock() - r.virtual.start_time + 0.5)

        def scrape() -> str:
            return ExpositionCache(lambda: collector.snapshot).render(generate_latest, "text/plain").decode()

        def cycle() -> str:
            r.step()
            collector.collect_once()
            return scrape()

        def again() -> str:  # collect without moving time: waits for the event thread, not the window
            collector.collect_once()
            return scrape()

        cycle()
        cycle()  # now inside the lost window
        down = poll(lambda: (t := again()) and 'xid="79"' in t and t, 10, interval=0.02, what="XID 79 exported")
        assert [line for line in down.splitlines() if line.startswith('roofwatch_gpu_up{gpu="0"')][0].endswith(" 0.0")
        assert 'roofwatch_gpu_xid_errors_total{gpu="0",node="n1"' in down
        assert [line for line in down.splitlines() if line.startswith('roofwatch_gpu_up{gpu="1"')][0].endswith(" 1.0")
        back = poll(lambda: (t := cycle()) and [ln for ln in t.splitlines()
                                               if ln.startswith('roofwatch_gpu_up{gpu="0"')][0].endswith(" 1.0") and t,
                    10, interval=0.0, what="GPU 0 back up")
        assert 'xid="79"' in back  # the counter stays: it counts events, it is not a sticky state
    finally:
        collector.stop()
