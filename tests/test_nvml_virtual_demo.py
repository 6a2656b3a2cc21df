"""``roofwatch demo --backend nvml-virtual``: the real NVML code path serves what the simulator serves.

Both demos run as real processes over the same scenario; the NVML one reaches the simulation
only through pynvml and the fake driver. Every series the virtual demo exports must also come
from the NVML path, with the same labels and (for the slowly changing values) close values,
and the same verdicts.
"""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.agent_process import AgentProcess, clean_env, poll, roofwatch_cmd

pytestmark = pytest.mark.slow

NVML_ONLY = {
    # What the driver reports and the simulator's own backend has no notion of.
    "roofwatch_gpu_driver_calls_per_sample", "roofwatch_gpu_driver_calls_total",
    "roofwatch_gpu_ecc_errors_total", "roofwatch_gpu_remapped_rows", "roofwatch_gpu_remapped_rows_pending",
    "roofwatch_gpu_remapped_rows_failure", "roofwatch_gpu_clock_event_seconds_total",
    "roofwatch_gpu_memory_temperature_celsius", "roofwatch_gpu_process_sm_utilization_ratio",
}
STEADY = {  # values that hold still between two scrapes a second apart
    "roofwatch_gpu_memory_total_bytes", "roofwatch_gpu_memory_used_bytes", "roofwatch_gpu_sm_clock_max_hertz",
    "roofwatch_gpu_power_limit_watts", "roofwatch_gpu_peak_flops", "roofwatch_gpu_workload_class",
    "roofwatch_gpu_processes", "roofwatch_gpu_process_memory_used_bytes", "roofwatch_gpus_visible",
}


def series(text: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = {k: v for k, v in s.labels.items() if k != "backend"}
            out[(s.name, tuple(sorted(labels.items())))] = s.value
    return out


@pytest.fixture(scope="module")
def demos():
    agents = [AgentProcess("demo", "--listen", "127.0.0.1:0", "--backend", backend)
              for backend in ("virtual", "nvml-virtual")]
    try:
        for agent in agents:
            agent.wait_healthy()
            # Every GPU's first GPM pair: right after start a GPM span can be too short for some GPUs
            # (the values are then unknown for that interval), so wait for all eight, not the first.
            poll(lambda a=agent: a.metrics().count("roofwatch_gpu_tensor_active_ratio{") == 8, 20,
                 what="tensor activity of all 8 GPUs")
        yield agents
    finally:
        for agent in agents:
            agent.kill()


def test_nvml_path_serves_every_series_of_the_virtual_backend(demos):
    virtual, nvml = (series(a.metrics()) for a in demos)
    missing = {k for k in virtual if k not in nvml}
    assert not missing, sorted(missing)[:10]
    extra = {name for name, _ in nvml if (name, _) not in virtual}
    assert extra <= NVML_ONLY, sorted(extra - NVML_ONLY)
    assert any(name == "roofwatch_gpu_driver_calls_per_sample" for name, _ in nvml)
    for key, value in virtual.items():
        if key[0] in STEADY:
            assert nvml[key] == pytest.approx(value, rel=0.02), key


def test_same_verdicts_and_live_values(demos):
    virtual, nvml = (series(a.metrics()) for a in demos)
    classes = {k: v for k, v in virtual.items() if k[0] == "roofwatch_gpu_workload_class" and v == 1.0}
    assert len(classes) == 8 and all(nvml[k] == 1.0 for k in classes)
    # A starved or jittered GPU's activity changes within the second by design (a loader stall, a
    # collective wait), and the two agents sample different seconds: only steady GPUs' per-interval
    # values can agree. The bursty ones are held to the same verdict above.
    bursty = {dict(k[1])["gpu"] for k in classes if dict(k[1])["class"] in ("input_starved", "communication_jittered")}
    compared = 0
    for key, value in virtual.items():
        if key[0] in ("roofwatch_gpu_tensor_active_ratio", "roofwatch_gpu_dram_active_ratio") and dict(key[1])["gpu"] not in bursty:
            assert nvml[key] == pytest.approx(value, abs=0.08), key  # same phase, scraped a moment apart
            compared += 1
    assert compared >= 8, "most GPUs are steady in the demo"


def test_promtool_accepts_the_nvml_exposition(demos):
    promtool = shutil.which("promtool")
    assert promtool, "promtool is required (Debian package 'prometheus')"
    result = subprocess.run([promtool, "check", "metrics"], input=demos[1].metrics(), capture_output=True,
                            text=True, timeout=30)
    assert result.returncode == 0 and not result.stdout.strip() and not result.stderr.strip(), result


def run_doctor(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(roofwatch_cmd("doctor", *args), capture_output=True, text=True, timeout=60,
                          env=clean_env())


def test_doctor_without_a_gpu_explains_and_fails():
    result = run_doctor()
    assert result.returncode == 1, result.stderr
    assert "libnvidia-ml.so.1 not found" in result.stdout
    assert "roofwatch demo" in result.stdout and "not usable" in result.stdout
    assert "Traceback" not in result.stdout + result.stderr


def test_doctor_on_a_full_hopper_node_is_clean():
    result = run_doctor("--backend", "nvml-virtual", "--json")
    report = json.loads(result.stdout)
    assert result.returncode == 0 and report["fully_usable"] and report["gpus"] == 8, result.stdout
    assert not [f for f in report["findings"] if f["status"] in ("warn", "fail")]


def test_doctor_names_what_an_old_a100_driver_costs(tmp_path):
    scenario = tmp_path / "a100.yaml"
    scenario.write_text(
        "name: old\nnodes:\n  - name: n\n    model: a100-sxm-80gb\n    gpus: 1\n"
        "    nvml: {driver_version: '470.82.01', persistence_mode: false,\n"
        "           no_permission: [nvmlDeviceGetComputeRunningProcesses_v2]}\n")
    result = run_doctor("--backend", "nvml-virtual", "--scenario", str(scenario))
    assert result.returncode == 3, result.stdout + result.stderr
    text = result.stdout
    assert "driver 470.82.01" in text
    assert "WARN GPM [GPU 0]: unavailable: function not found" in text and "tensor-pipe" in text
    assert "WARN persistence mode" in text and "nvidia-persistenced" in text
    assert "WARN processes [GPU 0]" in text and "hostPID" in text
    assert "usable, with pieces missing" in text


def test_run_with_nvml_and_no_driver_is_one_clear_line():
    result = subprocess.run(roofwatch_cmd("run", "--backend", "nvml", "--listen", "127.0.0.1:0"), capture_output=True,
                            text=True, timeout=60, env=clean_env())
    assert result.returncode == 1
    assert result.stderr.strip().startswith("roofwatch run: NVML: libnvidia-ml.so.1 not found")
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
