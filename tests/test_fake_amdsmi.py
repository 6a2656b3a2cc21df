"""The fake libamd_smi.so under the real amdsmi package: every check goes through a load_amdsmi copy.

The fake is set up from a scenario and a hand-moved clock; after that the tests only use the
amdsmi Python API (plus the library's public hooks: calls, hung_calls, latest_sample, close) and
compare what amdsmi reports with a twin virtual backend's samples over the same window.
"""

from __future__ import annotations

import ctypes
import sys
import threading
from typing import Any

import pytest

from agent.backends.virtual import VirtualBackend
from agent.virtual.devices import MIB
from agent.virtual.fake_amdsmi import FakeAmdSmiLibrary, codes, load_amdsmi
from agent.virtual.profiles import AmdProfile
from agent.virtual.scenario import parse_scenario, resolve_scenario
from tests.agent_process import poll

T0 = 1_800_000_000.0
START = T0 - 100.0  # the scenario started 100 s before the test's "now"
TICK_J = codes.ENERGY_RESOLUTION_UJ * 1e-6


class Clock:
    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def scenario(model: str = "mi300x", gpus: int = 2, **node: Any) -> Any:
    workloads = node.pop("workloads", [
        {"job": "train", "gpus": [0], "phases": [{"kind": "compute", "mfu": 0.45, "duration_s": 3600}]},
        {"job": "decode", "gpus": [1], "process": "vllm",
         "phases": [{"kind": "memory", "mbu": 0.6, "duration_s": 3600}]},
    ][:gpus])
    return parse_scenario({"name": "t", "seed": 5, "nodes": [
        {"name": "n1", "model": model, "gpus": gpus, "workloads": workloads, **node}]})


CPX = scenario(gpus=2, amd={"compute_partition": "CPX", "memory_partition": "NPS4"}, workloads=[
    {"job": "a", "gpus": ["0/0"], "phases": [{"kind": "compute", "mfu": 0.4, "duration_s": 3600}]},
    {"job": "b", "gpus": ["0/3"], "process": "vllm", "phases": [{"kind": "memory", "mbu": 0.5, "duration_s": 3600}]},
])


class Rig:
    """A fake node: the virtual backend behind the fake library, its amdsmi copy, and a twin backend
    (same scenario and clock) whose samples are the reference for what amdsmi must report."""

    def __init__(self, scen: Any = "mi300x", **lib_kw: Any) -> None:
        scen = resolve_scenario(scen) if isinstance(scen, str) else scen
        self.clock = Clock()
        self.virtual = VirtualBackend(scen, clock=self.clock, start_time=START)
        self.twin = VirtualBackend(scen, clock=self.clock, start_time=START)
        self.lib = FakeAmdSmiLibrary(self.virtual, **lib_kw)
        self.smi = load_amdsmi(self.lib)
        self.infos = {d.gpu: d for d in self.twin.discover()}

    def init(self) -> Any:
        self.smi.amdsmi_init()
        return self.smi

    def step(self, seconds: float) -> None:
        self.clock.t += seconds

    def handles(self) -> list[Any]:
        return self.smi.amdsmi_get_processor_handles()

    def twin_samples(self, *gpus: str) -> dict[str, Any]:
        return {g: self.twin.sample(g, self.clock.t) for g in gpus}

    def code(self, fn: Any, *args: Any) -> int:
        """The status a call fails with (it must fail)."""
        with pytest.raises(self.smi.AmdSmiLibraryException) as failure:
            fn(*args)
        return failure.value.get_error_code()


@pytest.fixture
def rig() -> Any:
    r = Rig()
    r.init()
    yield r
    r.lib.close()


def address(handle: Any) -> int:
    return ctypes.cast(handle, ctypes.c_void_p).value or 0


# ----------------------------------------------------------------------------- loading, init


def test_constants_agree_with_the_real_wrapper(rig: Rig) -> None:
    w = rig.smi.amdsmi_wrapper
    for name in ("SUCCESS", "INVAL", "NOT_SUPPORTED", "API_FAILED", "TIMEOUT", "NO_PERM", "OUT_OF_RESOURCES",
                 "NOT_FOUND", "NOT_INIT", "DRIVER_NOT_LOADED", "INSUFFICIENT_SIZE"):
        assert getattr(codes, f"STATUS_{name}") == getattr(w, f"AMDSMI_STATUS_{name}"), name
    assert codes.PROCESSOR_TYPE_AMD_GPU == w.AMDSMI_PROCESSOR_TYPE_AMD_GPU
    assert (codes.CLK_TYPE_GFX, codes.CLK_TYPE_SOC, codes.CLK_TYPE_MEM) == (
        w.AMDSMI_CLK_TYPE_GFX, w.AMDSMI_CLK_TYPE_SOC, w.AMDSMI_CLK_TYPE_MEM)
    assert (codes.TEMP_EDGE, codes.TEMP_HOTSPOT, codes.TEMP_VRAM, codes.TEMP_HBM_0, codes.TEMP_HBM_3) == (
        w.AMDSMI_TEMPERATURE_TYPE_EDGE, w.AMDSMI_TEMPERATURE_TYPE_HOTSPOT, w.AMDSMI_TEMPERATURE_TYPE_VRAM,
        w.AMDSMI_TEMPERATURE_TYPE_HBM_0, w.AMDSMI_TEMPERATURE_TYPE_HBM_3)
    assert (codes.TEMP_CURRENT, codes.TEMP_CRITICAL, codes.TEMP_EMERGENCY) == (
        w.AMDSMI_TEMP_CURRENT, w.AMDSMI_TEMP_CRITICAL, w.AMDSMI_TEMP_EMERGENCY)
    assert (codes.MEM_TYPE_VRAM, codes.MEM_TYPE_VIS_VRAM, codes.MEM_TYPE_GTT) == (
        w.AMDSMI_MEM_TYPE_VRAM, w.AMDSMI_MEM_TYPE_VIS_VRAM, w.AMDSMI_MEM_TYPE_GTT)
    assert (codes.VRAM_TYPE_HBM2E, codes.VRAM_TYPE_HBM3) == (w.AMDSMI_VRAM_TYPE_HBM2E, w.AMDSMI_VRAM_TYPE_HBM3)
    assert (codes.LINK_TYPE_XGMI, codes.XGMI_LINK_UP, codes.CARD_FORM_FACTOR_OAM, codes.INIT_AMD_GPUS) == (
        w.AMDSMI_LINK_TYPE_XGMI, w.AMDSMI_XGMI_LINK_UP, w.AMDSMI_CARD_FORM_FACTOR_OAM, w.AMDSMI_INIT_AMD_GPUS)
    top = [f[0] for f in w.amdsmi_gpu_metrics_t._fields_ if not f[0].startswith("PADDING")]
    fields = codes.GPU_METRICS_FIELDS
    assert tuple(top) == ("common_header",) + fields[:64] + ("xcp_stats",) + fields[64:]
    assert tuple(f[0] for f in w.amdsmi_gpu_xcp_metrics_t._fields_) == codes.XCP_FIELDS


def test_without_a_library_the_import_fails_like_a_host_without_rocm(capsys: pytest.CaptureFixture[str]) -> None:
    absent = FakeAmdSmiLibrary(VirtualBackend("mi300x"), profile=AmdProfile(library=False))
    for library in (None, absent):
        before = set(sys.modules)
        with pytest.raises(KeyError) as failure:
            load_amdsmi(library)
        assert failure.value.args == ("libamd_smi.so",)
        out = capsys.readouterr().out
        assert "Unable to find libamd_smi.so" in out and "cannot open shared object file" in out
        assert set(sys.modules) - before == set()  # a failed copy leaves nothing behind
    assert "amdsmi" not in sys.modules  # the installed package itself is never imported


def test_a_missing_symbol_fails_the_import_like_an_older_rocm() -> None:
    profile = AmdProfile(missing_symbols=["amdsmi_get_violation_status"])
    lib = FakeAmdSmiLibrary(VirtualBackend("mi300x"), profile=profile)
    with pytest.raises(AttributeError, match="undefined symbol: amdsmi_get_violation_status"):
        load_amdsmi(lib)
    with pytest.raises(AttributeError, match="undefined symbol"):
        lib.not_an_amdsmi_symbol  # noqa: B018


def test_copies_are_independent() -> None:
    a, b = Rig(), Rig(scenario())
    assert a.smi is not b.smi and a.smi.amdsmi_wrapper is not b.smi.amdsmi_wrapper
    assert a.smi.AmdSmiLibraryException is not b.smi.AmdSmiLibraryException
    a.init()
    assert len(a.handles()) == 8
    assert b.code(b.smi.amdsmi_get_socket_handles) == codes.STATUS_NOT_INIT  # b's library was never initialised
    again = load_amdsmi(a.lib)  # a second copy over the same library shares its state, as one .so would
    assert len(again.amdsmi_get_processor_handles()) == 8


def test_init_reference_counting_and_not_init(rig: Rig) -> None:
    smi = rig.smi
    smi.amdsmi_init()  # second reference
    smi.amdsmi_shut_down()
    assert len(smi.amdsmi_get_socket_handles()) == 8  # one reference left
    smi.amdsmi_shut_down()
    assert rig.code(smi.amdsmi_get_socket_handles) == codes.STATUS_NOT_INIT
    assert rig.code(smi.amdsmi_get_lib_version) == codes.STATUS_NOT_INIT
    assert rig.code(smi.amdsmi_shut_down) == codes.STATUS_NOT_INIT
    smi.amdsmi_init()
    assert len(rig.handles()) == 8
    nvidia = Rig(scenario(model="h100-sxm"))
    assert nvidia.code(nvidia.smi.amdsmi_init) == codes.STATUS_DRIVER_NOT_LOADED


# ----------------------------------------------------------------------------- enumeration, identity


def test_enumeration_and_identity_of_an_8x_mi300x_node(rig: Rig) -> None:
    smi = rig.smi
    sockets = smi.amdsmi_get_socket_handles()
    handles = rig.handles()
    assert len(sockets) == len(handles) == 8
    assert len({address(h) for h in handles}) == 8
    for k, handle in enumerate(handles):
        info = rig.infos[str(k)]
        assert smi.amdsmi_get_socket_info(sockets[k]) == info.pci_bus_id.rsplit(".", 1)[0]
        assert smi.amdsmi_get_processor_type(handle) == {"processor_type": "AMDSMI_PROCESSOR_TYPE_AMD_GPU"}
        assert smi.amdsmi_get_gpu_device_uuid(handle) == info.uuid
        assert smi.amdsmi_get_gpu_device_bdf(handle) == info.pci_bus_id
        asic = smi.amdsmi_get_gpu_asic_info(handle)
        assert asic["market_name"] == info.model == "AMD Instinct MI300X"
        assert (asic["vendor_id"], asic["device_id"]) == ("0x1002", hex(info.pci_device_id))
        assert asic["num_compute_units"] == info.sm_count and asic["oam_id"] == k
        assert asic["target_graphics_version"] == "gfx942"
        assert smi.amdsmi_get_gpu_kfd_info(handle)["current_partition_id"] == 0
        assert smi.amdsmi_get_gpu_compute_partition(handle) == "SPX"
        assert smi.amdsmi_get_gpu_memory_partition(handle) == "NPS1"
        assert smi.amdsmi_get_gpu_xcd_counter(handle) == 8
        assert smi.amdsmi_get_gpu_vram_info(handle)["vram_size"] == info.memory_total_bytes // MIB
        assert smi.amdsmi_get_gpu_memory_total(handle, smi.AmdSmiMemoryType.VRAM) == info.memory_total_bytes
    driver = smi.amdsmi_get_gpu_driver_info(handles[0])
    assert (driver["driver_name"], driver["driver_version"]) == ("amdgpu", rig.lib.profile.driver_version)
    version = smi.amdsmi_get_lib_version()
    assert (version["major"], version["minor"], version["release"]) == (26, 0, 2)  # ROCm 7.0.2's libamd_smi
    links = smi.amdsmi_get_link_metrics(handles[0])
    assert links["num_links"] == 7 == rig.infos["0"].link_count
    assert [link["bdf"] for link in links["links"][:7]] == [rig.infos[str(k)].pci_bus_id for k in range(1, 8)]
    assert {link["link_type"] for link in links["links"][:7]} == {codes.LINK_TYPE_XGMI}
    assert smi.amdsmi_get_gpu_xgmi_link_status(handles[0]) == {"status": ["U"] * 7, "total_links": 7}


def test_unmodelled_symbols_return_not_supported(rig: Rig) -> None:
    handle = rig.handles()[0]
    assert rig.code(rig.smi.amdsmi_get_gpu_vbios_info, handle) == codes.STATUS_NOT_SUPPORTED
    assert rig.code(rig.smi.amdsmi_get_gpu_board_info, handle) == codes.STATUS_NOT_SUPPORTED
    assert {"amdsmi_get_gpu_metrics_info", "amdsmi_get_violation_status", "amdsmi_get_gpu_process_list",
            "amdsmi_get_link_metrics", "amdsmi_get_pcie_info"} <= set(rig.lib.symbols)
    assert "amdsmi_get_gpu_vbios_info" not in rig.lib.symbols


# ----------------------------------------------------------------------------- readings


def test_metrics_table_agrees_with_the_virtual_samples(rig: Rig) -> None:
    smi, h0 = rig.smi, rig.handles()[0]
    m1 = smi.amdsmi_get_gpu_metrics_info(h0)
    rig.twin_samples("0")
    rig.step(5.0)
    m2 = smi.amdsmi_get_gpu_metrics_info(h0)
    s = rig.twin_samples("0")["0"]
    assert s.gr_active and s.link_tx_bytes_per_s and s.power_w  # GPU 0 trains: the comparisons below bite

    assert m2["current_socket_power"] == round(s.power_w) and m2["average_socket_power"] == "N/A"
    assert abs(m2["energy_accumulator"] * TICK_J - s.energy_j) <= TICK_J
    energy = smi.amdsmi_get_energy_count(h0)
    assert energy["energy_accumulator"] == m2["energy_accumulator"]
    assert energy["timestamp"] == m2["system_clock_counter"]  # ns
    assert energy["counter_resolution"] == pytest.approx(15.259)
    assert m2["system_clock_counter"] - m1["system_clock_counter"] == 5_000_000_000
    assert m2["average_gfx_activity"] == round(100 * s.gr_active)
    assert m2["average_umc_activity"] == round(100 * s.dram_active)
    assert smi.amdsmi_get_gpu_activity(h0) == {"gfx_activity": round(100 * s.gr_active),
                                               "umc_activity": round(100 * s.dram_active), "mm_activity": "N/A"}
    assert m2["xcp_stats.gfx_busy_inst"][0] == [round(100 * s.gr_active)] * 8 and m2["num_partition"] == 1
    assert m2["temperature_hotspot"] == round(s.temperature_c) and m2["temperature_edge"] == "N/A"
    assert m2["current_gfxclks"] == [round(s.sm_clock_mhz)] * 8
    assert (m2["pcie_link_width"], m2["pcie_link_speed"]) == (16, 320)  # x16, 32.0 GT/s in 0.1 GT/s
    power = smi.amdsmi_get_power_info(h0)
    assert power["socket_power"] == power["current_socket_power"] == m2["current_socket_power"]
    assert power["power_limit"] == round(s.power_limit_w)

    ticks = m2["accumulation_counter"] - m1["accumulation_counter"]
    assert ticks == 5000  # 1 ms PMFW ticks
    busy = (m2["xcp_stats.gfx_busy_acc"][0][0] - m1["xcp_stats.gfx_busy_acc"][0][0]) / ticks
    assert busy == pytest.approx(100 * s.gr_active, abs=0.01)

    dt = 5.0
    write = [b - a for a, b in zip(m1["xgmi_write_data_acc"][:7], m2["xgmi_write_data_acc"][:7])]
    read = [b - a for a, b in zip(m1["xgmi_read_data_acc"][:7], m2["xgmi_read_data_acc"][:7])]
    assert all(d > 0 for d in write + read) and len(set(write)) == 7  # uneven split over the 7 links
    assert sum(write) * 1024 / dt == pytest.approx(s.link_tx_bytes_per_s, rel=1e-4)
    assert sum(read) * 1024 / dt == pytest.approx(s.link_rx_bytes_per_s, rel=1e-4)
    assert m2["xgmi_write_data_acc"][7] == "N/A"  # MI300X has 7 links
    links = smi.amdsmi_get_link_metrics(h0)["links"]
    assert [link["write"] for link in links[:7]] == m2["xgmi_write_data_acc"][:7]
    assert [link["read"] for link in links[:7]] == m2["xgmi_read_data_acc"][:7]

    pcie = smi.amdsmi_get_pcie_info(h0)["pcie_metric"]
    rate = s.pcie_tx_bytes_per_s + s.pcie_rx_bytes_per_s
    assert pcie["pcie_bandwidth"] == round(rate * 8 / 1e6) and pcie["pcie_speed"] == 32000
    acc = (m2["pcie_bandwidth_acc"] - m1["pcie_bandwidth_acc"]) / ticks
    assert acc == pytest.approx(rate / 1e9, abs=2 / ticks)
    clocks = smi.amdsmi_get_clock_info(h0, smi.AmdSmiClkType.GFX)
    assert (clocks["clk"], clocks["max_clk"]) == (round(s.sm_clock_mhz), rig.infos["0"].sm_clock_max_mhz)
    hot = smi.amdsmi_get_temp_metric(h0, smi.AmdSmiTemperatureType.HOTSPOT, smi.AmdSmiTemperatureMetric.CURRENT)
    assert hot == round(s.temperature_c)
    used = smi.amdsmi_get_gpu_memory_usage(h0, smi.AmdSmiMemoryType.VRAM)
    assert used == s.mem_used_bytes and smi.amdsmi_get_gpu_vram_usage(h0)["vram_used"] == used // MIB


def test_unknown_and_na_fields_read_as_na() -> None:
    rig = Rig(profile=AmdProfile(na_metrics=["current_socket_power", "xcp_stats.gfx_busy_acc", "pcie_link_speed"]))
    smi = rig.init()
    h0 = rig.handles()[0]
    m = smi.amdsmi_get_gpu_metrics_info(h0)
    s = rig.lib.latest_sample(0)
    assert m["current_socket_power"] == "N/A" and smi.amdsmi_get_power_info(h0)["socket_power"] == "N/A"
    assert m["xcp_stats.gfx_busy_acc"][0] == ["N/A"] * 8 and m["pcie_link_speed"] == "N/A"
    assert m["energy_accumulator"] != "N/A" and m["pcie_link_width"] == 16  # only the listed fields
    assert s.memory_temperature_c is None  # the engine has no HBM temperature for this node ...
    assert m["temperature_mem"] == "N/A" and m["temperature_hbm"] == ["N/A"] * 4  # ... so neither has amdsmi
    vram = (h0, smi.AmdSmiTemperatureType.VRAM, smi.AmdSmiTemperatureMetric.CURRENT)
    assert rig.code(smi.amdsmi_get_temp_metric, *vram) == codes.STATUS_NOT_SUPPORTED
    assert m["current_fan_speed"] == "N/A" and m["voltage_gfx"] == "N/A"
    with pytest.raises(ValueError, match="not a field"):
        FakeAmdSmiLibrary(rig.twin, profile=AmdProfile(na_metrics=["socket_power"]))


def test_counters_the_node_cannot_read_are_na_never_zero() -> None:
    rig = Rig(scenario(gpus=1, counters="minimal"))
    smi = rig.init()
    handle = rig.handles()[0]
    rig.step(1.0)
    m = smi.amdsmi_get_gpu_metrics_info(handle)
    s = rig.lib.latest_sample(0)
    assert s.gr_active is None and s.dram_active is None and s.power_w is not None
    assert m["average_gfx_activity"] == m["average_umc_activity"] == m["gfx_activity_acc"] == "N/A"
    assert m["xcp_stats.gfx_busy_inst"][0] == m["xcp_stats.gfx_busy_acc"][0] == ["N/A"] * 8
    assert smi.amdsmi_get_gpu_activity(handle) == {"gfx_activity": "N/A", "umc_activity": "N/A", "mm_activity": "N/A"}
    assert m["current_socket_power"] == round(s.power_w)  # what it can read is still there


def test_status_strings_through_the_wrapper(rig: Rig) -> None:
    w = rig.smi.amdsmi_wrapper
    text = ctypes.POINTER(ctypes.c_char)()
    assert w.amdsmi_status_code_to_string(w.AMDSMI_STATUS_NOT_FOUND, ctypes.byref(text)) == w.AMDSMI_STATUS_SUCCESS
    assert w.string_cast(text).startswith("AMDSMI_STATUS_NOT_FOUND")


def test_compute_partitions_are_processors_of_one_socket() -> None:
    rig = Rig(CPX)
    smi = rig.init()
    assert len(smi.amdsmi_get_socket_handles()) == 2
    handles = rig.handles()
    assert len(handles) == 16
    for i, handle in enumerate(handles):
        k, p = divmod(i, 8)
        info = rig.infos[f"{k}/{p}"]
        assert smi.amdsmi_get_gpu_device_uuid(handle) == info.uuid
        assert smi.amdsmi_get_gpu_device_bdf(handle) == info.pci_bus_id and info.pci_bus_id.endswith(f".{p}")
        assert smi.amdsmi_get_gpu_kfd_info(handle)["current_partition_id"] == p
        assert smi.amdsmi_get_gpu_asic_info(handle)["num_compute_units"] == info.sm_count == 304 // 8
        assert smi.amdsmi_get_gpu_memory_total(handle, smi.AmdSmiMemoryType.VRAM) == info.memory_total_bytes
        assert smi.amdsmi_get_gpu_compute_partition(handle) == "CPX"
        assert smi.amdsmi_get_gpu_xcd_counter(handle) == 1
    rig.step(2.0)
    primary, third = smi.amdsmi_get_gpu_metrics_info(handles[0]), smi.amdsmi_get_gpu_metrics_info(handles[3])
    parts = rig.twin_samples(*(f"0/{p}" for p in range(8)))
    gr = [parts[f"0/{p}"].gr_active for p in range(8)]
    assert gr[0] > 0.5 and gr[1] == 0.0  # a busy and an idle partition
    assert primary["num_partition"] == 8
    assert primary["current_socket_power"] == round(sum(s.power_w for s in parts.values()))
    assert abs(primary["energy_accumulator"] * TICK_J - sum(s.energy_j for s in parts.values())) <= 2 * TICK_J
    assert primary["average_gfx_activity"] == third["average_gfx_activity"] == round(100 * sum(gr) / 8)
    for p in range(8):
        assert primary["xcp_stats.gfx_busy_inst"][p] == [round(100 * gr[p])] + ["N/A"] * 7
    for field in ("current_socket_power", "energy_accumulator", "pcie_bandwidth_inst"):
        assert third[field] == "N/A", field  # socket power, energy and traffic: partition 0 only
    assert third["xgmi_write_data_acc"] == ["N/A"] * 8 and primary["xgmi_write_data_acc"][0] != "N/A"
    assert smi.amdsmi_get_power_info(handles[3])["current_socket_power"] == "N/A"
    assert rig.code(smi.amdsmi_get_energy_count, handles[3]) == codes.STATUS_NOT_SUPPORTED
    assert smi.amdsmi_get_link_metrics(handles[3])["num_links"] == 0
    procs = smi.amdsmi_get_gpu_process_list(handles[3])
    assert [(q["pid"], q["name"]) for q in procs] == [(q.pid, q.name) for q in parts["0/3"].processes]
    assert procs[0]["name"] == "vllm" and smi.amdsmi_get_gpu_process_list(handles[1]) == []


def test_power_cap_and_heat_drive_the_residencies_and_violation_status() -> None:
    capped = scenario(gpus=2, workloads=[
        {"job": "capped", "gpus": [0],
         "phases": [{"kind": "compute", "mfu": 0.6, "power_cap_w": 300, "duration_s": 3600}]},
        {"job": "hot", "gpus": [1], "phases": [{"kind": "compute", "mfu": 0.3, "thermal": True, "duration_s": 3600}]}])
    rig = Rig(capped)
    smi = rig.init()
    h0, h1 = rig.handles()
    a = smi.amdsmi_get_gpu_metrics_info(h0)
    smi.amdsmi_get_gpu_metrics_info(h1)
    rig.twin_samples("0", "1")
    rig.step(4.0)
    b = smi.amdsmi_get_gpu_metrics_info(h0)
    s = rig.twin_samples("0", "1")
    assert s["0"].clock_event_reasons & 0x4 and not s["1"].clock_event_reasons & 0x4
    assert s["1"].clock_event_reasons & 0x28 == 0x28  # HW slowdown + SW thermal
    ticks = b["accumulation_counter"] - a["accumulation_counter"]
    pviol = (b["ppt_residency_acc"] - a["ppt_residency_acc"]) * 100 // ticks  # amdsmi's PVIOL formula
    assert pviol == 100 and b["throttle_status"] is True and b["indep_throttle_status"] is True
    capped_status, hot_status = smi.amdsmi_get_violation_status(h0), smi.amdsmi_get_violation_status(h1)
    assert (capped_status["per_ppt_pwr"], capped_status["active_ppt_pwr"]) == (100, True)
    assert capped_status["acc_ppt_pwr"] == b["ppt_residency_acc"] and capped_status["per_socket_thrm"] == 0
    assert (hot_status["per_ppt_pwr"], hot_status["active_ppt_pwr"]) == (0, False)
    assert (hot_status["per_socket_thrm"], hot_status["per_prochot_thrm"], hot_status["per_hbm_thrm"]) == (100, 100, 0)
    assert capped_status["per_gfx_clk_below_host_limit_pwr"][0] == [100] * 8
    assert smi.amdsmi_get_power_cap_info(h0)["power_cap"] == 300 * 10**6  # µW


def test_mi250x_reports_average_power_and_has_no_accumulators() -> None:
    rig = Rig(scenario(model="mi250x", gpus=2))
    smi = rig.init()
    handle = rig.handles()[0]
    rig.step(1.0)
    m = smi.amdsmi_get_gpu_metrics_info(handle)
    s = rig.lib.latest_sample(0)
    assert m["average_socket_power"] == round(s.power_w) and m["current_socket_power"] == "N/A"
    assert smi.amdsmi_get_power_info(handle)["socket_power"] == m["average_socket_power"]
    assert m["common_header.content_revision"] == 3 and m["accumulation_counter"] == "N/A"
    assert m["temperature_edge"] != "N/A" and m["xcp_stats.gfx_busy_inst"][0] == ["N/A"] * 8
    assert smi.amdsmi_get_gpu_asic_info(handle)["target_graphics_version"] == "gfx90a"
    assert rig.code(smi.amdsmi_get_violation_status, handle) == codes.STATUS_NOT_SUPPORTED
    assert rig.code(smi.amdsmi_get_gpu_compute_partition, handle) == codes.STATUS_NOT_SUPPORTED


def test_process_list(rig: Rig) -> None:
    smi = rig.smi
    handles = rig.handles()
    first = smi.amdsmi_get_gpu_process_list(handles[4])
    rig.twin_samples("4")
    rig.step(4.0)
    (proc,) = smi.amdsmi_get_gpu_process_list(handles[4])
    s = rig.twin_samples("4")["4"]
    (expected,) = s.processes
    assert (proc["pid"], proc["name"]) == (expected.pid, expected.name) == (expected.pid, "vllm")
    assert proc["mem"] == proc["memory_usage"]["vram_mem"] == expected.used_memory_bytes
    assert proc["engine_usage"]["gfx"] - first[0]["engine_usage"]["gfx"] == pytest.approx(s.gr_active * 4e9, rel=1e-9)
    assert proc["cu_occupancy"] == "N/A"  # the engine does not say how many CUs it holds
    assert smi.amdsmi_get_gpu_process_list(handles[7]) == []  # the idle GPU


# ----------------------------------------------------------------------------- failures


def test_not_supported_and_no_permission() -> None:
    profile = AmdProfile(not_supported=["amdsmi_get_gpu_activity"], no_permission=["amdsmi_get_gpu_process_list"])
    rig = Rig(profile=profile)
    smi = rig.init()
    handle = rig.handles()[0]
    assert rig.code(smi.amdsmi_get_gpu_activity, handle) == 2
    assert rig.code(smi.amdsmi_get_gpu_process_list, handle) == 10
    assert smi.amdsmi_get_gpu_metrics_info(handle)["average_gfx_activity"] != "N/A"


def test_a_lost_gpu_disappears_and_returns_with_a_new_handle(rig: Rig) -> None:
    smi = rig.smi
    old = rig.handles()[2]
    rig.virtual.inject_fault(2, "lost", 10.0)
    now = rig.handles()
    assert len(now) == 7 and address(old) not in {address(h) for h in now}
    assert rig.code(smi.amdsmi_get_gpu_device_uuid, old) == codes.STATUS_NOT_FOUND
    assert rig.code(smi.amdsmi_get_gpu_metrics_info, old) == codes.STATUS_NOT_FOUND
    rig.step(11.0)
    back = rig.handles()
    assert len(back) == 8
    new = back[2]
    assert address(new) != address(old)
    assert rig.code(smi.amdsmi_get_gpu_device_uuid, old) == codes.STATUS_NOT_FOUND  # stale for good, as after a reset
    assert smi.amdsmi_get_gpu_device_uuid(new) == rig.infos["2"].uuid
    assert smi.amdsmi_get_gpu_metrics_info(new)["average_gfx_activity"] != "N/A"


def test_read_errors_are_api_failed(rig: Rig) -> None:
    handle = rig.handles()[1]
    rig.virtual.inject_fault(1, "error", 5.0)
    assert rig.code(rig.smi.amdsmi_get_gpu_metrics_info, handle) == codes.STATUS_API_FAILED
    assert rig.smi.amdsmi_get_gpu_device_uuid(handle) == rig.infos["1"].uuid  # identity still answers
    rig.step(6.0)
    assert rig.smi.amdsmi_get_gpu_activity(handle)["gfx_activity"] != "N/A"


def test_a_forced_status_raises_what_the_real_package_raises_for_it(rig: Rig) -> None:
    smi, w = rig.smi, rig.smi.amdsmi_wrapper
    handles = rig.handles()
    rig.lib.force_error("amdsmi_get_gpu_metrics_info", w.AMDSMI_STATUS_NO_PERM, gpu=1)
    assert rig.code(smi.amdsmi_get_gpu_metrics_info, handles[1]) == w.AMDSMI_STATUS_NO_PERM
    assert smi.amdsmi_get_gpu_metrics_info(handles[0])["average_gfx_activity"] != "N/A"  # only GPU 1
    assert smi.amdsmi_get_gpu_activity(handles[1])["gfx_activity"] != "N/A"  # only that function
    assert rig.lib.calls[("1", "amdsmi_get_gpu_metrics_info")] == 1  # a failing call is still a call
    rig.lib.force_error("amdsmi_get_power_info", w.AMDSMI_STATUS_TIMEOUT, gpu=handles[2])  # by handle
    with pytest.raises(smi.AmdSmiTimeoutException):
        smi.amdsmi_get_power_info(handles[2])
    rig.lib.force_error("amdsmi_get_energy_count", w.AMDSMI_STATUS_RETRY)  # every GPU
    for handle in (handles[0], handles[7]):
        with pytest.raises(smi.AmdSmiRetryException):
            smi.amdsmi_get_energy_count(handle)
    rig.lib.force_error("amdsmi_get_gpu_memory_usage", w.AMDSMI_STATUS_UNKNOWN_ERROR, gpu="3")
    with pytest.raises(smi.AmdSmiLibraryException) as failure:
        smi.amdsmi_get_gpu_memory_usage(handles[3], smi.AmdSmiMemoryType.VRAM)
    assert type(failure.value) is smi.AmdSmiLibraryException
    assert failure.value.get_error_code() == w.AMDSMI_STATUS_UNKNOWN_ERROR
    assert "AMDSMI_STATUS_UNKNOWN_ERROR" in str(failure.value)
    rig.lib.force_error("amdsmi_get_processor_handles", w.AMDSMI_STATUS_NOT_FOUND, gpu=5)  # by socket
    assert rig.code(smi.amdsmi_get_processor_handles) == w.AMDSMI_STATUS_NOT_FOUND
    rig.lib.clear_forced_errors()
    assert len(rig.handles()) == 8
    assert smi.amdsmi_get_gpu_metrics_info(handles[1])["average_gfx_activity"] != "N/A"
    assert smi.amdsmi_get_energy_count(handles[0])["energy_accumulator"] > 0


def test_a_forced_status_on_a_partition_and_bad_requests() -> None:
    rig = Rig(CPX)
    smi = rig.init()
    w = smi.amdsmi_wrapper
    handles = rig.handles()
    rig.lib.force_error("amdsmi_get_gpu_process_list", w.AMDSMI_STATUS_NOT_SUPPORTED, gpu="0/3")
    assert rig.code(smi.amdsmi_get_gpu_process_list, handles[3]) == w.AMDSMI_STATUS_NOT_SUPPORTED
    assert isinstance(smi.amdsmi_get_gpu_process_list(handles[2]), list)  # its neighbour on the socket
    for symbol, status, gpu in (("nvmlDeviceGetCount", 2, None), ("amdsmi_get_gpu_activity", 2, "9"),
                                ("amdsmi_get_gpu_activity", 2, object()),
                                ("amdsmi_get_gpu_activity", w.AMDSMI_STATUS_SUCCESS, None)):
        with pytest.raises(ValueError):
            rig.lib.force_error(symbol, status, gpu)


def test_a_hang_times_out_and_close_releases_it(rig: Rig) -> None:
    smi, handle = rig.smi, rig.handles()[3]
    rig.virtual.inject_fault(3, "hang", 5.0, hang_s=0.05)
    with pytest.raises(smi.AmdSmiTimeoutException):
        smi.amdsmi_get_gpu_metrics_info(handle)
    rig.virtual.clear_faults()
    rig.virtual.inject_fault(3, "hang", 5.0, hang_s=30.0)
    outcome: list[Any] = []

    def read() -> None:
        try:
            smi.amdsmi_get_power_info(handle)
        except smi.AmdSmiLibraryException as exc:
            outcome.append(exc.get_error_code())

    worker = threading.Thread(target=read)
    worker.start()
    assert poll(lambda: rig.lib.hung_calls == 1, timeout=2.0)
    rig.lib.close()
    worker.join(timeout=2.0)
    assert not worker.is_alive() and outcome == [codes.STATUS_TIMEOUT] and rig.lib.hung_calls == 0


def test_calls_are_counted_per_gpu_from_many_threads(rig: Rig) -> None:
    handles = rig.handles()
    errors: list[BaseException] = []

    def poll_gpu(handle: Any) -> None:
        try:
            for _ in range(3):
                rig.smi.amdsmi_get_gpu_metrics_info(handle)
                rig.smi.amdsmi_get_gpu_process_list(handle)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=poll_gpu, args=(h,)) for h in handles]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10.0)
    assert not errors
    for k in range(8):
        assert rig.lib.calls[(str(k), "amdsmi_get_gpu_metrics_info")] == 3
        assert rig.lib.calls[(str(k), "amdsmi_get_processor_handles")] == 2  # count, then fill
    assert rig.lib.latest_sample(5) is not None
