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
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests import shared_bill
from tests.shared_bill import JSON_ROUNDING, POINT_H, kwh_within

pytestmark = pytest.mark.slow

RULES = Path(__file__).resolve().parent.parent / "deploy" / "prometheus" / "roofwatch-rules.yml"
DEVICES = 10  # GPUs 0-2 and 4-7, and GPU 3's three MIG instances: each has its one class series
NAMESPACE_OF_HOLDER = {"ml/trainer-0/main": "ml", "research/notebook/main": "research",
                       "vision/augment/main": "vision", "inference/chat-a/main": "inference",
                       "inference/chat-b/main": "inference"}


BOARDS = "(every board)"
"""The key of the node's whole energy: every device's counter and each MIG GPU's remainder (no namespace is named so)."""


def holder_energy(text: str) -> dict[str, float]:
    """Joules per namespace from the agent's own per-holder counters in one scrape, and the node's whole energy."""
    out: dict[str, float] = {BOARDS: 0.0}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "roofwatch_gpu_holder_energy_joules_total" and s.labels["holder"] in NAMESPACE_OF_HOLDER:
                ns = NAMESPACE_OF_HOLDER[s.labels["holder"]]
                out[ns] = out.get(ns, 0.0) + s.value
            if s.name in ("roofwatch_gpu_energy_joules_total", "roofwatch_gpu_mig_unattributed_energy_joules_total"):
                out[BOARDS] += s.value
    return out


def namespace_rule(prometheus, end: int) -> dict[tuple[str, str], float]:
    """The namespace recording rule at the report's end, per (namespace, waste)."""
    return {(r["metric"].get("namespace"), r["metric"].get("waste")): float(r["value"][1])
            for r in prometheus.api("query", query="roofwatch_namespace:gpus_by_waste:sum", time=str(end))["result"]}


@pytest.fixture(scope="module")
def billed(tmp_path_factory):
    with shared_bill.billed(tmp_path_factory.mktemp("shared-bill"), (), holder_energy, rule_files=(RULES,),
                            at_end=namespace_rule) as bill:
        yield bill.data, bill.at_end, bill.grown, bill.html, bill.watts


def namespaces(data: dict) -> dict[str, dict]:
    return {row["namespace"]: row for row in data["namespaces"]}


def test_the_namespace_rule_counts_each_holder_share_with_its_own_waste(billed) -> None:
    _, rules, *_ = billed
    assert rules == pytest.approx({("ml", "none"): 1 / 3, ("research", "idle_held"): 1 / 3, ("vision", "none"): 1 / 3,
                                   ("inference", "none"): 1.0}, rel=1e-9)


def test_the_report_bills_each_namespace_its_share_of_the_shared_gpus(billed) -> None:
    data, *_ = billed
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
    data, _, grown, _, watts = billed
    rows = namespaces(data)
    # The holders' counters start with the agent, inside the 10-minute period: the period's increase is what they
    # grew by from Prometheus's first scrape to the period's end (read from the agent's own exposition, the end
    # interpolated at the holders' steady power).
    for ns, joules in grown.items():
        if ns != BOARDS:
            assert rows[ns]["kwh"] == kwh_within(joules, watts[ns]), ns
    assert rows["research"]["kwh"] < rows["vision"]["kwh"] / 5, "the idle notebook gets only the idle floor's third"
    assert all(rows[ns]["mfu"] is None for ns in rows), "MFU only over whole GPUs: every namespace here shares"
    assert not [p for p in data["problems"] if "namespace" in p["section"]], data["problems"]


def test_the_report_counts_every_board_whole_mig_gpus_with_their_remainder(billed) -> None:
    """The report's energy is every device's counter plus each MIG GPU's remainder: the MIG GPU (GPU 3, three
    instances, slices in no instance) counts whole, as its board's counter does (docs/attribution.md, "MIG")."""
    data, _, grown, *_ = billed
    assert data["energy"]["kwh"] == pytest.approx(grown[BOARDS] / 3.6e6, rel=0.03)


def test_the_page_states_the_shared_gpus_rule(billed) -> None:
    _, _, _, html, _ = billed
    assert 'id="shared-rule"' in html and "equal share for each holder" in html
    assert "<th>kWh</th>" in html
    embedded = json.loads(html.split('id="fleet-data">', 1)[1].split("</script>", 1)[0])
    assert {row["namespace"] for row in embedded["namespaces"]} == {"ml", "research", "vision", "inference"}
