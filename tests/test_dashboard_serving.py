"""The serving dashboard against real agents: every panel has data, a replica counts once, the
numbers are those the agents export, and the alerts' conditions pick the replicas they should.

Two agents each play the built-in ``serving`` scenario (one 8x H100 node of vLLM, SGLang and TGI
servers in five serving states, each a fake server's real ``/metrics`` that the agent scrapes), in
two clusters, scraped by a real Prometheus that loads the shipped rules unchanged. The same server
and node names in both clusters check that the rules keep replicas apart by cluster and node, and
the 4-GPU tensor-parallel replica checks that it counts once. Expected values are computed here
from the agents' own expositions, not from the rules or the dashboard.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from agent.model.serving import SERVING_STATES
from agent.virtual.scenario import resolve_scenario
from dashboards import serving
from tests.agent_process import AgentProcess, http_get, poll
from tests.prometheus_server import PrometheusServer
from tests import test_dashboard_transforms
from tests.test_dashboard_transforms import describe, every_query_has_data, table_problems, transformed
from tests.test_dashboards import RULES, dashboards, panel_problems, panels, run_target, until_no_problems

pytestmark = pytest.mark.slow
grafana_js = test_dashboard_transforms.grafana_js
"""Node with @grafana/data (a fixture of test_dashboard_transforms)."""

DOCS = Path(__file__).resolve().parent.parent / "docs"
CLUSTERS = ("serve-east", "serve-west")
VIEW = {"datasource": "prometheus", "cluster": ".*", "model": ".*", "server": ".*"}
SCENARIO = resolve_scenario("serving")
(NODE,) = SCENARIO.nodes
REPLICA_GPUS = {w.job: len(w.gpus) for w in NODE.workloads}
"""Each server of the scenario (named after its job) and its GPUs."""


def the_panel(title: str) -> dict:
    return next(p for p in panels(dashboards()[serving.UID]) if p["title"] == title)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """``(prometheus, agents by cluster)``, once every replica of both clusters is recorded."""
    agents: dict[str, AgentProcess] = {}
    prom = None
    try:
        for cluster in CLUSTERS:
            agents[cluster] = AgentProcess("demo", "--listen", "127.0.0.1:0", "--scenario", "serving")
        for agent in agents.values():
            agent.wait_healthy()
        targets = {a.url.removeprefix("http://").rstrip("/"): c for c, a in agents.items()}
        prom = PrometheusServer(tmp_path_factory.mktemp("serving"), list(targets), rule_files=[RULES],
                                target_labels={t: {"cluster": c} for t, c in targets.items()})
        replicas = len(CLUSTERS) * len(REPLICA_GPUS)
        poll(lambda: all(len(prom.query(f"roofwatch_server:serving_{name}")) == replicas
                         for name in ("info:max", "batch_fill:ratio")), timeout=90, interval=0.5,
             what=f"{replicas} replicas recorded")
        yield prom, agents
    finally:
        log = prom.stop() if prom else ""
        for agent in agents.values():
            agent.stop()
        if log.strip():
            print(log)


def exported(agents: dict[str, AgentProcess]) -> dict[tuple[str, str], dict]:
    """Per replica ``(cluster, server)``, as the agents export it now: its GPUs, state, model and the
    per-GPU figures (which must agree on every GPU of the replica)."""
    replicas: dict[tuple[str, str], dict] = defaultdict(lambda: {"gpus": set()})
    for cluster, agent in agents.items():
        status, body = http_get(agent.url + "metrics")
        assert status == 200
        server_of: dict[str, str] = {}
        families = list(text_string_to_metric_families(body.decode()))
        for family in families:
            for sample in family.samples:
                if sample.name == "roofwatch_serving_info":
                    key = (cluster, sample.labels["server"])
                    server_of[sample.labels["uuid"]] = sample.labels["server"]
                    replicas[key]["gpus"].add(sample.labels["uuid"])
                    replicas[key].update(state=sample.labels["state"], model=sample.labels["model"])
        for family in families:
            for sample in family.samples:
                uuid = sample.labels.get("uuid")
                if sample.name.startswith("roofwatch_serving_") and uuid in server_of and sample.name != "roofwatch_serving_info":
                    extra = sorted(v for k, v in sample.labels.items() if k not in ("node", "gpu", "uuid"))
                    name = sample.name.removeprefix("roofwatch_serving_") + (f"{{{','.join(extra)}}}" if extra else "")
                    figures = replicas[(cluster, server_of[uuid])]
                    if name in figures:
                        assert figures[name] == pytest.approx(sample.value), (cluster, server_of[uuid], name)
                    figures[name] = sample.value
    return dict(replicas)


def fill(replica: dict) -> float:
    """Running / the batch the KV cache could hold; where the agent leaves that batch out (KV usage
    under 1%), the KV usage, which the ratio equals by the agent's definition (running / usage)."""
    if "possible_batch_requests" in replica:
        return replica["requests{running}"] / replica["possible_batch_requests"]
    return replica["kv_cache_usage_ratio"]


def instant(prom: PrometheusServer, target: dict, view: dict[str, str] = VIEW) -> list[dict]:
    return run_target(prom, {**target, "instant": True}, view)


# --- every panel ------------------------------------------------------------------------------

def test_every_panel_query_runs_and_returns_data(served):
    prom, _ = served
    problems = until_no_problems(lambda: [problem for panel in panels(dashboards()[serving.UID])
                                          for problem in panel_problems(prom, panel, VIEW, serving.MAY_BE_EMPTY)])
    assert problems == [], "\n".join(problems)


def test_variables_list_the_models_servers_and_clusters(served):
    prom, agents = served
    expected = {"cluster": set(CLUSTERS), "server": set(REPLICA_GPUS),
                "model": {r["model"] for r in exported(agents).values()} - {""}}
    assert len(expected["model"]) >= 3
    for variable in dashboards()[serving.UID]["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]["query"].replace('"$cluster"', '".*"').replace('"$model"', '".*"')
            selector, label = query.removeprefix("label_values(").removesuffix(")").rsplit(", ", 1)
            values = {s[label] for s in prom.api("series", **{"match[]": selector}) if s.get(label)}
            assert expected[variable["name"]] <= values, (variable["name"], values)


# --- the numbers are the agents' --------------------------------------------------------------

def test_each_replica_counts_once_across_its_gpus_and_clusters_stay_apart(served):
    """The 4-GPU SGLang replica is one server with 4 GPUs per cluster, not 4 servers or 8 GPUs;
    the fleet stats add replicas, not GPUs' copies of their figures."""
    prom, agents = served
    replicas = exported(agents)
    assert {len(r["gpus"]) for r in replicas.values()} >= {1, max(REPLICA_GPUS.values())}
    gpus = {(s["metric"]["cluster"], s["metric"]["server"]): float(s["value"][1])
            for s in prom.query("roofwatch_server:serving_gpus:count")}
    assert gpus == {key: len(r["gpus"]) for key, r in replicas.items()}
    value = lambda title: float(instant(prom, the_panel(title)["targets"][0])[0]["value"][1])  # noqa: E731
    assert value("Servers") == len(replicas) == len(CLUSTERS) * len(REPLICA_GPUS)
    assert value("Serving GPUs") == sum(len(r["gpus"]) for r in replicas.values()) == len(CLUSTERS) * NODE.gpus
    tokens = sum(r["output_tokens_per_second_per_gpu"] * len(r["gpus"]) for r in replicas.values())
    assert value("Output tokens/s") == pytest.approx(tokens, rel=0.05)
    assert value("Tokens/s per GPU") == pytest.approx(tokens / (len(CLUSTERS) * NODE.gpus), rel=0.05)
    assert value("Requests waiting") == pytest.approx(sum(r.get("requests{waiting}", 0) for r in replicas.values()), rel=0.05)


def test_servers_by_state_are_the_agents_verdicts(served):
    prom, agents = served
    counts: dict[str, int] = defaultdict(int)
    for replica in exported(agents).values():
        counts[replica["state"]] += 1
    assert set(counts) <= set(SERVING_STATES) and len(counts) >= 4, counts
    panel = the_panel("Servers by state")
    got = {s["metric"]["state"]: float(s["value"][1]) for s in instant(prom, panel["targets"][0])}
    assert got == counts
    gpus = {s["metric"]["state"]: float(s["value"][1]) for s in instant(prom, the_panel("Serving GPUs by state")["targets"][0])}
    assert sum(gpus.values()) == len(CLUSTERS) * NODE.gpus and set(gpus) == set(counts)


def test_alert_conditions_pick_the_replicas_the_thresholds_say(served):
    """Each serving alert's expression, run on the live data, names exactly the replicas that the
    shipped thresholds select from the exported figures (its `for:` aside)."""
    prom, agents = served
    rules = {r["alert"]: r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r}
    thresholds = {r["record"].rsplit(":", 1)[1]: float(r["expr"].strip()[7:-1])
                  for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]
                  if r.get("record", "").startswith("roofwatch:alert_threshold:serving_")}
    replicas = exported(agents)
    expected = {
        "ServingUnderBatched": {key for key, r in replicas.items()
                                if r.get("tpot_floor_multiple", 0) > thresholds["serving_far_ratio"]
                                and fill(r) < thresholds["serving_under_batched"] and r["state"] != "prefill_heavy"},
        "ServingKvCacheSaturated": {key for key, r in replicas.items()
                                    if r.get("requests{waiting}", 0) >= thresholds["serving_queue"]
                                    and (r.get("kv_cache_usage_ratio", 0) >= thresholds["serving_kv_full"]
                                         or r.get("preemptions_per_second", 0) > 0)},
    }
    assert expected["ServingKvCacheSaturated"] and expected["ServingUnderBatched"], expected
    for name, keys in expected.items():
        got = {(s["metric"]["cluster"], s["metric"]["server"]) for s in prom.query(rules[name]["expr"])}
        assert got == keys, name
    stat = the_panel("Under-batched, far from floor")["targets"][0]
    assert float(instant(prom, stat)[0]["value"][1]) == len(expected["ServingUnderBatched"])


# --- picking and filtering --------------------------------------------------------------------

def test_picking_a_server_in_one_cluster_shows_only_that_replica(served):
    """What a click in the table does: every per-server panel shows that server, in that cluster."""
    prom, _ = served
    server = max(REPLICA_GPUS, key=REPLICA_GPUS.get)
    view = {**VIEW, "cluster": CLUSTERS[1], "server": server}
    for panel in panels(dashboards()[serving.UID]):
        for target in panel["targets"]:
            for series in run_target(prom, target, view):
                metric = series["metric"]
                assert metric.get("server", server) == server and metric.get("cluster", CLUSTERS[1]) == CLUSTERS[1], \
                    (panel["title"], metric)
    assert float(instant(prom, the_panel("Servers")["targets"][0], view)[0]["value"][1]) == 1
    assert float(instant(prom, the_panel("Serving GPUs")["targets"][0], view)[0]["value"][1]) == REPLICA_GPUS[server]


def test_the_table_links_a_server_to_this_dashboard_and_a_node_to_the_node_dashboard():
    table = the_panel("Servers now")
    links = {o["matcher"]["options"]: [p["value"] for p in o["properties"] if p["id"] == "links"]
             for o in table["fieldConfig"]["overrides"]}
    assert f"/d/{serving.UID}?" in links["Server"][0][0]["url"] and "var-server=${__value.raw}" in links["Server"][0][0]["url"]
    assert "/d/roofwatch-node?" in links["Node"][0][0]["url"]
    mapping = next(p["value"] for o in table["fieldConfig"]["overrides"] if o["matcher"]["options"] == "State"
                   for p in o["properties"] if p["id"] == "mappings")
    assert set(mapping[0]["options"]) == set(SERVING_STATES) == set(serving.STATE_COLOURS)


def table_columns(prom: PrometheusServer, table: dict, rows: int, what: str) -> dict[str, list]:
    """The table as Grafana shows it once every query has data (its own transformations run in Node): one table of
    ``rows`` rows, column name -> values."""
    seen: dict[str, list[dict]] = {}

    def check() -> list[str]:
        seen["frames"], seen["out"] = transformed(prom, table, VIEW)
        problems = table_problems(table, seen["frames"], seen["out"])
        if not problems and seen["out"][0]["length"] != rows:
            problems.append(f"{seen['out'][0]['length']} rows, not {what}")
        return problems

    problems = until_no_problems(check, lambda: every_query_has_data(seen))
    assert problems == [], "\n".join(problems + ["Grafana's input frames:", describe(seen["frames"]),
                                                 "after the transformations:", describe(seen["out"], 10)])
    (out,) = seen["out"]
    return {f["name"]: f["values"] for f in out["fields"]}


def test_the_servers_table_shows_one_row_per_replica(served, grafana_js):
    prom, _ = served
    table = the_panel("Servers now")
    columns = table_columns(prom, table, len(CLUSTERS) * len(REPLICA_GPUS), "one per replica")
    assert set(columns["state"]) <= set(SERVING_STATES) and all(columns["advice"])
    assert [v for v in columns["Value #C"] if v is not None], "no TPOT / floor in the table"
    assert table["options"]["sortBy"] == [{"desc": True, "displayName": "TPOT / floor"}]


# --- needs attention (issue 43, item 2) -------------------------------------------------------

NEEDS_A_KNOB = {"kv_saturated", "under_batched", "prefill_heavy", "above_floor"}
"""The states the issue names as needing attention: a full KV cache with a queue, under-batched,
prefill-heavy, far above the floor (the status page and ``top`` list the same servers)."""


def test_the_attention_row_lists_the_replicas_in_a_state_with_a_knob_and_what_to_do(served, grafana_js):
    prom, agents = served
    replicas = exported(agents)
    expected = {key for key, r in replicas.items() if r["state"] in NEEDS_A_KNOB}
    assert len(expected) == 4 * len(CLUSTERS), "the scenario's four servers in each cluster"
    stat = the_panel("Servers needing attention")["targets"][0]
    assert float(instant(prom, stat)[0]["value"][1]) == len(expected)
    table = the_panel("Servers that need attention")
    columns = table_columns(prom, table, len(expected), "one per replica that needs attention")
    assert set(zip(columns["cluster"], columns["server"])) == expected
    assert {(c, s): st for c, s, st in zip(columns["cluster"], columns["server"], columns["state"])} == {
        key: replicas[key]["state"] for key in expected}
    waiting = {(c, s): w for c, s, w in zip(columns["cluster"], columns["server"], columns["Value #C"])}
    assert all(waiting[key] == pytest.approx(replicas[key].get("requests{waiting}", 0)) for key in expected)
    mapping = next(p["value"] for o in table["fieldConfig"]["overrides"] if o["matcher"]["options"] == "What to do"
                   for p in o["properties"] if p["id"] == "mappings")[0]["options"]
    docs = " ".join(DOCS.joinpath("serving.md").read_text().replace("`", "").lower().split())
    assert set(columns["advice"]) <= set(mapping), "every advice code shown has its words"
    for code, result in mapping.items():
        assert result["text"].lower() in docs, f"{code}: the advice is docs/serving.md's ({result['text']})"
