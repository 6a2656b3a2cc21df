"""The shared GPUs' panels against a real agent (issue 47): the node dashboard's holder table and the cluster
dashboard's namespace bill, fed by ``roofwatch demo --scenario shared`` through a real Prometheus that loads the
shipped rules unchanged.

The test fleet of tests/test_dashboards.py shares no GPU and runs no pod, so there these panels are listed in
MAY_BE_EMPTY; here they must have data, their tables must come out of Grafana's own transformations as one table
with every column named or hidden, and show the scenario's holders with the shares worked out by hand from
agent/virtual/scenarios/shared.yaml: GPU 0 time-sliced between three pods of ``ml``, ``research`` (the idle
notebook) and ``vision``, a third each; GPU 2 two halves of ``inference``; GPU 1's four MPS clients, a quarter each
and in no namespace.
"""

from __future__ import annotations

import pytest

from dashboards import cluster, node
from tests import test_dashboard_transforms
from tests.agent_process import AgentProcess, clean_env, poll
from tests.prometheus_server import PrometheusServer
from tests.test_dashboard_transforms import assert_one_named_table, transformed
from tests.test_dashboards import RULES, dashboards, panel_problems, panels, until_no_problems

pytestmark = pytest.mark.slow
grafana_js = test_dashboard_transforms.grafana_js
"""Node with @grafana/data (a fixture of test_dashboard_transforms)."""

VIEWS = {node.UID: {"datasource": "prometheus", "cluster": ".*", "node": "shared-node", "gpu": ".*"},
         cluster.UID: {"datasource": "prometheus", "cluster": ".*"}}
PANELS = [(node.UID, node.HOLDERS), (cluster.UID, cluster.NAMESPACE_BILL)]


def the_panel(uid: str, title: str) -> dict:
    return next(p for p in panels(dashboards()[uid]) if p["title"] == title)


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """Prometheus scraping one agent of the shared scenario, once the notebook is idle_held for itself."""
    agent = AgentProcess("demo", "--listen", "127.0.0.1:0", "--backend", "nvml-virtual", "--scenario", "shared",
                         env=clean_env())
    prom = None
    try:
        agent.wait_healthy(60)
        target = agent.url.removeprefix("http://").rstrip("/")
        prom = PrometheusServer(tmp_path_factory.mktemp("shared-dash"), [target], rule_files=[RULES],
                                target_labels={target: {"cluster": "lab"}})
        poll(lambda: prom.query('roofwatch_namespace:gpus_by_waste:sum{waste="idle_held"}'), timeout=120,
             interval=0.5, what="the notebook's idle_held share in the namespace recording")
        yield prom
    finally:
        log = prom.stop() if prom else ""
        agent.kill()
        assert "error" not in log.lower(), log[-2000:]


@pytest.mark.parametrize("uid, title", PANELS, ids=[t for _, t in PANELS])
def test_every_query_of_the_shared_panels_returns_data(shared, uid, title) -> None:
    problems = until_no_problems(lambda: panel_problems(shared, the_panel(uid, title), VIEWS[uid], {}))
    assert problems == [], "\n".join(problems)


@pytest.mark.parametrize("uid, title", PANELS, ids=[t for _, t in PANELS])
def test_the_shared_tables_come_out_as_one_table_with_named_columns(shared, grafana_js, uid, title) -> None:
    assert_one_named_table(shared, the_panel(uid, title), VIEWS[uid])


def rows_of(shared: PrometheusServer, uid: str, title: str) -> list[dict[str, object]]:
    """The table as the user sees it: one dict per row, keyed by the shown column titles."""
    _, out = transformed(shared, the_panel(uid, title), VIEWS[uid])
    (table,) = out
    return [{f.get("displayName", f["name"]): f["values"][i] for f in table["fields"]} for i in range(table["length"])]


def test_the_holder_table_shows_each_holder_its_billed_share_and_own_verdict(shared, grafana_js) -> None:
    def ready() -> list[dict] | None:
        rows = rows_of(shared, node.UID, node.HOLDERS)
        return rows if any(r.get("Own verdict") == "idle_held" for r in rows) else None

    rows = {(r["GPU"], r["Holder"]): r for r in poll(ready, 60, interval=1, what="the holder table")}
    third = {("0", h) for h in ("ml/trainer-0/main", "research/notebook/main", "vision/augment/main")}
    assert third <= set(rows)
    for key in third:
        assert rows[key]["Billed share"] == pytest.approx(1 / 3), key
    assert rows[("0", "research/notebook/main")]["Own verdict"] == "idle_held"
    assert rows[("0", "research/notebook/main")]["Namespace"] == "research"
    assert rows[("2", "inference/chat-a/main")]["Billed share"] == pytest.approx(1 / 2)
    mps = [r for (gpu, _), r in rows.items() if gpu == "1" and r.get("Via") == "mps"]
    assert len(mps) == 4 and all(r["Billed share"] == pytest.approx(1 / 4) for r in mps)
    assert ("0", "unattributed") in rows and rows[("0", "unattributed")].get("Billed share") in (None, ""), \
        "the remainder has energy, no share"
    assert not {gpu for gpu, _ in rows} & {"4", "5", "6", "7"}, "whole GPUs have no holder rows"


def test_the_namespace_bill_counts_shared_gpus_by_share(shared, grafana_js) -> None:
    rows = {r["Namespace"]: r for r in rows_of(shared, cluster.UID, cluster.NAMESPACE_BILL)}
    assert set(rows) == {"ml", "research", "vision", "inference"}, "MPS clients have no pod"
    assert {ns: r["GPUs now"] for ns, r in rows.items()} == pytest.approx(
        {"ml": 1 / 3, "research": 1 / 3, "vision": 1 / 3, "inference": 1.0})
    assert rows["research"]["Wasted GPU-hours (1h)"] > 0
    assert rows["ml"].get("Wasted GPU-hours (1h)") in (None, ""), "the trainer's GPU wastes nothing"
    assert all(r["Energy (1h)"] > 0 for r in rows.values())
