"""dcgm-exporter as a source in the real agent: ``roofwatch demo`` and ``roofwatch run`` as child
processes reading a stand-in exporter over HTTP (fixtures in the real exporter's format), and the
NVML backend over the fake driver joined to an exporter whose UUIDs match its GPUs."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from agent.virtual.devices import device_uuid
from tests.agent_process import AgentProcess, clean_env, http_get, poll, roofwatch_cmd
from tests.dcgm_exporter_server import FakeExporter, fixture, replace_uuids
from tests.prometheus_server import free_port

pytestmark = pytest.mark.slow

FAST = {  # read the exporter often and classify over short windows, so a test takes seconds
    "ROOFWATCH_DCGM_EXPORTER_INTERVAL_S": "0.2", "ROOFWATCH_CLASSIFIER__WINDOW_S": "2",
    "ROOFWATCH_CLASSIFIER__LONG_WINDOW_S": "4", "ROOFWATCH_CLASSIFIER__EVALUATE_EVERY_S": "0.5",
}


def snapshot(url: str) -> dict:
    status, body = http_get(url + "api/v1/snapshot")
    assert status == 200
    return json.loads(body)


def devices(url: str) -> dict[str, dict]:
    return {d["info"]["gpu"]: d for d in snapshot(url)["devices"]}


def family(text: str, name: str) -> dict[str, dict]:
    """gpu -> labels and value of one family's samples."""
    for fam in text_string_to_metric_families(text):
        if fam.name == name:
            return {s.labels["gpu"]: {**s.labels, "value": s.value} for s in fam.samples}
    return {}


def classes(url: str) -> dict[str, str]:
    return {d["gpu"]: d["class"] for d in snapshot(url)["verdicts"]}


def test_demo_reads_the_exporter_gives_verdicts_and_marks_gpus_down_while_it_is_gone():
    with FakeExporter(fixture("a100-8x-pods.prom")) as exporter:
        agent = AgentProcess("demo", "--backend", "dcgm-exporter", "--dcgm-exporter-url", exporter.url,
                             "--listen", "127.0.0.1:0", "--interval", "0.2", env=clean_env(**FAST))
        try:
            agent.wait_healthy()
            verdicts = poll(lambda: (c := classes(agent.url)) and len(c) == 8 and "unknown" not in c.values() and c,
                            30, what="a verdict for each of the 8 GPUs")
            assert verdicts["7"] == "idle", "GPU 7 draws 61 W with every engine at 0"
            metrics = agent.metrics()
            up = family(metrics, "roofwatch_gpu_up")
            assert {g: s["value"] for g, s in up.items()} == {str(i): 1.0 for i in range(8)}
            assert {s["node"] for s in up.values()} == {"dgx-a100-017"}, "node from the exporter's Hostname label"
            sm = family(metrics, "roofwatch_gpu_sm_active_ratio")
            assert sm["0"]["value"] == 0.913 and sm["6"]["value"] == 0.352
            pods = family(metrics, "roofwatch_gpu_pod_info")
            assert pods["6"]["pod"] == "triton-llama-7b-5f7c9d8b6-x2kqp" and pods["6"]["namespace"] == "inference"

            exporter.stop()

            def refused() -> dict | None:
                # A read in flight when the server stopped may first fail otherwise (reset, cut short):
                # what the test waits for is the state once the exporter is gone, every GPU down as refused.
                d = devices(agent.url)
                gone = d and all(not x["up"] and "connection refused" in (x["error"] or "") for x in d.values())
                return d if gone else None

            down = poll(refused, 20, what="every GPU down as refused while the exporter is gone")
            assert all(exporter.url in x["error"] for x in down.values()), [x["error"] for x in down.values()]
            assert agent.get("metrics")[0] == 200, "the agent keeps serving"

            exporter.start()
            poll(lambda: all(x["up"] for x in devices(agent.url).values()), 20, what="every GPU up again")
        finally:
            agent.kill()


def test_run_reads_mig_instances_and_leaves_what_the_exporter_lacks_absent():
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    with FakeExporter(fixture("h100-8x-mig.prom")) as exporter:
        proc = subprocess.Popen(roofwatch_cmd("run", "--backend", "dcgm-exporter", "--dcgm-exporter-url", exporter.url,
                                              "--listen", f"127.0.0.1:{port}", "--interval", "0.2"),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env(**FAST))
        try:
            expected = ["0/1", "0/2", *(f"1/{gi}" for gi in range(7, 14)), "2", "3", "4", "5", "6", "7"]
            poll(lambda: http_get(url + "healthz")[0] == 200, 30, what="/healthz")
            verdicts = poll(lambda: (c := classes(url)) and sorted(c) == sorted(expected)
                            and "unknown" not in c.values() and c, 30, what="a verdict for every GPU and instance")
            assert verdicts["7"] == "idle"
            metrics = http_get(url + "metrics")[1].decode()
            info = family(metrics, "roofwatch_gpu_info")
            assert info["0/1"]["model"] == "NVIDIA H100 80GB HBM3 MIG 3g.40gb"
            memory = family(metrics, "roofwatch_gpu_memory_used_bytes")
            assert "0/1" not in memory and "1/7" not in memory, "no FB series for MIG instances: absent, not 0"
            assert memory["2"]["value"] == 77120 * 1024 * 1024
            power = family(metrics, "roofwatch_gpu_power_watts")
            assert power["4"]["value"] == 432.9 and "0/1" not in power
        finally:
            proc.terminate()
            proc.communicate(timeout=15)
    assert proc.returncode == 0


def test_demo_without_a_url_names_the_setting():
    result = subprocess.run(roofwatch_cmd("demo", "--backend", "dcgm-exporter", "--listen", "127.0.0.1:0"),
                            capture_output=True, text=True, timeout=60, env=clean_env())
    assert result.returncode == 1
    assert "set dcgm_exporter_url (--dcgm-exporter-url URL, ROOFWATCH_DCGM_EXPORTER_URL)" in result.stderr


@pytest.fixture
def a100_scenario(tmp_path: Path) -> Path:
    """An 8 x A100 node for the fake NVML: pre-Hopper, so NVML alone reads no SM or tensor activity."""
    path = tmp_path / "a100.yaml"
    path.write_text(yaml.safe_dump({"name": "a100-join", "seed": 5, "nodes": [{
        "name": "dgx-a100-017", "model": "a100-sxm-80gb", "gpus": 8, "workloads": [
            {"job": "train", "gpus": [0, 1, 2, 3, 4, 5], "phases": [{"kind": "compute", "mfu": 0.45, "duration_s": 3600}]},
        ]}]}))
    return path


def test_nvml_joined_with_the_exporter_fills_the_profiling_counters_nvml_lacks(a100_scenario):
    uuids = {str(i): device_uuid(5, "dgx-a100-017", i, "nvidia") for i in range(8)}
    body = replace_uuids(fixture("a100-8x-pods.prom"), {k: v for k, v in uuids.items() if k != "7"})
    with FakeExporter(body) as exporter:
        with FakeExporter(fixture("a100-8x-pods.prom")) as unmatched:
            plain = AgentProcess("demo", "--backend", "nvml-virtual", "--scenario", str(a100_scenario),
                                 "--dcgm-exporter-url", unmatched.url, "--listen", "127.0.0.1:0", "--interval", "0.2",
                                 env=clean_env(**FAST))
            try:
                plain.wait_healthy()
                alone = devices(plain.url)["0"]["sample"]
            finally:
                plain.kill()
        assert alone["sm_active"] is None and alone["tensor_active"] is None, "pre-Hopper NVML: no profiling"
        agent = AgentProcess("demo", "--backend", "nvml-virtual", "--scenario", str(a100_scenario),
                             "--dcgm-exporter-url", exporter.url, "--listen", "127.0.0.1:0", "--interval", "0.2",
                             env=clean_env(**FAST))
        try:
            agent.wait_healthy()
            joined = poll(lambda: (d := devices(agent.url)) and d["0"]["sample"] and d["0"]["sample"]["sm_active"]
                          is not None and d, 20, what="GPU 0 joined")
            for gpu in map(str, range(7)):
                sample = joined[gpu]["sample"]
                assert sample["uuid"] == uuids[gpu]
                for name, metric in (("sm_active", "DCGM_FI_PROF_SM_ACTIVE"), ("tensor_active",
                                     "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"), ("dram_active", "DCGM_FI_PROF_DRAM_ACTIVE"),
                                     ("gr_active", "DCGM_FI_PROF_GR_ENGINE_ACTIVE"),
                                     ("sm_occupancy", "DCGM_FI_PROF_SM_OCCUPANCY")):
                    expected = float(next(line.rsplit(" ", 1)[1] for line in body.splitlines()
                                          if line.startswith(metric + f'{{gpu="{gpu}",')))
                    assert sample[name] == expected, f"GPU {gpu} {name}"
                theirs = float(next(line.rsplit(" ", 1)[1] for line in body.splitlines()
                                    if line.startswith(f'DCGM_FI_DEV_POWER_USAGE{{gpu="{gpu}",')))
                assert sample["power_w"] is not None and sample["power_w"] != theirs, "NVML's own power wins"
            assert joined["7"]["sample"]["sm_active"] is None, "GPU 7's UUID is not the exporter's: NVML alone"
        finally:
            agent.kill()
