"""Where the real amdsmi differs from what the fake libamd_smi used to assume (issue 23, docs/amd.md).

Each test pins one behaviour of the real library, read in the ROCm amdsmi sources (tag rocm-6.2.2,
branch rocm-6.2.x and the ROCm 6.3 development branch of src/amd_smi/amd_smi.cc and
rocm_smi/src/rocm_smi*.cc) and the per-release headers, then checks that the fake plays it and that
the backend copes with it:

* a lost or reset GPU keeps its processor handle; reads fail with NOT_SUPPORTED (ENOENT: the
  sysfs node is gone) or UNEXPECTED_SIZE (EIO while the reset runs), never NOT_FOUND;
* amdsmi_get_gpu_activity, amdsmi_get_clock_info, amdsmi_get_pcie_info, amdsmi_get_link_metrics and
  amdsmi_get_energy_count are computed from the gpu_metrics table, so they fail when it fails;
* pcie_metric.pcie_bandwidth is the table's pcie_bandwidth_inst copied as is: GB/s, though the
  header says Mb/s.
"""

from __future__ import annotations

import ctypes
from typing import Any

import pytest

from agent.backends.base import DeviceLostError
from agent.context.sources import HostFacts
from agent.virtual.fake_amdsmi import codes
from agent.virtual.profiles import AmdProfile
from tests.amd_backend_rig import rig as backend_rig  # noqa: F401 (a fixture)
from tests.amd_backend_rig import scenario
from tests.amdsmi_releases import package, release  # noqa: F401 (release is a fixture)
from tests.fake_amdsmi_rig import Rig
from tests.fake_amdsmi_rig import rig  # noqa: F401 (a fixture)
from tests.nvml_harness import ManualClock

UNEXPECTED_SIZE = 42
"""AMDSMI_STATUS_UNEXPECTED_SIZE: rocm_smi's ErrnoToRsmiStatus maps EIO to it."""

READINGS = ("amdsmi_get_gpu_metrics_info", "amdsmi_get_energy_count", "amdsmi_get_gpu_memory_usage",
            "amdsmi_get_gpu_process_list", "amdsmi_get_gpu_activity", "amdsmi_get_power_info",
            "amdsmi_get_temp_metric", "amdsmi_get_clock_info", "amdsmi_get_pcie_info",
            "amdsmi_get_link_metrics", "amdsmi_get_power_cap_info", "amdsmi_get_gpu_total_ecc_count")
"""Every reading call on a GPU: what fails when its sysfs node goes away."""


def address(handle: Any) -> int:
    return ctypes.cast(handle, ctypes.c_void_p).value or 0


# ----------------------------------------------------------------------------- a lost or reset GPU


def test_a_lost_gpu_keeps_its_handle_and_fails_its_reads_as_amdsmi_does(rig: Rig) -> None:
    """amdsmi builds its processor list at amdsmi_init and keeps it: a GPU that falls off the bus is
    still listed, under the same handle, and its reads fail the way its missing sysfs files make
    them fail. Only a new amdsmi_init enumerates again."""
    smi = rig.smi
    old = rig.handles()[2]
    vram = smi.AmdSmiMemoryType.VRAM
    rig.virtual.inject_fault(2, "lost", 10.0)
    assert address(old) in {address(h) for h in rig.handles()}  # still listed, same handle
    assert rig.code(smi.amdsmi_get_gpu_metrics_info, old) == UNEXPECTED_SIZE  # EIO while the reset runs
    rig.step(2.0)
    for call, args in ((smi.amdsmi_get_gpu_metrics_info, ()), (smi.amdsmi_get_gpu_memory_usage, (vram,)),
                       (smi.amdsmi_get_gpu_device_uuid, ())):
        assert rig.code(call, old, *args) == codes.STATUS_NOT_SUPPORTED  # the sysfs node is gone (ENOENT)
    assert smi.amdsmi_get_gpu_device_bdf(old) == rig.infos["2"].pci_bus_id  # cached at init: still answers
    rig.step(9.0)  # the GPU is back, as a new DRM node: the old handle still points at the old one
    assert rig.code(smi.amdsmi_get_gpu_memory_usage, old, vram) == codes.STATUS_NOT_SUPPORTED
    smi.amdsmi_shut_down()
    smi.amdsmi_init()
    assert rig.code(smi.amdsmi_get_gpu_memory_usage, old, vram) == codes.STATUS_NOT_FOUND  # not in the new list
    new = rig.handles()[2]
    assert address(new) != address(old) and smi.amdsmi_get_gpu_device_uuid(new) == rig.infos["2"].uuid
    assert smi.amdsmi_get_gpu_memory_usage(new, vram) > 0


def test_amdsmi_init_during_the_loss_does_not_list_the_gpu(rig: Rig) -> None:
    rig.virtual.inject_fault(5, "lost", 10.0)
    rig.smi.amdsmi_shut_down()
    rig.smi.amdsmi_init()
    uuids = {rig.smi.amdsmi_get_gpu_device_uuid(h) for h in rig.handles()}
    assert len(uuids) == 7 and rig.infos["5"].uuid not in uuids


@pytest.mark.parametrize("status", ["NOT_SUPPORTED", "UNEXPECTED_SIZE"])
def test_a_gpu_whose_reads_fail_like_a_lost_one_goes_down_and_comes_back_whole(backend_rig, status, release):
    """What a lost GPU looks like through real amdsmi: every read fails with NOT_SUPPORTED or
    UNEXPECTED_SIZE. The GPU must go down (not stay up with its readings switched off for good),
    and once it answers again come back with every reading it had."""
    r = backend_rig(package=package(release))
    r.cycle()
    before = r.cycle()["1"]
    unknown_before = dict(r.backend.devices["1"].absent)  # what this release cannot tell (6.2: accumulators)
    code = {"NOT_SUPPORTED": codes.STATUS_NOT_SUPPORTED, "UNEXPECTED_SIZE": UNEXPECTED_SIZE}[status]
    for symbol in READINGS:
        r.library.force_error(symbol, code, gpu="1")
    failed = r.cycle()
    assert isinstance(failed["1"], DeviceLostError), failed["1"]
    assert not isinstance(failed["0"], Exception)  # the other GPU kept reporting
    r.library.clear_forced_errors()
    for _ in range(4):
        back = r.cycle()["1"]
        if not isinstance(back, Exception):
            break
    assert not isinstance(back, Exception), back
    for field in ("gr_active", "dram_active", "power_w", "energy_j", "temperature_c", "mem_used_bytes", "links"):
        assert getattr(before, field) is not None and getattr(back, field) is not None, field
    assert back.processes and r.backend.devices["1"].absent == unknown_before  # nothing switched off by the loss


def test_a_lost_window_takes_the_gpu_down_and_a_reinitialised_amdsmi_brings_it_back(backend_rig):
    r = backend_rig(scenario(faults=[{"gpu": 1, "kind": "lost", "start_s": 103, "duration_s": 4}]))
    results = [r.cycle() for _ in range(10)]  # virtual time 101 .. 111
    lost = [c["1"] for c in results if isinstance(c["1"], Exception)]
    assert lost and all(isinstance(e, DeviceLostError) for e in lost), lost
    assert all(not isinstance(c["0"], Exception) for c in results)
    last = results[-1]["1"]
    assert not isinstance(last, Exception) and last.gr_active is not None and last.energy_j is not None
    assert r.library.calls[(None, "amdsmi_init")] >= 2  # the GPU came back as a new node: amdsmi re-initialised


# ----------------------------------------------------------------------------- getters from the metrics table


def test_getters_computed_from_the_metrics_table_fail_with_it() -> None:
    rig = Rig(profile=AmdProfile(not_supported=["amdsmi_get_gpu_metrics_info"]))
    smi = rig.init()
    h = rig.handles()[0]
    assert rig.code(smi.amdsmi_get_gpu_activity, h) == codes.STATUS_NOT_SUPPORTED
    assert rig.code(smi.amdsmi_get_clock_info, h, smi.AmdSmiClkType.GFX) == codes.STATUS_NOT_SUPPORTED
    assert rig.code(smi.amdsmi_get_pcie_info, h) == codes.STATUS_NOT_SUPPORTED
    assert rig.code(smi.amdsmi_get_link_metrics, h) == codes.STATUS_NOT_SUPPORTED
    assert rig.code(smi.amdsmi_get_energy_count, h) == codes.STATUS_NOT_SUPPORTED
    power = smi.amdsmi_get_power_info(h)  # the socket power fields come from the table: unknown
    assert power["current_socket_power"] == "N/A" and power["average_socket_power"] == "N/A"
    hot = smi.amdsmi_get_temp_metric(h, smi.AmdSmiTemperatureType.HOTSPOT, smi.AmdSmiTemperatureMetric.CURRENT)
    assert 20 < hot < 110  # hwmon, not the table: still answers
    assert smi.amdsmi_get_gpu_memory_usage(h, smi.AmdSmiMemoryType.VRAM) > 0


def test_without_the_metrics_table_its_readings_are_unknown_and_the_getters_not_asked(backend_rig, release):
    r = backend_rig(scenario(amd={"not_supported": ["amdsmi_get_gpu_metrics_info"]}), package(release))
    before = r.library.calls.copy()
    s = r.cycle()["0"]
    for field in ("gr_active", "dram_active", "sm_clock_mhz", "pcie_bytes_per_s", "links", "energy_j",
                  "clock_event_reasons"):
        assert getattr(s, field) is None, field  # amdsmi computes all of them from the table
    assert s.temperature_c is not None and s.mem_used_bytes is not None  # hwmon and sysfs: still read
    asked = {sym for (gpu, sym), n in r.library.calls.items() if gpu == "0" and n > before.get((gpu, sym), 0)}
    assert not asked & {"amdsmi_get_gpu_activity", "amdsmi_get_clock_info", "amdsmi_get_pcie_info",
                        "amdsmi_get_link_metrics", "amdsmi_get_energy_count"}, asked
    reason = r.backend.devices["0"].absent.get("gr_active", "")
    assert "metrics table" in reason, r.backend.devices["0"].absent


def test_pcie_bandwidth_is_the_tables_gbps_copied_as_is(rig: Rig) -> None:
    """amd_smi.cc: pcie_metric.pcie_bandwidth = metric_info.pcie_bandwidth_inst (GB/s), whatever the
    header's "Mb/s" says; GPU 6 of the mi300x scenario moves a few GB/s over PCIe."""
    smi, h = rig.smi, rig.handles()[6]
    rig.step(2.0)
    table = smi.amdsmi_get_gpu_metrics_info(h)
    bandwidth = smi.amdsmi_get_pcie_info(h)["pcie_metric"]["pcie_bandwidth"]
    assert table["pcie_bandwidth_inst"] >= 1 and bandwidth == table["pcie_bandwidth_inst"]
    assert smi.amdsmi_get_pcie_info(h)["pcie_metric"]["pcie_speed"] == table["pcie_link_speed"] * 100  # MT/s


# ----------------------------------------------------------------------------- sentinels


def test_an_unknown_socket_power_is_max_int_in_power_info_and_unknown_in_the_backend(backend_rig):
    """amdsmi 7.x sets unsupported amdsmi_power_info_t members to UINT32_MAX, and its Python interface
    maps only 0xFFFF to "N/A": socket_power reaches the caller as 4294967295."""
    r = backend_rig(scenario(amd={"na_metrics": ["current_socket_power"]}))
    assert r.amdsmi.amdsmi_get_power_info(r.backend._found["0"].handle)["socket_power"] == 0xFFFFFFFF
    s = r.cycle()["0"]
    assert s.power_w is None  # unknown, never 4 GW


STUB_TABLE = {
    "average_gfx_activity": 40, "average_umc_activity": 30, "current_socket_power": 0xFFFE,
    "average_socket_power": "N/A", "current_gfxclk": 0xFFFF, "current_gfxclks": ["N/A"] * 8,
    "temperature_hotspot": 0xFFFE, "temperature_mem": -300, "temperature_hbm": ["N/A"] * 4,
    "pcie_bandwidth_acc": "N/A", "pcie_bandwidth_inst": 0xFFFFFFFF, "pcie_replay_count_acc": 0xFFFFFFFFFFFFFFFF,
    "xgmi_read_data_acc": [0xFFFFFFFFFFFFFFFF] * 8, "xgmi_write_data_acc": ["N/A"] * 8,
    "accumulation_counter": "N/A",
}
"""A metrics table whose every reading is an amdsmi sentinel or out of range."""


class StubAmdsmi:
    """The amdsmi calls of one interval, answering what the wrappers can hand back unmapped: the
    table's 16-bit all-ones that 6.2 maps only when exactly 0xFFFF (0xFFFE W, 0xFFFE °C), energy_count's
    64-bit all-ones, ECC and power-cap all-ones, a process's all-ones VRAM and cu_occupancy."""

    class AmdSmiException(Exception):
        pass

    class AmdSmiLibraryException(AmdSmiException):
        def get_error_code(self) -> int:
            return 2

    class AmdSmiMemoryType:
        VRAM = 0

    class AmdSmiClkType:
        GFX = 0

    class AmdSmiTemperatureType:
        HOTSPOT = 1

    class AmdSmiTemperatureMetric:
        CURRENT = 0

    def amdsmi_get_gpu_metrics_info(self, h: Any) -> dict:
        return dict(STUB_TABLE)

    def amdsmi_get_energy_count(self, h: Any) -> dict:
        return {"energy_accumulator": 0xFFFFFFFFFFFFFFFF, "counter_resolution": 15.259, "timestamp": 1}

    def amdsmi_get_temp_metric(self, h: Any, sensor: Any, metric: Any) -> int:
        return 0xFFFF

    def amdsmi_get_power_cap_info(self, h: Any) -> dict:
        return {"power_cap": 0xFFFFFFFFFFFFFFFF}

    def amdsmi_get_gpu_total_ecc_count(self, h: Any) -> dict:
        return {"correctable_count": 0xFFFFFFFFFFFFFFFF, "uncorrectable_count": 0xFFFFFFFFFFFFFFFF}

    def amdsmi_get_gpu_memory_usage(self, h: Any, kind: Any) -> int:
        return 8 << 30

    def amdsmi_get_gpu_process_list(self, h: Any) -> list:
        return [{"pid": 42, "name": "x", "memory_usage": {"vram_mem": 0xFFFFFFFFFFFFFFFF}, "cu_occupancy": 0xFFFFFFFF}]


class NoHost:
    def facts(self, *args: Any, **kwargs: Any) -> HostFacts:
        return HostFacts(processes={})


def test_sentinels_and_out_of_range_values_are_unknown_never_absurd() -> None:
    from agent.backends.amd.device import AmdDevice, SocketTable
    from agent.model import DeviceInfo

    info = DeviceInfo(gpu="0", uuid="u", vendor="amd", model="AMD Instinct MI300X", memory_total_bytes=192 << 30)
    clock = ManualClock()
    device = AmdDevice(StubAmdsmi(), info, object(), SocketTable(), partition=0, partitions=1,
                       host=NoHost(), clock=clock)
    for _ in range(2):
        clock.advance(1.0)
        s = device.read(clock())
    assert (s.gr_active, s.dram_active) == (0.4, 0.3)  # real values still come through
    for field in ("power_w", "energy_j", "sm_clock_mhz", "temperature_c", "memory_temperature_c",
                  "pcie_bytes_per_s", "pcie_replays", "power_limit_w", "ecc_corrected_errors",
                  "ecc_uncorrected_errors", "link_rx_bytes_per_s", "link_tx_bytes_per_s"):
        assert getattr(s, field) is None, (field, getattr(s, field))
    assert not s.links
    (proc,) = s.processes
    assert proc.used_memory_bytes is None and proc.compute_units is None
