"""``roofwatch demo --scenario serving`` as a real process, read at once as a user would (issue 43, item 2).

The issue: the page said "Nothing wasted" and ``top`` said ``wasted 0/8`` while one server's KV cache
was full with 40 requests waiting, one was under-batched, one prefill-heavy and one at 4.2x its decode
floor; and the serving series only appeared one inference interval after the verdicts. Here the first
``/metrics`` read once the agent answers ``/healthz`` already names every server's state, the ``/`` page
lists the four servers under "Needs attention" with their figures and advice, and ``roofwatch top
--once`` (a second process reading the agent's ``/metrics``) lists the same four. The states the
scenario promises are in tests/serving_scenario_expectations.py, not taken from the code under test.
"""

from __future__ import annotations

import re
import subprocess
from html import unescape
from typing import Iterator

import pytest

from tests.agent_process import AgentProcess, clean_env, roofwatch_cmd
from tests.serving_scenario_expectations import STATES, expected_servers
from tests.top_exposition import series

pytestmark = pytest.mark.slow

NEEDS_A_KNOB = {"kv_saturated", "under_batched", "prefill_heavy", "above_floor"}
EXPECTED = expected_servers()


@pytest.fixture(scope="module")
def agent() -> Iterator[AgentProcess]:
    agent = AgentProcess("demo", "--listen", "127.0.0.1:0", "--scenario", "serving")  # the default 5 s scrapes
    try:
        agent.wait_healthy()
        yield agent
    finally:
        agent.kill()


@pytest.fixture(scope="module")
def first_metrics(agent: AgentProcess) -> str:
    """The first exposition read, before anything else asks the agent for one."""
    return agent.metrics()


def test_the_serving_series_are_there_from_the_first_scrape(first_metrics):
    states = {labels["gpu"]: (labels["server"], labels["state"], labels["advice"])
              for labels, _ in series(first_metrics, "roofwatch_serving_info")}
    expected = {gpu: (job, *STATES[job]) for job, e in EXPECTED.items() for gpu in e.gpus}
    assert states == expected
    for name in ("roofwatch_serving_tpot_floor_multiple", "roofwatch_serving_decode_floor_seconds",
                 "roofwatch_serving_kv_cache_usage_ratio", "roofwatch_serving_prefill_time_ratio"):
        assert {labels["gpu"] for labels, _ in series(first_metrics, name)} == set(expected), name
    wastes = {labels["gpu"]: labels["waste"] for labels, _ in series(first_metrics, "roofwatch_gpu_workload_reason_info")}
    assert set(wastes.values()) == {"none"}, "no GPU of the serving node is wasted"


def test_the_page_lists_the_servers_that_need_a_knob_turned(agent, first_metrics):
    status, body = agent.get("/")
    page = unescape(body.decode())
    assert status == 200 and "Nothing needs attention" not in page
    panel = re.search(r'<div class="attention" id="attention">(.*?)</div>', page, re.S).group(1)
    listed = dict(re.findall(r'<li data-server="([^"]+)" data-gpus="[^"]+" data-kind="serving" data-code="([^"]+)"', panel))
    assert listed == {job: state for job, (state, _) in STATES.items() if state in NEEDS_A_KNOB}
    assert re.search(r"chat-70b.*KV cache 9\d% full.*40 requests waiting.*what to do: add replicas \(scale out\)",
                     panel, re.S)
    assert re.search(r"tiny-1b.*4\.\dx its decode floor.*what to do: time goes outside the weight read", panel, re.S)
    assert 'id="wasted" data-count="0"' in page and 'id="attention-count" data-count="7"' in page


def test_top_lists_the_same_servers(agent, first_metrics):
    result = subprocess.run(roofwatch_cmd("top", agent.url, "--once"), capture_output=True, text=True, timeout=60,
                            env=clean_env(COLUMNS="220"))
    assert result.returncode == 0, result.stderr
    assert "wasted 0/8 (whole windows)" in result.stdout and "attention 7" in result.stdout
    needs = result.stdout.split("NEEDS ATTENTION", 1)[1].split("\nSERVING", 1)[0]  # the serving table follows
    listed = {line.split()[0] for line in needs.splitlines() if line.strip()}
    assert listed == {job for job, (state, _) in STATES.items() if state in NEEDS_A_KNOB}
    assert re.search(r"^chat-70b \(GPUs 3,4,5,6\) .*KV cache 9\d% full.*40 requests waiting: add replicas", needs, re.M)
