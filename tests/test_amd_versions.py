"""The amdsmi version matrix: each released package over a fake libamd_smi that plays that release.

The backend tests of test_amd_backend.py run over every release; this file checks the matrix itself
(the fake offers that release's C symbols and structures, not the newest one's) and what the
backend and ``doctor`` make of a release's gaps: an optional function missing is unknown plus a
finding, never a crash; a required one is one clear line.
"""

from __future__ import annotations

import pytest

from agent.backends.amd import AmdBackend
from agent.backends.base import BackendUnavailable
from agent.backends.nvml_virtual import SimulatedHost
from agent.backends.virtual import VirtualBackend
from agent.diagnostics.amd import amd_findings
from agent.virtual.fake_amdsmi import FakeAmdSmiLibrary, load_amdsmi
from tests.amd_backend_rig import CPX, scenario
from tests.amd_backend_rig import rig  # noqa: F401 (a fixture)
from tests.amdsmi_releases import NEWEST, OLDEST, package, release, version_of  # noqa: F401 (release: a fixture)
from tests.wheels import AMDSMI

ADDED = {
    # C symbol the backend or the fake's tests touch: the first release whose libamd_smi has it
    "amdsmi_get_gpu_kfd_info": (6, 3), "amdsmi_get_violation_status": (6, 3),
    "amdsmi_get_gpu_xgmi_link_status": (6, 4), "amdsmi_get_gpu_enumeration_info": (6, 4),
    "amdsmi_get_gpu_xcd_counter": (6, 4),
}
ONLY = {"amdsmi_get_power_info_v2": ((6, 4), (6, 4))}
"""Symbols that came and went: 6.4's power_info_v2, removed again in 7.0."""
LIB_VERSIONS = {(6, 2): "24.6.3.0", (6, 3): "24.7.1.0", (6, 4): "25.3.0", (7, 0): "26.0.2"}
"""libamd_smi's version as the backend prints it (with the year the struct had until 6.3)."""


def test_the_matrix_is_every_line_we_declare_oldest_first():
    assert [version_of(v) for v in AMDSMI] == sorted(version_of(v) for v in AMDSMI)
    assert version_of(OLDEST) == (6, 2) and version_of(NEWEST) == (7, 0)


def test_the_fake_exports_the_c_symbols_of_that_release_and_no_others(release):
    lib = FakeAmdSmiLibrary(VirtualBackend("mi300x"))
    smi = load_amdsmi(lib, package(release))
    version = version_of(release)
    assert lib.release.version is not None and lib.release.version[:2] == version
    bound = lib.release.symbols
    assert bound and set(lib.symbols) <= bound  # nothing beyond what this release's wrapper binds
    for symbol, since in ADDED.items():
        if version >= since:
            assert symbol in lib.symbols and callable(getattr(lib, symbol))
        else:
            assert symbol not in bound
            with pytest.raises(AttributeError, match=f"undefined symbol: {symbol}"):
                getattr(lib, symbol)
    for symbol, (first, last) in ONLY.items():
        assert (symbol in lib.symbols) == (first <= version <= last)
    smi.amdsmi_init()
    handle = smi.amdsmi_get_processor_handles()[0]
    power = smi.amdsmi_get_power_info(handle)  # 6.4's package calls the C power_info_v2
    assert power["current_socket_power"] > 0 and ("socket_power" in power) == (version >= (7, 0))
    with pytest.raises(ValueError, match="already plays"):
        load_amdsmi(lib, package(NEWEST if release != NEWEST else OLDEST))  # one .so is one release


def test_the_library_reports_its_releases_version(rig, release):
    r = rig(package=package(release))
    assert r.backend.library_version == LIB_VERSIONS[version_of(release)]
    assert r.backend.bindings.package == release
    assert (r.backend.rocm_version is None) and r.backend.driver_version == "6.12.12"  # no librocm-core here


def test_a_scenarios_own_rocm_version_wins_over_the_package_release():
    lib = FakeAmdSmiLibrary(VirtualBackend(scenario(amd={"rocm_version": "6.4.1"})))
    smi = load_amdsmi(lib, package(NEWEST))
    version = smi.amdsmi_get_lib_version()
    assert (version["major"], version["minor"], version["release"]) == (25, 3, 0)


def test_the_metrics_table_is_that_releases_structure(release):
    lib = FakeAmdSmiLibrary(VirtualBackend("mi300x"))
    smi = load_amdsmi(lib, package(release))
    smi.amdsmi_init()
    table = smi.amdsmi_get_gpu_metrics_info(smi.amdsmi_get_processor_handles()[0])
    accumulators = {"accumulation_counter", "ppt_residency_acc", "num_partition", "xcp_stats.gfx_busy_inst"}
    if version_of(release) < (6, 3):  # amdsmi_gpu_metrics_t of 6.2: no gpu_metrics 1.6 fields
        assert not accumulators & set(table)
    else:
        assert accumulators <= set(table) and table["num_partition"] == 1
    assert ("xgmi_link_status" in table) == (version_of(release) >= (6, 4))
    assert 0 < table["average_gfx_activity"] <= 100 and table["current_socket_power"] > 0  # filled where it exists


def test_doctor_names_what_a_release_cannot_tell(rig, release):
    r = rig(scenario(**CPX), package(release))
    findings, gpus = amd_findings(r.backend)
    assert gpus == 8
    by_check = {(f.check, f.gpu): f for f in findings}
    pkg = by_check[("amdsmi package", None)]
    assert release in pkg.detail
    if version_of(release) < (6, 3):
        assert pkg.status == "info" and "no amdsmi_get_gpu_kfd_info: partition ids" in pkg.detail
        activity = by_check[("gr_active", "0/3")]
        assert activity.status == "fail" and "per-partition activity" in activity.detail and "6.3" in activity.detail
        assert "accumulators" in by_check[("clock_event_reasons", "0/0")].detail
    else:
        assert ("gr_active", "0/3") not in by_check and ("clock_event_reasons", "0/0") not in by_check
    if version_of(release) >= (6, 4):
        assert pkg.status == "ok" and "every function roofwatch uses is present" in pkg.detail


def test_a_missing_optional_function_is_unknown_and_reported_not_a_crash(rig):
    """A package without the process list or the KFD call (a future or trimmed release) still
    discovers every GPU; what those calls gave is unknown, and doctor says why."""
    lib = FakeAmdSmiLibrary(VirtualBackend(scenario(**CPX)))
    smi = load_amdsmi(lib, package(NEWEST))
    del smi.amdsmi_get_gpu_process_list, smi.amdsmi_get_gpu_kfd_info
    backend = AmdBackend(smi, host=SimulatedHost(lib))
    try:
        devices = {d.gpu: d for d in backend.discover()}
        assert sorted(devices) == [f"0/{p}" for p in range(8)]  # partition ids from the PCI function
        assert "processes" not in devices["0/0"].capabilities
        assert "has no amdsmi_get_gpu_process_list" in backend.devices["0/0"].absent["processes"]
        findings, _ = amd_findings(backend)
        pkg = next(f for f in findings if f.check == "amdsmi package")
        assert "no amdsmi_get_gpu_process_list: processes are unknown" in pkg.detail
    finally:
        backend.close()
        lib.close()


def test_a_missing_required_function_is_one_clear_line():
    lib = FakeAmdSmiLibrary(VirtualBackend("mi300x"))
    smi = load_amdsmi(lib, package(NEWEST))
    del smi.amdsmi_get_gpu_memory_usage
    with pytest.raises(BackendUnavailable, match="lacks amdsmi_get_gpu_memory_usage.*6.2 or newer"):
        AmdBackend(smi, host=SimulatedHost(lib))
