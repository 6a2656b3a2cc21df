"""A workload report beside dcgm-exporter gives MFU on GPUs whose model has a known peak (issue 46 item 5).

A real ``roofwatch run --backend dcgm-exporter`` process, started before its exporter (the DaemonSet order the
issue names), takes a job's report over HTTP while it waits, and another over its unix socket once it reads; the
exporter is the A100 node under dcgm-exporter 4.10's names and the H100 node of the MIG fixture. Each reported
GPU's ``roofwatch_gpu_mfu_ratio{source="workload"}`` is tokens/s x FLOPs/token over the datasheet's dense BF16
peak (A100 SXM4 312 TFLOPS, H100 SXM5 989.4 TFLOPS), and its verdict says the MFU came from the workload.
Before, the agent exited at start while the exporter did not answer ("connection refused"), and a job's report
never reached an MFU.
"""

from __future__ import annotations

import json

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.agent_process import poll
from tests.dcgm_exporter_server import FakeExporter, fixture
from tests.report_fixtures import http_post, short_dir, unix_post  # noqa: F401 (short_dir: a fixture)
from tests.neighbour_agent import Agent, free_port

pytestmark = pytest.mark.slow

JSON = {"Content-Type": "application/json"}
TOKENS_PER_S, FLOPS_PER_TOKEN = 2000.0, 3.0e10
NODES = {
    "A100, dcgm-exporter 4.10 names": ("a100-8x-pods.exporter-4.10.prom", "7", "2", 312e12),
    "H100 (MIG node), old names": ("h100-8x-mig.prom", "3", "4", 989.4e12),
}


def workload_mfu(metrics: str) -> dict[str, float]:
    return {s.labels["gpu"]: s.value for family in text_string_to_metric_families(metrics) for s in family.samples
            if s.name == "roofwatch_gpu_mfu_ratio" and s.labels.get("source") == "workload"}


@pytest.mark.parametrize("node", NODES)
def test_reports_over_http_and_the_socket_give_workload_mfu_on_known_peaks(node, tmp_path, short_dir):  # noqa: F811
    name, http_gpu, socket_gpu, peak = NODES[node]
    exporter_port = free_port()
    sock = short_dir / "report.sock"
    agent = Agent(tmp_path, "run", "--backend", "dcgm-exporter", "--dcgm-exporter-url",
                  f"http://127.0.0.1:{exporter_port}/metrics", ROOFWATCH_DCGM_EXPORTER_INTERVAL_S="0.5",
                  ROOFWATCH_REPORT_SOCKET=str(sock), ROOFWATCH_CLASSIFIER__WINDOW_S="2",
                  ROOFWATCH_CLASSIFIER__LONG_WINDOW_S="4", ROOFWATCH_CLASSIFIER__EVALUATE_EVERY_S="0.5")
    report = {"tokens_per_s": TOKENS_PER_S, "flops_per_token": FLOPS_PER_TOKEN, "dtype": "bf16"}
    exporter = None
    try:
        waiting = poll(lambda: (r := agent.get("readyz"))[0] == 503 and r, 30, what="the agent waiting")
        assert waiting[1].startswith("not ready: waiting for dcgm-exporter at"), waiting
        status, _, answer = http_post(agent.port, json.dumps({**report, "gpu": http_gpu, "job": "train-http"}).encode(),
                                      JSON)
        assert status == 204, answer  # taken while the agent waits: it cannot tell yet which GPUs are there
        exporter = FakeExporter(fixture(name), port=exporter_port)

        def mfu() -> dict[str, float] | None:
            http_post(agent.port, json.dumps({**report, "gpu": http_gpu, "job": "train-http"}).encode(), JSON)
            unix_post(sock, json.dumps({**report, "gpu": socket_gpu, "job": "train-socket"}).encode(), JSON)
            found = workload_mfu(agent.get("metrics")[1])
            return found if {http_gpu, socket_gpu} <= set(found) else None

        found = poll(mfu, 60, interval=0.3, what="the reported MFU of both GPUs")
        verdicts = {v["gpu"]: v for v in agent.snapshot()["verdicts"]}
        metrics = agent.get("metrics")[1]
    finally:
        if exporter is not None:
            exporter.stop()
        agent.finish()
    expected = TOKENS_PER_S * FLOPS_PER_TOKEN / peak
    assert found[http_gpu] == pytest.approx(expected, rel=1e-6), (found, expected)
    assert found[socket_gpu] == pytest.approx(expected, rel=1e-6), (found, expected)
    assert set(found) == {http_gpu, socket_gpu}, "no other GPU was reported on"
    for gpu, job in ((http_gpu, "train-http"), (socket_gpu, "train-socket")):
        assert verdicts[gpu]["job"] == job and verdicts[gpu]["mfu_workload"] == pytest.approx(expected, abs=1e-4)
        assert f'roofwatch_gpu_job_info{{gpu="{gpu}",job_id="{job}"' in metrics
