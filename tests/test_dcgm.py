"""The DCGM source over the fake DCGM: start-up, field mapping, blanks, lost GPUs, restarts, releases.

The fake (agent/virtual/fake_dcgm) has the real bindings' module names, calls and error classes;
its host engine plays a twin of a virtual A100 node, and a second twin gives the expected values.
"""

from __future__ import annotations

import pytest

from agent.backends.base import BackendUnavailable, DeviceLostError
from agent.backends.dcgm import load_bindings
from agent.backends.dcgm.fields import FIELDS
from agent.backends.dcgm.source import BACKOFF_S
from agent.virtual.fake_dcgm import BINDINGS_DIR, FakeDcgmLibrary, install
from tests.dcgm_rig import DcgmRig


@pytest.fixture
def rig():
    return DcgmRig()


def expected(rig: DcgmRig, gpu: str, t: float) -> dict[str, float | None]:
    s = rig.reference.sample(gpu, t)
    return {name: getattr(s, name) for name in FIELDS.values()}


def test_values_appear_one_update_after_the_watch_and_map_onto_the_sample_fields(rig):
    source = rig.source()
    first = source.read(rig.uuid("0"), rig.clock())
    assert "first profiling update" in first.reason and not any(first.values.values())
    t = rig.step(1.0)
    for gpu in ("0", "1"):
        read = source.read(rig.uuid(gpu), t)
        want = expected(rig, gpu, t)
        assert read.reason is None and not read.paused
        assert read.values["sm_active"] == pytest.approx(want["sm_active"])
        assert read.values["tensor_active"] == pytest.approx(want["tensor_active"])
        assert read.values["dram_active"] == pytest.approx(want["dram_active"])
        assert read.values["pcie_rx_bytes_per_s"] == pytest.approx(round(want["pcie_rx_bytes_per_s"]), abs=1)
    # the compute GPU and the decode GPU differ the way their workloads do
    train, decode = (source.read(rig.uuid(g), t).values for g in ("0", "1"))
    assert train["tensor_active"] > decode["tensor_active"] and decode["dram_active"] > train["dram_active"]


def test_watch_uses_the_agents_interval_in_microseconds_never_under_100_ms(rig):
    assert rig.source(interval_s=2.0).update_us == 2_000_000
    assert rig.source(interval_s=0.05).update_us == 100_000
    assert rig.engine.watches[0].period_s == pytest.approx(0.1)


def test_paused_profiling_reads_blank_values_as_unknown_never_zero_and_says_so(rig):
    source = rig.source()
    rig.modules.agent.dcgmProfPause(source.handle)  # what `dcgmi profile --pause` does
    t = rig.step(1.0)
    read = source.read(rig.uuid("0"), t)
    assert read.paused and all(v is None for v in read.values.values())
    assert "dcgmi profile --pause" in read.reason and "Nsight" in read.reason
    rig.modules.agent.dcgmProfResume(source.handle)
    t = rig.step(1.0)
    back = source.read(rig.uuid("0"), t)
    assert not back.paused and back.values["sm_active"] is not None and back.values["sm_active"] > 0


def test_a_lost_gpu_raises_device_lost_while_the_other_keeps_reporting(rig):
    source = rig.source()
    rig.engine.twin.inject_fault(1, "lost", 30.0, start_s=rig.step(1.0) - rig.engine.twin.start_time - 0.5)
    t = rig.clock()
    with pytest.raises(DeviceLostError, match="GPU 1 .*GPU is unreachable|GPU 1 .*DCGM_ST -18"):
        source.read(rig.uuid("1"), t)
    assert source.read(rig.uuid("0"), t).values["sm_active"] is not None


def test_host_engine_restart_is_survived_by_reconnecting_with_back_off(rig):
    source = rig.source()
    t = rig.step(1.0)
    assert source.read(rig.uuid("0"), t).values["sm_active"] is not None
    rig.engine.stop()
    lost = source.read(rig.uuid("0"), t)
    assert "connection to the host engine is lost" in lost.reason and lost.values == {}
    connects = rig.lib.connect_attempts
    assert "retrying" in source.read(rig.uuid("0"), t).reason
    assert rig.lib.connect_attempts == connects  # within the back-off: no new attempt
    rig.step(BACKOFF_S[0])
    source.read(rig.uuid("0"), rig.clock())  # engine still down: one refused attempt, longer wait
    assert rig.lib.connect_attempts == connects + 1 and source._retry_at - rig.clock() == BACKOFF_S[1]
    rig.engine.restart()  # the new nv-hostengine knows none of the old groups or watches
    rig.step(BACKOFF_S[1])
    again = source.read(rig.uuid("0"), rig.clock())
    assert source.reconnects == 1 and "first profiling update" in again.reason
    assert rig.engine.watches and rig.engine.groups  # re-created on the new engine
    assert source.read(rig.uuid("0"), rig.step(1.0)).values["sm_active"] is not None


def test_missing_bindings_name_the_directories_and_the_package_to_install(tmp_path):
    with pytest.raises(BackendUnavailable) as err:
        load_bindings([str(tmp_path / "nope"), "/usr/local/dcgm/bindings/python3-absent"])
    text = str(err.value)
    assert str(tmp_path / "nope") in text and "datacenter-gpu-manager-4-core" in text and "dcgm_bindings_path" in text


def test_bindings_without_their_library_say_which_soname_is_missing(rig):
    install(rig.modules.structs, FakeDcgmLibrary(rig.engine))
    rig.modules.structs.dcgmLib = None
    with pytest.raises(BackendUnavailable, match=r"no libdcgm\.so\.4"):
        rig.source()


def test_dcgm_3_library_under_dcgm_4_bindings_is_not_found_and_under_its_own_works(monkeypatch):
    rig = DcgmRig(version="3.3.9")
    with pytest.raises(BackendUnavailable, match=r"libdcgm\.so\.4"):
        rig.source()
    monkeypatch.setattr(rig.modules.structs, "DCGM_MAJOR_VERSION", 3)  # the DCGM 3 bindings look for .so.3
    install(rig.modules.structs, rig.lib)
    source = rig.source()  # dcgmConnect_v2 exists in 3.x and 4.x
    assert source.read(rig.uuid("0"), rig.step(1.0)).values["sm_active"] is not None
    params = rig.modules.structs.c_dcgmConnectV2Params_v2()
    with pytest.raises(rig.modules.structs.dcgmExceptionClass(rig.modules.structs.DCGM_ST_FUNCTION_NOT_FOUND)):
        rig.modules.agent.dcgmConnect_v3("tcp://localhost", params)  # DCGM 4.5+ only


def test_no_host_engine_is_one_line_naming_the_address_and_the_fix(rig):
    with pytest.raises(BackendUnavailable) as err:
        rig.source(host="localhost:5556")
    assert "localhost:5556" in str(err.value) and "nv-hostengine" in str(err.value)
    embedded = rig.source(host="embedded")  # DCGM inside the agent needs no host engine
    assert embedded.read(rig.uuid("0"), rig.step(1.0)).values["sm_active"] is not None


def test_a_non_root_host_engine_refuses_profiling_watches_before_hopper():
    rig = DcgmRig(root=False)
    source = rig.source()
    read = source.read(rig.uuid("0"), rig.step(1.0))
    assert all(v is None for v in read.values.values())
    assert "root" in read.reason and "DCGM_ST -29" in read.reason


def test_a_gpu_dcgm_cannot_profile_is_left_out_and_the_others_are_watched():
    rig = DcgmRig(unsupported=("1",))
    source = rig.source()
    assert source.gpus[rig.uuid("1")].fields == ()
    assert "DCGM_ST -36" in source.gpus[rig.uuid("1")].absent["profiling"]
    t = rig.step(1.0)
    assert source.read(rig.uuid("0"), t).values["sm_active"] is not None
    assert "profiling" in source.read(rig.uuid("1"), t).reason


def test_the_fake_bindings_keep_the_real_names_errors_and_sentinels(rig):
    structs, fields, value = rig.modules.structs, rig.modules.fields, rig.modules.value
    err = structs.DCGMError(structs.DCGM_ST_CONNECTION_NOT_VALID)
    assert type(err).__name__ == "DCGMError_ConnectionNotValid" and err.value == -21
    assert isinstance(err, structs.dcgmExceptionClass(-21)) and "host engine" in str(err)
    assert structs.dcgmExceptionClass(-48).__name__ == "DCGMError_3rdPartyLibraryError"
    with pytest.warns(DeprecationWarning, match="DCGM_FI_PROF_SM_UTIL_RATIO"):
        assert fields.DCGM_FI_PROF_SM_ACTIVE == 1002  # 4.6 renamed it; the old name is an alias
    assert value.DCGM_FP64_IS_BLANK(value.DCGM_FP64_NOT_SUPPORTED) and not value.DCGM_FP64_IS_BLANK(0.0)
    assert structs.c_dcgmConnectV2Params_version2 == structs.make_dcgm_version(structs.c_dcgmConnectV2Params_v2, 2)
    assert structs.c_dcgmConnectV2Params_version2 >> 24 == 2


def test_bindings_are_reloaded_from_another_directory(tmp_path):
    again = load_bindings([str(BINDINGS_DIR)])
    assert again.path == BINDINGS_DIR and again.agent.__file__.startswith(str(BINDINGS_DIR))
    broken = tmp_path / "bindings"
    broken.mkdir()
    for name in ("dcgmvalue", "dcgm_fields", "dcgm_agent"):
        (broken / f"{name}.py").write_text((BINDINGS_DIR / f"{name}.py").read_text())
    (broken / "dcgm_structs.py").write_text("raise RuntimeError('half-installed')\n")
    with pytest.raises(BackendUnavailable, match="do not import .*half-installed"):
        load_bindings([str(broken)])
