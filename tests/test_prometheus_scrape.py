"""A real Prometheus server scrapes two demo agents (one per node of the cluster scenario)."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import urllib.parse

import pytest

from tests.agent_process import AgentProcess, http_get, poll

pytestmark = pytest.mark.e2e


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def query(base: str, promql: str) -> list[dict]:
    status, body = http_get(f"{base}/api/v1/query?query={urllib.parse.quote(promql)}")
    data = json.loads(body)
    assert status == 200 and data["status"] == "success", data
    return data["data"]["result"]


def test_prometheus_scrapes_a_two_node_virtual_cluster(tmp_path):
    prometheus = shutil.which("prometheus")
    assert prometheus, "the prometheus server is required (Debian package 'prometheus'; ./dev.sh test installs it)"
    agents = [
        AgentProcess("demo", "--listen", "127.0.0.1:0", "--scenario", "cluster", "--virtual-node", node)
        for node in ("node-h100", "node-h200")
    ]
    prom = None
    try:
        targets = [a.url.removeprefix("http://").rstrip("/") for a in agents]
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            "scrape_configs:\n"
            f"  - job_name: roofwatch\n    static_configs: [{{targets: {json.dumps(targets)}}}]\n"
        )
        port = free_port()
        prom = subprocess.Popen(
            [prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )
        base = f"http://127.0.0.1:{port}"
        poll(lambda: http_get(base + "/-/ready")[0] == 200, timeout=30, what="Prometheus ready")
        # Prometheus 2.x applies targets on a 5 s tick: allow a while for the first samples.
        results = poll(lambda: (r := query(base, "roofwatch_gpu_up")) and len(r) == 16 and r, timeout=60,
                       what="16 GPUs scraped from two agents")
        nodes = {r["metric"]["node"] for r in results}
        assert nodes == {"node-h100", "node-h200"}
        assert all(r["value"][1] == "1" for r in results)
        health = query(base, 'up{job="roofwatch"}')
        assert len(health) == 2 and all(r["value"][1] == "1" for r in health)
        models = {r["metric"]["model"] for r in query(base, "roofwatch_gpu_info")}
        assert len(models) == 2  # the cluster mixes two GPU models
        # A counter that Prometheus can rate: energy keeps growing between scrapes.
        poll(lambda: len(query(base, "rate(roofwatch_gpu_energy_joules_total[10s]) > 0")) == 16, timeout=60,
             what="positive energy rate on every GPU")
        # The catalogue peaks make roofline arithmetic possible in PromQL.
        achieved = query(base, 'roofwatch_gpu_tensor_active_ratio * on(node,gpu,uuid) roofwatch_gpu_peak_flops{dtype="bf16"}')
        assert achieved and all(float(r["value"][1]) <= 989.4e12 for r in achieved)
    finally:
        if prom is not None:
            prom.terminate()
            prom.communicate(timeout=20)
        for agent in agents:
            agent.kill()
