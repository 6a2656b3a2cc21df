"""End to end: the real ``roofwatch`` process, scraped over HTTP, checked by promtool.

These start the CLI exactly as a user does (``roofwatch demo``) and look only at what comes
out of its sockets and streams.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from agent.model import WORKLOAD_CLASSES

from tests.agent_process import AgentProcess, clean_env, gauge_values, poll, roofwatch_cmd, running_demo

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def demo():
    with running_demo() as agent:
        yield agent


def test_demo_serves_eight_live_gpus(demo):
    text = demo.metrics()
    up = gauge_values(text, "roofwatch_gpu_up")
    assert up == {str(i): 1.0 for i in range(8)}
    models = {s for s in text.splitlines() if s.startswith("roofwatch_gpu_info{")}
    assert len(models) == 8 and all('model="NVIDIA H100 80GB HBM3"' in line for line in models)
    assert all('node="demo-node"' in line for line in models)
    first_ts = gauge_values(text, "roofwatch_gpu_last_sample_timestamp_seconds")

    def changed():
        later = demo.metrics()
        ts = gauge_values(later, "roofwatch_gpu_last_sample_timestamp_seconds")
        return later if all(ts[g] > first_ts[g] for g in ts) else None

    later = poll(changed, timeout=15, what="a new collection cycle")
    before = gauge_values(text, "roofwatch_gpu_power_watts")
    after = gauge_values(later, "roofwatch_gpu_power_watts")
    assert any(before[g] != after[g] for g in before), "values should change between cycles"


def test_demo_exposition_passes_promtool(demo):
    promtool = shutil.which("promtool")
    assert promtool, "promtool is required (Debian package 'prometheus'; ./dev.sh test installs it)"
    result = subprocess.run([promtool, "check", "metrics"], input=demo.metrics(), capture_output=True, text=True, timeout=30)
    assert result.returncode == 0 and result.stdout == "" and result.stderr == "", result.stdout + result.stderr


def test_demo_shows_every_workload_signature(demo):
    text = demo.metrics()
    engine = gauge_values(text, "roofwatch_gpu_engine_active_ratio")
    tensor = gauge_values(text, "roofwatch_gpu_tensor_active_ratio")
    dram = gauge_values(text, "roofwatch_gpu_dram_active_ratio")
    assert tensor["7"] > 0.6  # capped GEMM near the compute roof
    assert dram["2"] > 0.4 and tensor["2"] < 0.15  # decode: bandwidth-bound
    assert engine["6"] < 0.05  # idle notebook
    memory = gauge_values(text, "roofwatch_gpu_memory_used_bytes")
    assert memory["6"] > 20 * 2**30  # ... holding memory


def test_demo_shows_every_class_from_the_first_scrape(demo):
    """The demo's verdicts: each of the six workload classes on at least one of its 8 GPUs."""
    families = {f.name: f for f in text_string_to_metric_families(demo.metrics())}
    published = {s.labels["gpu"]: s.labels["class"] for s in families["roofwatch_gpu_workload_class"].samples if s.value == 1.0}
    assert len(published) == 8
    assert set(published.values()) == set(WORKLOAD_CLASSES) - {"unknown"}
    per_gpu = {}
    for s in families["roofwatch_gpu_workload_class"].samples:
        per_gpu[s.labels["gpu"]] = per_gpu.get(s.labels["gpu"], 0) + 1
    assert set(per_gpu.values()) == {1}  # the class's series only (the zeros are opt-in), always
    reasons = {s.labels["gpu"]: s.labels for s in families["roofwatch_gpu_workload_reason_info"].samples}
    assert reasons["3"]["detail"] == "dataloader" and reasons["5"]["detail"] == "straggler"
    assert reasons["7"]["throttle"] != "none"
    mfu = {(s.labels["gpu"], s.labels["source"]): s.value for s in families["roofwatch_gpu_mfu_ratio"].samples}
    assert mfu[("0", "workload")] == pytest.approx(0.42, abs=0.01) and mfu[("0", "counters")] == pytest.approx(0.42, abs=0.03)


def test_snapshot_api_and_cli_against_running_agent(demo):
    status, body = demo.get("api/v1/snapshot")
    data = json.loads(body)
    assert status == 200 and len(data["devices"]) == 8 and data["visible_devices"] == 8
    host_port = demo.url.removeprefix("http://").rstrip("/")
    for url in (demo.url, host_port):  # "127.0.0.1:PORT" as `top` takes it (it was "unknown url type")
        result = subprocess.run(roofwatch_cmd("snapshot", "--url", url), capture_output=True, text=True, timeout=30,
                                env=clean_env())
        assert result.returncode == 0, result.stderr
        lines = result.stdout.splitlines()
        assert lines[0].startswith("node demo-node: 8/8 GPUs up")
        assert sum(1 for line in lines if "NVIDIA H100 80GB HBM3" in line) == 8


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signals_stop_cleanly(sig):
    agent = AgentProcess("demo", "--listen", "127.0.0.1:0")
    agent.wait_healthy()
    code, _elapsed, err = agent.stop(sig, timeout=5.0)
    assert code == 0
    assert "Traceback" not in err and "msg=stopping" in err


def _demo_with_faults(tmp_path, faults, scenario: str = "demo"):
    data = yaml.safe_load(_builtin_text(scenario))
    data["nodes"][0]["faults"] = faults
    path = tmp_path / "faulty.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _builtin_text(name: str) -> str:
    from importlib import resources

    return resources.files("agent.virtual").joinpath("scenarios", f"{name}.yaml").read_text()


def test_failing_and_hanging_gpus_leave_the_others_reporting(tmp_path):
    scenario = _demo_with_faults(
        tmp_path,
        [
            {"gpu": 5, "kind": "hang", "start_s": 2, "duration_s": 600, "hang_s": 600},
            {"gpu": 6, "kind": "error", "start_s": 2, "duration_s": 600},
        ],
    )
    agent = AgentProcess("demo", "--listen", "127.0.0.1:0", "--scenario", str(scenario), "--interval", "0.5")
    try:
        agent.wait_healthy()

        def faults_visible():
            text = agent.metrics()
            up = gauge_values(text, "roofwatch_gpu_up")
            return text if up.get("5") == 0.0 and up.get("6") == 0.0 else None

        text = poll(faults_visible, timeout=20, what="GPUs 5 and 6 marked down")
        up = gauge_values(text, "roofwatch_gpu_up")
        assert {g: v for g, v in up.items() if g not in ("5", "6")} == {g: 1.0 for g in "012347"}
        assert "roofwatch_gpus_visible{node=\"demo-node\"} 6.0" in text
        assert "5" not in gauge_values(text, "roofwatch_gpu_power_watts")
        # The others keep moving while GPU 5 is stuck inside a driver call.
        ts_then = gauge_values(text, "roofwatch_gpu_last_sample_timestamp_seconds")
        poll(
            lambda: gauge_values(agent.metrics(), "roofwatch_gpu_last_sample_timestamp_seconds")["0"] > ts_then["0"],
            timeout=15, what="GPU 0 to keep reporting",
        )
        assert agent.get("healthz")[0] == 200  # a down GPU is not a dead agent
        code, _, err = agent.stop(signal.SIGTERM, timeout=5.0)  # a hung call must not block shutdown
        assert code == 0
        assert "msg=\"device down\"" in err and "gpu=5" in err and "gpu=6" in err
    finally:
        agent.kill()


def test_run_without_gpu_points_to_demo():
    result = subprocess.run(
        roofwatch_cmd("run", "--listen", "127.0.0.1:0"), capture_output=True, text=True, timeout=60, env=clean_env()
    )
    assert result.returncode == 1
    assert "no GPU backend found" in result.stderr and "NVML" in result.stderr
    assert "roofwatch demo" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("command", [[], ["run"], ["demo"], ["snapshot"], ["record"], ["specs"]])
def test_help_everywhere(command):
    result = subprocess.run(roofwatch_cmd(*command, "--help"), capture_output=True, text=True, timeout=30, env=clean_env())
    assert result.returncode == 0 and "usage: roofwatch" in result.stdout


def test_version():
    from agent import __version__

    result = subprocess.run(roofwatch_cmd("--version"), capture_output=True, text=True, timeout=30, env=clean_env())
    assert result.returncode == 0 and result.stdout.strip() == f"roofwatch {__version__}"


def test_port_in_use_is_a_clear_error(demo):
    port = demo.url.rsplit(":", 1)[1].strip("/")
    result = subprocess.run(
        roofwatch_cmd("demo", "--listen", f"127.0.0.1:{port}"), capture_output=True, text=True, timeout=60, env=clean_env()
    )
    assert result.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr and "Traceback" not in result.stderr
    assert "--listen" in result.stderr and "ROOFWATCH_LISTEN" in result.stderr, "it names what to change"


@pytest.mark.parametrize("backend", ["nvml-virtual", "amd-virtual"])
def test_a_lost_gpu_goes_down_alone_and_comes_back_in_the_real_process(tmp_path, backend):
    """The fault matrix's first row against the real agent process, through the real vendor backend:
    GPU 3 falls off the bus for the first seconds of the agent's life, then answers again."""
    from agent.backends.registry import VIRTUAL_HEAD_START_S

    # The scenario has run VIRTUAL_HEAD_START_S when the backend opens: lost from about 4 s to 7 s later
    # (after discovery even on a slow machine; a GPU lost before discovery has its own test below).
    path = _demo_with_faults(tmp_path, [{"gpu": 3, "kind": "lost", "start_s": VIRTUAL_HEAD_START_S + 4, "duration_s": 3}],
                             "demo" if backend == "nvml-virtual" else "mi300x")
    agent = AgentProcess("demo", "--backend", backend, "--listen", "127.0.0.1:0", "--scenario", str(path),
                         "--interval", "0.5")
    try:
        agent.wait_healthy()
        assert gauge_values(agent.metrics(), "roofwatch_gpu_up").get("3") == 1.0, "GPU 3 must be found before its fall"
        down = _when_gpu_up(agent, "3", 0.0, 20)
        up = gauge_values(down, "roofwatch_gpu_up")
        assert {g: v for g, v in up.items() if g != "3"} == {g: 1.0 for g in "0124567"}
        assert agent.get("healthz")[0] == 200
        back = _when_gpu_up(agent, "3", 1.0, 30)
        assert gauge_values(back, "roofwatch_gpu_power_watts").get("3", 0) > 0
        if backend == "nvml-virtual":  # NVML reports the fall as XID 79; the counter stays after recovery
            assert 'roofwatch_gpu_xid_errors_total{gpu="3"' in back and 'xid="79"' in back
        code, _, err = agent.stop(signal.SIGTERM, timeout=5.0)
    finally:
        agent.kill()
    assert code == 0
    assert 'msg="device down"' in err and "gpu=3" in err


def test_a_gpu_lost_before_the_agent_starts_is_listed_down_then_found(tmp_path):
    """NVML counts a GPU it cannot hand out (fallen off the bus): the agent must start anyway, list it
    down under its index (the fleet does not silently shrink) and fill in its identity once found."""
    from agent.backends.registry import VIRTUAL_HEAD_START_S

    path = _demo_with_faults(tmp_path, [{"gpu": 3, "kind": "lost", "start_s": 0, "duration_s": VIRTUAL_HEAD_START_S + 4}])
    agent = AgentProcess("demo", "--backend", "nvml-virtual", "--listen", "127.0.0.1:0", "--scenario", str(path),
                         "--interval", "0.5")
    try:
        agent.wait_healthy()
        text = agent.metrics()
        up = gauge_values(text, "roofwatch_gpu_up")
        assert up.get("3") == 0.0 and sorted(g for g, v in up.items() if v == 1.0) == list("0124567")
        assert 'roofwatch_gpus_expected{node="demo-node"} 8.0' in text
        assert 'gpu="3",model="unknown"' in text
        back = _when_gpu_up(agent, "3", 1.0, 30)
        info = [line for line in back.splitlines() if line.startswith('roofwatch_gpu_info{gpu="3"')]
        assert len(info) == 1 and 'model="NVIDIA H100 80GB HBM3"' in info[0] and 'uuid="GPU-' in info[0]
        code, _, err = agent.stop(signal.SIGTERM, timeout=5.0)
    finally:
        agent.kill()
    assert code == 0
    assert "GPU 3 cannot be read at start" in err and "GPU 3 found" in err


def test_doctor_names_a_gpu_lost_before_start_and_how_to_fix_it(tmp_path):
    path = _demo_with_faults(tmp_path, [{"gpu": 3, "kind": "lost", "start_s": 0, "duration_s": 3600}])
    result = subprocess.run(roofwatch_cmd("doctor", "--backend", "nvml-virtual", "--scenario", str(path)),
                            capture_output=True, text=True, timeout=60, env=clean_env())
    assert result.returncode != 0, "a lost GPU is a failed check"
    lines = result.stdout.splitlines()
    lost = [i for i, line in enumerate(lines) if line.startswith("FAIL GPU [GPU 3]")]
    assert lost and "GPU is lost" in lines[lost[0]] and "XID 79" in "\n".join(lines[lost[0]:lost[0] + 3])
    assert [line for line in lines if line.startswith("ok   GPM [")] == [
        "ok   GPM [GPUs 0-2, 4-7]: supported (two-sample read succeeded)"], "the other seven are checked as usual"


def _when_gpu_up(agent: AgentProcess, gpu: str, value: float, timeout: float) -> str:
    """The first exposition in which ``roofwatch_gpu_up`` of ``gpu`` is ``value``."""
    return poll(lambda: (t := agent.metrics()) and gauge_values(t, "roofwatch_gpu_up").get(gpu) == value and t,
                timeout, what=f"roofwatch_gpu_up of GPU {gpu} at {value}")
