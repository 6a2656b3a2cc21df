"""The shipped deploy/prometheus/prometheus.yml end to end (issue 43, item 8): a real ``roofwatch demo``, a real
Prometheus started with the shipped file (its one scrape job pointed at the demo, 1 s intervals, the rules file
by its path, no Alertmanager; nothing else changed, checked), the shipped rules, and the real ``roofwatch
fleet-report`` as a child process against it.

The file used to set ``cluster`` in ``external_labels``, which only what leaves Prometheus carries (remote write,
federation, alerts): the rules' ``by (cluster)`` and every report table read cluster "(none)". The cluster is now
a target label, so the recordings and the report name it. The same run shows the rest of item 8 on a real fleet
outside Kubernetes: no red "Incomplete" for the empty namespace section, the period as "10 min", class cells
that add up, and the demo's two-rank straggler (the one the status page names) listed by the classifier's rule.
"""

from __future__ import annotations

import copy
import json
import math
import re
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests.agent_process import poll, running_demo
from tests.fleet_stores import run_report
from tests.prometheus_server import PrometheusServer

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
SHIPPED = REPO / "deploy" / "prometheus" / "prometheus.yml"
RULES = REPO / "deploy" / "prometheus" / "roofwatch-rules.yml"
CLUSTER = "example"
"""The cluster the shipped file names."""


def shipped_config(target: str) -> str:
    """The shipped file with ``target`` as its one target, 1 s intervals, the rules by absolute path and no
    Alertmanager: checked to change nothing else (its relabelling, job name and timeouts' keys stay)."""
    shipped = yaml.safe_load(SHIPPED.read_text())
    config = copy.deepcopy(shipped)
    config["global"].update(scrape_interval="1s", evaluation_interval="1s")
    config["rule_files"] = [str(RULES)]
    config.pop("alerting", None)
    (job,) = config["scrape_configs"]
    job.update(scrape_timeout="1s", static_configs=[{"targets": [target]}])
    untouched = {k: v for k, v in config.items() if k not in ("global", "rule_files", "scrape_configs")}
    assert untouched == {k: v for k, v in shipped.items() if k not in ("global", "rule_files", "scrape_configs", "alerting")}
    assert {k: v for k, v in job.items() if k not in ("scrape_timeout", "static_configs")} == \
        {k: v for k, v in shipped["scrape_configs"][0].items() if k not in ("scrape_timeout", "static_configs")}
    return yaml.safe_dump(config)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    work: Path = tmp_path_factory.mktemp("shipped")
    assert CLUSTER in SHIPPED.read_text()
    with running_demo() as agent:
        prometheus = PrometheusServer(work, [], config_text=shipped_config(agent.url.removeprefix("http://").rstrip("/")))
        try:
            poll(lambda: prometheus.query("roofwatch_cluster:gpus:sum"), timeout=90, interval=0.5,
                 what="the shipped rules' per-cluster recording")
            yield agent, prometheus, work
        finally:
            log = prometheus.stop()
            assert "error" not in log.lower(), log[-2000:]


@pytest.fixture(scope="module")
def report(stack):
    """The report of the last 10 minutes, once its step-aligned end has data (within a minute of the first
    scrape: the end is rounded down to the 60 s step)."""
    _, prometheus, work = stack

    def ready():
        done, data = run_report(prometheus.base, work, end=int(time.time()), range_="10m")
        assert done.returncode == 0, done.stderr[-3000:]
        return (done, data, (work / "fleet.html").read_text()) if data["totals"]["gpu_hours"] > 0 else None

    return poll(ready, timeout=180, interval=3, what="a report with GPU-hours")


def test_the_rules_and_queries_see_the_shipped_cluster_label(stack) -> None:
    _, prometheus, _ = stack
    classes = prometheus.query("roofwatch_gpu_workload_class")
    assert classes and {s["metric"].get("cluster") for s in classes} == {CLUSTER}
    recorded = prometheus.query("roofwatch_cluster:gpus:sum")
    assert {s["metric"].get("cluster") for s in recorded} == {CLUSTER}, "the recording rules aggregate by it"
    assert sum(float(s["value"][1]) for s in recorded) == len({s["metric"]["uuid"] for s in classes})


def test_the_fleet_report_names_the_cluster(stack, report) -> None:
    _, prometheus, work = stack
    _, data, page = report
    assert [c["cluster"] for c in data["clusters"]] == [CLUSTER]
    assert {u["cluster"] for u in data["users"]} == {CLUSTER}
    assert f'data-cluster="{CLUSTER}"' in page and 'data-cluster=""' not in page, "no cluster row reads (none)"
    done, only = run_report(prometheus.base, work, "--cluster", CLUSTER, end=int(data["window"]["end"]), range_="10m")
    assert done.returncode == 0, done.stderr[-3000:]
    assert only["totals"]["gpu_hours"] == pytest.approx(data["totals"]["gpu_hours"])
    assert only["problems"] == []


def test_outside_kubernetes_no_incomplete_banner(report) -> None:
    done, data, page = report
    assert data["problems"] == [] and "Waste by namespace" in data["notes"]
    assert 'class="banner"' not in page and "incomplete" not in done.stdout
    assert 'id="waste-namespace-note"' in page


def test_the_period_and_step_read_as_people_say_them(report) -> None:
    _, _, page = report
    assert "(10 min), compared with the 10 min before" in page and "sampled every 1 min" in page
    assert "0.166667" not in page


def test_class_cells_add_up_on_a_real_report(report) -> None:
    _, data, page = report
    table = page[page.index("<h2>GPU-hours by class</h2>"):page.index("<h2>Wasted GPU-hours")]
    row = re.search(rf'<tr data-cluster="{CLUSTER}">(.*?)</tr>', table).group(1)
    cells = [float(c.replace(",", "")) for c in re.findall(r'<td class="num">([\d,.]+)</td>', row)]
    assert math.isclose(sum(cells[:-1]), cells[-1], abs_tol=1e-9), cells
    assert cells[-1] == pytest.approx(data["clusters"][0]["total_hours"], abs=0.05)


def test_the_demos_straggler_is_named_by_the_rule_the_status_page_uses(stack, report) -> None:
    """The demo's two-rank all-reduce: the status page names its straggler; the report lists it under the
    classifier's rule and says why the lead rule (three GPUs or more) has none."""
    agent, _, _ = stack
    _, data, page = report
    snapshot = json.loads(agent.get("api/v1/snapshot")[1])
    live = {(v["node"], str(v["gpu"])) for v in snapshot["verdicts"] if v.get("detail") == "straggler"}
    assert live, "the demo's straggler"
    assert {(s["node"], s["gpu"]) for s in data["named_stragglers"]} == live
    assert data["stragglers"] == [] and "3 or more GPUs" in page


def test_the_shipped_file_passes_promtool() -> None:
    done = subprocess.run(["promtool", "check", "config", str(SHIPPED)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_charts_service_monitor_sets_the_cluster_where_rules_see_it() -> None:
    """With the prometheus-operator the chart's ServiceMonitor is the scrape config: ``serviceMonitor.cluster``
    becomes a relabeling to the ``cluster`` target label (quoted whatever it holds); unset, none is added."""
    from tests.helm_chart import only, render

    def relabelings(values: dict) -> list[dict]:
        monitor = only(render({"serviceMonitor": {"enabled": True, **values}}), "ServiceMonitor")
        (endpoint,) = monitor["spec"]["endpoints"]
        return endpoint["relabelings"]

    named = 'gpu "east": 1'
    assert {"targetLabel": "cluster", "replacement": named, "action": "replace"} in relabelings({"cluster": named})
    assert not [r for r in relabelings({}) if r.get("targetLabel") == "cluster"]
