"""``roofwatch demo --backend amd-virtual``: a virtual 8 x MI300X node through the real amdsmi code path.

The agent runs as a real process; it reaches the simulation only through the real amdsmi package
and the fake libamd_smi, and must serve MI300X metrics and a verdict per GPU. It does so with the
installed amdsmi, and with the oldest and the newest release we support first on PYTHONPATH (the
fake then plays that release's libamd_smi).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.agent_process import AgentProcess, clean_env, poll, roofwatch_cmd
from tests.amdsmi_releases import NEWEST, OLDEST
from tests.wheels import unpacked

pytestmark = pytest.mark.slow


def samples(text: str, name: str) -> list:
    return [s for f in text_string_to_metric_families(text) for s in f.samples if s.name == name]


@pytest.fixture(scope="module")
def agent():
    # per-link XGMI bytes are opt-in (issue 36): this agent asks for them through the environment
    proc = AgentProcess("demo", "--listen", "127.0.0.1:0", "--backend", "amd-virtual",
                        env=clean_env(ROOFWATCH_OPTIONAL_METRICS='["fabric_links"]'))
    try:
        proc.wait_healthy()
        poll(lambda: "roofwatch_gpu_fabric_link_bytes_total{" in proc.metrics(), 20, what="first AMD samples")
        yield proc
    finally:
        proc.kill()


def test_serves_eight_mi300x_with_amd_readings_and_verdicts(agent):
    text = agent.metrics()
    info = samples(text, "roofwatch_gpu_info")
    assert len(info) == 8 and {s.labels["model"] for s in info} == {"AMD Instinct MI300X"}
    assert {s.labels["vendor"] for s in info} == {"amd"} and {s.labels["spec"] for s in info} == {"mi300x"}
    assert {s.labels["backend"] for s in samples(text, "roofwatch_collector_cycles_total")} == {"amd-virtual"}
    classes = {s.labels["gpu"]: s.labels["class"] for s in samples(text, "roofwatch_gpu_workload_class") if s.value == 1.0}
    assert len(classes) == 8
    assert classes["7"] == "idle" and classes["4"] == "memory_bound"  # the scenario's idle GPU and FP8 decode
    assert not samples(text, "roofwatch_gpu_tensor_active_ratio")  # amdsmi has no tensor counter: absent, not 0
    assert len(samples(text, "roofwatch_gpu_power_watts")) == 8
    links = {(s.labels["gpu"], s.labels["link"]) for s in samples(text, "roofwatch_gpu_fabric_link_bytes_total")}
    assert len({gpu for gpu, _ in links}) == 8 and len(links) == 8 * 7
    calls = samples(text, "roofwatch_gpu_driver_calls_per_sample")
    assert calls and all(s.value >= 3 for s in calls)


def test_promtool_accepts_the_amd_exposition(agent):
    promtool = shutil.which("promtool")
    assert promtool, "promtool is required (Debian package 'prometheus')"
    result = subprocess.run([promtool, "check", "metrics"], input=agent.metrics(), capture_output=True,
                            text=True, timeout=30)
    assert result.returncode == 0 and not result.stdout.strip() and not result.stderr.strip(), result


def run_doctor(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(roofwatch_cmd("doctor", *args), capture_output=True, text=True, timeout=60, env=clean_env())


def test_doctor_on_the_virtual_mi300x_node_names_what_amd_lacks():
    result = run_doctor("--backend", "amd-virtual", "--json")
    report = json.loads(result.stdout)
    assert report["gpus"] == 8, result.stdout + result.stderr
    checks = {f["check"] for f in report["findings"]}
    assert {"AMD driver", "tensor activity"} <= checks
    lacking = next(f for f in report["findings"] if f["check"] == "tensor activity")
    assert "no tensor-pipe" in lacking["detail"] and "agent.client" in lacking["fix"]


def test_doctor_on_a_cpx_node_with_a_locked_process_list(tmp_path):
    scenario = tmp_path / "cpx.yaml"
    scenario.write_text(
        "name: cpx\nnodes:\n  - name: n\n    model: mi300x\n    gpus: 1\n"
        "    amd: {compute_partition: CPX, no_permission: [amdsmi_get_gpu_process_list]}\n")
    result = run_doctor("--backend", "amd-virtual", "--scenario", str(scenario))
    assert result.returncode == 3, result.stdout + result.stderr
    text = result.stdout
    assert "partition 3 of 8 (CPX/NPS1)" in text
    processes = [line for line in text.splitlines() if line.startswith("WARN processes [")]
    assert len(processes) == 1 and "unavailable" in processes[0] and "no permission" in text
    assert processes[0].startswith("WARN processes [GPUs 0/0, 0/1, 0/2,"), "each partition's, said once"
    assert "WARN power [" not in text  # socket power lives on partition 0: not a defect elsewhere


def test_doctor_amd_without_rocm_says_how_to_fix_it():
    result = run_doctor("--backend", "amd")
    assert result.returncode == 1
    assert "libamd_smi.so not found" in result.stdout and "/dev/kfd" in result.stdout
    assert "Traceback" not in result.stdout + result.stderr


@pytest.mark.parametrize("version", [OLDEST, NEWEST])
def test_the_agent_serves_every_gpu_with_a_verdict_on_the_oldest_and_newest_amdsmi(version):
    env = clean_env(PYTHONPATH=os.pathsep.join([str(unpacked("amdsmi", version)), os.getcwd()]))
    proc = AgentProcess("demo", "--listen", "127.0.0.1:0", "--backend", "amd-virtual", env=env)
    try:
        proc.wait_healthy()

        def classified() -> str | None:
            text = proc.metrics()
            verdicts = [s for s in samples(text, "roofwatch_gpu_workload_class") if s.value == 1.0]
            return text if len({s.labels["gpu"] for s in verdicts}) == 8 else None

        text = poll(classified, 30, what=f"a verdict for all 8 GPUs over amdsmi {version}")
        info = samples(text, "roofwatch_gpu_info")
        assert len(info) == 8 and {s.labels["model"] for s in info} == {"AMD Instinct MI300X"}
        assert len(samples(text, "roofwatch_gpu_power_watts")) == 8
        assert len(samples(text, "roofwatch_gpu_engine_active_ratio")) == 8
        xgmi = {(s.labels["gpu"], s.labels["direction"]) for s in samples(text, "roofwatch_gpu_link_bytes_total")}
        assert len(xgmi) == 8 * 2  # the sum over the 7 links; per-link bytes are opt-in
        assert not samples(text, "roofwatch_gpu_fabric_link_bytes_total")
    finally:
        proc.kill()
    doctor = subprocess.run(roofwatch_cmd("doctor", "--backend", "amd-virtual", "--json"), capture_output=True,
                            text=True, timeout=60, env=env)
    report = json.loads(doctor.stdout)
    package = next(f for f in report["findings"] if f["check"] == "amdsmi package")
    assert version in package["detail"], package  # that release, not the installed one, was loaded


def test_doctor_never_calls_an_unknown_rocm_version_ok_and_reads_the_installations_own_file(tmp_path):
    """amdsmi 6.4+ asks librocm-core.so, which the fake node (like many containers) lacks: the version was then
    printed as "ok ... ROCm unknown". Unknown is said as info with why; an installation's .info/version is read."""
    result = run_doctor("--backend", "amd-virtual", "--json")
    findings = {f["check"]: f for f in json.loads(result.stdout)["findings"]}
    assert "ROCm" not in findings["AMD driver"]["detail"]
    unknown = findings["ROCm version"]
    assert unknown["status"] == "info" and "librocm-core" in unknown["detail"] and ".info/version" in unknown["detail"]
    root = tmp_path / "rocm"
    (root / ".info").mkdir(parents=True)
    (root / ".info" / "version").write_text("6.4.1-99\n")
    found = subprocess.run(roofwatch_cmd("doctor", "--backend", "amd-virtual", "--json"), capture_output=True, text=True,
                           timeout=60, env=clean_env(ROCM_PATH=str(root)))
    findings = {f["check"]: f for f in json.loads(found.stdout)["findings"]}
    assert "ROCm 6.4.1" in findings["AMD driver"]["detail"] and "ROCm version" not in findings, found.stdout[-2000:]
