"""VictoriaMetrics end to end, all real processes: agents -> vmagent -> VictoriaMetrics <- vmalert,
the dashboards' queries against it, and a Prometheus remote-writing into it.

The agents are ``roofwatch demo`` children: the three nodes of the built-in ``fleet`` scenario (one
job across them with a slow rank on node-c), the 8-GPU demo node through the NVML backend over the
fake driver, and the ``serving`` scenario's node (fake vLLM, SGLang and TGI servers). vmagent scrapes
them with the shipped deploy/victoriametrics/vmagent.yml (only its targets replaced) and
remote-writes into a single-node VictoriaMetrics; vmalert evaluates the shipped
deploy/prometheus/roofwatch-rules.yml, unchanged, every 2 s against it, writes the recording rules
back by remote write and sends alerts to a notifier here (a loopback HTTP receiver).

VictoriaMetrics runs with ``-search.latencyOffset=2s`` (default 30 s: the newest 30 s of samples are
held back from queries while they may still be incomplete), so that a test of a few minutes sees
recent points; nothing else differs from its defaults but the cache (tests/victoriametrics.py).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from dashboards import serving
from tests.agent_process import AgentProcess, http_get, poll, serving as serving_thread
from tests.prometheus_server import free_port
from tests.test_dashboards import MODULES, VIEWS, dashboards, panel_problems, panels, until_no_problems
from tests.victoriametrics import VictoriaMetrics, VmAgent, VmAlert, available

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not available(), reason="victoria-metrics missing: apt-get install victoria-metrics")]

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "deploy" / "prometheus" / "roofwatch-rules.yml"
VMAGENT_CONFIG = ROOT / "deploy" / "victoriametrics" / "vmagent.yml"
REMOTE_WRITE_CONFIG = ROOT / "deploy" / "prometheus" / "remote-write-victoriametrics.yml"
CLUSTER = "vm-fleet"
FLEET_NODES = ("node-a", "node-b", "node-c")
AGENT_ARGS = [*(("--scenario", "fleet", "--virtual-node", n) for n in FLEET_NODES),
              ("--backend", "nvml-virtual"), ("--scenario", "serving")]
NODES = {*FLEET_NODES, "demo-node", "serving-node"}
DASHBOARD_VIEWS = {**VIEWS, serving.UID: {"datasource": "prometheus", "cluster": ".*", "model": ".*", "server": ".*"}}
MAY_BE_EMPTY_UNDER_VM: dict[str, str] = {}
"""Panels that may have no data here but do under Prometheus, with the reason: none. Every panel
of every dashboard has data from this fleet, as under Prometheus (tests/test_dashboards.py)."""


class Notifications(BaseHTTPRequestHandler):
    """Alertmanager's POST /api/v2/alerts, as vmalert calls it: records each alert it is sent."""

    received: list[dict] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path.endswith("/alerts"):
            type(self).received.extend(json.loads(body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def vmagent_config(targets: list[str], cluster: str) -> str:
    """The shipped vmagent.yml with these targets and this cluster; checked to change nothing else."""
    config = yaml.safe_load(VMAGENT_CONFIG.read_text())
    config["global"]["external_labels"]["cluster"] = cluster
    config["global"]["scrape_interval"] = "1s"
    (job,) = config["scrape_configs"]
    job["scrape_timeout"] = "1s"
    job["static_configs"] = [{"targets": targets}]
    return yaml.safe_dump(config)


def test_shipped_vmagent_config_passes_dry_run(tmp_path):
    ok = subprocess.run(["vmagent", "-dryRun", f"-promscrape.config={VMAGENT_CONFIG}"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    broken = tmp_path / "broken.yml"
    broken.write_text(VMAGENT_CONFIG.read_text().replace("static_configs:", "static_config:"))
    bad = subprocess.run(["vmagent", "-dryRun", f"-promscrape.config={broken}"], capture_output=True, text=True)
    assert bad.returncode != 0 and "static_config" in bad.stderr + bad.stdout, "the dry run has no teeth"


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool missing: apt-get install prometheus")
def test_shipped_remote_write_config_is_valid_prometheus_config():
    result = subprocess.run(["promtool", "check", "config", str(REMOTE_WRITE_CONFIG)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    config = yaml.safe_load(REMOTE_WRITE_CONFIG.read_text())
    assert [w["url"] for w in config["remote_write"]] == ["http://victoria-metrics:8428/api/v1/write"]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """``(vm, vmalert, agents)`` once vmagent has delivered every agent and vmalert has recorded."""
    workdir = tmp_path_factory.mktemp("vm-e2e")
    agents = [AgentProcess("demo", "--listen", "127.0.0.1:0", *args) for args in AGENT_ARGS]
    processes = []
    Notifications.received = []
    notifier = ThreadingHTTPServer(("127.0.0.1", 0), Notifications)
    try:
        for agent in agents:
            agent.wait_healthy()
        vm = VictoriaMetrics(workdir, "-search.latencyOffset=2s")
        processes.append(vm)
        config = workdir / "vmagent.yml"
        config.write_text(vmagent_config([a.url.removeprefix("http://").rstrip("/") for a in agents], CLUSTER))
        processes.append(VmAgent(workdir, config, vm.base + "/api/v1/write"))
        with serving_thread(notifier):
            vmalert = VmAlert(workdir, [RULES], vm, f"http://127.0.0.1:{notifier.server_address[1]}")
            processes.append(vmalert)
            poll(lambda: len(vm.query("roofwatch_build_info")) == len(agents), timeout=60, interval=0.5,
                 what="every agent's series in VictoriaMetrics")
            poll(lambda: vm.query("roofwatch_job:gpu_mfu:avg") and vm.query("roofwatch_server:serving_info:max"),
                 timeout=60, interval=0.5, what="vmalert's recording rules in VictoriaMetrics")
            yield vm, vmalert, agents
    finally:
        logs = [p.stop() for p in reversed(processes)]
        for agent in agents:
            agent.kill()
        problems = [line for log in logs for line in log.splitlines() if "error" in line.lower()]
        if problems:
            print("\n".join(problems))


def test_vmagent_delivers_every_agents_series_with_the_cluster_label(stack):
    vm, _, agents = stack
    info = vm.query("roofwatch_build_info")
    assert {r["metric"]["cluster"] for r in info} == {CLUSTER}, "vmagent's global external_labels"
    ups = {r["metric"]["instance"]: float(r["value"][1]) for r in vm.query('up{job="roofwatch"}')}
    assert ups == {a.url.removeprefix("http://").rstrip("/"): 1.0 for a in agents}
    visible = {r["metric"]["node"]: float(r["value"][1]) for r in vm.query("roofwatch_gpus_visible")}
    assert set(visible) == NODES
    for agent in agents:  # what each agent exports is what VictoriaMetrics holds
        exposition = {f.name: f for f in text_string_to_metric_families(agent.metrics())}
        family = exposition["roofwatch_gpus_visible"]
        (sample,) = family.samples
        assert visible[sample.labels["node"]] == sample.value


def test_vmalert_runs_every_shipped_rule_without_error(stack):
    _, vmalert, _ = stack
    shipped = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]

    def evaluated() -> list[dict] | None:
        rules = vmalert.rules()
        return rules if all(r.get("lastEvaluation", "").startswith("2") for r in rules) else None

    loaded = poll(evaluated, timeout=30, interval=0.5, what="every rule evaluated once")
    assert len(loaded) == len(shipped)
    errors = {r["name"]: r["lastError"] for r in loaded if r.get("lastError")}
    assert errors == {}


def test_recording_rules_agree_with_the_agents(stack):
    """Rules vmalert recorded hold the values the agents' own series give: the job's GPUs across
    three agents, and one series per serving replica."""
    vm, _, _ = stack
    counts = {r["metric"]["job_id"]: float(r["value"][1]) for r in vm.query("roofwatch_job:gpus:count")}
    raw = {r["metric"]["job_id"]: float(r["value"][1])
           for r in vm.query("count by (job_id) (roofwatch_gpu_job_info)")}
    assert counts == raw and counts["pretrain-7b"] >= 3
    nodes = {r["metric"]["node"] for r in vm.query('roofwatch_gpu_job_info{job_id="pretrain-7b"}')}
    assert nodes == set(FLEET_NODES)
    replicas = vm.query("roofwatch_server:serving_info:max")
    servers = {r["metric"]["server"] for r in vm.query("roofwatch_serving_info")}
    assert sorted(r["metric"]["server"] for r in replicas) == sorted(servers), "one series per replica"


def test_straggler_alert_is_raised_by_vmalert_with_its_annotations(stack):
    """GpuJobStraggler (for: 10m) becomes active within seconds as pending, for node-c's GPU 0
    only; its annotations render (vmalert lists active alerts with them)."""
    _, vmalert, _ = stack

    def straggler() -> list[dict]:
        status, body = http_get(vmalert.base + "/api/v1/alerts")
        assert status == 200, body
        return [a for a in json.loads(body)["data"]["alerts"] if a["name"] == "GpuJobStraggler"]

    active = poll(straggler, timeout=60, interval=0.5, what="GpuJobStraggler active")
    assert [(a["labels"]["node"], a["labels"]["gpu"], a["labels"]["job_id"]) for a in active] == \
        [("node-c", "0", "pretrain-7b")]
    assert "straggler of job pretrain-7b" in active[0]["annotations"]["summary"]


@pytest.mark.parametrize("uid", sorted(DASHBOARD_VIEWS))
def test_every_dashboard_query_returns_data_from_victoriametrics(stack, uid):
    """What Grafana would send (template variables filled in; instant and range queries) to
    VictoriaMetrics' Prometheus API: every panel's every query answers, with data."""
    vm, _, _ = stack
    may_be_empty = {**MODULES[uid].MAY_BE_EMPTY, **MAY_BE_EMPTY_UNDER_VM}
    problems = until_no_problems(lambda: [p for panel in panels(dashboards()[uid])
                                          for p in panel_problems(vm, panel, DASHBOARD_VIEWS[uid], may_be_empty)])
    assert problems == [], "\n".join(problems)


def test_prometheus_remote_write_into_victoriametrics(stack, tmp_path):
    """A real Prometheus scraping one agent, with the shipped remote_write section pointed at a
    second VictoriaMetrics: the agent's series arrive there with Prometheus' external label."""
    _, _, agents = stack
    binary = shutil.which("prometheus")
    assert binary, "the prometheus server is required (Debian package 'prometheus')"
    target = agents[0].url.removeprefix("http://").rstrip("/")
    vm = VictoriaMetrics(tmp_path / "vm", "-search.latencyOffset=2s")  # as the stack's: recent points visible
    config = yaml.safe_load(REMOTE_WRITE_CONFIG.read_text())
    config["global"].update(scrape_interval="1s", external_labels={"cluster": "prom-east"})
    config["scrape_configs"][0].update(scrape_timeout="1s", static_configs=[{"targets": [target]}])
    config["remote_write"][0]["url"] = vm.base + "/api/v1/write"
    config["remote_write"][0]["queue_config"]["batch_send_deadline"] = "1s"
    del config["rule_files"], config["alerting"]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    prom = subprocess.Popen([binary, f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
                             "--log.level=warn"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        arrived = poll(lambda: vm.query('roofwatch_gpus_visible{cluster="prom-east"}'), timeout=90, interval=0.5,
                       what="remote-written series in VictoriaMetrics")
        assert [r["metric"]["node"] for r in arrived] == ["node-a"]
        assert arrived[0]["metric"]["instance"] == target and arrived[0]["metric"]["job"] == "roofwatch"
        names = {r["metric"]["__name__"] for r in vm.query('{__name__=~"roofwatch_gpu_.+", cluster="prom-east"}')}
        assert len(names) >= 20, sorted(names)
    finally:
        prom.terminate()
        _, err = prom.communicate(timeout=20)
        vm.stop()
    assert "error" not in err.lower(), err
