"""The real AMD backend over each released amdsmi package over the fake libamd_smi, on a hand-moved clock.

Values are compared with a twin virtual backend (same scenario, same clock): what amdsmi reports,
through every unit conversion and "N/A", must come back out of the backend as the simulation's
truth. Discovery, partitions, sampling, energy and processes run over every release in
tests/wheels.py's AMDSMI (the fake then plays that release's libamd_smi); where a release cannot
know something (6.2: no accumulators, no per-partition activity, no compute-unit count) the test
checks that it is unknown and says why.
"""

from __future__ import annotations

import pytest

from agent.backends.amd_virtual import VirtualAmdBackend
from agent.backends.base import BackendUnavailable, DeviceError, DeviceLostError
from agent.backends.options import BackendOptions
from agent.backends.registry import open_backend
from agent.backends.virtual import VirtualBackend
from agent.app.config import Settings
from agent.model.specs import spec_by_key
from tests.amd_backend_rig import CPX, scenario
from tests.amd_backend_rig import rig  # noqa: F401 (a fixture)
from tests.amdsmi_releases import package, release, version_of  # noqa: F401 (release is a fixture)
from tests.nvml_harness import T0

ENERGY_KEYS = {(6, 2): {"power"}, (6, 3): {"power", "energy_accumulator"}}
"""amdsmi_get_energy_count's counter key: renamed in 6.3 (both there), "power" dropped in 6.4."""


def test_whole_gpus_read_like_the_simulation(rig, release):
    r = rig(package=package(release))
    old = version_of(release) < (6, 3)
    assert set(r.devices) == {"0", "1"}
    info = r.devices["0"]
    assert info.vendor == "amd" and info.model == "AMD Instinct MI300X" and info.spec.key == "mi300x"
    assert {"gr_active", "dram_active", "power", "energy", "pcie", "xgmi", "memory",
            "processes"} <= set(info.capabilities)
    assert info.link_count == 7
    assert info.sm_count == (None if old else 304)  # asic_info has num_compute_units from 6.3
    if old:  # 6.2's metrics table has no residency accumulators: unknown, and doctor says why
        assert "clock_event_reasons" not in info.capabilities
        assert "accumulators" in r.backend.devices["0"].absent["clock_event_reasons"]
    else:
        assert "clock_event_reasons" in info.capabilities
    handle = r.backend._found["0"].handle
    keys = set(r.amdsmi.amdsmi_get_energy_count(handle)) - {"counter_resolution", "timestamp"}
    assert keys == ENERGY_KEYS.get(version_of(release), {"energy_accumulator"})
    r.cycle()
    before = T0 + 0.12 + 1.0
    samples = r.cycle()
    for gpu in ("0", "1"):
        s, truth = samples[gpu], r.truth(gpu, before)
        assert s.vendor == "amd" and s.interval_s == pytest.approx(1.0)
        assert s.gr_active == pytest.approx(truth.gr_active, abs=0.011)  # amdsmi reports whole percent
        assert s.dram_active == pytest.approx(truth.dram_active, abs=0.011)
        assert s.power_w == pytest.approx(truth.power_w, abs=1.0)  # whole watts
        assert s.tensor_active is None and s.sm_active is None  # amdsmi has no such counter: unknown, not 0
        assert s.mem_used_bytes == pytest.approx(truth.mem_used_bytes, rel=1e-3)
        assert s.link_tx_bytes_per_s == pytest.approx(truth.link_tx_bytes_per_s, rel=0.02, abs=2048)
        # xgmi_link_status is in the table from 6.4: before, a link's state is unknown, not down
        assert len(s.links) == 7 and all(link.up is (None if version_of(release) < (6, 4) else True) for link in s.links)
        assert s.driver_calls is not None and s.driver_calls >= 4  # table, energy, VRAM, processes
    # Energy is the driver's counter: its rise over a cycle is power x time.
    e0 = samples["0"].energy_j
    nxt = r.cycle()
    assert nxt["0"].energy_j - e0 == pytest.approx(nxt["0"].power_w * 1.0, rel=0.05)
    # Per-link byte totals are cumulative and their deltas sum to the link rate.
    sent = sum(link.write_bytes for link in nxt["0"].links) - sum(link.write_bytes for link in samples["0"].links)
    assert sent == pytest.approx(nxt["0"].link_tx_bytes_per_s, rel=1e-6)


def test_cpx_partitions_are_devices_held_to_their_share(rig, release):
    r = rig(scenario(**CPX), package(release))
    old = version_of(release) < (6, 3)  # no kfd_info (partition id = PCI function), no xcp_stats
    assert sorted(r.devices) == [f"0/{p}" for p in range(8)]
    assert [r.devices[f"0/{p}"].pci_bus_id.rsplit(".", 1)[1] for p in range(8)] == [str(p) for p in range(8)]
    full = spec_by_key("mi300x")
    for info in r.devices.values():
        assert info.spec.peak_flops["bf16"] == pytest.approx(full.peak_flops["bf16"] / 8)
        assert info.sm_count == (None if old else 38) and info.partition == "CPX/NPS1"
    r.cycle()
    before = r.clock()
    calls_before = r.library.calls.copy()
    samples = r.cycle()
    # One metrics-table read per GPU per cycle, shared by its eight partitions.
    reads = sum(n - calls_before.get(k, 0) for k, n in r.library.calls.items() if k[1] == "amdsmi_get_gpu_metrics_info")
    assert reads == 1
    busy, neighbour = samples["0/0"], samples["0/1"]
    if old:  # the whole GPU's average is not a partition's activity: unknown, and doctor says why
        assert all(samples[f"0/{p}"].gr_active is None for p in range(8))
        assert "per-partition activity" in r.backend.devices["0/3"].absent["gr_active"]
        assert "gr_active" not in r.devices["0/3"].capabilities
    else:
        assert busy.gr_active == pytest.approx(r.truth("0/0", before).gr_active, abs=0.011)
        assert samples["0/3"].gr_active == pytest.approx(r.truth("0/3", before).gr_active, abs=0.011)
        assert neighbour.gr_active < 0.05 < busy.gr_active
    # Socket power is on partition 0 only; it is the whole GPU's, the sum of the partitions' draw.
    socket = sum(r.truth(f"0/{p}", before).power_w for p in range(8))
    assert busy.power_w == pytest.approx(socket, abs=2.0)
    assert all(samples[f"0/{p}"].power_w is None and samples[f"0/{p}"].energy_j is None for p in range(1, 8))
    assert busy.links and all(samples[f"0/{p}"].links is None for p in range(1, 8))


def test_na_values_stay_unknown_and_fallbacks_fill_what_they_can(rig, release):
    r = rig(scenario(amd={"na_metrics": ["average_umc_activity", "temperature_hotspot", "current_socket_power"],
                          "not_supported": ["amdsmi_get_temp_metric"]}), package(release))
    s = r.cycle()["0"]
    assert s.dram_active is None  # N/A in the table (amdsmi_get_gpu_activity copies the same field): unknown, never 0
    assert s.temperature_c is None  # N/A in the table, and hwmon not supported
    assert s.gr_active is not None and s.gr_active > 0.5
    assert s.power_w is None  # power_info reads the same firmware field: N/A there too (7.x: UINT32_MAX), so unknown
    device = r.backend.devices["0"]
    assert "temperature" in device.absent and "not supported" in device.absent["temperature"]


def test_no_permission_on_processes_switches_them_off_for_good(rig, release):
    r = rig(scenario(amd={"no_permission": ["amdsmi_get_gpu_process_list"]}), package(release))
    assert "processes" not in r.devices["0"].capabilities
    before = r.library.calls.copy()
    s = r.cycle()["0"]
    assert s.processes is None
    assert r.library.calls == before or all(
        r.library.calls[k] == before.get(k, 0) for k in r.library.calls if k[1] == "amdsmi_get_gpu_process_list")


def test_processes_carry_vram_from_amdsmi(rig, release):
    r = rig(package=package(release))
    s = r.cycle()["1"]
    assert s.processes and s.processes[0].pid > 0 and s.processes[0].name == "vllm"
    assert s.processes[0].used_memory_bytes and s.processes[0].used_memory_bytes > 2**30


def test_a_lost_gpu_goes_down_alone_and_comes_back_with_a_new_handle(rig, release):
    scen = scenario(faults=[{"gpu": 1, "kind": "lost", "start_s": 103, "duration_s": 4}])
    r = rig(scen, package(release))
    old_handle = r.backend._found["1"].handle.value
    results = [r.cycle() for _ in range(10)]  # virtual time 101 .. 111
    lost = [c["1"] for c in results if isinstance(c["1"], DeviceError)]
    assert lost and all(isinstance(e, DeviceLostError) for e in lost)
    assert all(not isinstance(c["0"], Exception) for c in results)  # the other GPU kept reporting
    back = results[-1]["1"]
    assert not isinstance(back, Exception) and back.gr_active is not None and back.energy_j is not None
    assert r.backend._found["1"].handle.value != old_handle  # amdsmi re-initialised: a new handle


def test_import_failures_are_one_clear_line():
    no_lib = scenario(amd={"library": False})
    with pytest.raises(BackendUnavailable) as info:
        VirtualAmdBackend(VirtualBackend(no_lib))
    assert "libamd_smi.so not found" in str(info.value)
    skew = scenario(amd={"missing_symbols": ["amdsmi_get_cpu_affinity_with_scope"]})
    with pytest.raises(BackendUnavailable) as info:
        VirtualAmdBackend(VirtualBackend(skew))
    assert "newer than the installed ROCm" in str(info.value) and "amdsmi_get_cpu_affinity_with_scope" in str(info.value)


def test_amd_virtual_defaults_to_the_mi300x_node():
    backend = open_backend(BackendOptions.of(Settings(backend="amd-virtual")))
    try:
        devices = backend.discover()
        assert len(devices) == 8 and {d.model for d in devices} == {"AMD Instinct MI300X"}
        assert backend.name == "amd-virtual"
    finally:
        backend.close()
