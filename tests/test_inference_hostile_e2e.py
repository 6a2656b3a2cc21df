"""Hostile inference servers against a real agent process (issue 42: findings 12 and 14, items d and e of 15).

``roofwatch run --backend dcgm-exporter`` over a stand-in exporter (the A100 node's fixture, 8 GPUs) reads
inference endpoints served by a real HTTP server in another process (tests/inference_server.py, with the
bodies of tests/inference_bodies.py), watched from outside with psutil as the unit's limits would see it.

Before: three endpoints naming 10,000 models each and one naming 10,000 engines took the agent to 292 MiB
(the unit allows 256) and 13.5 s of CPU in 15 s; two engines with a latency sum of 1e308 marked their
endpoint down; a counter going backwards logged a line at every scrape; and endpoints on one host and port
were one server in ``top`` and in the ``server`` label.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import time
from pathlib import Path
from typing import Iterator

import psutil
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.agent_process import clean_env, http_get, poll, roofwatch_cmd
from tests.capture_replays import stop_all
from tests.dcgm_exporter_server import FakeExporter, fixture
from tests.inference_bodies import RUNNING, TPOT_S
from tests.inference_server import server  # noqa: F401 (a fixture)
from tests.prometheus_server import free_port

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
MIB = 2**20
SCRAPES = 8
"""Scrapes of every endpoint watched: each bomb is read (and refused) this often."""


class Agent:
    """``roofwatch run`` over the exporter with ``endpoints`` (url, gpu), its log in ``workdir``."""

    def __init__(self, workdir: Path, exporter: FakeExporter, endpoints: list[tuple[str, str]]) -> None:
        workdir.mkdir()
        config = workdir / "roofwatch.yaml"
        config.write_text(yaml.safe_dump({"inference_interval_s": 1.0, "inference_endpoints": [
            {"url": url, "gpus": [gpu], "model_bytes": 16e9} for url, gpu in endpoints]}))
        self.url = f"http://127.0.0.1:{free_port()}/"
        self.log = workdir / "agent.log"
        with self.log.open("w") as log:
            self.proc = subprocess.Popen(roofwatch_cmd(
                "run", "--backend", "dcgm-exporter", "--dcgm-exporter-url", exporter.url, "--config", str(config),
                "--listen", self.url.removeprefix("http://").rstrip("/")), stdout=subprocess.DEVNULL, stderr=log,
                env=clean_env(), cwd=REPO)
        self.ps = psutil.Process(self.proc.pid)
        self.peak_rss = 0

    def watch(self) -> None:
        assert self.proc.poll() is None, f"the agent exited: {self.log.read_text()[-2000:]}"
        self.peak_rss = max(self.peak_rss, self.ps.memory_info().rss)

    def cpu_s(self) -> float:
        times = self.ps.cpu_times()
        return times.user + times.system

    def get(self, path: str) -> str:
        status, body = http_get(self.url + path)
        assert status == 200, (path, status)
        return body.decode()

    def log_lines(self, words: str) -> list[str]:
        return [line for line in self.log.read_text().splitlines() if words in line]


@contextlib.contextmanager
def agents(tmp_path: Path, **endpoints: list[tuple[str, str]]) -> Iterator[dict[str, Agent]]:
    """One healthy agent per keyword, started together beside one stand-in exporter; stopped on the way out."""
    with FakeExporter(fixture("a100-8x-pods.prom")) as exporter:
        started = {}
        try:
            for name, its in endpoints.items():
                started[name] = Agent(tmp_path / name, exporter, its)
            for agent in started.values():
                poll(lambda: agent.watch() or http_get(agent.url + "healthz")[0] == 200, 60, what="/healthz")
            yield started
        finally:
            stop_all([agent.proc for agent in started.values()], [])


def samples(text: str, name: str) -> list[dict]:
    return [{**s.labels, "value": s.value} for family in text_string_to_metric_families(text)
            for s in family.samples if s.name == name]


def serving_of(text: str, gpu: str) -> dict[str, float]:
    """GPU ``gpu``'s time per output token and running requests in an exposition."""
    tpot = [s["value"] for s in samples(text, "roofwatch_serving_time_per_output_token_seconds") if s["gpu"] == gpu]
    running = [s["value"] for s in samples(text, "roofwatch_serving_requests")
               if s["gpu"] == gpu and s["state"] == "running"]
    return {"tpot_s": tpot[0] if tpot else None, "running": running[0] if running else None}


def source_details(agent: Agent) -> dict[str, str | None]:
    return {s["name"]: s.get("detail") for s in json.loads(agent.get("api/v1/snapshot"))["sources"]}


# -- finding 12 ---------------------------------------------------------------------------------------------


def test_label_bombs_cost_the_agent_what_any_body_of_their_size_costs(server, tmp_path):
    """The baseline is the same agent reading the same number of bodies of the same size without a bomb (an
    honest engine and 52,000 lines of a family the agent reads past): what is left is the price of the 4 MiB
    body cap, which a bomb may no longer raise."""
    bombs = [server.gen("bomb-model_name-10000") for _ in range(3)] + [server.gen("bomb-engine-10000")]
    padded = [server.gen("padded-52000") for _ in range(4)]
    honest = {name: server.gen("honest-1") for name in ("baseline", "hostile")}
    with agents(tmp_path, baseline=[(honest["baseline"], "0")] + [(url, str(i + 1)) for i, url in enumerate(padded)],
                hostile=[(honest["hostile"], "0")] + [(url, str(i + 1)) for i, url in enumerate(bombs)]) as running:
        baseline, hostile = running["baseline"], running["hostile"]
        cpu = {name: agent.cpu_s() for name, agent in running.items()}
        started = time.monotonic()

        def read_often() -> bool:
            baseline.watch()
            hostile.watch()
            return all(server.hits(url) >= SCRAPES for url in bombs + padded)

        poll(read_often, 120, interval=0.2, what=f"{SCRAPES} scrapes of every bomb and every padded body")
        took = time.monotonic() - started
        cpu = {name: agent.cpu_s() - cpu[name] for name, agent in running.items()}
        text = hostile.get("metrics")
        details = source_details(hostile)
    print(f"\n  in {took:.1f} s: baseline RSS {baseline.peak_rss / MIB:.0f} MiB, CPU {cpu['baseline']:.1f} s; "
          f"hostile RSS {hostile.peak_rss / MIB:.0f} MiB, CPU {cpu['hostile']:.1f} s")
    assert hostile.peak_rss < baseline.peak_rss + 16 * MIB, "the bombs cost what bodies of their size cost"
    assert hostile.peak_rss < 131 * MIB, "four bombs now cost less than one did before"
    assert cpu["hostile"] < 2 * cpu["baseline"] + 2.0
    assert serving_of(text, "0") == {"tpot_s": pytest.approx(TPOT_S), "running": RUNNING}, "the honest server's"
    refused = hostile.log_lines("refused past the label bounds")
    assert sorted(re.search(r"inference endpoint (\S+):", line).group(1) for line in refused) == sorted(bombs), \
        "one line per bomb, however often it was read"
    for url, label, bound in [(u, "model_name", 16) for u in bombs[:3]] + [(bombs[3], "engine", 64)]:
        assert f"{5 * (10_000 - bound)} samples refused past the label bounds ({label} > {bound} values" \
            in details[f"inference {url}"]


# -- finding 14, and items d and e of 15: one agent beside honest, overflowing and backwards servers -------------


@pytest.fixture(scope="module")
def served(server, tmp_path_factory):
    """GPU 0: an honest server; 1: three engines, two reporting 1e308; 2: counters going backwards at every
    scrape; 3: another honest one. All on the test server's one host and port, at different paths."""
    urls = {"0": server.gen("honest-1"), "1": server.gen("overflow-2-3"), "2": server.gen("backwards"),
            "3": server.gen("honest-1")}
    with agents(tmp_path_factory.mktemp("served"), agent=[(url, gpu) for gpu, url in urls.items()]) as running:
        agent = running["agent"]
        poll(lambda: agent.watch() or server.hits(urls["2"]) >= SCRAPES, 60, what=f"{SCRAPES} scrapes")
        text = poll(lambda: (t := agent.get("metrics")) and serving_of(t, "0")["tpot_s"] and serving_of(t, "3")["tpot_s"]
                    and t, 30, what="the serving figures of the honest servers, GPUs 0 and 3")
        top = subprocess.run(roofwatch_cmd("top", agent.url, "--once"), capture_output=True, text=True,
                             env=clean_env(COLUMNS="160"), cwd=REPO, timeout=60)
        yield {"urls": urls, "agent": agent, "metrics": text, "details": source_details(agent), "top": top,
               "port": server.port}


def test_engines_reporting_1e308_cost_only_their_own_figures(served):
    url, agent = served["urls"]["1"], served["agent"]
    assert serving_of(served["metrics"], "1") == {"tpot_s": pytest.approx(TPOT_S), "running": RUNNING}, \
        "engine 0's own figures"
    up = [s for s in samples(served["metrics"], "roofwatch_source_up") if s["source"] == f"inference {url}"]
    assert [s["state"] for s in up if s["value"] == 1] == ["up"]
    assert re.search(r"values outside the serving bounds rejected; first vllm:inter_token_latency_seconds_sum"
                     r'\{engine="1",model_name="llama"\}: time per output token \(mean since start\) \S+ s, outside '
                     r"0\.\.21600", served["details"][f"inference {url}"]), served["details"]
    assert len(agent.log_lines("outside the serving bounds")) == 1, "one line, not one per scrape"
    assert not agent.log_lines("Traceback") and not agent.log_lines("OverflowError")


def test_a_counter_going_backwards_at_every_scrape_is_one_log_line(served, server):
    url, agent = served["urls"]["2"], served["agent"]
    assert server.hits(url) >= SCRAPES
    resets = agent.log_lines("counter reset")
    assert len(resets) == 1 and url in resets[0], resets
    assert "counter reset" in served["details"][f"inference {url}"]


def test_endpoints_on_one_host_and_port_have_names_of_their_own_in_metrics_and_top(served):
    host = f"127.0.0.1:{served['port']}"
    names = {s["gpu"]: s["server"] for s in samples(served["metrics"], "roofwatch_serving_info")}
    paths = {gpu: url.split(host, 1)[1] for gpu, url in served["urls"].items()}
    assert names == {gpu: f"vllm {host}{paths[gpu]}" for gpu in ("0", "1", "3")}
    top = served["top"]
    assert top.returncode == 0, top.stderr
    rows = [line for line in top.stdout.splitlines() if line.startswith("vllm ")]
    assert len(rows) == 3 and len({row.split("  ")[0] for row in rows}) == 3, top.stdout
