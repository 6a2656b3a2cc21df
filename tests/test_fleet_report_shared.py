"""The fleet report and the namespace rules bill shared GPUs by holder share, over a real Prometheus scraping a real
agent running ``--scenario shared`` (issue 47).

The scenario (agent/virtual/scenarios/shared.yaml) time-slices GPU 0 between three pods of three namespaces
(``ml/trainer-0``, ``research/notebook`` holding 20 GiB and idle, ``vision/augment``), gives GPU 2 to two pods of
``inference`` through one DRA claim, and runs four MPS client processes (no pod) on GPU 1, beside MIG instances and
whole GPUs that no pod holds. The bill's rule (docs/attribution.md, "The bill"): every holder the agent names on a
shared GPU holds an equal share of it, so by hand, at every instant:

* ``ml``, ``research`` and ``vision`` each hold 1/3 of GPU 0; ``inference`` holds 1/2 + 1/2 = 1 GPU;
* the notebook's third is idle-allocated (``idle_held``) once its own window says so, whatever GPU 0 does;
* the MPS clients, with no pod, are in no namespace;
* each namespace's kWh is its holders' estimated energy: what the agent's own per-holder counters grew by
  between Prometheus's first scrape and the end of the report's period.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.agent_process import AgentProcess, clean_env, poll
from tests.fleet_stores import run_report
from tests.prometheus_server import PrometheusServer

pytestmark = pytest.mark.slow

RULES = Path(__file__).resolve().parent.parent / "deploy" / "prometheus" / "roofwatch-rules.yml"
STEP_S = 60  # the report's step over its shortest period (10m): agent/views/fleet_report/window.py
POINT_H = STEP_S / 3600
JSON_ROUNDING = 1e-6  # the --json data rounds hours to 6 decimals (agent/views/fleet_report/data.py)
DEVICES = 10  # GPUs 0-2 and 4-7, and GPU 3's three MIG instances: each has its one class series
NAMESPACE_OF_HOLDER = {"ml/trainer-0/main": "ml", "research/notebook/main": "research",
                       "vision/augment/main": "vision", "inference/chat-a/main": "inference",
                       "inference/chat-b/main": "inference"}


def holder_energy(text: str) -> dict[str, float]:
    """Joules per namespace from the agent's own per-holder counters in one scrape."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "roofwatch_gpu_holder_energy_joules_total" and s.labels["holder"] in NAMESPACE_OF_HOLDER:
                ns = NAMESPACE_OF_HOLDER[s.labels["holder"]]
                out[ns] = out.get(ns, 0.0) + s.value
    return out


@pytest.fixture(scope="module")
def billed(tmp_path_factory):
    work: Path = tmp_path_factory.mktemp("shared-bill")
    agent = AgentProcess("demo", "--listen", "127.0.0.1:0", "--backend", "nvml-virtual", "--scenario", "shared",
                         env=clean_env())
    prometheus = None
    try:
        agent.wait_healthy(60)
        prometheus = PrometheusServer(work, [agent.url.removeprefix("http://").rstrip("/")], rule_files=[RULES])
        poll(lambda: prometheus.query("roofwatch_gpu_holder_energy_joules_total"), timeout=60, interval=0.2,
             what="Prometheus's first scrape of the holders")
        first_scraped = holder_energy(agent.metrics())
        poll(lambda: prometheus.query('roofwatch_gpu_holder_class{class="idle_held"}'), timeout=120, interval=0.5,
             what="the idle notebook's own idle_held in Prometheus")
        first_idle = time.time()
        energy_a, at_a = holder_energy(agent.metrics()), time.time()
        # Two report points (whole minutes) after the notebook was idle_held, and one second for the last scrape.
        end = (int(first_idle) // STEP_S + 2) * STEP_S
        poll(lambda: time.time() > end + 2, timeout=200, interval=0.5, what="the report's last point")
        rules = {(r["metric"].get("namespace"), r["metric"].get("waste")): float(r["value"][1])
                 for r in prometheus.api("query", query="roofwatch_namespace:gpus_by_waste:sum", time=str(end))["result"]}
        energy_b, at_b = holder_energy(agent.metrics()), time.time()
        done, data = run_report(prometheus.base, work, end=end, range_="10m")
        assert done.returncode == 0, done.stderr
        watts = {ns: (energy_b[ns] - energy_a[ns]) / (at_b - at_a) for ns in energy_b}
        grown = {ns: energy_b[ns] - watts[ns] * (at_b - end) - first_scraped[ns] for ns in energy_b}
        yield data, rules, grown, (work / "fleet.html").read_text()
    finally:
        if prometheus is not None:
            log = prometheus.stop()
            assert "error" not in log.lower(), log[-2000:]
        agent.kill()


def namespaces(data: dict) -> dict[str, dict]:
    return {row["namespace"]: row for row in data["namespaces"]}


def test_the_namespace_rule_counts_each_holder_share_with_its_own_waste(billed) -> None:
    _, rules, _, _ = billed
    assert rules == pytest.approx({("ml", "none"): 1 / 3, ("research", "idle_held"): 1 / 3, ("vision", "none"): 1 / 3,
                                   ("inference", "none"): 1.0}, rel=1e-9)


def test_the_report_bills_each_namespace_its_share_of_the_shared_gpus(billed) -> None:
    data, _, _, _ = billed
    rows = namespaces(data)
    assert set(rows) == {"ml", "research", "vision", "inference"}, "the MPS clients have no pod: no namespace"
    points = round(rows["ml"]["total_hours"] * 3 / POINT_H)
    assert points >= 2, rows["ml"]
    third = points * POINT_H / 3
    for ns in ("ml", "research", "vision"):
        assert rows[ns]["total_hours"] == pytest.approx(third, abs=JSON_ROUNDING), ns
    assert rows["inference"]["total_hours"] == pytest.approx(3 * third, abs=JSON_ROUNDING), "two halves of GPU 2"
    gpu_hours = sum(row["total_hours"] for row in data["clusters"])
    assert gpu_hours == pytest.approx(DEVICES * points * POINT_H, abs=JSON_ROUNDING), "10 devices at every point"
    for ns in ("ml", "vision", "inference"):
        assert rows[ns]["wasted_hours"] == 0, f"{ns}: its GPU's verdict wastes nothing"
    research = rows["research"]
    assert research["idle_allocated_hours"] == research["wasted_hours"]
    assert research["idle_allocated_hours"] >= third - POINT_H / 3 - JSON_ROUNDING, \
        "the notebook's third is idle-allocated at every point after its own window said so"
    assert research["wasted_cost_usd"] == pytest.approx(research["idle_allocated_hours"] * 2.0, abs=1e-4), \
        "at the default $2 per GPU-hour"


def test_the_report_bills_each_namespace_its_holders_energy(billed) -> None:
    data, _, grown, _ = billed
    rows = namespaces(data)
    # The holders' counters start with the agent, inside the 10-minute period: the period's increase is what they
    # grew by from Prometheus's first scrape to the period's end (read from the agent's own exposition, the end
    # interpolated at the holders' steady power).
    for ns, joules in grown.items():
        assert rows[ns]["kwh"] == pytest.approx(joules / 3.6e6, rel=0.03), ns
    assert rows["research"]["kwh"] < rows["vision"]["kwh"] / 5, "the idle notebook gets only the idle floor's third"
    assert all(rows[ns]["mfu"] is None for ns in rows), "MFU only over whole GPUs: every namespace here shares"
    assert not [p for p in data["problems"] if "namespace" in p["section"]], data["problems"]


def test_the_page_states_the_shared_gpus_rule(billed) -> None:
    _, _, _, html = billed
    assert 'id="shared-rule"' in html and "equal share for each holder" in html
    assert "<th>kWh</th>" in html
    embedded = json.loads(html.split('id="fleet-data">', 1)[1].split("</script>", 1)[0])
    assert {row["namespace"] for row in embedded["namespaces"]} == {"ml", "research", "vision", "inference"}
