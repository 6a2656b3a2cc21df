"""``roofwatch doctor`` with dcgm-exporter: whether it answers, which source each GPU's counters come
from, and the counters-CSV lines that would give the missing profiling fields."""

from __future__ import annotations

import re
import subprocess

import pytest
import yaml

from agent.app.config import load_settings
from agent.diagnostics.doctor import run_doctor
from agent.diagnostics.findings import EXIT_DEGRADED, EXIT_UNUSABLE
from agent.virtual.devices import device_uuid
from tests.agent_process import clean_env, roofwatch_cmd
from tests.dcgm_exporter_server import FakeExporter, fixture, replace_uuids, set_value


def by_gpu(report, check: str) -> dict[str, str]:
    return {f.gpu: f.detail for f in report.findings if f.check == check}


def test_doctor_on_the_exporter_alone_names_source_and_missing_profiling_fields():
    with FakeExporter(fixture("h100-8x-mig.prom")) as exporter:
        report = run_doctor(load_settings(backend="dcgm-exporter", dcgm_exporter_url=exporter.url))
    assert report.gpus == 15 and report.exit_code == EXIT_DEGRADED
    (ok,) = [f for f in report.findings if f.check == "dcgm-exporter"]
    assert ok.status == "ok" and "15 GPU(s)" in ok.detail
    assert by_gpu(report, "counter source")["2"].startswith("dcgm-exporter: ")
    missing = {f.gpu: f for f in report.findings if f.check == "profiling counters"}
    assert "sm_active" in missing["2"].detail and "fp64_active" in missing["2"].detail
    assert "tensor_active" not in missing["2"].detail, "exported by the default CSV"
    assert "DCGM_FI_PROF_SM_ACTIVE" in missing["2"].fix


def test_doctor_names_both_duty_readings_when_the_profiling_counter_is_dead():
    """NVIDIA/dcgm-exporter#662: GPU_UTIL 91 % under load while PROF_GR_ENGINE_ACTIVE reads 0.156."""
    body = set_value(set_value(fixture("a100-8x-pods.prom"), "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "0", "0.156"),
                     "DCGM_FI_DEV_GPU_UTIL", "0", "91")
    with FakeExporter(body) as exporter:
        report = run_doctor(load_settings(backend="dcgm-exporter", dcgm_exporter_url=exporter.url))
    (dead,) = [f for f in report.findings if f.check == "counters"]
    assert dead.gpu == "0" and dead.status == "warn"
    assert "GPU_UTIL reads 91% busy" in dead.detail and "PROF_GR_ENGINE_ACTIVE reads 0.156" in dead.detail
    assert "dcgmi profile --resume" in dead.fix and "counters_disagree" in dead.impact


def test_doctor_with_the_exporter_down_fails_with_the_fix():
    exporter = FakeExporter(fixture("a100-8x-pods.prom"))
    exporter.stop()
    report = run_doctor(load_settings(backend="dcgm-exporter", dcgm_exporter_url=exporter.url))
    assert report.exit_code == EXIT_UNUSABLE
    (failed,) = [f for f in report.findings if f.check == "dcgm-exporter backend"]
    assert "connection refused" in failed.detail and "dcgm_exporter_url" in failed.fix


def test_doctor_on_nvml_joined_with_the_exporter_names_the_joined_fields(tmp_path):
    scenario = tmp_path / "a100.yaml"
    scenario.write_text(yaml.safe_dump({"name": "a100-join", "seed": 5, "nodes": [
        {"name": "n1", "model": "a100-sxm-80gb", "gpus": 2}]}))
    body = replace_uuids(fixture("a100-8x-pods.prom"), {"0": device_uuid(5, "n1", 0, "nvidia")})
    with FakeExporter(body) as exporter:
        report = run_doctor(load_settings(backend="nvml-virtual", scenario=str(scenario),
                                          dcgm_exporter_url=exporter.url))
    sources = by_gpu(report, "counter source")
    assert "from dcgm-exporter: " in sources["0"] and "sm_active" in sources["0"]
    assert "dcgm-exporter" not in sources["1"]
    joins = by_gpu(report, "dcgm-exporter join")
    assert set(joins) == {"1"} and "not in dcgm-exporter's exposition" in joins["1"]
    missing = {f.gpu: f.detail for f in report.findings if f.check == "profiling counters"}
    assert "0" not in missing and "sm_active" in missing["1"], "GPU 1 has NVML alone: pre-Hopper, no GPM"


@pytest.mark.slow
def test_doctor_command_prints_the_sources():
    with FakeExporter(fixture("a100-8x-pods.prom")) as exporter:
        result = subprocess.run(roofwatch_cmd("doctor", "--backend", "dcgm-exporter"), capture_output=True, text=True,
                                timeout=60, env=clean_env(ROOFWATCH_DCGM_EXPORTER_URL=exporter.url))
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"counter source \[GPUs [^\]]*\b7\b[^\]]*\]: dcgm-exporter: ", result.stdout), result.stdout
