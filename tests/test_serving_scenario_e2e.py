"""The agent as a real process on the built-in ``serving`` scenario, read as a user would read it.

``roofwatch demo --scenario serving`` starts a fake vLLM, SGLang or TGI endpoint per serving job and
scrapes it over HTTP; each server's floor, time per output token over the floor, prefill share and
state with its advice code must then be in ``/api/v1/snapshot`` and ``/metrics``. The expected
numbers are computed from published figures in tests/serving_scenario_expectations.py, not by the
code under test. The agent scrapes its servers every 0.5 s; the test polls, never sleeps.
"""

from __future__ import annotations

import json
import re
from typing import Any, Iterator

import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.agent_process import AgentProcess, clean_env, http_get, poll
from tests.serving_scenario_expectations import H100_SXM_BANDWIDTH, REQUIRED, expected_servers

EXPECTED = expected_servers()


@pytest.fixture(scope="module")
def agent() -> Iterator[AgentProcess]:
    agent = AgentProcess("demo", "--listen", "127.0.0.1:0", "--scenario", "serving", "--interval", "0.5",
                         env=clean_env(ROOFWATCH_INFERENCE_INTERVAL_S="0.5"))
    try:
        agent.wait_healthy()
        yield agent
    finally:
        agent.kill()


def serving_views(agent: AgentProcess) -> dict[str, dict[str, Any]]:
    status, body = agent.get("api/v1/snapshot")
    assert status == 200
    return {v["gpu"]: v["serving"] for v in json.loads(body)["verdicts"] if v.get("serving")}


@pytest.fixture(scope="module")
def settled(agent: AgentProcess) -> dict[str, dict[str, Any]]:
    """The serving views once every server has reached the state its figures put it in."""
    def ready() -> dict[str, dict[str, Any]] | None:
        views = serving_views(agent)
        states = {g: views.get(g, {}).get("state") for e in EXPECTED.values() for g in e.gpus}
        return views if all(states[g] == e.state for e in EXPECTED.values() for g in e.gpus) else None

    return poll(ready, 60, interval=0.2, what="every serving GPU in its expected state")


def per_gpu(text: str, name: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name:
                out.setdefault(s.labels["gpu"], []).append((s.labels, s.value))
    return out


def assert_prefill_share(value: float, e, abs: float) -> None:
    """Exact where the server times prefill and decode (vLLM, TGI, SGLang's device timer). SGLang without it times
    prefill forwards only, and the scraper divides them by the wall time between its scrapes, which moves with
    when each scrape ran: below the prefill-heavy line is all that can be promised."""
    if e.prefill_share_exact:
        assert value == pytest.approx(e.prefill_share, abs=abs)
    else:
        assert 0.0 < value < 0.4


def test_the_four_servers_the_issue_asks_for_are_there() -> None:
    states = {EXPECTED[job].state for job in REQUIRED}
    assert states == {"at_floor", "under_batched", "prefill_heavy", "kv_saturated"}
    assert {EXPECTED[job].server for job in REQUIRED} == {"vllm", "sglang", "tgi"}


@pytest.mark.slow
@pytest.mark.parametrize("job", sorted(EXPECTED))
def test_snapshot_shows_each_servers_floor_ratio_prefill_share_and_state(settled, job: str) -> None:
    e = EXPECTED[job]
    for gpu in e.gpus:
        view = settled[gpu]
        assert (view["server"], view["state"], view["advice_code"]) == (job, e.state, e.advice)
        assert view["model"] == e.model  # TGI exports none: the endpoint's configured model names it
        assert view["floor_s"] == pytest.approx(e.floor_s, abs=1e-6)  # rounded to the microsecond in JSON
        assert view["floor_ratio"] == pytest.approx(e.ratio, abs=1e-3)
        assert_prefill_share(view["prefill_share"], e, abs=1e-3)
        assert view["weight_bytes"] == pytest.approx(e.weight_bytes, rel=1e-3) and view["gpus"] == len(e.gpus)
        assert view["kv_usage"] == pytest.approx(e.kv_usage, abs=1e-3) and view["kv_bytes_estimated"] is False
        assert view["batch"] == e.phase["running"] and view["waiting"] == e.phase.get("waiting", 0)


@pytest.mark.slow
def test_the_advice_names_the_numbers_that_decided_it(settled) -> None:
    under = settled[EXPECTED["batch-capped-8b"].gpus[0]]["advice"]
    assert "max_num_seqs" in under and "24 requests waiting" in under
    assert "40 requests waiting" in settled[EXPECTED["chat-70b"].gpus[0]]["advice"]
    assert "93% full" in settled[EXPECTED["chat-70b"].gpus[0]]["advice"]
    assert "55%" in settled[EXPECTED["rag-7b"].gpus[0]]["advice"]


@pytest.mark.slow
@pytest.mark.parametrize("job", sorted(EXPECTED))
def test_metrics_export_each_servers_figures_at_full_precision(agent: AgentProcess, settled, job: str) -> None:
    e = EXPECTED[job]
    text = agent.metrics()
    info = per_gpu(text, "roofwatch_serving_info")
    floor = per_gpu(text, "roofwatch_serving_decode_floor_seconds")
    ratio = per_gpu(text, "roofwatch_serving_tpot_floor_multiple")
    prefill = per_gpu(text, "roofwatch_serving_prefill_time_ratio")
    read = per_gpu(text, "roofwatch_serving_step_read_bytes")
    for gpu in e.gpus:
        labels = info[gpu][0][0]
        assert (labels["server"], labels["state"], labels["advice"]) == (job, e.state, e.advice)
        assert floor[gpu][0][1] == pytest.approx(e.floor_s, rel=1e-5)
        assert ratio[gpu][0][1] == pytest.approx(e.ratio, rel=1e-5)
        assert_prefill_share(prefill[gpu][0][1], e, abs=1e-9)
        bytes_read = {labels["kind"]: value for labels, value in read[gpu]}
        assert bytes_read["weights"] == pytest.approx(e.weight_bytes, rel=1e-3)
        assert bytes_read["kv_cache"] == pytest.approx(e.kv_usage * e.kv_pool_bytes, rel=1e-4)
        # every floor here is the memory one (even at batch 164 the 70B reads 20.6 ms, computes 5.8 ms)
        assert (bytes_read["weights"] + bytes_read["kv_cache"]) / (len(e.gpus) * H100_SXM_BANDWIDTH) == \
            pytest.approx(floor[gpu][0][1], rel=1e-9)


@pytest.mark.slow
def test_the_figures_came_over_http_from_one_fake_server_per_job(agent: AgentProcess, settled) -> None:
    """The agent listens on its own port and one port per serving job; each answers its server's dialect."""
    agent_port = int(agent.url.rstrip("/").rsplit(":", 1)[1])
    ports = {c.laddr.port for c in psutil.Process(agent.proc.pid).net_connections("tcp")
             if c.status == psutil.CONN_LISTEN} - {agent_port}
    assert len(ports) == len(EXPECTED)
    dialects = []
    for port in sorted(ports):
        status, body = http_get(f"http://127.0.0.1:{port}/metrics")
        assert status == 200
        names = {line.split("{")[0].split(" ")[0] for line in body.decode().splitlines() if not line.startswith("#")}
        prefixes = {re.split(r"[:_]", name, maxsplit=1)[0] for name in names} - {"process"}
        assert len(prefixes) == 1, prefixes
        dialects.append(prefixes.pop())
    assert sorted(dialects) == sorted(e.server for e in EXPECTED.values())
