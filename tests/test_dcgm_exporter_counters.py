"""DCGM 4.6's cumulative counters read through dcgm-exporter, in process (issue 46 item 1): the published names
become activity over the window between two reads, win over a sampled ratio beside them, and fill an NVML
sample through the join on a GPU without GPM, named as the counters' source. A real agent process over them:
tests/test_dcgm_exporter_cumulative.py; the arithmetic: tests/test_cumulative.py."""

from __future__ import annotations

import time

import pytest
import yaml

from agent.app.config import load_settings
from agent.backends.dcgm_exporter.backend import DcgmExporterBackend
from agent.backends.dcgm_exporter.exposition import read_records
from agent.backends.dcgm_exporter.reader import ExporterReader
from agent.backends.options import BackendOptions
from agent.backends.registry import open_nvml_virtual
from agent.virtual.devices import device_uuid
from tests.cumulative_exporter import FIRST, SECOND, AdvancingExporter, advanced, window_activity
from tests.dcgm_exporter_server import fixture, replace_uuids


def test_the_exporter_backend_prefers_the_counters_to_a_sampled_ratio_beside_them():
    first, second = fixture(FIRST), fixture(SECOND)
    expected = window_activity("DCGM_FI_PROF_MMA_CYCLES_ACTIVE_TOTAL")
    gauge = 'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{gpu="0",UUID="GPU-4f2a0c1e-8b3d-6a71-0c5e-9d2b7e1f3a60"} 0.010000\n'
    backend = DcgmExporterBackend(ExporterReader("http://127.0.0.1:9/metrics", fetch=lambda *a: b""))
    got = [backend.values("0", read_records(body + gauge).records["0"], float(i))
           for i, body in enumerate((first, advanced(first, second, 1)))]
    assert got[0]["tensor_active"] == pytest.approx(0.01), "before a window, the sampled ratio is what there is"
    assert got[1]["tensor_active"] == pytest.approx(expected["0"], abs=1e-9)
    assert abs(expected["0"] - 0.01) > 0.3, "the two readings differ, so the test can tell which won"


def test_nvml_joined_to_the_exporter_takes_the_counters_window_on_a_gpu_without_gpm(tmp_path):
    scenario = tmp_path / "a100.yaml"
    scenario.write_text(yaml.safe_dump({"name": "a100-join", "seed": 5, "nodes": [
        {"name": "n1", "model": "a100-sxm-80gb", "gpus": 1}]}))
    uuids = {"0": device_uuid(5, "n1", 0, "nvidia")}
    expected = window_activity("DCGM_FI_PROF_MMA_CYCLES_ACTIVE_TOTAL")["0"]
    with AdvancingExporter(replace_uuids(fixture(FIRST), uuids), replace_uuids(fixture(SECOND), uuids)) as exporter:
        settings = BackendOptions.of(load_settings(backend="nvml-virtual", scenario=str(scenario),
                                                   dcgm_exporter_url=exporter.url, dcgm_exporter_interval_s=60))
        backend = open_nvml_virtual(settings)
        try:
            backend.discover()
            first = backend.sample("0", time.time())  # the counters' baseline
            backend.reader.read_once()  # a second reading: one window of the counters
            sample = backend.sample("0", time.time())
            sources = backend.counter_sources("0")
        finally:
            backend.close()
    assert first.tensor_active is None, "no window yet, and no sampled ratio exported"
    assert sample.tensor_active == pytest.approx(expected, abs=1e-9)
    assert sources["tensor_active"] == "dcgm-exporter-totals" and sources["dram_active"] == "dcgm-exporter"
