"""The sidecar mode made whole: ``roofwatch run --backend dcgm-exporter`` beside NVIDIA's exporter is a
whole agent. On real captures (tests/fixtures/captures): the node's inference server is scraped, a
job's report is joined to its GPU (its job and MFU appear; a job's own report then stands for
that GPU's workload in place of the server's, as on every backend), and a GPU that a pod holds while nothing
runs on it is ``idle_held``, not capacity the scheduler could hand out.

Before, this mode ran no host context at all: no serving series, reports answered 204 and thrown
away, and the capture's pod-held GPUs 0 and 1 were called ``idle_free``.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.agent_process import clean_env, http_get, poll, roofwatch_cmd
from tests.dcgm_exporter_server import FakeExporter
from tests.prometheus_server import free_port
from tests.report_fixtures import http_post

pytestmark = pytest.mark.slow

CAPTURES = Path(__file__).parent / "fixtures" / "captures"
FAST = {"ROOFWATCH_DCGM_EXPORTER_INTERVAL_S": "0.2", "ROOFWATCH_INFERENCE_INTERVAL_S": "0.5",
        "ROOFWATCH_CLASSIFIER__WINDOW_S": "2", "ROOFWATCH_CLASSIFIER__LONG_WINDOW_S": "4",
        "ROOFWATCH_CLASSIFIER__EVALUATE_EVERY_S": "0.5"}
REPORT = {"gpu": "2", "job": "train-7", "tokens_per_s": 2000.0, "flops_per_token": 3.0e9, "dtype": "bf16"}


def capture(path: str) -> str:
    return (CAPTURES / path).read_text()


def samples(text: str, name: str) -> list[dict]:
    return [{**s.labels, "value": s.value} for fam in text_string_to_metric_families(text)
            for s in fam.samples if s.name == name]


def test_the_sidecar_scrapes_the_server_joins_the_report_and_calls_a_pod_held_idle_gpu_held(tmp_path):
    with FakeExporter(capture("dcgm-exporter/dcgm226-l40s-pods-excerpt.txt")) as exporter, \
            FakeExporter(capture("vllm/kops-qwen05b-v1-idle.txt")) as vllm:
        config = tmp_path / "roofwatch.yaml"
        config.write_text(yaml.safe_dump({"inference_endpoints": [
            {"url": vllm.url, "gpus": ["2"], "model_bytes": 1.0e9}]}))
        port = free_port()
        url = f"http://127.0.0.1:{port}/"
        agent = subprocess.Popen(roofwatch_cmd("run", "--backend", "dcgm-exporter", "--dcgm-exporter-url", exporter.url,
                                               "--listen", f"127.0.0.1:{port}", "--interval", "0.2", "--config", str(config)),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env(**FAST))
        try:
            poll(lambda: http_get(url + "healthz")[0] == 200, 30, what="/healthz")

            def verdicts():
                return {v["gpu"]: v for v in json.loads(http_get(url + "api/v1/snapshot")[1])["verdicts"]}

            before = poll(lambda: (v := verdicts()) and len(v) == 3 and all(x["class"] == "idle" for x in v.values()) and v,
                          30, what="an idle verdict for each of the capture's 3 L40S")
            serving = poll(lambda: samples(http_get(url + "metrics")[1].decode(), "roofwatch_serving_info"), 30,
                           what="the vLLM server's serving series")
            status, _, answer = http_post(port, json.dumps(REPORT).encode(), {"Content-Type": "application/json"})
            assert status == 204, answer
            metrics = poll(lambda: (m := http_get(url + "metrics")[1].decode()) and any(
                s["source"] == "workload" for s in samples(m, "roofwatch_gpu_mfu_ratio")) and m, 30,
                what="the reported job's MFU")
            after = poll(lambda: (v := verdicts()) and v["2"]["detail"] == "idle_held" and v, 30,
                         what="GPU 2 held by the reporting job")
        finally:
            agent.terminate()
            agent.communicate(timeout=15)
    for gpu in ("0", "1"):
        assert before[gpu]["detail"] == "idle_held", before[gpu]
        assert any("pod redacted/tensorflow-0" in r for r in before[gpu]["reasons"]), before[gpu]["reasons"]
    assert before["2"]["detail"] == "idle_free", "no pod holds GPU 2 in the capture, and no job has reported yet"
    assert any("job train-7" in r for r in after["2"]["reasons"]), after["2"]["reasons"]
    pods = {s["gpu"]: s["pod"] for s in samples(metrics, "roofwatch_gpu_pod_info")}
    assert pods == {"0": "tensorflow-0", "1": "tensorflow-0"}
    assert [(s["gpu"], s["server"].split()[0], s["model"]) for s in serving] == [("2", "vllm", "Qwen/Qwen2.5-0.5B-Instruct")]
    jobs = {s["gpu"]: s["job_id"] for s in samples(metrics, "roofwatch_gpu_job_info")}
    assert jobs.get("2") == "train-7", jobs
    sources = {s["source"].split()[0]: (s["state"], s["value"]) for s in samples(metrics, "roofwatch_source_up")}
    assert sources == {"dcgm-exporter": ("up", 1.0), "inference": ("up", 1.0)}
    mfu = [s for s in samples(metrics, "roofwatch_gpu_mfu_ratio") if s["source"] == "workload"]
    assert [s["gpu"] for s in mfu] == ["2"] and mfu[0]["value"] > 0, mfu


def test_what_the_l4_capture_does_not_say_is_absent_not_zero():
    """kops-l4.txt (a published L4 under dcgm-exporter's default CSV): no clock-event reasons field, and
    MEMORY_TEMP 0 because GDDR6 boards have no memory sensor. Before, /metrics said throttled 0,
    throttle="none" and a memory at 0 °C."""
    with FakeExporter(capture("dcgm-exporter/kops-l4.txt")) as exporter:
        port = free_port()
        url = f"http://127.0.0.1:{port}/"
        agent = subprocess.Popen(roofwatch_cmd("run", "--backend", "dcgm-exporter", "--dcgm-exporter-url", exporter.url,
                                               "--listen", f"127.0.0.1:{port}", "--interval", "0.2"),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env(**FAST))
        try:
            poll(lambda: http_get(url + "healthz")[0] == 200, 30, what="/healthz")
            metrics = poll(lambda: (m := http_get(url + "metrics")[1].decode()) and any(
                s["class"] != "unknown" for s in samples(m, "roofwatch_gpu_workload_reason_info")) and m, 30,
                what="a verdict for the L4")
        finally:
            agent.terminate()
            agent.communicate(timeout=15)
    (reason,) = samples(metrics, "roofwatch_gpu_workload_reason_info")
    assert reason["throttle"] == "unknown", reason
    assert samples(metrics, "roofwatch_gpu_throttled") == []
    assert [s["value"] for s in samples(metrics, "roofwatch_gpu_temperature_celsius")] == [31.0]
    assert samples(metrics, "roofwatch_gpu_memory_temperature_celsius") == []
