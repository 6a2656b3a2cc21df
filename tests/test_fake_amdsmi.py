"""The fake libamd_smi.so under the real amdsmi package: loading, init, identity, failures.

Every check goes through a load_amdsmi copy. The fake is set up from a scenario and a hand-moved
clock (tests/fake_amdsmi_rig.py); after that the tests only use the amdsmi Python API (plus the
library's public hooks: calls, hung_calls, latest_sample, close, force_error). What the readings
say, compared with the twin virtual backend's samples, is in test_fake_amdsmi_readings.py.
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
from tests.agent_process import poll
from tests.fake_amdsmi_rig import CPX, Rig, scenario
from tests.fake_amdsmi_rig import rig  # noqa: F401 (a fixture)


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
    assert smi.amdsmi_get_lib_version()["major"] == 26  # from amdsmi 6.4 the version needs no init
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
    board = rig.smi.amdsmi_get_gpu_board_info(handle)  # modelled: the serial the exporter join matches on
    assert len(board["product_serial"]) == 12 and board["product_serial"].isdigit() and board["fru_id"] == "N/A"
    assert {"amdsmi_get_gpu_metrics_info", "amdsmi_get_violation_status", "amdsmi_get_gpu_process_list",
            "amdsmi_get_link_metrics", "amdsmi_get_pcie_info"} <= set(rig.lib.symbols)
    assert "amdsmi_get_gpu_vbios_info" not in rig.lib.symbols


# ----------------------------------------------------------------------------- failures


def test_status_strings_through_the_wrapper(rig: Rig) -> None:
    w = rig.smi.amdsmi_wrapper
    text = ctypes.POINTER(ctypes.c_char)()
    assert w.amdsmi_status_code_to_string(w.AMDSMI_STATUS_NOT_FOUND, ctypes.byref(text)) == w.AMDSMI_STATUS_SUCCESS
    assert w.string_cast(text).startswith("AMDSMI_STATUS_NOT_FOUND")


def test_not_supported_and_no_permission() -> None:
    profile = AmdProfile(not_supported=["amdsmi_get_gpu_activity"], no_permission=["amdsmi_get_gpu_process_list"])
    rig = Rig(profile=profile)
    smi = rig.init()
    handle = rig.handles()[0]
    assert rig.code(smi.amdsmi_get_gpu_activity, handle) == 2
    assert rig.code(smi.amdsmi_get_gpu_process_list, handle) == 10
    assert smi.amdsmi_get_gpu_metrics_info(handle)["average_gfx_activity"] != "N/A"


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
