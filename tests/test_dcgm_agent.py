"""DCGM joined into NVML: an A100-class virtual GPU gets SM, tensor and DRAM activity; doctor; a real agent process.

NVML runs over the fake libnvidia-ml (no GPM on Ampere), DCGM over the fake bindings and host
engine of the same virtual node (agent/virtual/fake_dcgm), joined by UUID.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from agent.app.config import load_settings
from agent.backends.base import BackendUnavailable
from agent.backends.dcgm import dcgm_join
from agent.backends.dcgm_virtual import virtual_loader
from agent.backends.nvml_virtual import VirtualNvmlBackend
from agent.backends.profiling import ProfilingJoin, merge_profiling
from agent.backends.registry import open_backend
from agent.backends.virtual import VirtualBackend
from agent.diagnostics.dcgm import dcgm_findings
from agent.model import GpuSample
from agent.virtual.fake_dcgm import BINDINGS_DIR
from agent.virtual.fake_dcgm.engine import full_counters_twin
from tests.agent_process import AgentProcess, clean_env, gauge_values, http_get, poll, roofwatch_cmd
from tests.fake_nvml_rig import START, scenario
from tests.nvml_harness import ManualClock

A100 = "a100-sxm-80gb"


def joined(model: str = A100, *, mode: str = "on", host: str = "localhost:5555", **engine):
    clock = ManualClock()
    virtual = VirtualBackend(scenario(model, 2), clock=clock, start_time=START)
    nvml = VirtualNvmlBackend(virtual, wall=clock, clock=clock, sleep=lambda s: setattr(clock, "t", clock.t + s))
    backend = dcgm_join(nvml, mode=mode, host=host, paths=[str(BINDINGS_DIR)], interval_s=1.0,
                        load=virtual_loader(virtual, **engine))
    return backend, clock, virtual


def test_merge_fills_unknown_fields_replaces_only_named_ones_and_never_erases():
    s = GpuSample(ts=1.0, gpu="0", gr_active=0.9, sm_active=None, pcie_tx_bytes_per_s=5.0)
    out = merge_profiling(s, {"gr_active": 0.4, "sm_active": 0.3, "pcie_tx_bytes_per_s": 7.0, "tensor_active": None,
                              "power_w": 1.0})
    assert (out.gr_active, out.sm_active, out.pcie_tx_bytes_per_s, out.power_w) == (0.9, 0.3, 5.0, None)
    assert merge_profiling(s, {"gr_active": 0.4}, replace={"gr_active"}).gr_active == 0.4
    assert merge_profiling(s, {"gr_active": None}, replace={"gr_active"}).gr_active == 0.9


def test_an_a100_gets_its_sm_tensor_and_dram_activity_from_dcgm():
    backend, clock, virtual = joined()
    try:
        devices = backend.discover()
        assert isinstance(backend, ProfilingJoin) and set(backend.joined) == {"0", "1"}
        reference = full_counters_twin(VirtualBackend(virtual.engine.scenario, clock=clock, start_time=START))
        clock.t += 1.0
        t = clock.t
        want = {g: reference.sample(g, t) for g in ("0", "1")}
        samples = {d.gpu: backend.sample(d.gpu, t) for d in devices}
        for gpu, s in samples.items():
            assert s.sm_active == pytest.approx(want[gpu].sm_active)
            assert s.tensor_active == pytest.approx(want[gpu].tensor_active)
            assert s.dram_active == pytest.approx(want[gpu].dram_active)
            assert s.gr_active == pytest.approx(want[gpu].gr_active)  # DCGM's engine activity, not utilization.gpu
            assert s.power_w is not None and s.uuid == backend.joined[gpu]  # NVML's own readings stay
        assert backend.devices  # the NVML backend's attributes are reachable through the join (doctor uses them)
    finally:
        backend.close()


def test_a_gpu_dcgm_loses_keeps_its_nvml_sample_and_the_other_gpu_keeps_its_profiling():
    backend, clock, virtual = joined()
    try:
        backend.discover()
        engine = backend.source.m.structs.dcgmLib.engine
        engine.twin.inject_fault(1, "lost", 30.0, start_s=clock.t + 0.5 - engine.twin.start_time)
        clock.t += 1.0
        lost, fine = backend.sample("1", clock.t), backend.sample("0", clock.t)
        assert lost.sm_active is None and lost.power_w is not None
        assert "GPU is unreachable" in backend.last["1"].reason or "-18" in backend.last["1"].reason
        assert fine.sm_active is not None
    finally:
        backend.close()


def test_hopper_gpus_need_no_dcgm_and_doctor_says_so():
    backend, _, _ = joined("h100-sxm")
    try:
        backend.discover()
        assert backend.source is None and "GPM" in backend.unavailable
        (finding,) = dcgm_findings(backend, load_settings(dcgm="on"))
        assert finding.status == "ok" and "not needed" in finding.detail
    finally:
        backend.close()


@pytest.mark.slow
def test_dcgm_on_without_a_host_engine_is_fatal_and_auto_carries_on_with_nvml():
    backend, _, _ = joined(host="localhost:5599")
    with pytest.raises(BackendUnavailable, match="no host engine answers at localhost:5599"):
        backend.discover()
    backend, clock, _ = joined(mode="auto", host="localhost:5599")
    try:
        backend.discover()
        assert backend.source is None and "localhost:5599" in backend.unavailable
        (state,) = backend.source_states(clock.t)
        assert (state.name, state.state) == ("dcgm", "down") and "localhost:5599" in state.detail
        clock.t += 1.0
        assert backend.sample("0", clock.t).sm_active is None  # NVML alone, as before
        (finding,) = dcgm_findings(backend, load_settings(dcgm="auto"))
        assert finding.status == "warn" and "nv-hostengine" in finding.detail
    finally:
        backend.close()


def test_doctor_lists_each_gpus_fields_and_says_how_to_resume_paused_profiling():
    backend, clock, _ = joined()
    try:
        backend.discover()
        advance = lambda s: setattr(clock, "t", clock.t + s)  # noqa: E731
        findings = dcgm_findings(backend, load_settings(dcgm="on"), sleep=advance)
        per_gpu = {f.gpu: f for f in findings if f.gpu is not None}
        assert per_gpu["0"].status == "ok" and "SM_UTIL_RATIO" in per_gpu["0"].detail, "DCGM 4.6 names its fields so"
        assert [(s.name, s.state) for s in backend.source_states(clock.t)] == [("dcgm", "up")]
        backend.source.version = "version:4.5.2;arch:x86_64"  # an older host engine: the names it uses
        older = {f.gpu: f for f in dcgm_findings(backend, load_settings(dcgm="on"), sleep=advance) if f.gpu}
        assert "SM_ACTIVE" in older["0"].detail and "SM_UTIL_RATIO" not in older["0"].detail
        backend.source.m.structs.dcgmLib.engine.paused = True  # `dcgmi profile --pause`
        advance(1.0)
        paused = [f for f in dcgm_findings(backend, load_settings(dcgm="on"), sleep=advance) if f.gpu == "0"]
        assert paused[0].status == "warn" and "dcgmi profile --resume" in paused[0].fix
    finally:
        backend.close()


def test_a_non_root_host_engine_gets_a_doctor_fix():
    backend, clock, _ = joined(root=False)
    try:
        backend.discover()
        findings = dcgm_findings(backend, load_settings(dcgm="on"), sleep=lambda s: None)
        warn = [f for f in findings if f.gpu == "0"][0]
        assert warn.status == "warn" and "root" in warn.detail and "nv-hostengine as root" in warn.fix
    finally:
        backend.close()


@pytest.fixture
def a100_scenario(tmp_path) -> Path:
    path = tmp_path / "a100.yaml"
    path.write_text(yaml.safe_dump({"name": "pre-hopper", "seed": 5, "nodes": [{
        "name": "a100-node", "model": A100, "gpus": 2, "workloads": [
            {"job": "train", "gpus": [0, 1], "phases": [{"kind": "compute", "mfu": 0.5, "duration_s": 3600}]}]}]}))
    return path


@pytest.mark.slow
def test_the_agent_process_reads_dcgm_through_the_bindings_on_its_path(a100_scenario):
    env = clean_env(ROOFWATCH_DCGM="on", ROOFWATCH_DCGM_BINDINGS_PATH=json.dumps([str(BINDINGS_DIR)]))
    agent = AgentProcess("demo", "--listen", "127.0.0.1:0", "--backend", "nvml-virtual", "--scenario",
                         str(a100_scenario), "--interval", "0.5", env=env)
    try:
        def sm_active():
            status, body = http_get(agent.url + "metrics")
            values = gauge_values(body.decode(), "roofwatch_gpu_sm_active_ratio")
            return values if status == 200 and set(values) == {"0", "1"} else None

        values = poll(sm_active, timeout=30, what="SM activity of both A100s from DCGM")
        assert all(0.0 < v <= 1.0 for v in values.values())
    finally:
        agent.stop()
    doctor = subprocess.run(roofwatch_cmd("doctor", "--backend", "nvml-virtual", "--scenario", str(a100_scenario),
                                          "--json"), capture_output=True, text=True, env=env, timeout=60)
    report = json.loads(doctor.stdout)
    dcgm = [f for f in report["findings"] if f["check"] == "dcgm"]
    assert any(f["status"] == "ok" and "SM_UTIL_RATIO" in f["detail"] for f in dcgm), dcgm


@pytest.mark.slow
def test_the_agent_process_names_the_package_when_the_bindings_are_missing(a100_scenario, tmp_path):
    env = clean_env(ROOFWATCH_DCGM="on", ROOFWATCH_DCGM_BINDINGS_PATH=json.dumps([str(tmp_path / "none")]))
    run = subprocess.run(roofwatch_cmd("demo", "--listen", "127.0.0.1:0", "--backend", "nvml-virtual", "--scenario",
                                       str(a100_scenario)), capture_output=True, text=True, env=env, timeout=60)
    assert run.returncode != 0
    assert "datacenter-gpu-manager-4-core" in run.stderr and str(tmp_path / "none") in run.stderr
    assert "Traceback" not in run.stderr
