"""End to end: three agents, one job across them with a slow rank, a real Prometheus with our rules.

Each agent is a separate process playing one node of the built-in ``fleet`` scenario. No agent
knows the others; only Prometheus, joining their series by job, can see that node-c's GPU 0 is
the straggler of ``pretrain-7b`` and that the job as a whole runs below the MFU target. The
shipped rules are loaded with their time windows shrunk (minutes become seconds) so the test
finishes in seconds; the expressions themselves are unchanged.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.agent_process import AgentProcess, poll
from tests.prometheus_server import PrometheusServer

pytestmark = pytest.mark.slow

RULES = Path(__file__).resolve().parent.parent / "deploy" / "prometheus" / "roofwatch-rules.yml"
NODES = ("node-a", "node-b", "node-c")
HEALTHY_NODES = {"node-a", "node-b"}
EXPECTED = {"LowMFU", "GpuJobStraggler", "GpuJobCommunicationJitter"}
"""Every alert the fleet scenario should raise: anything else is a false positive."""


def fast_rules(text: str) -> str:
    """The shipped rules on a seconds scale: range windows of 15 s, pending periods of 20 s.

    As in the shipped rules, an alert must hold for longer than its window, so the ragged
    start (a window with only a sample or two, agents sampling out of phase) cannot fire one.
    """
    text, windows = re.subn(r"\[\d+[mhd]\]", "[15s]", text)
    text, pendings = re.subn(r"for: \d+[mh]", "for: 20s", text)
    assert windows >= 5 and pendings >= 5, "rule file layout changed: update fast_rules"
    return text


def test_fast_rules_change_only_durations():
    original = RULES.read_text()
    fast = fast_rules(original)
    strip = lambda t: re.sub(r"\[\d+[smhd]\]|for: \d+[smh]", "", t)  # noqa: E731
    assert strip(fast) == strip(original)


def firing(alerts: list[dict]) -> list[dict]:
    return [a for a in alerts if a["state"] == "firing"]


def test_straggler_and_low_mfu_fire_across_three_agents_and_healthy_nodes_stay_quiet(tmp_path):
    rules = tmp_path / "rules.yml"
    rules.write_text(fast_rules(RULES.read_text()))
    agents = [AgentProcess("demo", "--listen", "127.0.0.1:0", "--scenario", "fleet", "--virtual-node", node)
              for node in NODES]
    prom = None
    try:
        for agent in agents:
            agent.wait_healthy()
        prom = PrometheusServer(tmp_path, [a.url.removeprefix("http://").rstrip("/") for a in agents],
                                rule_files=[rules])

        def straggler_and_low_mfu() -> list[dict] | None:
            active = firing(prom.alerts())
            names = {a["labels"]["alertname"] for a in active}
            return active if {"LowMFU", "GpuJobStraggler"} <= names else None

        active = poll(straggler_and_low_mfu, timeout=90, interval=0.5, what="LowMFU and GpuJobStraggler firing")

        stragglers = [a["labels"] for a in active if a["labels"]["alertname"] == "GpuJobStraggler"]
        assert [(s["node"], s["gpu"], s["job_id"]) for s in stragglers] == [("node-c", "0", "pretrain-7b")]
        low = [a["labels"] for a in active if a["labels"]["alertname"] == "LowMFU"]
        assert [(a["scope"], a["job_id"]) for a in low] == [("job", "pretrain-7b")]

        raised = firing(prom.alerts())
        assert {a["labels"]["alertname"] for a in raised} <= EXPECTED, raised
        on_healthy = [a["labels"] for a in raised if a["labels"].get("node") in HEALTHY_NODES]
        assert on_healthy == []
        assert not [a for a in raised if a["labels"].get("node") == "node-c" and a["labels"].get("gpu") != "0"]

        # The job-level numbers behind the verdicts: the job is low, its neighbours are not.
        job_mfu = {r["metric"]["job_id"]: float(r["value"][1]) for r in prom.query("roofwatch_job:gpu_mfu:avg")}
        assert job_mfu["pretrain-7b"] < 0.4
        assert job_mfu["finetune-a"] > 0.4 and job_mfu["finetune-c"] > 0.4
        assert {r["metric"]["node"] for r in prom.query('roofwatch_gpu_job_info{job_id="pretrain-7b"}')} == set(NODES)
    finally:
        log = prom.stop() if prom is not None else ""
        for agent in agents:
            agent.kill()
    assert "error" not in log.lower(), log
