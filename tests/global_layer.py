"""The global layer as real processes on loopback: two clusters, each with its own store and its own rule
evaluation, sending only their aggregates to one global VictoriaMetrics (docs/deploy.md, "The global layer").

* ``east`` is a Prometheus cluster: a real Prometheus scrapes three ``roofwatch demo`` agents (the ``fleet``
  scenario's nodes: one job across them with a slow rank) and a pod attribution (below), runs the shipped
  deploy/prometheus/roofwatch-rules.yml and remote-writes with the shipped
  deploy/prometheus/remote-write-global.yml, only its URL, targets and cluster name replaced.
* ``west`` is a VictoriaMetrics cluster: vmagent scrapes two agents (the 8-GPU demo node through the NVML
  backend over the fake driver, and the ``serving`` scenario's inference servers) with the shipped
  deploy/victoriametrics/vmagent.yml into the cluster's own VictoriaMetrics; vmalert evaluates the same rule
  file against it and writes its recordings back through vmagent, which forwards them to the global store
  through the shipped deploy/victoriametrics/global-relabel.yml.

The virtual fleet runs outside Kubernetes, so no agent exports ``roofwatch_gpu_pod_info``; the east cluster
also scrapes a stand-in exporter serving that series for node-a's GPUs, as an agent that found them in the
kubelet would (tests/dcgm_exporter_server.py's FakeExporter), so that the namespace aggregates exist.

Every store runs with a 2 s search latency offset (VictoriaMetrics) and 1 s intervals, so a test of a
minute sees its data.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Iterator

import yaml

from tests.agent_process import AgentProcess, poll, serving
from tests.dcgm_exporter_server import FakeExporter
from tests.prometheus_server import PrometheusServer
from tests.test_victoriametrics_e2e import Notifications, vmagent_config
from tests.victoriametrics import VictoriaMetrics, VmAgent, VmAlert

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "deploy" / "prometheus" / "roofwatch-rules.yml"
REMOTE_WRITE_GLOBAL = ROOT / "deploy" / "prometheus" / "remote-write-global.yml"
GLOBAL_RELABEL = ROOT / "deploy" / "victoriametrics" / "global-relabel.yml"
AGGREGATE = re.compile(r"roofwatch_(cluster|job|namespace):.+")
"""The families that cross, as both shipped files keep them."""
EAST, WEST = "east", "west"
EAST_AGENTS = [("--scenario", "fleet", "--virtual-node", n) for n in ("node-a", "node-b", "node-c")]
WEST_AGENTS = [("--backend", "nvml-virtual"), ("--scenario", "serving")]
NAMESPACES = ("ml-train", "ml-eval")


def target(agent: AgentProcess) -> str:
    return agent.url.removeprefix("http://").rstrip("/")


def east_config(targets: list[str], write_url: str) -> str:
    """The shipped remote-write-global.yml with these targets, this URL, 1 s intervals and no Alertmanager;
    the rest, the write relabelling above all, as shipped."""
    config = yaml.safe_load(REMOTE_WRITE_GLOBAL.read_text())
    config["global"].update(scrape_interval="1s", evaluation_interval="1s")
    config["rule_files"] = [str(RULES)]
    del config["alerting"]
    (job,) = config["scrape_configs"]
    job.update(scrape_timeout="1s", static_configs=[{"targets": targets}])
    (relabel,) = job["relabel_configs"]
    relabel["replacement"] = EAST
    (write,) = config["remote_write"]
    write["url"] = write_url
    write["queue_config"]["batch_send_deadline"] = "1s"
    return yaml.safe_dump(config)


def pod_info(agent: AgentProcess) -> str:
    """``roofwatch_gpu_pod_info`` for each GPU of ``agent``, half of them in each of :data:`NAMESPACES`."""
    gpus = [(m["node"], m["gpu"], m["uuid"]) for m in _series(agent.metrics(), "roofwatch_gpu_info")]
    return "".join(f'roofwatch_gpu_pod_info{{node="{node}",gpu="{gpu}",uuid="{uuid}",'
                   f'namespace="{NAMESPACES[i % 2]}",pod="p{i}",container="main"}} 1\n'
                   for i, (node, gpu, uuid) in enumerate(sorted(gpus)))


def _series(exposition: str, name: str) -> list[dict[str, str]]:
    return [dict(re.findall(r'(\w+)="([^"]*)"', line)) for line in exposition.splitlines()
            if line.startswith(name + "{")]


@dataclass
class Layers:
    """The running layer: the global store and each cluster's own."""

    global_vm: VictoriaMetrics
    east: PrometheusServer
    west: VictoriaMetrics
    agents: dict[str, list[AgentProcess]] = field(default_factory=dict)


def running_layers(workdir: Path) -> Iterator[Layers]:
    """Start everything, wait until both clusters' aggregates are in the global store, yield, stop all."""
    agents = {EAST: [AgentProcess("demo", "--listen", "127.0.0.1:0", *a) for a in EAST_AGENTS],
              WEST: [AgentProcess("demo", "--listen", "127.0.0.1:0", *a) for a in WEST_AGENTS]}
    stoppable: list = []
    notifier = ThreadingHTTPServer(("127.0.0.1", 0), Notifications)
    try:
        for agent in (*agents[EAST], *agents[WEST]):
            agent.wait_healthy()
        global_vm = VictoriaMetrics(workdir / "global", "-search.latencyOffset=2s")
        stoppable.append(global_vm)
        pods = FakeExporter(pod_info(agents[EAST][0]))
        stoppable.append(pods)
        (workdir / "east").mkdir()
        east = PrometheusServer(workdir / "east", [], config_text=east_config(
            [*map(target, agents[EAST]), f"127.0.0.1:{pods.port}"], global_vm.base + "/api/v1/write"))
        stoppable.append(east)
        west = VictoriaMetrics(workdir / "west", "-search.latencyOffset=2s")
        stoppable.append(west)
        config = workdir / "vmagent.yml"
        config.write_text(vmagent_config([target(a) for a in agents[WEST]], WEST))
        vmagent = VmAgent(workdir / "west", config, west.base + "/api/v1/write",
                          f"-remoteWrite.url={global_vm.base}/api/v1/write",
                          f"-remoteWrite.urlRelabelConfig=,{GLOBAL_RELABEL}")
        stoppable.append(vmagent)
        with serving(notifier):
            vmalert = VmAlert(workdir / "west", [RULES], west, f"http://127.0.0.1:{notifier.server_address[1]}",
                              interval="1s", write_url=vmagent.base)
            stoppable.append(vmalert)
            wanted = {(EAST, "roofwatch_job:gpu_mfu:avg"), (EAST, "roofwatch_namespace:gpus_by_waste:sum"),
                      (WEST, "roofwatch_cluster:serving_gpus:count"), (WEST, "roofwatch_cluster:gpu_mfu:avg")}
            poll(lambda: all(global_vm.query(f'{name}{{cluster="{c}"}}') for c, name in wanted), timeout=120,
                 interval=1, what="both clusters' aggregates in the global store")
            yield Layers(global_vm, east, west, agents)
    finally:
        logs = [(type(p).__name__, p.stop()) for p in reversed(stoppable)]
        for agent in (*agents[EAST], *agents[WEST]):
            agent.kill()
        problems = [f"{who}: {line}" for who, log in logs if isinstance(log, str)
                    for line in log.splitlines() if "error" in line.lower()]
        if problems:
            print("\n".join(problems))


def global_names(layers: Layers) -> set[str]:
    return layers.global_vm.series_names()


def dump(result: list[dict]) -> str:
    return json.dumps([r["metric"] for r in result], sort_keys=True)[:2000]
