"""The fleet report bills users and Slurm accounts for whole and shared GPUs, over a real Prometheus scraping a real
agent playing the ``shared`` scenario's ``slurm-node`` (issue 47, items 1, 3 and 5).

The node (agent/virtual/scenarios/shared.yaml) is two H100s. GPU 0 is shared by two Slurm jobs: 5101 of alice,
account physics, training and reporting 40% MFU of its own; 5102 of bob, account chem, holding 20 GiB and running
nothing. GPU 1 is carol's (account bio) whole. By the bill's rule (docs/attribution.md, "The bill"), by hand, at
every report point:

* alice/physics and bob/chem each hold 1/2 of GPU 0; carol/bio holds all of GPU 1;
* bob's half is idle-allocated once his own window says so, while GPU 0 is busy;
* alice's busy MFU is her own report's, 0.4 exactly; the shared GPU's own MFU is no one's;
* each user's kWh is what the agent's own counters grew by over the period: alice's and bob's holder counters,
  carol's GPU's energy counter;
* H100 GPU-hours cost $1.5 (``--cost-per-gpu-hour``).
"""

from __future__ import annotations

import json

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests import shared_bill
from tests.shared_bill import JSON_ROUNDING, POINT_H, kwh_within

pytestmark = pytest.mark.slow

PRICE = 1.5
USERS = {"alice": "physics", "bob": "chem", "carol": "bio"}
COUNTERS = {("roofwatch_gpu_holder_energy_joules_total", "holder", "job:5101"): "alice",
            ("roofwatch_gpu_holder_energy_joules_total", "holder", "job:5102"): "bob",
            ("roofwatch_gpu_energy_joules_total", "gpu", "1"): "carol"}
"""The counter each user's kWh comes from, named from the scenario, not from the report's code."""


def energy_by_user(text: str) -> dict[str, float]:
    """Joules per user from the agent's own counters in one scrape."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            for (name, label, value), user in COUNTERS.items():
                if s.name == name and s.labels.get(label) == value:
                    out[user] = s.value
    return out


@pytest.fixture(scope="module")
def billed(tmp_path_factory):
    with shared_bill.billed(tmp_path_factory.mktemp("slurm-bill"), ("--virtual-node", "slurm-node"), energy_by_user,
                            report_args=("--cost-per-gpu-hour", f"h100-sxm={PRICE}")) as bill:
        yield bill.data, bill.grown, bill.html, bill.metrics, bill.watts


def by(data: dict, table: str, label: str) -> dict[str, dict]:
    return {row[label]: row for row in data[table]}


def test_the_agent_names_each_jobs_user_and_account_and_alices_own_mfu(billed) -> None:
    _, _, _, text, _ = billed
    info, mfu = {}, {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "roofwatch_gpu_holder_info":
                info[s.labels["holder"]] = (s.labels.get("user"), s.labels.get("account"))
            elif s.name == "roofwatch_gpu_holder_mfu_ratio":
                mfu[s.labels["holder"]] = s.value
            elif s.name == "roofwatch_gpu_job_info" and s.labels["gpu"] == "1":
                info["gpu1"] = (s.labels.get("user"), s.labels.get("account"))
    assert info == {"job:5101": ("alice", "physics"), "job:5102": ("bob", "chem"), "gpu1": ("carol", "bio")}
    assert mfu == {"job:5101": pytest.approx(0.4, abs=1e-9)}, "only the holder with its own report has an MFU series"


@pytest.mark.parametrize("table,label", [("users", "user"), ("accounts", "account")])
def test_the_report_bills_users_and_accounts_their_share_of_the_shared_gpu(billed, table, label) -> None:
    data, *_ = billed
    rows = by(data, table, label)
    name = {u: (u if label == "user" else a) for u, a in USERS.items()}
    assert set(rows) == set(name.values()), "GPU 0's own job names no user: only its holders are billed for it"
    points = round(rows[name["carol"]]["total_hours"] / POINT_H)
    assert points >= 2, rows
    half = points * POINT_H / 2
    assert rows[name["alice"]]["total_hours"] == pytest.approx(half, abs=JSON_ROUNDING)
    assert rows[name["bob"]]["total_hours"] == pytest.approx(half, abs=JSON_ROUNDING)
    assert rows[name["alice"]]["wasted_hours"] == 0 and rows[name["carol"]]["wasted_hours"] == 0
    bob = rows[name["bob"]]
    assert bob["idle_allocated_hours"] == bob["wasted_hours"]
    assert bob["idle_allocated_hours"] >= half - POINT_H / 2 - JSON_ROUNDING, \
        "bob's half is idle-allocated at every point after his own window said so"
    assert bob["wasted_cost_usd"] == pytest.approx(bob["idle_allocated_hours"] * PRICE, abs=1e-4)
    assert rows[name["carol"]]["cost_usd"] == pytest.approx(points * POINT_H * PRICE, abs=1e-4)
    assert rows[name["alice"]]["mfu"] == pytest.approx(0.4, abs=1e-6), "her own report's MFU"
    assert rows[name["bob"]]["mfu"] is None, "bob reports nothing, and GPU 0's counters are not his"
    assert rows[name["carol"]]["mfu"] == pytest.approx(0.45, abs=0.02), "her whole GPU's busy MFU (its counters)"
    assert not [p for p in data["problems"] if label in p["section"]], data["problems"]


def test_the_report_bills_each_user_and_account_its_energy(billed) -> None:
    data, grown, *_, watts = billed
    users, accounts = by(data, "users", "user"), by(data, "accounts", "account")
    for user, joules in grown.items():
        assert users[user]["kwh"] == kwh_within(joules, watts[user]), user
        assert accounts[USERS[user]]["kwh"] == kwh_within(joules, watts[user]), user
    assert users["bob"]["kwh"] < users["alice"]["kwh"] / 3, "bob gets only half the idle floor"


def test_the_page_shows_the_account_bill_and_states_the_rule_once(billed) -> None:
    _, _, html, *_ = billed
    assert html.count('id="shared-rule"') == 1 and "equal share for each holder" in html
    assert 'id="waste-account"' in html and 'data-account="physics"' in html
    embedded = json.loads(html.split('id="fleet-data">', 1)[1].split("</script>", 1)[0])
    assert {row["account"] for row in embedded["accounts"]} == set(USERS.values())
