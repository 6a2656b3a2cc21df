"""``fleet-report`` over a global store of aggregates and over several cluster stores at once gives the headline
figures of the report over one store holding everything, on one synthetic fleet (tests/fleet_fixture.py).

The stores are real VictoriaMetrics servers:

* ``everything``: the fleet's per-GPU series, and the shipped rules' recordings over them, evaluated by vmalert's
  replay of deploy/prometheus/roofwatch-rules.yml (the groups that write the aggregates and what they read);
* ``global``: only the aggregate families, copied out of ``everything`` (VictoriaMetrics' export and import:
  what remote write would have delivered, the series the shipped relabelling keeps, tests/global_layer.py);
* ``east`` and ``west``: each cluster's per-GPU series alone, as each cluster's own store holds them.

The fixture's reason series carry the ``waste`` label as today's agents write it (the rules count by it), derived
here by the agent's rule (agent/model/waste.py) from class and detail."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests import fleet_fixture
from tests.agent_process import http_get, poll
from tests.fleet_stores import fleet_end, run_report
from tests.global_layer import AGGREGATE, RULES
from tests.test_fleet_report_hostile import MARGIN_S, SEEN, fleet_report, server, strict_json  # noqa: F401 (fixture)
from tests.victoriametrics import VictoriaMetrics, available, replay_by_level

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not available(), reason="victoria-metrics missing: apt-get install victoria-metrics")]

GROUPS = ("roofwatch-efficiency", "roofwatch-aggregates", "roofwatch-hourly")
"""The rule groups whose recordings the aggregates are or read; the others (jobs, serving, alerts) write
nothing the report reads from the global store."""
HEADLINE = ("gpu_hours", "gpu_hours_by_class", "held_gpu_hours", "wasted_gpu_hours", "idle_allocated_gpu_hours",
            "spare_gpu_hours", "useful_gpu_hours", "wasted_cost_usd", "cost_usd", "mfu_mean", "energy_kwh")
WASTED_CLASSES = {"input_starved", "communication_jittered"}
STALE_AFTER = "-search.maxStalenessInterval=59s"
"""A series is gone 59 s after its last sample (the samples are 60 s apart, on the steps the queries read): what
a live Prometheus's staleness markers do when a GPU's reason series changes its class, and an import cannot
write. Without it a changed series is read for minutes after it ended and the GPU counted twice meanwhile."""


def waste_label(cls: str, detail: str) -> str:
    """agent.model.waste.waste_of for a verdict of this class and detail (an idle GPU nobody holds is spare)."""
    if cls == "idle":
        return "spare" if detail == "idle_free" else "idle_held"
    return cls if cls in WASTED_CLASSES else "none"


def labelled_fleet(end: int) -> list[str]:
    """The fixture's samples as import lines, each reason series with its ``waste`` label."""
    def label(match: re.Match[str]) -> str:
        return f'{match.group(0)[:-1]},waste="{waste_label(match.group(1), match.group(2))}"}}'

    reason = re.compile(r'roofwatch_gpu_workload_reason_info\{[^}]*class="(\w+)",detail="(\w+)"[^}]*\}')
    return [reason.sub(label, line) for line in fleet_fixture.prometheus_text(end).splitlines()]


def rfc3339(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def searchable(vm: VictoriaMetrics, expr: str, end: int) -> None:
    http_get(vm.base + "/internal/force_flush")
    poll(lambda: vm.query(expr, end), timeout=30, interval=0.5, what=f"{expr} searchable")


def copy_aggregates(source: VictoriaMetrics, target: VictoriaMetrics, start: float, end: float) -> int:
    """Every series of the families that cross, exported from ``source`` and imported into ``target``."""
    lines = [json.dumps(s) for s in source.export('{__name__=~"%s"}' % AGGREGATE.pattern, start, end)]
    request = urllib.request.Request(target.base + "/api/v1/import", data="\n".join(lines).encode(), method="POST")
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.status == 204
    return len(lines)


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("fleet-global")
    end = fleet_end()
    start = end - 2 * fleet_fixture.PERIOD - fleet_fixture.LEAD_IN
    started: dict[str, VictoriaMetrics] = {}
    try:
        lines = labelled_fleet(end)
        for name in ("everything", "global", "east", "west"):
            started[name] = VictoriaMetrics(workdir / name, STALE_AFTER)
        started["everything"].import_prometheus(lines)
        for cluster in ("east", "west"):
            started[cluster].import_prometheus([line for line in lines if f'cluster="{cluster}"' in line])
            searchable(started[cluster], "roofwatch_gpu_workload_class", end)
        searchable(started["everything"], "roofwatch_gpu_workload_reason_info", end)
        document = yaml.safe_load(RULES.read_text())
        document["groups"] = [g for g in document["groups"] if g["name"] in GROUPS]
        for result in replay_by_level(document, started["everything"], workdir, rfc3339(start), rfc3339(end)):
            assert result.returncode == 0, result.stderr[-3000:]
        searchable(started["everything"], "roofwatch_cluster:gpu_energy_kwh:sum_1h", end)
        assert copy_aggregates(started["everything"], started["global"], start, end) > 0
        searchable(started["global"], "roofwatch_cluster:gpus:sum", end)
        yield {name: vm.base for name, vm in started.items()}, end
    finally:
        for vm in started.values():
            vm.stop()


def headline(data: dict) -> dict:
    return {key: data["totals"][key] for key in HEADLINE}


def same(a: dict, b: dict) -> list[str]:
    """The headline figures that differ (to a part in a thousand, or 0.001 absolute: rounding)."""
    out = []
    for key in HEADLINE:
        x, y = a[key], b[key]
        if isinstance(x, dict):
            x, y = {k: v for k, v in x.items() if v}, {k: v for k, v in y.items() if v}
            if x.keys() != y.keys() or any(x[k] != pytest.approx(y[k], rel=1e-3, abs=1e-3) for k in x):
                out.append(f"{key}: {x} != {y}")
        elif x is None or y is None or x != pytest.approx(y, rel=1e-3, abs=1e-3):
            out.append(f"{key}: {x} != {y}")
    return out


def test_the_global_store_holds_no_per_gpu_series(stores):
    bases, _ = stores
    status, body = http_get(bases["global"] + "/api/v1/label/__name__/values")
    names = json.loads(body)["data"]
    assert status == 200 and names and all(AGGREGATE.fullmatch(n) for n in names), names


def test_the_global_store_gives_the_headline_figures_of_one_store_holding_everything(stores, tmp_path: Path):
    bases, end = stores
    (tmp_path / "one").mkdir()
    (tmp_path / "global").mkdir()
    done, everything = run_report(bases["everything"], tmp_path / "one", end=end)
    assert done.returncode == 0, done.stderr
    done, aggregates = run_report(bases["global"], tmp_path / "global", "--source", "aggregates", end=end)
    assert done.returncode == 0, done.stderr
    assert everything["totals"]["wasted_gpu_hours"] > 0 and everything["totals"]["mfu_mean"], everything["totals"]
    assert same(headline(aggregates), headline(everything)) == []
    assert aggregates["source"] == "aggregates" and aggregates["problems"] == [], aggregates["problems"]
    worst = {(j["cluster"], j["job_id"]): j["wasted_hours"] for j in everything["jobs"]}
    found = {(j["cluster"], j["job_id"]): j["wasted_hours"] for j in aggregates["jobs"]}
    assert found.keys() == worst.keys() and all(found[k] == pytest.approx(worst[k], abs=1e-3) for k in worst), found
    namespaces = {(n["cluster"], n["namespace"]): n["wasted_hours"] for n in aggregates["namespaces"]}
    expected = {(n["cluster"], n["namespace"]): n["wasted_hours"] for n in everything["namespaces"]}
    assert namespaces.keys() == expected.keys() and all(namespaces[k] == pytest.approx(expected[k], abs=1e-3)
                                                        for k in expected)
    page = (tmp_path / "global" / "fleet.html").read_text()
    assert 'id="aggregates-notes"' in page and "MFU distribution" in page


def test_several_cluster_stores_give_the_headline_figures_of_one_store_holding_everything(stores, tmp_path: Path):
    bases, end = stores
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    _, everything = run_report(bases["everything"], tmp_path / "one", end=end)
    done, merged = run_report(bases["east"], tmp_path / "two", "--prometheus", bases["west"], end=end)
    assert done.returncode == 0, done.stderr
    assert same(headline(merged), headline(everything)) == []
    assert merged["mfu"]["histogram"] == everything["mfu"]["histogram"]
    assert {c["cluster"] for c in merged["clusters"]} == {"east", "west"}


def test_a_cluster_store_that_does_not_answer_is_listed_and_the_others_reported(stores, tmp_path: Path):
    bases, end = stores
    dead = "http://user:s3cret-pass@127.0.0.1:1"
    done, merged = run_report(bases["east"], tmp_path, "--prometheus", dead, "--prometheus", bases["west"],
                              "--timeout", "5", end=end)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    failed = [p for p in merged["problems"] if p["section"].startswith("Store ")]
    assert len(failed) == 1 and "127.0.0.1:1" in failed[0]["section"], merged["problems"]
    assert {c["cluster"] for c in merged["clusters"]} == {"east", "west"}
    everything_text = done.stdout + done.stderr + (tmp_path / "fleet.html").read_text() + json.dumps(merged)
    assert "s3cret-pass" not in everything_text


def test_no_store_answering_is_one_error_line(tmp_path: Path):
    done, _ = run_report("http://127.0.0.1:1", tmp_path, "--prometheus", "http://127.0.0.1:2", "--timeout", "2",
                         end=int(time.time()))
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "no store answered" in done.stderr, done.stderr


def test_one_deadline_bounds_the_command_over_every_store(server, tmp_path: Path):  # noqa: F811 (fixture)
    """Two stores that drip every answer (tests/test_fleet_report_hostile.py): with --deadline 10 the command
    ends within it, not within 10 s per store, and the store it had no time left for is listed."""
    started = time.monotonic()
    done = fleet_report(f"{server}/drip/multi-a", tmp_path, "--prometheus", f"{server}/drip/multi-b",
                        "--timeout", "3", "--deadline", "10", timeout=60)
    took = time.monotonic() - started
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert took < 10 + MARGIN_S, f"{took:.1f} s"
    data = strict_json((tmp_path / "f.json").read_text())
    assert [p["section"] for p in data["problems"] if p["section"].startswith("Store ")] == \
        [f"Store {server}/drip/multi-b"], data["problems"]
    assert SEEN["/drip/multi-b"] == [], "no query was sent to the second store after the deadline"
    assert data["deadline_s"] == 10
