"""The global layer end to end with real engines on loopback (tests/global_layer.py): two clusters, one on
Prometheus and one on VictoriaMetrics, each evaluating the shipped rules over its own agents and sending only
the aggregate families to one global VictoriaMetrics, through the shipped configs."""

from __future__ import annotations

import re
import subprocess

import pytest
import yaml

from dashboards import global_fleet

from tests.global_layer import (AGGREGATE, EAST, GLOBAL_RELABEL, NAMESPACES, REMOTE_WRITE_GLOBAL, WEST, Layers,
                                dump, global_names, running_layers)
from tests.test_dashboards import dashboards, panel_problems, panels, until_no_problems
from tests.victoriametrics import available, binary

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not available(), reason="victoria-metrics missing: apt-get install victoria-metrics")]

PER_GPU = {"gpu", "uuid", "node", "server", "instance"}
"""Labels no series in the global store may carry: they would make it one series per GPU, node or replica."""


@pytest.fixture(scope="module")
def layers(tmp_path_factory):
    yield from running_layers(tmp_path_factory.mktemp("global-layer"))


def test_the_shipped_configs_keep_the_same_families_and_pass_their_checkers(tmp_path):
    check = subprocess.run(["promtool", "check", "config", str(REMOTE_WRITE_GLOBAL)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    (write,) = yaml.safe_load(REMOTE_WRITE_GLOBAL.read_text())["remote_write"]
    (relabel,) = yaml.safe_load(GLOBAL_RELABEL.read_text())
    assert write["write_relabel_configs"] == [relabel], "one rule for both engines"
    assert relabel["regex"] == AGGREGATE.pattern and relabel["action"] == "keep"
    scrape = tmp_path / "scrape.yml"
    scrape.write_text("scrape_configs: []\n")
    dry = subprocess.run([binary("vmagent"), "-dryRun", f"-promscrape.config={scrape}",
                          "-remoteWrite.url=http://cluster:8428/api/v1/write",
                          "-remoteWrite.url=http://global:8428/api/v1/write",
                          f"-remoteWrite.urlRelabelConfig=,{GLOBAL_RELABEL}"], capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, dry.stdout[-2000:] + dry.stderr[-2000:]


def test_only_the_aggregate_families_reach_the_global_store(layers: Layers):
    names = global_names(layers)
    assert names and all(AGGREGATE.fullmatch(n) for n in names), sorted(n for n in names if not AGGREGATE.fullmatch(n))
    # the per-GPU series and recordings existed in each cluster: they were held back, not missing
    for store in (layers.east, layers.west):
        assert store.query("roofwatch_gpu_workload_class") and store.query("roofwatch:gpu_mfu:ratio")
    everything = layers.global_vm.query('{__name__=~"roofwatch.+"}')
    leaking = [r for r in everything if PER_GPU & set(r["metric"])]
    assert leaking == [], dump(leaking)


def test_every_aggregate_carries_its_cluster(layers: Layers):
    everything = layers.global_vm.query('{__name__=~"roofwatch.+"}')
    assert {r["metric"].get("cluster") for r in everything} == {EAST, WEST}
    for cluster in (EAST, WEST):  # each cluster's families all arrive, per cluster and per job
        names = {r["metric"]["__name__"] for r in everything if r["metric"]["cluster"] == cluster}
        assert {"roofwatch_cluster:gpus:sum", "roofwatch_cluster:gpu_mfu:avg",
                "roofwatch_cluster:gpus_by_waste:sum", "roofwatch_job:gpus:count"} <= names, sorted(names)


def test_the_aggregates_in_the_global_store_are_the_clusters_own(layers: Layers):
    """The GPUs per cluster and per job in the global store are those the cluster's own per-GPU series count,
    and every namespace the pods name arrives."""
    def gpus(store, expr: str, key: str) -> dict[str, float]:
        return {r["metric"].get(key, ""): float(r["value"][1]) for r in store.query(expr)}

    for cluster, store in ((EAST, layers.east), (WEST, layers.west)):
        # Compared at the instant the cluster's rule recorded what reached the global store: a GPU whose class just
        # changed has two reason series for the 5-minute lookback, so "now" may count one more than that instant.
        recorded = f'roofwatch_cluster:gpus:sum{{cluster="{cluster}"}}'
        (stamp,) = layers.global_vm.query(f"max(timestamp({recorded}))")  # the recording's own time, not now
        at = float(stamp["value"][1])
        there = gpus(layers.global_vm, f"sum by (cluster) ({recorded})", "cluster")
        own = store.api("query", query="count by (cluster) (roofwatch_gpu_workload_reason_info)", time=str(at))
        here = {r["metric"].get("cluster", ""): float(r["value"][1]) for r in own["result"]}
        assert there == here and here[cluster] > 0, (cluster, at, here, there)
    jobs_here = gpus(layers.east, "count by (job_id) (roofwatch_gpu_job_info)", "job_id")
    jobs_there = gpus(layers.global_vm, f'roofwatch_job:gpus:count{{cluster="{EAST}"}}', "job_id")
    assert jobs_there == jobs_here and jobs_here
    namespaces = {r["metric"]["namespace"] for r in layers.global_vm.query("roofwatch_namespace:gpus_by_waste:sum")}
    assert namespaces == set(NAMESPACES)


# --- the global dashboard, every query against the global store -------------------------------------

GLOBAL_VIEW = {"datasource": "prometheus", "cluster": ".*", "price": "2.5"}


def test_every_global_dashboard_query_returns_data_from_the_global_store(layers: Layers):
    """What Grafana would send to the global store (variables filled in, instant and range queries): every
    panel's every query answers with data, from the aggregates alone."""
    board = dashboards()[global_fleet.UID]
    problems = until_no_problems(lambda: [p for panel in panels(board) for p in panel_problems(
        layers.global_vm, panel, GLOBAL_VIEW, global_fleet.MAY_BE_EMPTY)])
    assert problems == [], "\n".join(problems)


def test_the_global_dashboards_cluster_variable_lists_both_clusters(layers: Layers):
    (variable,) = [v for v in dashboards()[global_fleet.UID]["templating"]["list"] if v["name"] == "cluster"]
    metric, label = re.fullmatch(r"label_values\((.+), (\w+)\)", variable["query"]["query"]).groups()
    values = {r["metric"][label] for r in layers.global_vm.query(metric)}
    assert values == {EAST, WEST}
