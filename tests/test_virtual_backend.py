"""Tests for the virtual backend: discovery, interval bookkeeping, threads, and injected faults."""

from __future__ import annotations

import dataclasses

import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from agent.backends.base import Backend, BackendUnavailable, DeviceError, DeviceLostError
from agent.model import GpuSample
from agent.virtual.engine import VirtualEngine
from agent.virtual.scenario import ScenarioError, builtin_scenario, parse_scenario
from agent.backends.virtual import VirtualBackend
from tests.agent_process import poll

MIB = 1024**2


class FakeClock:
    """A wall clock the test moves by hand."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def faulty_backend(*faults: dict[str, Any], clock: FakeClock | None = None) -> tuple[VirtualBackend, FakeClock]:
    clock = clock or FakeClock()
    scenario = parse_scenario({"name": "f", "seed": 3, "nodes": [{
        "name": "n", "model": "h100-sxm", "gpus": 4,
        "workloads": [{"job": "j", "gpus": [0, 1, 2, 3], "phases": [{"kind": "compute", "duration_s": 60, "mfu": 0.5}]}],
        "faults": list(faults)}]})
    return VirtualBackend(scenario, clock=clock), clock


# ----------------------------------------------------------------------------- discovery


def test_discover_looks_like_an_hgx_h100_node() -> None:
    backend = VirtualBackend("demo")
    assert isinstance(backend, Backend) and backend.name == "virtual" and backend.node == "demo-node"
    devices = backend.discover()
    assert [d.gpu for d in devices] == [str(i) for i in range(8)]
    first = devices[0]
    assert first.vendor == "nvidia" and first.model == "NVIDIA H100 80GB HBM3"
    assert first.memory_total_bytes == 81559 * MIB
    assert first.link_count == 18 and first.sm_count == 132 and first.sm_clock_max_mhz == 1980
    assert first.pci_device_id in first.spec.pci_device_ids and first.spec.key == "h100-sxm"
    assert first.pci_bus_id == "00000000:18:00.0"
    assert "gpm" in first.capabilities and "nvlink" in first.capabilities
    uuids = [d.uuid for d in devices]
    assert len(set(uuids)) == 8
    assert all(re.fullmatch(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", u) for u in uuids)
    assert [d.uuid for d in VirtualBackend("demo").discover()] == uuids


def test_node_selection() -> None:
    engine = VirtualEngine(builtin_scenario("cluster"))
    assert VirtualBackend(engine).node == "node-h100"
    h200 = VirtualBackend(engine, node="node-h200")
    assert {d.model for d in h200.discover()} == {"NVIDIA H200"}
    with pytest.raises(BackendUnavailable, match="node-h100, node-h200"):
        VirtualBackend(engine, node="node-x")


def test_accepts_scenario_objects_names_and_paths(tmp_path: Path) -> None:
    assert VirtualBackend(builtin_scenario("mi300x")).discover()[0].model == "AMD Instinct MI300X"
    path = tmp_path / "s.yaml"
    path.write_text("name: s\nnodes: [{name: a, model: a100-sxm-80gb, gpus: 2}]\n", encoding="utf-8")
    devices = VirtualBackend(str(path)).discover()
    assert [d.model for d in devices] == ["NVIDIA A100-SXM4-80GB"] * 2
    with pytest.raises(ScenarioError, match="cannot read"):
        VirtualBackend(str(tmp_path / "missing.yaml"))


# ----------------------------------------------------------------------------- sampling


def test_sample_intervals_follow_calls() -> None:
    clock = FakeClock()
    backend = VirtualBackend("demo", clock=clock, start_time=clock.now - 10.0, interval_s=0.5)
    first = backend.sample("0", clock.now)
    assert first.ts == clock.now and first.interval_s == 0.5 and first.gpu == "0" and first.node == "demo-node"
    second = backend.sample("0", clock.now + 2.0)
    assert second.interval_s == pytest.approx(2.0) and second.ts == clock.now + 2.0
    assert second.energy_j > first.energy_j
    other_gpu = backend.sample("1", clock.now + 2.0)
    assert other_gpu.interval_s == 0.5  # per-GPU bookkeeping
    same = backend.sample("0", clock.now + 2.0)  # no time passed: fall back to the nominal interval
    assert same.interval_s == 0.5


def test_sample_matches_engine_in_virtual_time() -> None:
    clock = FakeClock()
    backend = VirtualBackend("demo", clock=clock, start_time=clock.now)
    engine = VirtualEngine(builtin_scenario("demo"))
    for k in range(1, 6):
        got = backend.sample("3", clock.now + k)
        want = engine.sample("demo-node", 3, k - 1.0, float(k), ts=clock.now + k)
        assert got == want


def test_unknown_gpu_is_a_device_error() -> None:
    backend = VirtualBackend("demo")
    with pytest.raises(DeviceError, match="no GPU '9'"):
        backend.sample("9", time.time())


def test_concurrent_sampling_of_different_gpus_is_deterministic() -> None:
    clock = FakeClock()
    start = clock.now

    def run(backend: VirtualBackend, gpu: str) -> list[GpuSample]:
        return [backend.sample(gpu, start + 0.5 * k) for k in range(1, 41)]

    sequential = VirtualBackend("demo", clock=clock, start_time=start)
    expected = {str(g): run(sequential, str(g)) for g in range(8)}
    threaded = VirtualBackend("demo", clock=clock, start_time=start)
    with ThreadPoolExecutor(max_workers=8) as pool:
        futures = {str(g): pool.submit(run, threaded, str(g)) for g in range(8)}
        got = {g: f.result(timeout=30) for g, f in futures.items()}
    assert got == expected


# ----------------------------------------------------------------------------- faults


def test_scenario_error_fault_window_then_recovery() -> None:
    backend, clock = faulty_backend({"gpu": 1, "kind": "error", "start_s": 3, "duration_s": 5})
    t0 = backend.start_time
    good = backend.sample("1", t0 + 2.0)
    with pytest.raises(DeviceError, match="virtual fault") as info:
        backend.sample("1", t0 + 4.0)
    assert not isinstance(info.value, DeviceLostError)
    assert backend.sample("0", t0 + 4.0).gpu == "0"  # other GPUs unaffected
    recovered = backend.sample("1", t0 + 8.5)
    assert recovered.interval_s == pytest.approx(6.5)  # spans the failed interval, like GPM would
    assert recovered.energy_j > good.energy_j


def test_lost_device_raises_lost_and_restarts_its_sample_pair() -> None:
    backend, clock = faulty_backend({"gpu": 2, "kind": "lost", "start_s": 1, "duration_s": 2})
    t0 = backend.start_time
    backend.sample("2", t0 + 0.5)
    with pytest.raises(DeviceLostError, match="virtual fault"):
        backend.sample("2", t0 + 1.5)
    with pytest.raises(DeviceLostError):
        backend.sample("2", t0 + 2.9)
    back = backend.sample("2", t0 + 3.0)
    assert back.interval_s == pytest.approx(1.0)


def test_hang_is_released_by_close() -> None:
    backend, clock = faulty_backend({"gpu": 0, "kind": "hang", "start_s": 0, "duration_s": 100, "hang_s": 60})
    outcome: list[BaseException] = []

    def call() -> None:
        try:
            backend.sample("0", clock.now + 1.0)
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            outcome.append(exc)

    worker = threading.Thread(target=call, daemon=True)
    worker.start()
    poll(lambda: backend.hung_calls == 1, timeout=5.0, what='the hang to start')
    assert worker.is_alive()
    backend.close()
    worker.join(timeout=5.0)
    assert not worker.is_alive() and backend.hung_calls == 0
    assert len(outcome) == 1 and isinstance(outcome[0], DeviceError)
    assert "released by close()" in str(outcome[0])
    with pytest.raises(DeviceError, match="closed"):
        backend.sample("1", clock.now + 2.0)


def test_hang_gives_up_after_hang_s() -> None:
    backend, clock = faulty_backend({"gpu": 0, "kind": "hang", "start_s": 0, "duration_s": 100, "hang_s": 0.01})
    with pytest.raises(DeviceError, match="gave up after 0.01s"):
        backend.sample("0", clock.now + 1.0)
    assert backend.hung_calls == 0


def test_injected_faults_start_now_and_end() -> None:
    backend, clock = faulty_backend()
    backend.sample("3", clock.now + 1.0)
    clock.now += 10.0
    window = backend.inject_fault(3, "lost", duration_s=2.0)
    assert window.start_s == pytest.approx(10.0) and window.source == "injected"
    with pytest.raises(DeviceLostError, match="injected"):
        backend.sample("3", clock.now + 0.5)
    assert backend.sample("2", clock.now + 0.5).gpu == "2"
    assert backend.sample("3", clock.now + 2.5).gpu == "3"
    backend.inject_fault("3", "error", duration_s=100.0, start_s=20.0)
    with pytest.raises(DeviceError):
        backend.sample("3", clock.now + 11.0)
    backend.clear_faults()
    assert backend.sample("3", clock.now + 12.0).gpu == "3"
    with pytest.raises(ValueError, match="kind"):
        backend.inject_fault(0, "melt", duration_s=1.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no GPU"):
        backend.inject_fault(7, "error", duration_s=1.0)


def test_fault_on_missing_gpu_is_rejected_by_the_scenario() -> None:
    with pytest.raises(ScenarioError, match=r"nodes\.0\.faults\.0\.gpu: GPU 9 does not exist"):
        faulty_backend({"gpu": 9, "kind": "error", "start_s": 0, "duration_s": 1})


# ----------------------------------------------------------------------------- MIG instances


def mig_backend(*faults: dict[str, Any]) -> tuple[VirtualBackend, FakeClock]:
    clock = FakeClock()
    scenario = parse_scenario({"name": "m", "seed": 5, "nodes": [{
        "name": "n", "model": "h100-sxm", "gpus": 2, "mig": {0: ["3g.40gb", "4g.40gb"]},
        "workloads": [{"job": "j", "gpus": ["0/1", "0/2", 1],
                       "phases": [{"kind": "compute", "duration_s": 60, "mfu": 0.5}]}],
        "faults": list(faults)}]})
    return VirtualBackend(scenario, clock=clock, start_time=clock.now), clock


def test_discovers_and_samples_mig_instances() -> None:
    backend, clock = mig_backend()
    devices = backend.discover()
    assert [d.gpu for d in devices] == ["0/1", "0/2", "1"]
    assert devices[0].model == "NVIDIA H100 80GB HBM3 MIG 3g.40gb" and devices[0].uuid.startswith("MIG-")
    engine = VirtualEngine(backend.engine.scenario)
    for k in range(1, 4):
        got = backend.sample("0/2", clock.now + k)
        # As NVML: no energy of its own, its board's counter beside (tests/test_mig_energy.py holds its value).
        assert got.energy_j is None and got.parent_energy_j is not None
        assert dataclasses.replace(got, parent_energy_j=None) == engine.sample("n", "0/2", k - 1.0, float(k),
                                                                              ts=clock.now + k)
        assert got.gpu == "0/2" and got.power_w is None and got.tensor_active is not None
    with pytest.raises(DeviceError, match="no GPU '0'"):
        backend.sample("0", clock.now + 1.0)


def test_fault_on_a_mig_gpu_hits_all_its_instances() -> None:
    backend, clock = mig_backend({"gpu": 0, "kind": "error", "start_s": 2, "duration_s": 2},
                                 {"gpu": "0/2", "kind": "lost", "start_s": 10, "duration_s": 2})
    t0 = backend.start_time
    for gpu in ("0/1", "0/2"):
        with pytest.raises(DeviceError, match=f"GPU {gpu} on n"):
            backend.sample(gpu, t0 + 3.0)
    assert backend.sample("1", t0 + 3.0).gpu == "1"
    assert backend.sample("0/1", t0 + 11.0).gpu == "0/1"  # only 0/2 is lost
    with pytest.raises(DeviceLostError):
        backend.sample("0/2", t0 + 11.0)


def test_inject_fault_accepts_instances() -> None:
    backend, clock = mig_backend()
    t0 = backend.start_time
    window = backend.inject_fault("0/1", "error", duration_s=5.0, start_s=0.0)
    assert window.gpu == "0/1"
    with pytest.raises(DeviceError, match="injected"):
        backend.sample("0/1", t0 + 1.0)
    assert backend.sample("0/2", t0 + 1.0).gpu == "0/2"
    backend.inject_fault(0, "error", duration_s=5.0, start_s=0.0)  # the whole GPU: both instances
    with pytest.raises(DeviceError, match="injected"):
        backend.sample("0/2", t0 + 2.0)
    for bad in ("0/3", 2, "1/1"):
        with pytest.raises(ValueError, match="no GPU"):
            backend.inject_fault(bad, "error", duration_s=1.0)
