"""The global layer's benchmark (benchmarks/global_layer.py): what it generates is what the rules send, and it
runs end to end at a tiny size (the full 200,000-GPU run is minutes of this machine: docs/performance.md)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from benchmarks import fleet_queries, fleet_table, global_data, global_layer
from tests.global_layer import AGGREGATE, RULES
from tests.victoriametrics import available

LABELS = {"class": {"class"}, "waste": {"waste"}, "waste_kind": {"waste"}, "model_state": {"model", "state"},
          "model": {"model"}, None: set()}
"""What each of the generator's label kinds is in the rules' ``by (...)``."""


def aggregate_rules() -> dict[str, str]:
    return {r["record"]: r["expr"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]
            if AGGREGATE.fullmatch(r.get("record", ""))}


def test_the_generator_writes_every_family_that_crosses_with_its_rules_labels():
    rules = aggregate_rules()
    assert {f.name for f in global_data.FAMILIES} == set(rules)
    for family in global_data.FAMILIES:
        by = re.match(r"\s*(?:count|sum|avg|quantile|max) by \(([^)]*)\)", rules[family.name])
        if by is None:  # a ratio or an hourly sum of another recording: its labels are that one's
            continue
        grouped = {x.strip() for x in by.group(1).split(",")} - {"cluster", "job_id", "namespace"}
        assert grouped == LABELS[family.label], (family.name, grouped)
        assert family.hourly == family.name.endswith("_1h")


def test_what_one_cluster_sends_is_counted_from_its_series():
    shape = global_data.GlobalShape(clusters=1, gpus=1024)
    one = global_data.series(shape)
    sent = global_data.per_cluster(shape)
    assert sent["series"] == len(one) == len({s.labels for s in one})
    hour = sum(1 for _ in global_data.lines(one, 0, 3600, global_data.EVAL_S))
    assert sent["samples_per_s"] == pytest.approx(hour / 3600)
    assert all(AGGREGATE.fullmatch(s.labels.split("{")[0]) and 'cluster="cluster-00"' in s.labels for s in one)
    jobs = {re.search(r'job_id="([^"]+)"', s.labels).group(1) for s in one if "job_id" in s.labels}
    assert len(jobs) == 1024 // 128


def test_the_per_cluster_benchmark_does_not_time_the_global_dashboard():
    assert fleet_queries.GLOBAL_DASHBOARD.exists() and fleet_queries.GLOBAL_DASHBOARD not in fleet_queries.DASHBOARDS


def test_a_global_run_missing_a_field_is_refused():
    doc = json.loads(fleet_table.JSON_PATH.read_text())
    runs = [r for r in doc["runs"] if r.get("layer") == fleet_table.GLOBAL]
    assert runs, "docs/fleet-benchmark.json holds the global layer's runs"
    broken = {**runs[0]}
    del broken["fleet_report"]
    assert fleet_table.validate({"runs": [broken]}) == ["run 0: fleet_report missing or not <class 'dict'>"]
    assert fleet_table.validate(doc) == []


@pytest.mark.slow
@pytest.mark.skipif(not available(), reason="victoria-metrics missing: apt-get install victoria-metrics")
def test_the_benchmark_runs_at_a_tiny_size_on_both_engines(tmp_path: Path):
    out = tmp_path / "runs.json"
    out.write_text(json.dumps({"runs": []}))
    assert global_layer.main(["--clusters", "2", "--gpus", "512", "--days", "0.125", "--hours", "1",
                              "--prom-hours", "1", "--repeat", "1", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert fleet_table.validate(doc) == []
    runs = {r["engine"]: r for r in doc["runs"]}
    assert set(runs) == {"victoriametrics", "prometheus"}
    expected_series = 2 * global_data.per_cluster(global_data.GlobalShape(1, 512))["series"]
    for run in runs.values():
        assert run["layer"] == "global" and run["gpus"] == 1024 and run["series"] == expected_series
        assert run["empty_panels"] == [] and run["fleet_report"]["problems"] == [], run
        assert run["queries_timed"] == len(fleet_queries.panel_queries([fleet_queries.GLOBAL_DASHBOARD])) + 1
    assert "| 1,024 | 2 x 512" in fleet_table.render(doc)
