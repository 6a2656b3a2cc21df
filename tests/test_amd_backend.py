"""The real AMD backend over the real amdsmi package over the fake libamd_smi, on a hand-moved clock.

Values are compared with a twin virtual backend (same scenario, same clock): what amdsmi reports,
through every unit conversion and "N/A", must come back out of the backend as the simulation's truth.
"""

from __future__ import annotations

from typing import Any

import pytest

from agent.backends.amd import AmdBackend
from agent.backends.amd_virtual import VirtualAmdBackend
from agent.backends.base import BackendUnavailable, DeviceError, DeviceLostError
from agent.backends.nvml_virtual import SimulatedHost
from agent.backends.registry import open_backend
from agent.backends.virtual import VirtualBackend
from agent.app.config import Settings
from agent.model.specs import spec_by_key
from agent.virtual.fake_amdsmi import FakeAmdSmiLibrary, load_amdsmi
from agent.virtual.scenario import parse_scenario
from tests.nvml_harness import T0, ManualClock


def scenario(gpus: int = 2, workloads: list | None = None, **node: Any) -> Any:
    workloads = workloads if workloads is not None else [
        {"job": "train", "gpus": [0], "phases": [{"kind": "compute", "mfu": 0.45, "duration_s": 3600}]},
        {"job": "decode", "gpus": [1], "process": "vllm", "phases": [{"kind": "memory", "mbu": 0.6, "duration_s": 3600}]},
    ][:gpus]
    return parse_scenario({"name": "t", "seed": 11, "nodes": [
        {"name": "n1", "model": "mi300x", "gpus": gpus, "workloads": workloads, **node}]})


CPX = dict(gpus=1, amd={"compute_partition": "CPX", "memory_partition": "NPS1"}, workloads=[
    {"job": "a", "gpus": ["0/0"], "phases": [{"kind": "compute", "mfu": 0.4, "duration_s": 3600}]},
    {"job": "b", "gpus": ["0/3"], "phases": [{"kind": "memory", "mbu": 0.5, "duration_s": 3600}]},
])


class Rig:
    def __init__(self, scen: Any) -> None:
        self.clock = ManualClock()
        start = T0 - 100.0
        self.virtual = VirtualBackend(scen, clock=self.clock, start_time=start)
        self.twin = VirtualBackend(scen, clock=self.clock, start_time=start)
        self.library = FakeAmdSmiLibrary(self.virtual)
        self.backend = AmdBackend(load_amdsmi(self.library), host=SimulatedHost(self.library), clock=self.clock,
                                  wall=self.clock, sleep=self.clock.advance)
        self.devices = {d.gpu: d for d in self.backend.discover()}

    def cycle(self, seconds: float = 1.0) -> dict[str, Any]:
        """Advance and read every device, as one collector cycle; devices that fail map to the exception."""
        self.clock.advance(seconds)
        now = self.clock()
        out: dict[str, Any] = {}
        for gpu in self.devices:
            try:
                out[gpu] = self.backend.sample(gpu, now)
            except DeviceError as exc:
                out[gpu] = exc
        return out

    def truth(self, gpu: str, since: float) -> Any:
        """The twin's average over the same span the last cycle covered."""
        self.twin._slots[gpu].last_t = since - self.twin.start_time
        return self.twin.sample(gpu, self.clock())

    def close(self) -> None:
        self.backend.close()
        self.library.close()
        self.virtual.close()


@pytest.fixture
def rig():
    made: list[Rig] = []

    def make(scen: Any = None) -> Rig:
        made.append(Rig(scen if scen is not None else scenario()))
        return made[-1]

    yield make
    for r in made:
        r.close()


def test_whole_gpus_read_like_the_simulation(rig):
    r = rig()
    assert set(r.devices) == {"0", "1"}
    info = r.devices["0"]
    assert info.vendor == "amd" and info.model == "AMD Instinct MI300X" and info.spec.key == "mi300x"
    assert {"gr_active", "dram_active", "power", "energy", "pcie", "xgmi", "clock_event_reasons", "memory",
            "processes"} <= set(info.capabilities)
    assert info.link_count == 7
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
        assert len(s.links) == 7 and all(link.up for link in s.links)
        assert s.driver_calls is not None and s.driver_calls >= 4  # table, energy, VRAM, processes
    # Energy is the driver's counter: its rise over a cycle is power x time.
    e0 = samples["0"].energy_j
    nxt = r.cycle()
    assert nxt["0"].energy_j - e0 == pytest.approx(nxt["0"].power_w * 1.0, rel=0.05)
    # Per-link byte totals are cumulative and their deltas sum to the link rate.
    sent = sum(link.write_bytes for link in nxt["0"].links) - sum(link.write_bytes for link in samples["0"].links)
    assert sent == pytest.approx(nxt["0"].link_tx_bytes_per_s, rel=1e-6)


def test_cpx_partitions_are_devices_held_to_their_share(rig):
    r = rig(scenario(**CPX))
    assert sorted(r.devices) == [f"0/{p}" for p in range(8)]
    full = spec_by_key("mi300x")
    for info in r.devices.values():
        assert info.spec.peak_flops["bf16"] == pytest.approx(full.peak_flops["bf16"] / 8)
        assert info.sm_count == 38 and info.partition == "CPX/NPS1"
    r.cycle()
    before = r.clock()
    calls_before = r.library.calls.copy()
    samples = r.cycle()
    # One metrics-table read per GPU per cycle, shared by its eight partitions.
    reads = sum(n - calls_before.get(k, 0) for k, n in r.library.calls.items() if k[1] == "amdsmi_get_gpu_metrics_info")
    assert reads == 1
    busy, neighbour = samples["0/0"], samples["0/1"]
    assert busy.gr_active == pytest.approx(r.truth("0/0", before).gr_active, abs=0.011)
    assert samples["0/3"].gr_active == pytest.approx(r.truth("0/3", before).gr_active, abs=0.011)
    assert neighbour.gr_active < 0.05 < busy.gr_active
    # Socket power is on partition 0 only; it is the whole GPU's, the sum of the partitions' draw.
    socket = sum(r.truth(f"0/{p}", before).power_w for p in range(8))
    assert busy.power_w == pytest.approx(socket, abs=2.0)
    assert all(samples[f"0/{p}"].power_w is None and samples[f"0/{p}"].energy_j is None for p in range(1, 8))
    assert busy.links and all(samples[f"0/{p}"].links is None for p in range(1, 8))


def test_na_values_stay_unknown_and_fallbacks_fill_what_they_can(rig):
    r = rig(scenario(amd={"na_metrics": ["average_umc_activity", "temperature_hotspot", "current_socket_power"],
                          "not_supported": ["amdsmi_get_gpu_activity", "amdsmi_get_temp_metric"]}))
    s = r.cycle()["0"]
    assert s.dram_active is None  # N/A in the table and no activity getter: unknown, never 0
    assert s.temperature_c is None
    assert s.gr_active is not None and s.gr_active > 0.5
    assert s.power_w is None  # power_info reads the same firmware field: N/A there too, so unknown
    device = r.backend.devices["0"]
    assert "activity" in device.absent and "not supported" in device.absent["activity"]


def test_without_the_metrics_table_the_getters_stand_in(rig):
    r = rig(scenario(amd={"not_supported": ["amdsmi_get_gpu_metrics_info"]}))
    before = r.clock()
    s = r.cycle()["0"]
    truth = r.truth("0", before)
    assert s.gr_active == pytest.approx(truth.gr_active, abs=0.011)
    assert s.power_w is not None and s.temperature_c is not None and s.sm_clock_mhz is not None
    assert s.clock_event_reasons is None  # residencies live only in the table
    assert "clock_event_reasons" not in r.devices["0"].capabilities
    assert r.backend.devices["0"].absent["gpu_metrics"] == "not supported"


def test_no_permission_on_processes_switches_them_off_for_good(rig):
    r = rig(scenario(amd={"no_permission": ["amdsmi_get_gpu_process_list"]}))
    assert "processes" not in r.devices["0"].capabilities
    before = r.library.calls.copy()
    s = r.cycle()["0"]
    assert s.processes is None
    assert r.library.calls == before or all(
        r.library.calls[k] == before.get(k, 0) for k in r.library.calls if k[1] == "amdsmi_get_gpu_process_list")


def test_processes_carry_vram_from_amdsmi(rig):
    r = rig()
    s = r.cycle()["1"]
    assert s.processes and s.processes[0].pid > 0
    assert s.processes[0].used_memory_bytes and s.processes[0].used_memory_bytes > 2**30


def test_a_lost_gpu_goes_down_alone_and_comes_back_with_a_new_handle(rig):
    scen = scenario(faults=[{"gpu": 1, "kind": "lost", "start_s": 103, "duration_s": 4}])
    r = rig(scen)
    old_handle = r.backend._found["1"].handle.value
    results = [r.cycle() for _ in range(8)]  # virtual time 101 .. 109
    lost = [c["1"] for c in results if isinstance(c["1"], DeviceError)]
    assert lost and all(isinstance(e, DeviceLostError) for e in lost)
    assert all(not isinstance(c["0"], Exception) for c in results)  # the other GPU kept reporting
    assert not isinstance(results[-1]["1"], Exception)  # back after the window
    assert r.backend._found["1"].handle.value != old_handle


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
    backend = open_backend(Settings(backend="amd-virtual"))
    try:
        devices = backend.discover()
        assert len(devices) == 8 and {d.model for d in devices} == {"AMD Instinct MI300X"}
        assert backend.name == "amd-virtual"
    finally:
        backend.close()
