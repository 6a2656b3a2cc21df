"""The fleet benchmark's data is right: a tiny fleet through the real promtool and Prometheus.

The timings are benchmarks/ business (``python -m benchmarks.fleet``); here 3 nodes x 24 minutes
go through the same generator, both backfills and a real Prometheus, and the data is checked
(the VictoriaMetrics path: tests/test_fleet_benchmark_victoria.py):
every node holds exactly the agent's exposition series, counters never fall, the history moves,
and the recording rules' outputs are there for the dashboards to read.
"""

from __future__ import annotations

import shutil

import pytest

from benchmarks import fleet, fleet_data, fleet_queries
from benchmarks.fleet_prometheus import Server

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not (shutil.which("promtool") and shutil.which("prometheus")),
                                reason="needs Debian's prometheus package (promtool and prometheus)")]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    shape = fleet_data.FleetShape(nodes=3, hours=0.4, clusters=2, job_nodes=2)
    built = fleet.build(shape, tmp_path_factory.mktemp("fleet"), log=lambda _m: None)
    server = Server(built.data.parent, built.data)
    yield built, server
    server.stop()


def values(server: Server, query: str, built) -> list[dict]:
    return server.api("query_range", query=query, start=built.start, end=built.end, step=15)["result"]


def test_every_node_holds_the_agent_exposition_series(tiny):
    """Counted 15 minutes in, inside the first 20-minute class segment: after a class change the
    GPU's previous class series stays visible for Prometheus' 5-minute lookback (a backfill writes
    no staleness marker), so a count taken then would hold both."""
    built, server = tiny
    template = fleet_data.parse_template(fleet_data.node_exposition())
    mid = built.start + 900
    per_node = server.api("query", query='count by (instance) ({job="roofwatch", __name__!~".*:.*"})', time=mid)["result"]
    assert sorted(r["metric"]["instance"] for r in per_node) == [f"node-{i:05d}:9477" for i in range(3)]
    assert {int(r["value"][1]) for r in per_node} == {len(template)}
    gpus = server.api("query", query="count(roofwatch_gpu_info)", time=built.end)["result"]
    assert int(gpus[0]["value"][1]) == 3 * fleet.GPUS_PER_NODE
    # series per GPU: what the exposition has per GPU (uuid-labelled), the same on every GPU of the fleet
    per_gpu = server.api("query", query='count by (uuid) ({uuid!="", __name__!~".*:.*"})', time=mid)["result"]
    expected = {}
    for s in template:
        if s.label("uuid"):
            expected[s.label("uuid")] = expected.get(s.label("uuid"), 0) + 1
    assert sorted(int(r["value"][1]) for r in per_gpu) == sorted(list(expected.values()) * 3)


def test_counters_never_fall_and_the_history_moves(tiny):
    built, server = tiny
    energy = values(server, "roofwatch_gpu_energy_joules_total", built)
    assert len(energy) == 3 * fleet.GPUS_PER_NODE
    for series in energy:
        points = [float(v) for _, v in series["values"]]
        assert len(points) == len(built.shape.timestamps())
        assert all(b > a for a, b in zip(points, points[1:])), series["metric"]
    falls = server.api("query", query="sum(resets(roofwatch_gpu_energy_joules_total[1h]))", time=built.end)["result"]
    assert float(falls[0]["value"][1]) == 0
    # classes change over time (a 20-minute segment boundary falls inside the history): a GPU's class
    # series ends and the next class's begins; at every scrape each GPU has exactly one, valued 1 (10 s:
    # Prometheus 2 ranges include their left end, so 15 s would reach the scrape before)
    classes = server.api("query", query="count(count_over_time(roofwatch_gpu_workload_class[1h]))", time=built.end)["result"]
    assert int(classes[0]["value"][1]) > 3 * fleet.GPUS_PER_NODE
    hot = values(server, "count by (uuid) (last_over_time(roofwatch_gpu_workload_class[10s]))", built)
    assert len(hot) == 3 * fleet.GPUS_PER_NODE
    assert {float(v) for series in hot for _, v in series["values"]} == {1.0}
    assert {float(v) for series in values(server, "roofwatch_gpu_workload_class", built) for _, v in series["values"]} == {1.0}


def test_jobs_span_nodes_and_the_recording_rules_have_output(tiny):
    built, server = tiny
    jobs = server.api("query", query="roofwatch_job:gpus:count", time=built.end)["result"]
    assert sorted((r["metric"]["job_id"], r["value"][1]) for r in jobs) == [("job-00000", "16"), ("job-00001", "8")]
    for level in fleet_queries.levels(fleet_queries.rules()):
        for rule in level:
            if rule.name.startswith("roofwatch_server:") or rule.name.startswith("roofwatch_cluster:serving"):
                continue  # the demo node runs no inference server
            if rule.name.startswith("roofwatch_namespace:"):
                continue  # nor in Kubernetes: no roofwatch_gpu_pod_info (tests/test_global_layer.py has pods)
            if rule.name == "roofwatch:gpu_holder_share:ratio":
                continue  # nor shares a GPU: no holder series (tests/test_fleet_report_shared.py has them)
            assert values(server, rule.name, built), f"{rule.name} has no backfilled output"
    mfu = server.api("query", query="roofwatch_cluster:gpu_mfu:avg", time=built.end)["result"]
    assert sorted(r["metric"]["cluster"] for r in mfu) == ["c0", "c1"]


def test_every_dashboard_query_runs_with_real_variable_values(tiny):
    built, server = tiny
    names = {"cluster": ".*", "job": "job-00000", "node": "node-00000", "gpu": ".*", "model": ".*", "server": ".*",
             "job_node": "(node-00000|node-00001)"}  # job-00000's nodes, as Grafana expands the hidden variable
    queries = fleet_queries.panel_queries()
    assert len(queries) > 100
    for q in queries:
        expr = fleet_queries.substitute(q.expr, names, 1200, 15)
        server.api("query", query=expr, time=built.end)  # raises on a PromQL error
    assert fleet_queries.step_for(6 * 3600) == 20 and fleet_queries.step_for(3600) == 15


def test_prometheus_times_every_group_live_over_a_history_reaching_past_now(tmp_path):
    """The rule manager evaluates the shipped file over backfilled blocks that reach past now (the
    benchmark's Prometheus path): every group is timed by Prometheus itself, three times, positive,
    with no rule error (its results land in the out-of-order window, not refused as out of bounds)."""
    import time

    end = int(time.time()) // 15 * 15 + 600
    shape = fleet_data.FleetShape(nodes=2, hours=0.6, clusters=2, job_nodes=2, end=end)  # 0.43 h before now
    built = fleet.build(shape, tmp_path, log=lambda _m: None)
    run = fleet.measure(built, tmp_path, 1, settle_s=1, live_eval_s=2, evaluations=3, log=lambda _m: None)
    assert run["rule_timing"].startswith("Prometheus rule manager live") and run["note"] == "", run["note"]
    assert set(run["groups"]) == {r.group for r in fleet_queries.rules()}
    for name, group in run["groups"].items():
        assert len(group["evaluations"]) >= 3 and all(s > 0 for s in group["evaluations"]), (name, group)
    # at the end a GPU's previous class series may still be within the lookback: at most one more per GPU
    assert 2 * built.series_per_node <= run["series_raw"] <= 2 * (built.series_per_node + fleet.GPUS_PER_NODE)
    assert run["history_h"] >= 0.4
