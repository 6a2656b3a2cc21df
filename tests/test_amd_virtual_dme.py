"""The virtual AMD Device Metrics Exporter (agent.virtual.fake_dme): a scenario's ``amd: {device_metrics_exporter:
true}`` makes ``amd-virtual`` render DME's ``/metrics`` from the fake libamd_smi's own samples and join it, so the
demo's AMD GPUs are judged on the profiler's counters. The fast tests run in process; the slow one is
``roofwatch demo`` as a real process."""

from __future__ import annotations

import json
import time
from pathlib import Path

import psutil
import pytest

from agent.app.config import Settings
from agent.backends.amd_exporter.exposition import read_records
from agent.backends.amd_exporter.join import AmdExporterJoin
from agent.backends.options import BackendOptions
from agent.backends.registry import open_backend
from agent.virtual.fake_amdsmi.api_identity import board_serial
from agent.virtual.fake_dme import IN_PROCESS_URL, render
from tests.agent_process import AgentProcess, clean_env, http_get, poll

SCENARIO = """\
name: dme-demo
seed: 35
nodes:
  - name: dme-node
    model: mi300x
    gpus: 2
    amd: {{device_metrics_exporter: true, compute_partition: {mode}}}
    workloads:
      - {{job: gemm, gpus: [{gemm}], phases: [{{kind: compute, duration_s: 900, mfu: 0.45}}]}}
      - {{job: decode, gpus: [{decode}], phases: [{{kind: memory, duration_s: 900, mbu: 0.7}}]}}
"""


def scenario(tmp_path: Path, mode: str = "SPX") -> str:
    gemm, decode = ("0", "1") if mode == "SPX" else ('"0/1"', '"1/0"')
    path = tmp_path / f"dme-{mode}.yaml"
    path.write_text(SCENARIO.format(mode=mode, gemm=gemm, decode=decode))
    return str(path)


def sampled(backend, rounds: int = 3) -> float:
    infos = backend.discover()
    for _ in range(rounds):
        now = time.time()
        for info in infos:
            backend.sample(info.gpu, now)
        time.sleep(0.05)  # samples spaced in time, as the collector's cycles are (energy and rates need it)
    return time.time()


def test_without_the_scenario_key_amd_virtual_is_amdsmi_alone():
    backend = open_backend(BackendOptions.of(Settings(backend="amd-virtual")))
    try:
        assert not isinstance(backend, AmdExporterJoin) and getattr(backend, "dme", None) is None
    finally:
        backend.close()


def _listening_ports() -> set[int]:
    return {c.laddr.port for c in psutil.Process().net_connections(kind="inet") if c.status == psutil.CONN_LISTEN}


def test_the_virtual_exporter_speaks_dme_and_the_join_takes_the_simulations_counters(tmp_path):
    """Read in process: the demo used to open the exporter on a random loopback port beside the one chosen."""
    before = _listening_ports()
    backend = open_backend(BackendOptions.of(Settings(backend="amd-virtual", scenario=scenario(tmp_path))))
    try:
        assert isinstance(backend, AmdExporterJoin) and backend.reader.url == IN_PROCESS_URL
        assert _listening_ports() <= before, "no port is opened for the virtual exporter"
        sampled(backend)
        library = backend.inner.library
        records = read_records(render(library)).records
        assert sorted(records) == ["0", "1"]
        assert [records[g].serial for g in ("0", "1")] == [board_serial("dme-node", i) for i in (0, 1)]
        assert records["0"].model == "102-G30211-0C" and records["0"].values["gpu_package_power"] > 0
        assert backend.reader.read_once() is None
        now = time.time()
        joined = {g: backend.sample(g, now) for g in ("0", "1")}
        assert backend.matched_by() == "serial" and backend.unmatched() == []
        for gpu, sample in joined.items():
            truth = library.latest_sample(gpu)
            assert backend.counter_sources(gpu)["tensor_active"] == "amd-exporter"
            assert sample.tensor_active == pytest.approx(truth.tensor_active, abs=0.05), gpu
            assert sample.dram_active == pytest.approx(truth.dram_active, abs=0.05), gpu
        assert joined["0"].tensor_active > 0.3 > joined["1"].tensor_active, "the GEMM, not the decode, is on MFMA"
    finally:
        backend.close()
    assert not backend.inner.dme.serving


def test_cpx_partitions_are_listed_with_their_own_partition_ids_and_power_on_partition_0(tmp_path):
    backend = open_backend(BackendOptions.of(Settings(backend="amd-virtual", scenario=scenario(tmp_path, "CPX"))))
    try:
        sampled(backend)
        records = read_records(render(backend.inner.library)).records
        assert len(records) == 16 and records["1/5"].partition == 5 and records["1/5"].partition_type == "cpx"
        assert {k for k, r in records.items() if "gpu_package_power" in r.values} == {"0/0", "1/0"}
        assert records["0/3"].serial == records["0/0"].serial != records["1/0"].serial
        backend.reader.read_once()
        now = time.time()
        assert backend.sample("0/1", now).tensor_active > 0.3
        assert backend.matched_by() == "serial" and backend.unmatched() == []
    finally:
        backend.close()


@pytest.mark.slow
def test_demo_amd_virtual_with_the_virtual_exporter_judges_its_gpus_on_counters(tmp_path):
    agent = AgentProcess("demo", "--backend", "amd-virtual", "--scenario", scenario(tmp_path), "--listen",
                         "127.0.0.1:0", "--interval", "0.2",
                         env=clean_env(ROOFWATCH_AMD_EXPORTER_INTERVAL_S="0.2", ROOFWATCH_CLASSIFIER__WINDOW_S="2",
                                       ROOFWATCH_CLASSIFIER__LONG_WINDOW_S="4",
                                       ROOFWATCH_CLASSIFIER__EVALUATE_EVERY_S="0.5"))
    try:
        agent.wait_healthy()

        def settled():
            verdicts = {v["gpu"]: v for v in json.loads(http_get(agent.url + "api/v1/snapshot")[1])["verdicts"]}
            pair = (verdicts.get("0", {}).get("class"), verdicts.get("1", {}).get("class"))
            return verdicts if pair == ("compute_bound", "memory_bound") and all(
                v["basis"] == "counters" for v in verdicts.values()) else None

        verdicts = poll(settled, 40, what="the GEMM compute_bound and the decode memory_bound, on counters")
        assert verdicts["0"]["mfu_counters"] == pytest.approx(0.45, abs=0.1), verdicts["0"]
    finally:
        agent.kill()


def test_the_built_in_mi300x_dme_scenario_joins_its_virtual_exporter():
    """``roofwatch demo --backend amd-virtual --scenario mi300x-dme``: the demo node with DME beside amdsmi."""
    backend = open_backend(BackendOptions.of(Settings(backend="amd-virtual", scenario="mi300x-dme")))
    try:
        assert isinstance(backend, AmdExporterJoin) and backend.reader.url == IN_PROCESS_URL
        sampled(backend)
        assert sorted(read_records(render(backend.inner.library)).records, key=int) == [str(i) for i in range(8)]
        assert backend.reader.read_once() is None
        backend.sample("0", time.time())
        assert backend.counter_sources("0")["tensor_active"] == "amd-exporter"
    finally:
        backend.close()
