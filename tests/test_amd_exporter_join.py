"""amdsmi joined with AMD's Device Metrics Exporter (agent.backends.amd_exporter.join): the profiler's tensor,
VALU and HBM counters fill what amdsmi has not got, matched by board serial (and partition), while amdsmi's own
readings win. The fast tests run the join in-process over ``amd-virtual`` (the real amdsmi package over the fake
libamd_smi) and a fixture exposition whose serials are the fake's; the slow one runs ``roofwatch demo`` as a process."""

from __future__ import annotations

import json
import re
import time

import pytest

from agent.app.config import Settings
from agent.backends.amd_exporter.exposition import read_records
from agent.backends.amd_exporter.join import AmdExporterJoin, DmeKey, select, shared_serials
from agent.backends.options import BackendOptions
from agent.backends.registry import open_backend
from agent.diagnostics.amd import exporter_join_findings
from agent.diagnostics.verdict_basis import basis_findings
from agent.virtual.fake_amdsmi.api_identity import board_serial
from tests import amd_exporter_fixtures as fx
from tests.agent_process import AgentProcess, clean_env, http_get, poll
from tests.dcgm_exporter_server import FakeExporter

NODE = "mi300x-node"
"""The node of the built-in mi300x scenario, amd-virtual's default."""
SERIALS = {str(i): board_serial(NODE, i) for i in range(7)}
"""The fake amdsmi's board serials for GPUs 0-6; GPU 7 keeps the fixture's serial, so it matches nothing."""


def joined_body() -> str:
    return fx.replace_serials(fx.FILES["mi300x-spx-profiler.prom"](), SERIALS)


def test_replace_serials_swaps_only_the_named_gpus():
    records = read_records(joined_body()).records
    assert [records[str(i)].serial for i in range(7)] == [SERIALS[str(i)] for i in range(7)]
    assert records["7"].serial == "692407004237"


def test_select_matches_serial_and_partition_and_falls_back_to_gpu_id_without_serials():
    records = read_records(fx.FILES["mi300x-cpx-profiler.prom"]()).records
    assert select(records, DmeKey("692407004231", 5, None)).key == "1/5"
    assert select(records, DmeKey("692407004231", None, None)) is None, "a whole GPU does not match a partition"
    assert select(records, DmeKey("000000000000", 5, 13)) is None, "serials present: no fallback to gpu_id"
    no_serials = read_records(fx.FILES["mi300x-cpx-profiler.prom"]().replace('serial_number="6924070042', 'x="')).records
    assert select(no_serials, DmeKey("692407004231", 5, 13)).key == "1/5", "no serials: gpu_id = enumeration index"


def test_the_joined_gpus_get_the_profiler_counters_and_amdsmi_keeps_its_own():
    # DME's power set to 1 W, a value no busy or idle MI300X of the simulation reads: the fixture's 515 W
    # is the simulation's own decode power too, so equal values could not tell whose power won.
    body = re.sub(r"^(gpu_package_power\{[^}]*\}) \S+$", r"\1 1", joined_body(), flags=re.M)
    with FakeExporter(body) as exporter:
        backend = open_backend(BackendOptions.of(Settings(backend="amd-virtual", amd_exporter_url=exporter.url)))
        try:
            assert isinstance(backend, AmdExporterJoin)
            infos = backend.discover()
            now = time.time()
            samples = {info.gpu: backend.sample(info.gpu, now) for info in infos}
            records = backend.reader.records()
            for gpu in map(str, range(7)):
                s, values = samples[gpu], records[gpu].values
                mfma, gui = values["gpu_prof_tensor_active_percent"] / 100, values["gpu_prof_gui_util_percent"] / 100
                assert s.tensor_active == pytest.approx(mfma * gui), gpu
                assert s.sm_active is not None and s.sm_occupancy is not None
                assert values["gpu_package_power"] == 1.0 and s.power_w is not None and s.power_w > 1.0, "amdsmi's power wins"
                sources = backend.counter_sources(gpu)
                assert sources["tensor_active"] == "amd-exporter"
                assert sources["power_w"] == sources["gr_active"] == "amdsmi"
                assert sources["dram_active"] == "amd-exporter", "the HBM bytes of the same profiler sample replace UMC"
            assert samples["7"].tensor_active is None and samples["7"].sm_active is None, "GPU 7: amdsmi alone"
            assert "not in amd-exporter's exposition" in backend.join_state("7").problem
            assert backend.matched_by() == "serial"
            assert backend.unmatched() == ["gpu_id 7 (serial 692407004237)"]
            findings = exporter_join_findings(backend, now)
            warned = [f.detail for f in findings if f.status == "warn"]
            assert any("match no amdsmi device: gpu_id 7" in w for w in warned), warned
            basis = {f.detail.split(":")[0]: f.detail for f in basis_findings(backend, infos)}
            assert "(basis counters)" in basis["GPUs 0, 1, 2, 3, 4, 5, 6"]
            assert "(basis power_and_dram)" in basis["GPU 7"]
        finally:
            backend.close()


def test_without_serials_the_join_matches_by_gpu_id_and_doctor_says_so():
    body = fx.FILES["mi300x-spx-profiler.prom"]().replace('serial_number="6924070042', 'card_serial="')
    with FakeExporter(body) as exporter:
        backend = open_backend(BackendOptions.of(Settings(backend="amd-virtual", amd_exporter_url=exporter.url)))
        try:
            backend.discover()
            now = time.time()
            assert backend.sample("3", now).tensor_active is not None
            assert backend.matched_by() == "gpu_id" and backend.unmatched() == []
            assert any("matched by gpu_id" in f.detail for f in exporter_join_findings(backend, now))
        finally:
            backend.close()


@pytest.mark.slow
def test_demo_amd_virtual_joined_with_the_exporter_reads_counters_where_serials_match():
    with FakeExporter(joined_body()) as exporter:
        agent = AgentProcess("demo", "--backend", "amd-virtual", "--listen", "127.0.0.1:0", "--interval", "0.2",
                             env=clean_env(ROOFWATCH_AMD_EXPORTER_URL=exporter.url, ROOFWATCH_AMD_EXPORTER_INTERVAL_S="0.2",
                                           ROOFWATCH_CLASSIFIER__WINDOW_S="2", ROOFWATCH_CLASSIFIER__LONG_WINDOW_S="4",
                                           ROOFWATCH_CLASSIFIER__EVALUATE_EVERY_S="0.5"))
        try:
            agent.wait_healthy()

            def snapshot() -> dict:
                return json.loads(http_get(agent.url + "api/v1/snapshot")[1])

            def settled():
                snap = snapshot()
                verdicts = {v["gpu"]: v for v in snap["verdicts"]}
                busy = [g for g in map(str, range(7)) if verdicts.get(g, {}).get("class") not in (None, "unknown", "idle")]
                return snap if busy and all(verdicts[g]["basis"] == "counters" for g in busy) else None

            snap = poll(settled, 40, what="the joined GPUs judged on counters")
            devices = {d["info"]["gpu"]: d["sample"] for d in snap["devices"]}
            verdicts = {v["gpu"]: v for v in snap["verdicts"]}
            body = joined_body()
            for gpu in map(str, range(7)):
                sample = devices[gpu]
                assert sample["tensor_active"] is not None and sample["sm_active"] is not None, gpu
                watts = float(next(line.rsplit(" ", 1)[1] for line in body.splitlines()
                                   if line.startswith("gpu_package_power{") and f'gpu_id="{gpu}"' in line))
                assert sample["power_w"] is not None and sample["power_w"] != watts, "amdsmi's power wins"
            assert devices["7"]["tensor_active"] is None and devices["7"]["sm_active"] is None
            assert verdicts["7"]["basis"] != "counters", verdicts["7"]
            assert verdicts["0"]["basis"] == "counters", verdicts["0"]
        finally:
            agent.kill()


def test_records_sharing_a_serial_are_told_apart_by_gpu_id():
    """An MI250X's two GCDs may read one board FRU (the fixture gives each package's GCDs one serial): serial alone
    names two records, so gpu_id picks, and a gpu_id outside the pair matches nothing."""
    records = read_records(fx.FILES["mi250x-profiler.prom"]()).records
    assert select(records, DmeKey("PCB046982-0071", None, 1)).key == "1"
    assert select(records, DmeKey("PCB046982-0071", None, 0)).key == "0"
    assert select(records, DmeKey("PCB046982-0071", None, 5)) is None
    assert select(records, DmeKey("PCB046984-0071", None, None)) is None
    assert shared_serials(records) == [f"PCB0{46982 + n}-0071" for n in range(4)]
    assert shared_serials(read_records(fx.FILES["mi300x-cpx-profiler.prom"]()).records) == []


def test_the_join_matches_gpus_whose_serials_are_shared_by_gpu_id_and_doctor_says_so(monkeypatch):
    """amdsmi and DME both give GPUs 3 and 4 one serial (GPU 3 runs a GEMM, 4 decodes): each still gets its own
    profiler counters, matched by serial and then gpu_id."""
    shared = {"0": "S-A", "1": "S-A", "2": "S-B", "3": "S-C", "4": "S-C", "5": "S-D", "6": "S-D", "7": "S-E"}
    body = fx.replace_serials(fx.FILES["mi300x-spx-profiler.prom"](), shared)
    with FakeExporter(body) as exporter:
        backend = open_backend(BackendOptions.of(Settings(backend="amd-virtual", amd_exporter_url=exporter.url)))
        try:
            amdsmi = backend.inner.amdsmi
            order = [getattr(h, "value", h) for h in amdsmi.amdsmi_get_processor_handles()]
            board = amdsmi.amdsmi_get_gpu_board_info

            def shared_board(handle):
                return {**board(handle), "product_serial": shared[str(order.index(getattr(handle, "value", handle)))]}

            monkeypatch.setattr(amdsmi, "amdsmi_get_gpu_board_info", shared_board)
            backend.discover()
            now = time.time()
            records = backend.reader.records()
            for gpu in ("3", "4"):
                values = records[gpu].values
                expected = values["gpu_prof_tensor_active_percent"] * values["gpu_prof_gui_util_percent"] / 1e4
                assert backend.sample(gpu, now).tensor_active == pytest.approx(expected), gpu
            assert backend.matched_by() == "serial+gpu_id" and backend.unmatched() == []
            assert any("told apart by gpu_id" in f.detail for f in exporter_join_findings(backend, now))
        finally:
            backend.close()
