"""The fake libamd_smi.so under the real amdsmi package: what the readings say.

The metrics table, activity, power, energy, clocks, temperatures, XGMI and PCIe traffic, and the
process list are compared with a twin virtual backend's samples over the same window
(tests/fake_amdsmi_rig.py); also N/A for what a node cannot read, compute partitions, power
capping and thermal residencies, and the MI250X's older metrics table.
"""

from __future__ import annotations

import pytest

from agent.virtual.devices import MIB
from agent.virtual.fake_amdsmi import FakeAmdSmiLibrary, codes
from agent.virtual.profiles import AmdProfile
from tests.fake_amdsmi_rig import CPX, Rig, scenario
from tests.fake_amdsmi_rig import rig  # noqa: F401 (a fixture)

TICK_J = codes.ENERGY_RESOLUTION_UJ * 1e-6

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
    assert pcie["pcie_bandwidth"] == m2["pcie_bandwidth_inst"] and pcie["pcie_speed"] == 32000  # GB/s copied as is
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
    assert m["current_socket_power"] == "N/A"
    assert smi.amdsmi_get_power_info(h0)["socket_power"] == 0xFFFFFFFF  # 7.x: UINT32_MAX, not mapped to "N/A"
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
    assert smi.amdsmi_get_energy_count(handles[3])["energy_accumulator"] == 0xFFFFFFFFFFFFFFFF  # the table's, unmapped
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
