"""The fleet benchmark's VictoriaMetrics path is right: a tiny fleet through the real VictoriaMetrics
1.79 and vmalert (Debian's victoria-metrics package).

The timings are benchmarks/ business (``python -m benchmarks.fleet --engine victoriametrics``); here
3 nodes x 24 minutes go through the same JSON-line import, and the store is checked series by series
and sample by sample against the generator (the same history promtool gets, in another format); then
the whole run (import, vmalert's replay, vmalert live, every dashboard query) is made on another tiny
fleet, and what it returns must be real: every rule group timed by vmalert, positive, three times,
recordings present, and a record in docs/fleet-benchmark.json's schema.
"""

from __future__ import annotations

import json
import shutil
import urllib.parse
import urllib.request

import pytest

from benchmarks import fleet, fleet_data, fleet_live, fleet_queries, fleet_table, fleet_victoria

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not all(shutil.which(b) for b in ("victoria-metrics", "vmalert")),
                                                   reason="needs Debian's victoria-metrics package")]
NODES = 3


@pytest.fixture(scope="module")
def template():
    return fleet_data.parse_template(fleet_data.node_exposition())


@pytest.fixture(scope="module")
def imported(tmp_path_factory, template):
    shape = fleet_data.FleetShape(nodes=NODES, hours=0.4, clusters=2, job_nodes=2)
    ts = shape.timestamps()
    vm = fleet_victoria.VictoriaServer(tmp_path_factory.mktemp("vm-import"))
    try:
        samples, _ = fleet_victoria.import_span(vm, template, shape, ts, ts[0], window_s=600, log=lambda _m: None)
        yield vm, shape, ts, samples
    finally:
        vm.stop()


def export(vm: fleet_victoria.VictoriaServer, selector: str, start: int, end: int) -> list[dict]:
    query = urllib.parse.urlencode({"match[]": selector, "start": start, "end": end})
    with urllib.request.urlopen(f"{vm.url}/api/v1/export?{query}", timeout=60) as answer:
        return [json.loads(line) for line in answer.read().decode().splitlines() if line.strip()]


def test_every_node_holds_the_agent_exposition_series(imported, template):
    """Counted 15 minutes in, inside the first class segment (after a change the previous class
    series is visible for the lookback, as in Prometheus)."""
    vm, shape, ts, samples = imported
    per_node = vm.api("query", query='count by (instance) ({job="roofwatch"})', time=ts[0] + 900)["result"]
    assert sorted(r["metric"]["instance"] for r in per_node) == [f"node-{i:05d}:9477" for i in range(NODES)]
    assert {int(r["value"][1]) for r in per_node} == {len(template)}
    assert samples == NODES * len(template) * len(ts)
    names = {s.name for s in template}
    assert set(vm.api("label/__name__/values")) == names


def test_every_series_has_every_sample_and_counters_only_grow(imported, template):
    vm, shape, ts, _ = imported
    everything = export(vm, '{job="roofwatch"}', ts[0], ts[-1])
    assert len({json.dumps(s["metric"], sort_keys=True) for s in everything}) == len(everything)
    per_series = [len(s["timestamps"]) for s in everything if s["metric"]["__name__"] != "roofwatch_gpu_workload_class"]
    assert set(per_series) == {len(ts)}  # windows of 10 min joined, none lost
    classes = [s for s in everything if s["metric"]["__name__"] == "roofwatch_gpu_workload_class"]
    by_gpu: dict[str, list[int]] = {}
    for s in classes:  # a GPU's class series share its timestamps: one class at every scrape
        by_gpu.setdefault(s["metric"]["uuid"], []).extend(s["timestamps"])
    assert len(by_gpu) == NODES * fleet.GPUS_PER_NODE and len(classes) > len(by_gpu)
    assert all(sorted(stamps) == [t * 1000 for t in ts] for stamps in by_gpu.values())
    energy = [s for s in everything if s["metric"]["__name__"] == "roofwatch_gpu_energy_joules_total"]
    assert len(energy) == NODES * fleet.GPUS_PER_NODE
    assert all(all(b > a for a, b in zip(s["values"], s["values"][1:])) for s in energy)


def test_the_values_are_the_generators_own(imported, template):
    """Same history as the OpenMetrics promtool reads: node 1's MFU and class, value for value."""
    vm, shape, ts, _ = imported
    p = fleet_data.Patterns(ts, ts[0])
    mfu = next(t for t in template if t.name == "roofwatch_gpu_mfu_ratio" and t.label("gpu") == "0")
    want = [float(line.split()[0]) for line in fleet_data.series_block(p, mfu, 0, shape.job(1)).split("\n")]
    selector = "roofwatch_gpu_mfu_ratio{" + ",".join(f'{k}="{v}"' for k, v in fleet_data.labels_of(mfu, shape, 1)) + "}"
    got = export(vm, selector, ts[0], ts[-1])
    assert len(got) == 1 and got[0]["values"] == want
    schedule = [fleet_data.CLASSES[c] for c in p.schedule_class(shape.job(1) % fleet_data.SCHEDULES)]
    got = export(vm, 'roofwatch_gpu_workload_class{instance="node-00001:9477",gpu="0"}', ts[0], ts[-1])
    at = {t // 1000: s["metric"]["class"] for s in got for t in s["timestamps"]}
    assert [at[t] for t in ts] == schedule and {v for s in got for v in s["values"]} == {1}


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    return fleet_live.measure_victoria(
        NODES, 0.4, tmp_path_factory.mktemp("vm-run"), rules=fleet_queries.RULES, boards=fleet_queries.DASHBOARDS,
        repeat=1, eval_s=2, evaluations=3, replay=True, intervals=fleet.recommended_interval, job_nodes=2,
        log=lambda _m: None)


def test_vmalert_timed_every_group_three_times(measured):
    assert set(measured["groups"]) == {r.group for r in fleet_queries.rules()}
    for name, g in measured["groups"].items():
        assert len(g["evaluations"]) >= 3 and all(s > 0 for s in g["evaluations"]), (name, g)
        assert g["seconds"] > 0 and g["interval_s"] == fleet.recommended_interval(name, 30.0)
    assert measured["note"] == "", measured["note"]  # no rule errors, the import kept ahead of now


def test_the_run_read_the_whole_fleet_and_the_replayed_recordings(measured, template):
    # at the end a GPU's previous class series may still be within the lookback: at most one more per GPU
    assert NODES * len(template) <= measured["series_raw"] <= NODES * (len(template) + fleet.GPUS_PER_NODE)
    assert measured["series_recorded"] > 0
    assert measured["history_h"] >= 0.4 and measured["rss_bytes"] > 0
    panels = fleet_queries.panel_queries()
    assert len(measured["queries"]) == len(panels) + len(fleet_queries.variable_queries())
    job_mfu = [q for q in measured["queries"] if q["dashboard"] == "job" and q["series"]]
    assert job_mfu, "the job dashboard found nothing for job-00000"


def test_the_run_is_a_record_of_the_schema(measured):
    rec = fleet_table.record(measured, 0.4)
    assert fleet_table.validate({"runs": [rec]}) == []
    assert rec["engine"] == "victoriametrics" and rec["measured"] is True
    assert rec["rule_groups"] and all(g["seconds"] > 0 for g in rec["rule_groups"].values())
