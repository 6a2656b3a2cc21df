"""The Grafana dashboards: generated JSON is committed and current, lints clean, and every panel's
queries run against a real Prometheus scraping real agents and return data.

There is no Grafana here, so the live test does what Grafana would: substitute the template
variables and run each target through the Prometheus HTTP API, instant or range as the target asks.
It also checks what Grafana would silently get wrong: a legend naming a label the result lacks, a
table renaming a column no query returns, a variable query that lists nothing.
"""

from __future__ import annotations

import json
import re
import time
import urllib.parse
from pathlib import Path

import pytest
from grafana_foundation_sdk.cog.plugins import register_default_plugins
from grafana_foundation_sdk.models.dashboard import Dashboard as DashboardModel

from agent.model import WORKLOAD_CLASSES
from dashboards import cluster, generate, job, node, serving
from dashboards.common import CLASS_CODES
from exporters.metrics import METRICS
from tests.agent_process import AgentProcess, http_get, poll
from tests.prometheus_server import PrometheusServer

REPO = Path(__file__).resolve().parent.parent
RULES = REPO / "deploy" / "prometheus" / "roofwatch-rules.yml"
MODULES = {cluster.UID: cluster, node.UID: node, job.UID: job, serving.UID: serving}
LIVE = {cluster.UID: cluster, node.UID: node, job.UID: job}
"""The dashboards the fleet below fills; the serving dashboard has its own (tests/test_dashboard_serving.py)."""

ALLOWED_PANEL_TYPES = {"row", "stat", "timeseries", "table", "bargauge", "state-timeline", "xychart",
                       "piechart", "gauge", "status-history", "heatmap", "barchart", "histogram", "text"}
"""Current Grafana 11 core panels. Anything else (graph, singlestat, table-old, the old piechart
plugin) is deprecated or external and would be auto-migrated or missing on import."""

GRAFANA_11_6_SCHEMA = 41
BUILTINS = {"__rate_interval": "10s", "__interval": "2s", "__range": "5m", "__range_s": "300"}
"""What Grafana would put in for its built-in variables at a 1 s scrape interval."""


def dashboards() -> dict[str, dict]:
    return {name.removesuffix(".json"): json.loads((REPO / "dashboards" / name).read_text())
            for name in generate.BUILDERS}


def panels(dashboard: dict) -> list[dict]:
    return [p for p in dashboard["panels"] if p["type"] != "row"]


# --- generated and committed ---------------------------------------------------------------

def test_committed_json_is_what_the_generator_writes():
    assert generate.stale_files() == [], "run: python -m dashboards.generate"


def test_check_mode_reports_a_hand_edited_file_and_stale_docs(tmp_path):
    (tmp_path / "dashboards").mkdir()
    (tmp_path / "docs").mkdir()
    for name, text in generate.render_all().items():
        (tmp_path / "dashboards" / name).write_text(text)
    docs = tmp_path / "docs" / "dashboards.md"
    docs.write_text(generate.DOCS.read_text())
    assert generate.stale_files(tmp_path / "dashboards", docs) == []
    edited = tmp_path / "dashboards" / f"{node.UID}.json"
    edited.write_text(edited.read_text().replace("Roofline", "Roofline (edited)"))
    (tmp_path / "dashboards" / "old-dashboard.json").write_text("{}")
    docs.write_text(docs.read_text().replace("*Roofline* (xychart)", "*Roofline*"))
    assert generate.stale_files(tmp_path / "dashboards", docs) == [
        f"{node.UID}.json", "old-dashboard.json", "docs/dashboards.md"]


def test_docs_list_every_panel_with_its_description():
    docs = generate.DOCS.read_text()
    for dashboard in dashboards().values():
        for panel in panels(dashboard):
            assert f"*{panel['title']}* ({panel['type']})" in docs


# --- lint ----------------------------------------------------------------------------------

@pytest.mark.parametrize("uid", MODULES)
def test_lint(uid):
    dashboard = dashboards()[uid]
    assert dashboard["uid"] == uid
    assert dashboard["schemaVersion"] == GRAFANA_11_6_SCHEMA
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)) and all(isinstance(i, int) and i > 0 for i in ids), ids
    titles = [p["title"] for p in panels(dashboard)]
    assert len(titles) == len(set(titles)), "panel titles must be unique within a dashboard"
    for panel in panels(dashboard):
        where = f"{uid} / {panel['title']}"
        assert panel["type"] in ALLOWED_PANEL_TYPES, f"{where}: deprecated or unknown type {panel['type']}"
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, where
        assert len(panel.get("description", "")) >= 80, f"{where}: say what a bad value means and what to do"
        assert panel["targets"], f"{where}: no queries"
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)) and all(refs), f"{where}: refIds {refs}"
        for target in panel["targets"]:
            assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, where
            assert target["expr"].strip(), where


@pytest.mark.parametrize("uid", MODULES)
def test_layout_fits_the_grid_without_overlaps(uid):
    occupied: dict[tuple[int, int], str] = {}
    for panel in dashboards()[uid]["panels"]:
        pos = panel["gridPos"]
        assert 0 <= pos["x"] and pos["x"] + pos["w"] <= 24, f"{panel['title']}: {pos}"
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in occupied, f"{panel['title']} overlaps {occupied[(x, y)]}"
                occupied[(x, y)] = panel["title"]


@pytest.mark.parametrize("uid", MODULES)
def test_variables_are_templated_and_every_reference_is_defined(uid):
    dashboard = dashboards()[uid]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert "cluster" in variables
    for name, variable in variables.items():
        if variable["type"] == "query":
            assert variable["datasource"]["uid"] == "${datasource}", name
    known = set(variables) | set(BUILTINS)
    text = json.dumps([p.get("targets", []) for p in dashboard["panels"]])
    used = set(re.findall(r"\$\{?(\w+)", text))
    assert used <= known, f"undefined variables: {used - known}"


def test_the_dashboards_have_the_variables_their_subject_needs():
    names = {uid: {v["name"] for v in d["templating"]["list"]} for uid, d in dashboards().items()}
    assert names[cluster.UID] >= {"datasource", "cluster"}
    assert names[node.UID] >= {"datasource", "cluster", "node", "gpu"}
    assert names[job.UID] >= {"datasource", "cluster", "job"}
    assert names[serving.UID] >= {"datasource", "cluster", "model", "server"}


def test_job_panels_narrow_per_gpu_series_to_the_jobs_nodes_before_joining():
    """The left side of a join to the job is read in full by PromQL: unnarrowed, a job panel reads
    (and joins) every GPU of the fleet over its whole range (docs/performance.md, Fleet)."""
    joins = [t["expr"] for p in panels(dashboards()[job.UID]) for t in p.get("targets", [])
             if "group_left (job_id)" in t["expr"]]
    assert joins
    for expr in joins:
        left = expr.split("* on (node, gpu, uuid) group_left (job_id)")[0]
        selectors = re.findall(r"(roofwatch[\w:]*)\{((?:[^{}]|\$\{\w+\})*)\}", left)
        assert selectors, expr
        for name, matchers in selectors:
            assert 'node=~"${job_node}"' in matchers, f"{name}{{{matchers}}} is not narrowed to the job's nodes"
    variable = next(v for v in dashboards()[job.UID]["templating"]["list"] if v["name"] == "job_node")
    assert variable["includeAll"] and "allValue" not in variable, "All must expand to the job's nodes, not .*"


def test_every_metric_a_query_names_exists():
    """A renamed metric or recording rule must not leave a panel silently empty."""
    recorded = set(re.findall(r"record: (\S+)", RULES.read_text()))
    exported = {m.name for m in METRICS}
    for uid, dashboard in dashboards().items():
        text = json.dumps(dashboard)
        for name in set(re.findall(r"roofwatch[a-z_]*:[a-z0-9_:]+|roofwatch_[a-z0-9_]+", text)):
            if name in {"roofwatch_gpu"}:
                continue
            assert name in recorded or name in exported, f"{uid}: unknown metric {name}"


def test_class_timeline_maps_every_workload_class():
    timeline = next(p for p in panels(dashboards()[node.UID]) if p["title"] == "Workload class")
    mapping = timeline["fieldConfig"]["defaults"]["mappings"][0]["options"]
    assert {v["text"] for v in mapping.values()} == set(WORKLOAD_CLASSES)
    assert {int(k) for k in mapping} == set(CLASS_CODES.values())


def test_node_dashboard_has_a_roofline_and_a_class_timeline():
    types = {p["title"]: p["type"] for p in panels(dashboards()[node.UID])}
    assert types["Roofline"] == "xychart"
    assert types["Workload class"] == "state-timeline"


def test_node_dashboard_shows_the_jitter_evidence_per_gpu():
    """Wait share, power-fabric correlation, step-time CV and the reason's basis, one row per GPU."""
    evidence = next(p for p in panels(dashboards()[node.UID]) if p["title"] == "Jitter evidence")
    exprs = " ".join(t["expr"] for t in evidence["targets"])
    for name in ("roofwatch_gpu_workload_reason_info", "roofwatch_gpu_comm_wait_ratio",
                 "roofwatch_gpu_power_fabric_correlation", "roofwatch_gpu_step_time_cv"):
        assert name in exprs, name
    renames = next(t for t in evidence["transformations"] if t["id"] == "organize" and t["options"]["renameByName"])
    assert renames["options"]["renameByName"]["basis"] == "Evidence"
    assert all(t.get("instant") and t.get("format") == "table" for t in evidence["targets"])


def test_dashboards_load_back_into_the_sdk_model():
    register_default_plugins()
    for uid, dashboard in dashboards().items():
        model = DashboardModel.from_json(dashboard)
        assert model.uid == uid and len(model.panels) == len(dashboard["panels"])


# --- live: every panel's queries against a real Prometheus ---------------------------------

CLUSTERS = {"node-a": "train", "node-b": "train", "node-c": "train", "demo-node": "lab"}
VIEWS: dict[str, dict[str, str]] = {
    cluster.UID: {"datasource": "prometheus", "cluster": ".*"},
    node.UID: {"datasource": "prometheus", "cluster": ".*", "node": "demo-node", "gpu": ".*"},
    job.UID: {"datasource": "prometheus", "cluster": ".*", "job": "pretrain-7b",
              "job_node": "(node-a|node-b|node-c)"},  # the hidden variable at All, as Grafana expands it
}
"""The variables a user would pick: the whole fleet, the demo node (every class, throttling, an
idle-but-held GPU), and the multi-node job with a straggler."""


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """Four agents (three fleet nodes, and the 8-GPU demo node through the real NVML backend over the
    fake driver) in two clusters, scraped by a real
    Prometheus that loads the shipped recording rules unchanged."""
    workdir = tmp_path_factory.mktemp("dashboards")
    agents = [AgentProcess("demo", "--listen", "127.0.0.1:0", "--scenario", "fleet", "--virtual-node", name)
              for name in ("node-a", "node-b", "node-c")]
    agents.append(AgentProcess("demo", "--listen", "127.0.0.1:0", "--backend", "nvml-virtual"))
    prom = None
    try:
        for agent in agents:
            agent.wait_healthy()
        targets = [a.url.removeprefix("http://").rstrip("/") for a in agents]
        labels = {t: {"cluster": c} for t, c in zip(targets, CLUSTERS.values())}
        prom = PrometheusServer(workdir, targets, rule_files=[RULES], target_labels=labels)
        poll(lambda: len(prom.query("roofwatch_build_info")) == len(agents), timeout=60, what="all agents scraped")
        yield prom
    finally:
        log = prom.stop() if prom else ""
        for agent in agents:
            agent.stop()
        if log.strip():
            print(log)


def substitute(text: str, view: dict[str, str]) -> str:
    values = {**BUILTINS, **view}
    out = re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)", lambda m: values[m.group(1) or m.group(2)], text)
    assert "$" not in out, out
    return out


def run_target(prom: PrometheusServer, target: dict, view: dict[str, str]) -> list[dict]:
    """What Grafana's Prometheus datasource would fetch for this target."""
    expr = substitute(target["expr"], view)
    if target.get("instant"):
        status, body = http_get(f"{prom.base}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    else:
        end = time.time()
        status, body = http_get(f"{prom.base}/api/v1/query_range?" + urllib.parse.urlencode(
            {"query": expr, "start": end - 60, "end": end, "step": 2}))
    data = json.loads(body)
    if status != 200 or data.get("status") != "success":
        raise AssertionError(f"query failed ({status}): {data.get('error')}\n{expr}")
    return data["data"]["result"]


def panel_problems(prom: PrometheusServer, panel: dict, view: dict[str, str], may_be_empty: dict) -> list[str]:
    problems = []
    labels_seen: set[str] = set()
    for target in panel["targets"]:
        where = f"{panel['title']} [{target['refId']}]"
        result = run_target(prom, target, view)
        if not result:
            if panel["title"] not in may_be_empty:
                problems.append(f"{where}: no data")
            continue
        for series in result:
            labels_seen |= set(series["metric"])
            for label in re.findall(r"\{\{\s*(\w+)\s*\}\}", target.get("legendFormat", "")):
                if label not in series["metric"]:
                    problems.append(f"{where}: legend uses {{{{{label}}}}}, the result has {sorted(series['metric'])}")
                    break
    if not labels_seen and panel["title"] in may_be_empty:
        return problems  # no data, as allowed: its columns are checked where it has data
    for transformation in panel.get("transformations", []):
        if transformation["id"] == "organize":
            for column in transformation["options"]["renameByName"]:
                if not column.startswith(("Value", "Time")) and column not in labels_seen:
                    problems.append(f"{panel['title']}: renames column {column!r}, which no query returns")
    return problems


def until_no_problems(check, ready=lambda: False, timeout: float = 90, settle: float = 10) -> list[str]:
    """Run ``check`` until it finds nothing wrong (the fleet and the rules need a few seconds), or
    until ``timeout``, or ``settle`` seconds after ``ready()`` first said every query has data: a
    problem that outlasts that is in the panel, not in the warm-up."""
    deadline = time.monotonic() + timeout
    while True:
        problems = check()
        if not problems or time.monotonic() > deadline:
            return problems
        if ready():
            deadline = min(deadline, time.monotonic() + settle)
        time.sleep(1)


def dashboard_problems(prom: PrometheusServer, uid: str) -> list[str]:
    dashboard = dashboards()[uid]
    return [problem for panel in panels(dashboard)
            for problem in panel_problems(prom, panel, VIEWS[uid], MODULES[uid].MAY_BE_EMPTY)]


@pytest.mark.slow
@pytest.mark.parametrize("uid", LIVE)
def test_every_panel_query_runs_and_returns_data(fleet, uid):
    """Polls until every panel has data (rules need a few evaluations), then reports what lacks it."""
    problems = until_no_problems(lambda: dashboard_problems(fleet, uid))
    assert problems == [], "\n".join(problems)


@pytest.mark.slow
@pytest.mark.parametrize("uid", LIVE)
def test_variable_queries_list_the_fleet(fleet, uid):
    expected = {"cluster": {"train", "lab"}, "node": {"node-a", "node-b", "node-c", "demo-node"},
                "gpu": {str(i) for i in range(8)}, "job": {"pretrain-7b", "finetune-a", "llama-8b-finetune"},
                "job_node": {"node-a", "node-b", "node-c"}}
    for variable in dashboards()[uid]["templating"]["list"]:
        if variable["type"] != "query":
            continue
        match = re.fullmatch(r"label_values\((.*), (\w+)\)", variable["query"]["query"])
        assert match, variable["query"]
        selector = substitute(match.group(1), {**VIEWS[uid], "node": ".*"})
        series = fleet.api("series", **{"match[]": selector})
        values = {s[match.group(2)] for s in series if match.group(2) in s}
        assert expected[variable["name"]] <= values, (variable["name"], values)


@pytest.mark.slow
def test_roofline_roof_matches_the_gpu_model_peaks(fleet):
    """The roof the panel draws: corners at (0.1, 0.1 x bandwidth), (ridge, peak), (10000, peak),
    for the H100's bf16 peak and HBM3 bandwidth, exactly as the spec catalogue exports them."""
    roofline = next(p for p in panels(dashboards()[node.UID]) if p["title"] == "Roofline")
    view = {**VIEWS[node.UID], "node": "node-a"}
    xs = {s["metric"]["point"]: float(s["value"][1]) for s in run_target(fleet, roofline["targets"][2], view)}
    ys = {s["metric"]["point"]: float(s["value"][1]) for s in run_target(fleet, roofline["targets"][3], view)}
    bandwidth = float(fleet.query('max(roofwatch_gpu_peak_memory_bandwidth_bytes_per_second{node="node-a"})')[0]["value"][1])
    peak = float(fleet.query('max(roofwatch_gpu_peak_flops{node="node-a", dtype="bf16"})')[0]["value"][1])
    assert sorted(xs) == sorted(ys) == ["p1", "p2", "p3"]
    assert xs["p1"] < xs["p2"] < xs["p3"]
    assert ys["p1"] == pytest.approx(xs["p1"] * bandwidth)
    assert ys["p2"] == ys["p3"] == pytest.approx(peak)
    assert xs["p2"] * bandwidth == pytest.approx(peak), "the ridge is where the memory roof meets the compute roof"
    # Every GPU with an intensity has a FLOP/s series with the same labels, so the merge pairs
    # each GPU's x with its y (an idle GPU has FLOP/s 0 and no intensity: no point, as it should).
    points_x = run_target(fleet, roofline["targets"][0], view)
    points_y = run_target(fleet, roofline["targets"][1], view)
    key = lambda s: tuple(sorted((k, v) for k, v in s["metric"].items() if k != "__name__"))  # noqa: E731
    assert len(points_x) == 3, "node-a runs three of its four GPUs"
    assert {key(s) for s in points_x} <= {key(s) for s in points_y}


@pytest.mark.slow
def test_cluster_variable_filters(fleet):
    """Picking one cluster leaves the other's nodes out (the selector is not decorative)."""
    by_node = next(p for p in panels(dashboards()[cluster.UID]) if p["title"] == "MFU by node")
    lab = run_target(fleet, by_node["targets"][0], {**VIEWS[cluster.UID], "cluster": "lab"})
    assert {s["metric"]["node"] for s in lab} == {"demo-node"}


@pytest.mark.slow
def test_waste_panels_count_the_gpus_the_agents_label_wasted(fleet):
    """Issue 43: the cluster dashboard counts waste by the agents' own waste label, so it names the same GPUs as
    their status pages and ``top``: per kind, and idle-but-allocated only where the agent says held."""
    kinds = {"idle_held", "input_starved", "communication_jittered"}
    by_kind = next(p for p in panels(dashboards()[cluster.UID]) if p["title"] == "GPUs wasted, by kind")
    held = next(p for p in panels(dashboards()[cluster.UID]) if p["title"] == "Idle but allocated")

    def problems() -> list[str]:
        exported: dict[str, int] = {}
        for series in fleet.query("roofwatch_gpu_workload_reason_info"):
            exported[series["metric"]["waste"]] = exported.get(series["metric"]["waste"], 0) + 1
        if not kinds <= set(exported):
            return [f"the demo node has held idle, starved and jittered GPUs: {exported}"]
        shown = {s["metric"]["waste"]: float(s["value"][1])
                 for s in run_target(fleet, {**by_kind["targets"][0], "instant": True}, VIEWS[cluster.UID])}
        (value,) = run_target(fleet, {**held["targets"][0], "instant": True}, VIEWS[cluster.UID])
        out = []
        if shown != {w: n for w, n in exported.items() if w in kinds | {"spare"}}:
            out.append(f"by kind {shown} against the agents' {exported}")
        if float(value["value"][1]) != exported["idle_held"]:
            out.append(f"idle but allocated {value['value'][1]} against the agents' {exported['idle_held']}")
        return out

    assert until_no_problems(problems) == []


@pytest.mark.slow
def test_mfu_and_mbu_bars_are_coloured_only_where_they_judge_the_verdict(fleet):
    """Issue 43 item 6: the node's MFU bars take the MFU bands only for compute-bound GPUs and the MBU bars the MBU
    bands only for memory-bound ones; every other GPU's figures are drawn grey, so a decode at its floor is not red
    for its MFU. The GPUs in each query are checked against the class the agent exports, and the colours the panel
    gives each query against the bands docs/views.md states."""
    bars = next(p for p in panels(dashboards()[node.UID]) if p["title"] == "MFU and MBU now")
    view = VIEWS[node.UID]
    targets = {t["refId"]: t for t in bars["targets"]}

    def problems() -> list[str]:
        classes = {s["metric"]["gpu"]: s["metric"]["class"] for s in fleet.query(
            'roofwatch_gpu_workload_class{node="demo-node"} == 1')}
        shown = {ref: {s["metric"]["gpu"] for s in run_target(fleet, t, view)} for ref, t in targets.items()}
        want = {"A": {g for g, c in classes.items() if c == "compute_bound"},
                "B": {g for g, c in classes.items() if c == "memory_bound"}}
        out = [f"{ref}: {shown[ref]} against {want[ref]}" for ref in "AB" if shown[ref] != want[ref] or not want[ref]]
        out += [f"{grey} overlaps {judged}" for judged, grey in (("A", "C"), ("B", "D")) if shown[judged] & shown[grey]]
        return out

    assert until_no_problems(problems) == []
    overrides = {o["matcher"]["options"]: o["properties"] for o in bars["fieldConfig"]["overrides"]}
    def steps(props: list[dict]) -> list[tuple]:
        return [(s["value"], s["color"]) for p in props if p["id"] == "thresholds" for s in p["value"]["steps"]]

    assert [(s["value"], s["color"]) for s in bars["fieldConfig"]["defaults"]["thresholds"]["steps"]] == [
        (None, "red"), (0.2, "orange"), (0.4, "green")], "MFU: red below 20%, green from 40%"
    assert steps(overrides["B"]) == [(None, "red"), (0.4, "orange"), (0.55, "green")], "MBU: red below 40%, green from 55%"
    for ref in "CD":
        assert [p["value"]["mode"] for p in overrides[ref] if p["id"] == "color"] == ["fixed"], f"{ref} is not judged"
