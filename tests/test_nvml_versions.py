"""The version matrix: every nvidia-ml-py release we accept, over every NVIDIA driver branch we model.

pyproject.toml accepts nvidia-ml-py 12.535 and newer. The releases differ in the Python names
they define (agent/backends/nvml/bindings.py); the driver branches differ in the C symbols and
field ids they have (agent/virtual/fake_nvml/profile.py, from each release's nvml.h). The agent
must start, discover and sample on every pair, and say in doctor what a pair costs. Releases are
downloaded once by tests/wheels.py; one that cannot be downloaded fails its tests.
"""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest

from agent.backends.nvml.bindings import Bindings
from agent.backends.nvml.gpm_totals import ACTIVE as GPM_TOTALS_ACTIVE
from agent.backends.nvml.gpm_totals import ELAPSED as GPM_TOTALS_ELAPSED
from agent.diagnostics.nvidia import nvml_findings
from agent.virtual.fake_nvml import load_pynvml
from agent.virtual.fake_nvml.api_device import DRIVER_RESERVED_BYTES
from tests.agent_process import AgentProcess, clean_env, gauge_values, poll, roofwatch_cmd
from tests.nvml_harness import NVIDIA_ML_PY, Rig, release_pynvml, scenario
from tests.wheels import REPO, unpacked

OLDEST, NEWEST = NVIDIA_ML_PY[0], NVIDIA_ML_PY[-1]

MISSING = {
    "12.535.161": {"nvmlDeviceGetTemperatureV", "c_nvmlProcessInfo_v3_t", "nvmlDeviceGetComputeRunningProcesses_v2",
                   "nvmlDeviceGetMPSComputeRunningProcesses_v2", "NVMLLibraryMismatchError", "c_nvmlValue_t.usVal"},
    "12.560.30": {"nvmlDeviceGetTemperatureV", "c_nvmlValue_t.usVal"},
}
"""What each release lacks among the names the backend uses (read from the releases' pynvml.py)."""

DRIVERS = ("470.82.01", "535.104.05", "550.144.03", "560.35.03", "570.211.01", "575.64.05", "580.76.05",
           "580.95.05")
"""One release of each driver branch the fake models, oldest first (R470 predates Hopper: an A100 there)."""


@pytest.mark.parametrize("release", NVIDIA_ML_PY)
def test_each_release_is_detected_for_what_it_has(release):
    bindings = Bindings.detect(load_pynvml(None, release_pynvml(release)))
    assert bindings.version == release
    assert set(bindings.missing) == MISSING.get(release, set())
    assert not bindings.lost  # every gap has a replacement: nothing becomes unknown
    assert bindings.process_struct is not None and bindings.function_pointer


CUMULATIVE_GPM = {"SM_CYCLES_ELAPSED": 248, "SM_CYCLES_ACTIVE": 249, "MMA_CYCLES_ACTIVE": 250, "DMMA_CYCLES_ACTIVE": 251,
                  "HMMA_CYCLES_ACTIVE": 252, "IMMA_CYCLES_ACTIVE": 253, "DFMA_CYCLES_ACTIVE": 254, "PCIE_TX": 255,
                  "PCIE_RX": 256, "INTEGER_CYCLES_ACTIVE": 257, "FP64_CYCLES_ACTIVE": 258, "FP32_CYCLES_ACTIVE": 259,
                  "FP16_CYCLES_ACTIVE": 260}
"""NVML's cumulative GPM metrics behind DCGM 4.6's fields 1084-1096 (NVIDIA/DCGM v4.6.0 dcgm_fields.cpp and its
sdk/nvidia/nvml/dcgm_nvml.h: "since reboot")."""


@pytest.mark.parametrize("release", NVIDIA_ML_PY)
def test_which_releases_define_the_cumulative_gpm_metric_ids_as_docs_nvidia_says(release):
    """docs/nvidia.md ("Exact-window activity"): only 13.615.71 of the tested releases defines them, at DCGM's ids;
    the backend reads the cycle counters among them where the release defines them (agent/backends/nvml/gpm_totals.py:
    not the PCIe bytes nor the integer pipe), and on the others asks for none (tests/test_nvml_gpm_totals.py)."""
    module = load_pynvml(None, release_pynvml(release))
    defined = {name: getattr(module, f"NVML_GPM_METRIC_{name}", None) for name in CUMULATIVE_GPM}
    if release == "13.615.71":
        assert defined == CUMULATIVE_GPM
    else:
        assert set(defined.values()) == {None}, defined
        assert module.NVML_GPM_METRIC_MAX in (98, 210)
    read = {f"NVML_GPM_METRIC_{name}" for name in CUMULATIVE_GPM} & pynvml_names_used()
    assert read == set(GPM_TOTALS_NAMES) == {f"NVML_GPM_METRIC_{name}" for name in CUMULATIVE_GPM
                                             if name not in ("PCIE_TX", "PCIE_RX", "INTEGER_CYCLES_ACTIVE")}


GPM_TOTALS_NAMES = (GPM_TOTALS_ELAPSED, *GPM_TOTALS_ACTIVE)
"""The cumulative GPM metric ids the backend reads where the release defines them: before 13.615 none is defined,
and the backend asks for none (no fallback needed: the GPM ratios it always reads stand)."""
NVIDIA_SOURCES = (*sorted((REPO / "agent/backends/nvml").glob("*.py")), REPO / "agent/diagnostics/nvidia.py")
NOT_PYNVML = {"nvmlReturn", "nvml_version"}
"""Matches of the name pattern that are no pynvml names: a struct field, an attribute of ours."""
BUILT_NAMES = {"nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetComputeRunningProcesses_v3"}
"""pynvml functions the process reader names with an f-string (agent/backends/nvml/process_reads.py)."""


def pynvml_names_used() -> set[str]:
    """Every pynvml name the NVIDIA backend and doctor use: attributes, and getattr / _opt strings."""
    names = set(BUILT_NAMES)
    for path in NVIDIA_SOURCES:
        text = path.read_text()
        names |= set(re.findall(r"\.((?:nvml|NVML|c_nvml|_nvml)\w+)", text))
        names |= set(re.findall(r"[\"']((?:nvml|NVML|c_nvml|_nvml)\w+)[\"']", text))
    return names - NOT_PYNVML


@pytest.mark.parametrize("release", NVIDIA_ML_PY)
def test_every_pynvml_name_the_backend_uses_is_in_the_release_or_has_a_fallback(release):
    module = load_pynvml(None, release_pynvml(release))
    used = pynvml_names_used()
    assert {"nvmlDeviceGetTemperatureV", "nvmlGpmMigSampleGet", "c_nvmlProcessInfo_v3_t"} <= used  # the scan works
    absent = {name for name in used if not hasattr(module, name)}
    assert absent & set(GPM_TOTALS_NAMES) == (set() if release == NEWEST else set(GPM_TOTALS_NAMES))
    absent -= set(GPM_TOTALS_NAMES)
    assert absent == MISSING.get(release, set()) - {"c_nvmlValue_t.usVal"}, absent


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("release", NVIDIA_ML_PY)
def test_every_release_discovers_and_samples_on_every_driver_branch(release, driver):
    model = "a100-sxm-80gb" if driver < "520" else "h100-sxm"
    r = Rig(scenario(model, nvml={"driver_version": driver}), pynvml=release_pynvml(release))
    try:
        backend = r.backend()
        devices = backend.discover()
        assert [d.gpu for d in devices] == ["0", "1"]
        for _ in range(2):
            now = r.step()
            samples = [backend.sample(d.gpu, now) for d in devices]
        for sample in samples:
            truth = r.library.latest_sample(sample.gpu)
            assert sample.gr_active is not None
            if driver >= "510":
                assert sample.mem_used_bytes == truth.mem_used_bytes
            else:  # no nvmlDeviceGetMemoryInfo_v2: v1's "used" includes the driver's reserve (512 MiB here)
                assert 0 < sample.mem_used_bytes - truth.mem_used_bytes <= DRIVER_RESERVED_BYTES
            assert sample.temperature_c is not None and sample.power_w is not None
            assert [p.pid for p in sample.processes] == [p.pid for p in truth.processes]
            assert sample.pcie_rx_bytes_per_s == pytest.approx(truth.pcie_rx_bytes_per_s, rel=1e-3) \
                if model == "h100-sxm" or driver >= "555" else sample.pcie_rx_bytes_per_s is None
        caps = devices[0].capabilities
        assert ("gpm" in caps) == (model == "h100-sxm")
        device = backend.devices["0"]
        assert not device.failed, device.failed
        trio = {"sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"}
        times = set(samples[0].clock_event_time_s or {})
        assert (trio <= times) == (driver >= "575"), times
    finally:
        r.close()


@pytest.mark.parametrize("release", NVIDIA_ML_PY)
def test_doctor_on_a_full_hopper_node_names_the_release_and_only_informs(release):
    r = Rig(scenario("h100-sxm"), pynvml=release_pynvml(release))
    try:
        backend = r.backend()
        backend.discover()
        findings, gpus = nvml_findings(backend)
        assert gpus == 2
        assert f"nvidia-ml-py {release}" in findings[0].detail
        assert not [f for f in findings if f.status in ("warn", "fail")], findings
        named = {f.detail.split(" has no ")[1].split(":")[0] for f in findings if f.check == "nvidia-ml-py"}
        assert named == MISSING.get(release, set())
    finally:
        r.close()


def _old_release_env(release: str) -> dict[str, str]:
    """The agent's environment with ``release``'s pynvml first on the path, as a pinned install would be."""
    path = os.pathsep.join(p for p in (str(unpacked("nvidia-ml-py", release)), os.environ.get("PYTHONPATH")) if p)
    return clean_env(PYTHONPATH=path)


@pytest.mark.slow
@pytest.mark.parametrize("release", [OLDEST, NEWEST])
def test_the_agent_process_serves_every_gpu_with_a_verdict_on_the_oldest_and_newest_release(release):
    env = _old_release_env(release)
    doctor = subprocess.run(roofwatch_cmd("doctor", "--backend", "nvml-virtual", "--json"), capture_output=True,
                            text=True, timeout=60, env=env)
    report = json.loads(doctor.stdout)
    assert f"nvidia-ml-py {release}" in report["findings"][0]["detail"], doctor.stdout  # the release ran
    assert report["gpus"] == 8 and report["exit_code"] == 0, doctor.stdout
    agent = AgentProcess("demo", "--listen", "127.0.0.1:0", "--backend", "nvml-virtual", env=env)
    try:
        agent.wait_healthy()

        def verdicts() -> dict[str, float]:
            text = agent.metrics()
            classes = [ln for ln in text.splitlines()
                       if ln.startswith("roofwatch_gpu_workload_class{") and ln.endswith(" 1.0")]
            return {ln.split('gpu="')[1].split('"')[0]: 1.0 for ln in classes}

        got = poll(lambda: (v := verdicts()) and len(v) == 8 and v, 30, what="a verdict for each of 8 GPUs")
        assert sorted(got) == [str(i) for i in range(8)]
        temps = gauge_values(agent.metrics(), "roofwatch_gpu_temperature_celsius")
        assert len(temps) == 8 and all(t > 0 for t in temps.values())
    finally:
        agent.kill()
