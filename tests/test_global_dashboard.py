"""The global dashboard reads only what crosses to the global store (quick tier: the committed JSON).

Its live proof, every query answering with data from a real global store fed by two real clusters, is in
tests/test_global_layer.py."""

from __future__ import annotations

import re

import yaml

from dashboards import global_fleet
from tests import test_dashboards
from tests.global_layer import AGGREGATE, REMOTE_WRITE_GLOBAL

UID = global_fleet.UID
NAME = re.compile(r"\b(roofwatch[a-z_]*:[a-z0-9_:]+|roofwatch_[a-z0-9_]+|ALERTS\w*|up)\b")
PER_GPU_LABELS = ("node", "gpu", "uuid", "server", "instance")


def dashboard() -> dict:
    return test_dashboards.dashboards()[UID]


def queries() -> list[str]:
    """Every panel target's expression and every query variable's query."""
    board = dashboard()
    exprs = [t["expr"] for p in test_dashboards.panels(board) for t in p["targets"]]
    exprs += [v["query"]["query"] for v in board["templating"]["list"] if v["type"] == "query"]
    return exprs


def test_the_global_dashboard_is_generated_and_lints_clean():
    assert f"{UID}.json" in test_dashboards.generate.BUILDERS
    test_dashboards.test_lint(UID)
    test_dashboards.test_layout_fits_the_grid_without_overlaps(UID)
    test_dashboards.test_variables_are_templated_and_every_reference_is_defined(UID)


def test_every_query_reads_only_the_families_that_cross():
    """The names each query reads all match the keep rule of the shipped remote-write-global.yml (read from
    the file, so narrowing it without the dashboard fails here)."""
    (write,) = yaml.safe_load(REMOTE_WRITE_GLOBAL.read_text())["remote_write"]
    (keep,) = [r for r in write["write_relabel_configs"] if r["action"] == "keep"]
    crossing = re.compile(keep["regex"])
    assert crossing.pattern == AGGREGATE.pattern
    seen: set[str] = set()
    for expr in queries():
        names = set(NAME.findall(expr))
        assert names, expr
        assert all(crossing.fullmatch(n) for n in names), (sorted(n for n in names if not crossing.fullmatch(n)), expr)
        seen |= names
    families = {n.split(":")[0] for n in seen}
    assert families == {"roofwatch_cluster", "roofwatch_job", "roofwatch_namespace"}


def test_no_query_groups_or_joins_by_a_per_gpu_label():
    for expr in queries():
        for clause in re.findall(r"\b(?:by|on|without|ignoring|group_left|group_right)\s*\(([^)]*)\)", expr):
            labels = {x.strip() for x in clause.split(",")}
            assert not labels & set(PER_GPU_LABELS), expr


def test_the_cluster_column_drills_down_to_the_clusters_own_store():
    clusters = next(p for p in test_dashboards.panels(dashboard()) if p["title"] == "Clusters")
    links = [link for o in clusters["fieldConfig"]["overrides"] if o["matcher"]["options"] == "Cluster"
             for prop in o["properties"] if prop["id"] == "links" for link in prop["value"]]
    assert links and "var-datasource=${__value.raw}" in links[0]["url"] and "/d/roofwatch-cluster?" in links[0]["url"]
