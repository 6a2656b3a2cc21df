"""A real Prometheus server scrapes two demo agents (one per node of the cluster scenario)."""

from __future__ import annotations

import pytest

from tests.agent_process import AgentProcess, poll
from tests.prometheus_server import PrometheusServer

pytestmark = pytest.mark.slow


def test_prometheus_scrapes_a_two_node_virtual_cluster(tmp_path):
    agents = [
        AgentProcess("demo", "--listen", "127.0.0.1:0", "--scenario", "cluster", "--virtual-node", node)
        for node in ("node-h100", "node-h200")
    ]
    prom = None
    try:
        targets = [a.url.removeprefix("http://").rstrip("/") for a in agents]
        prom = PrometheusServer(tmp_path, targets)
        # Prometheus 2.x applies targets on a 5 s tick: allow a while for the first samples.
        results = poll(lambda: (r := prom.query("roofwatch_gpu_up")) and len(r) == 16 and r, timeout=60,
                       what="16 GPUs scraped from two agents")
        nodes = {r["metric"]["node"] for r in results}
        assert nodes == {"node-h100", "node-h200"}
        assert all(r["value"][1] == "1" for r in results)
        health = prom.query('up{job="roofwatch"}')
        assert len(health) == 2 and all(r["value"][1] == "1" for r in health)
        models = {r["metric"]["model"] for r in prom.query("roofwatch_gpu_info")}
        assert len(models) == 2  # the cluster mixes two GPU models
        # A counter that Prometheus can rate: energy keeps growing between scrapes.
        poll(lambda: len(prom.query("rate(roofwatch_gpu_energy_joules_total[10s]) > 0")) == 16, timeout=60,
             what="positive energy rate on every GPU")
        # The catalogue peaks make roofline arithmetic possible in PromQL.
        achieved = prom.query('roofwatch_gpu_tensor_active_ratio * on(node,gpu,uuid) roofwatch_gpu_peak_flops{dtype="bf16"}')
        assert achieved and all(float(r["value"][1]) <= 989.4e12 for r in achieved)
    finally:
        if prom is not None:
            prom.stop()
        for agent in agents:
            agent.kill()
