"""docs/fleet-benchmark.json holds the issue's schema, and the table in docs/performance.md is the
one generated from it (``python -m benchmarks.fleet_table --write``): the doc cannot show figures the
benchmark did not produce. Also how runs merge and how extrapolated rows are made and marked.
Quick: no process, no engine."""

from __future__ import annotations

import json
import re

from benchmarks import fleet_table


def raw_run(gpus: int, engine: str, seconds: float, query_s: float) -> dict:
    """A measurement as benchmarks.fleet / fleet_live return it (the keys record() reads)."""
    return {"gpus": gpus, "engine": engine, "hours": 0.5, "history_h": 0.52,
            "groups": {"roofwatch-efficiency": {"seconds": seconds, "interval_s": 30.0, "evaluations": [seconds] * 3},
                       "roofwatch-hourly": {"seconds": seconds / 10, "interval_s": 300.0, "evaluations": []}},
            "queries": [{"dashboard": "job", "panel": "MFU", "range_h": 0.52, "instant": False, "seconds": query_s,
                         "series": 3, "expr": "avg(x)"},
                        {"dashboard": "node", "panel": "variable node", "range_h": 0.52, "instant": True,
                         "seconds": query_s / 2, "series": None, "expr": "up"}],
            "series_raw": gpus * 46, "series_recorded": 10, "rss_bytes": gpus * 1000, "rule_timing": "vmalert live",
            "note": ""}


def test_the_docs_json_has_the_schema_and_the_doc_shows_its_table():
    doc = json.loads(fleet_table.JSON_PATH.read_text())
    assert fleet_table.validate(doc) == []
    assert doc["runs"], "no run in docs/fleet-benchmark.json"
    shown = fleet_table.doc_block(fleet_table.DOC_PATH.read_text())
    assert shown == fleet_table.block(doc), "run: python -m benchmarks.fleet_table --write"


def test_a_record_has_exactly_the_issues_fields_and_the_slowest_query():
    rec = fleet_table.record(raw_run(1000, "victoriametrics", 0.2, 0.4), 0.5)
    assert fleet_table.validate({"runs": [rec]}) == []
    assert rec["measured"] is True and rec["engine"] == "victoriametrics" and rec["history_h"] == 0.52
    assert rec["rule_groups"]["roofwatch-efficiency"] == {"seconds": 0.2, "interval_s": 30.0}
    assert rec["dashboards"] == {"slowest_query_s": 0.4, "range_h": 0.52, "query": "avg(x)"}
    assert rec["slowest_panel"] == "job / MFU" and rec["series"] == 46_000 and rec["engine_rss_bytes"] == 1_000_000


def test_merge_replaces_a_rerun_and_extrapolates_only_sizes_not_measured():
    first = [fleet_table.record(raw_run(g, "victoriametrics", g / 10_000, g / 20_000), 0.5) for g in (1000, 2000)]
    runs = fleet_table.merge([], first)
    estimates = [r for r in runs if not r["measured"]]
    assert sorted(r["gpus"] for r in estimates) == [8_000, 32_000]
    big = next(r for r in estimates if r["gpus"] == 32_000)
    assert big["rule_groups"]["roofwatch-efficiency"]["seconds"] == 3.2  # linear through 1,000 and 2,000
    assert "extrapolated" in big["note"] and fleet_table.validate({"runs": runs}) == []
    rerun = fleet_table.record(raw_run(32_000, "victoriametrics", 2.0, 1.0), 0.5)
    runs = fleet_table.merge(runs, [rerun])
    assert [r["measured"] for r in runs if r["gpus"] == 32_000] == [True]
    assert sum(1 for r in runs if r["gpus"] == 1000) == 1
    again = fleet_table.merge(runs, [fleet_table.record(raw_run(1000, "victoriametrics", 0.5, 0.5), 0.5)])
    assert [r["rule_groups"]["roofwatch-efficiency"]["seconds"] for r in again if r["gpus"] == 1000] == [0.5]


def test_budgets_and_estimates_are_marked_in_the_table():
    runs = fleet_table.merge([], [fleet_table.record(raw_run(32_000, "prometheus", 4.0, 0.5), 0.5)])
    assert fleet_table.budget(runs[-1]) == "missed: efficiency 13%"
    assert fleet_table.budget(fleet_table.record(raw_run(8_000, "prometheus", 4.0, 1.5), 0.5)) == "missed: query 1.50 s > 1 s"
    table = fleet_table.render({"runs": runs})
    estimate = next(line for line in table.splitlines() if line.startswith("| 8,000 "))
    assert "no (extrapolated)" in estimate and "~" in estimate


def test_rules_per_cluster_limit_every_group_to_one_cluster(tmp_path):
    """--rules-per-cluster: the rule file as one cluster's vmalert runs it (docs/deploy.md, "Large fleets")."""
    import yaml

    from benchmarks import fleet_queries

    whole = yaml.safe_load(fleet_queries.measurement_rules(fleet_queries.RULES, tmp_path / "all.yml", 60).read_text())
    shard = yaml.safe_load(fleet_queries.measurement_rules(fleet_queries.RULES, tmp_path / "c0.yml", 60, "c0").read_text())
    assert [g["name"] for g in shard["groups"]] == [g["name"] for g in whole["groups"]]
    assert all(g["params"] == {"extra_label": ["cluster=c0"]} and g["interval"] == "60s" for g in shard["groups"])
    assert not any("params" in g for g in whole["groups"])
    # no rule may aggregate away the cluster: per-cluster evaluation must give what one evaluator gives
    for group in shard["groups"]:
        for rule in group["rules"]:
            for by in re.findall(r"\b(?:sum|avg|count|max|min|quantile) by \(([^)]*)\)", rule["expr"]):
                assert "cluster" in by or "node" in by, (rule.get("record") or rule.get("alert"), by)
