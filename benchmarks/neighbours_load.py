"""Hostile neighbours: what the agent's own node can do to it, all at once, against real agent processes.

Shared by the suite (tests/test_load_neighbours.py asserts its promises) and ``python -m benchmarks.hostile
--neighbours`` (the latencies as figures). Three agents, each behind basic auth (benchmarks/neighbour_parties.py
has the parties, the planted credentials and the checks):

- ``nvml``: ``roofwatch run --backend nvml`` over the fake driver (tests/late_driver/sitecustomize.py puts it
  under the real pynvml), with a unix report socket that needs ``report_token``, six inference endpoints, a
  dcgm-exporter to join and an OTLP collector to push to every second (``otlp_timeout_s: 2``, a bearer token
  and an API key in ``otlp_headers``);
- ``amd-exporter``: ``roofwatch run --backend amd-exporter`` reading the hostile AMD exporter below;
- ``amd-join``: ``roofwatch run --backend amd-virtual`` (the real amdsmi backend over the fake library) joined
  to the same exporter through ``amd_exporter_url``; without board serials it reads ``/gpumetrics``.

Their neighbours:

- a dcgm-exporter that drips its answer a byte a second (the join reads it every second);
- six inference servers: four honest (a vLLM exposition, served at once), one dripping, and a label bomb
  (10,000 ``model_name`` values, 3.95 MB, under the 4 MiB body cap) whose URL carries a ``?token=``;
- an OTLP collector that answers its pushes in turn with a 200 and 1.5 GiB of body, a 307 whose ``Location``
  holds a password, headers dripped a byte a second, a body dripped a byte a second, and a 401 quoting the
  bearer token back (tests/hostile_collectors.py);
- an AMD Device Metrics Exporter serving 1e308 MiB of VRAM (total and used), 1e308 W, -1e308 and 1e308 °C,
  1e308 MHz clocks and ECC errors, a ``link_index="²"`` line, and a ``/gpumetrics`` of 15 MiB of empty entries;
  halfway through one GPU leaves its ``/metrics`` (so the join reads ``/gpumetrics`` again) and the document
  becomes 4 MiB of them, under the size cap and past the entry bound;
- 70 connections on the report socket, each sending a request line and then a header byte every 2 s;
- a SIGHUP a third of the way in, after the web config was emptied (a Secret being rewritten), and another
  two thirds of the way in, after the settings file became a YAML alias bomb.

Meanwhile honest scrapers read every agent's ``/metrics`` with the password once a second, an unauthenticated
client tries each once a second, and a job in another process reports on the socket with the token twice a
second. Only loopback and a unix socket in a temporary directory are used.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import socketserver
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import bcrypt
import psutil

from benchmarks.neighbour_parties import (
    API_KEY, INFERENCE_TOKEN, LOCATION_SECRET, OTLP_TOKEN, PASSWORD, PLANTED, REPO, REPORT_TOKEN, RunningAgent,
    absurd_values, agent_env, body_handler, gpus_up, hostile_dme_metrics, label_bomb_handler, serve)
from tests.amd_exporter_server import FakeDme
from tests.hostile_collectors import HostileCollector
from tests.test_amd_exporter_hostile_e2e import tiny_entries, without_gpu
from tests.test_hostile_settings_files import alias_bomb

FAKE_DRIVER = REPO / "tests" / "late_driver"
VLLM = (REPO / "tests" / "fixtures" / "inference" / "vllm-1.prom").read_bytes()
HONEST_SERVERS = 4
SLOW_CONNECTIONS = 70
COLLECTOR_MODES = ("huge", "redirect", "drip-headers", "drip-body", "echo")
"""What the OTLP collector answers, push after push: every one but ``huge`` (a 200) is a failed push."""
VllmHandler = body_handler(VLLM)
"""An honest vLLM endpoint: the same fixture exposition on every GET."""


class DrippingServer:
    """Answers every request one byte every ``every_s`` seconds (status line and headers first, so a client
    waiting for them is the one held), for as long as the client stays."""

    def __init__(self, every_s: float = 1.0, body: bytes = b"x" * 4096) -> None:
        owner = self
        self.stop = threading.Event()

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                self.request.settimeout(5.0)
                try:
                    self.request.recv(65536)
                    answer = (b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: "
                              + str(len(body)).encode() + b"\r\n\r\n" + body)
                    for i in range(len(answer)):
                        if owner.stop.wait(every_s):
                            return
                        self.request.sendall(answer[i:i + 1])
                except OSError:
                    return

        self._server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/metrics"
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()

    def close(self) -> None:
        self.stop.set()
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> DrippingServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class Seen:
    """What the honest parties saw during the attack; per agent where it is keyed by the agent's name."""

    scrape_latencies: dict[str, list[float]] = field(default_factory=dict)
    scrape_failures: list[str] = field(default_factory=list)
    """``<agent>: <what went wrong>`` for every honest scrape not answered 200."""
    unauthenticated: dict[str, list[int]] = field(default_factory=dict)
    """Statuses a client without a password got: 401 while auth is on."""
    honest_servers_seen: list[int] = field(default_factory=list)
    """Per scrape of the nvml agent, how many of the honest inference servers had serving figures."""
    gpus_up: dict[str, list[frozenset[str]]] = field(default_factory=dict)
    """Per scrape of an AMD agent, the GPUs it said were up."""
    absurd: list[str] = field(default_factory=list)
    """``<agent>: <sample>`` for every value no GPU can give seen in an AMD agent's /metrics."""
    secrets_shown: list[str] = field(default_factory=list)
    """``<agent>: <secret>`` for every planted credential seen in a /metrics during the attack."""
    reports: list[str] = field(default_factory=list)
    """Statuses of the job's reports on the socket."""
    report_without_token: list[str] = field(default_factory=list)
    """Statuses of a report sent without the token after the attack: 401 while the token is in force."""
    rss_mib: dict[str, list[float]] = field(default_factory=dict)
    threads: dict[str, list[int]] = field(default_factory=dict)
    reload_logged: str = ""
    """The nvml agent's log lines about its reloads."""


class Neighbourhood:
    """The agents and their neighbours in ``workdir``; :meth:`close` ends them all."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.honest = [serve(VllmHandler) for _ in range(HONEST_SERVERS)]
        self.honest_urls = [f"http://127.0.0.1:{s.server_address[1]}/metrics" for s in self.honest]
        self.bomb = serve(label_bomb_handler())
        self.dripping_endpoint = DrippingServer()
        self.dripping_exporter = DrippingServer()
        location = f"https://roofwatch:{LOCATION_SECRET}@127.0.0.1:9/v1/metrics"
        self.collector = HostileCollector(COLLECTOR_MODES, location=location)
        self.dme_metrics = hostile_dme_metrics()
        self.dme = FakeDme(self.dme_metrics, tiny_entries(15 * 2**20)).__enter__()
        self.socket_path = str(workdir / "report.sock")
        hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
        self.web, amd_web = workdir / "web.yml", workdir / "web-amd.yml"
        for path in (self.web, amd_web):
            path.write_text(json.dumps({"basic_auth_users": {"prometheus": hashed}}))
        endpoints = [{"url": url, "gpus": [str(i)]} for i, url in enumerate(self.honest_urls)]
        endpoints.append({"url": self.dripping_endpoint.url, "gpus": ["4"]})
        self.bomb_url = f"http://127.0.0.1:{self.bomb.server_address[1]}/metrics?token={INFERENCE_TOKEN}"
        endpoints.append({"url": self.bomb_url, "gpus": ["5"]})
        self.config = workdir / "roofwatch.yaml"
        self.config.write_text(json.dumps({
            "web_config_file": str(self.web), "report_socket": self.socket_path, "report_token": REPORT_TOKEN,
            "inference_endpoints": endpoints, "inference_interval_s": 1.0, "inference_timeout_s": 2.0,
            "dcgm_exporter_url": self.dripping_exporter.url, "dcgm_exporter_interval_s": 1.0,
            "dcgm_exporter_timeout_s": 2.0, "otlp_endpoint": self.collector.base_url, "otlp_interval_s": 1,
            "otlp_timeout_s": 2, "otlp_headers": {"authorization": f"Bearer {OTLP_TOKEN}", "x-api-key": API_KEY},
            "log_level": "info"}))
        marker = workdir / "driver-loaded"
        marker.touch()  # the fake driver is there from the start
        amd = {"ROOFWATCH_AMD_EXPORTER_INTERVAL_S": "1"}
        self.agent = RunningAgent("nvml", workdir, ["run", "--backend", "nvml", "--config", str(self.config)],
                                  agent_env(PYTHONPATH=f"{FAKE_DRIVER}{os.pathsep}{REPO}",
                                            ROOFWATCH_TEST_DRIVER_MARKER=str(marker)))
        self.amd_exporter = RunningAgent(
            "amd-exporter", workdir, ["run", "--backend", "amd-exporter", "--amd-exporter-url", self.dme.url,
                                      "--web-config-file", str(amd_web)], agent_env(**amd))
        self.amd_join = RunningAgent(
            "amd-join", workdir, ["run", "--backend", "amd-virtual", "--web-config-file", str(amd_web)],
            agent_env(ROOFWATCH_AMD_EXPORTER_URL=self.dme.url, **amd))
        self.agents = [self.agent, self.amd_exporter, self.amd_join]
        try:
            for agent in self.agents:
                agent.wait_serving(timeout_s=60.0)
        except RuntimeError:
            self.close()
            raise

    # -- the honest parties ------------------------------------------------------------------------

    def scrape(self, password: str | None = PASSWORD) -> tuple[int, str]:
        """The nvml agent's /metrics."""
        return self.agent.get("/metrics", password)

    def honest_servers_in(self, text: str) -> int:
        """How many honest inference servers have serving figures in an exposition."""
        lines = [line for line in text.splitlines() if line.startswith("roofwatch_serving_info{")]
        return sum(1 for url in self.honest_urls if any(url.removesuffix("/metrics").split("//")[1] in line
                                                         for line in lines))

    def ready(self) -> bool:
        """Every agent serving with the password, the honest servers' figures in the nvml agent's and every
        GPU in the AMD agents' (the attack starts from a healthy neighbourhood)."""
        text = self.scrape()[1]
        return (self.honest_servers_in(text) == HONEST_SERVERS
                and all(len(gpus_up(agent.get()[1])) == 8 for agent in (self.amd_exporter, self.amd_join)))

    def threads(self) -> dict[str, int]:
        return {agent.name: agent.threads() for agent in self.agents}

    def close(self) -> None:
        for agent in getattr(self, "agents", []):
            agent.stop()
        for server in [*self.honest, self.bomb]:
            server.shutdown()
            server.server_close()
        self.dripping_endpoint.close()
        self.dripping_exporter.close()
        self.collector.close()
        self.dme.__exit__(None, None, None)


# A job in a process of its own, reporting on the unix socket twice a second and printing each status, with
# the bearer token when a third argument gives one (tests/test_report_socket_hostile.py runs it too).
REPORTING_JOB = """
import http.client, json, socket, sys, time
class Unix(http.client.HTTPConnection):
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(sys.argv[1])
headers = {"Content-Type": "application/json"}
if len(sys.argv) > 3:
    headers["Authorization"] = "Bearer " + sys.argv[3]
end = time.monotonic() + float(sys.argv[2])
step = 0
while time.monotonic() < end:
    step += 1
    conn = Unix("localhost", timeout=10)
    try:
        conn.request("POST", "/api/v1/report", body=json.dumps({"step": step, "step_time_s": 0.5}), headers=headers)
        print(conn.getresponse().status, flush=True)
    except OSError as exc:
        print("error", type(exc).__name__, flush=True)
    finally:
        conn.close()
    time.sleep(0.5)
"""


def slow_connection(path: str, stop: threading.Event, opened: list[int] | None = None) -> None:
    """One hostile connection on the unix socket: a request line, then a header byte every 2 s, never the
    blank line; again whenever the agent cuts it. Each connect appends to ``opened`` when given."""
    while not stop.is_set():
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
            if opened is not None:
                opened.append(1)
            sock.sendall(b"POST /api/v1/report HTTP/1.1\r\n")
            while not stop.wait(2.0):
                sock.sendall(b"X")
        except OSError:
            stop.wait(0.2)
        finally:
            sock.close()


def scrape_all(hood: Neighbourhood, seen: Seen) -> None:
    """One honest scrape of every agent with the password, one without; what each showed."""
    for agent in hood.agents:
        started = time.perf_counter()
        try:
            status, text = agent.get()
            seen.scrape_latencies.setdefault(agent.name, []).append(time.perf_counter() - started)
        except OSError as exc:
            seen.scrape_failures.append(f"{agent.name}: {type(exc).__name__}: {exc}")
            continue
        try:
            seen.unauthenticated.setdefault(agent.name, []).append(agent.get(password=None)[0])
        except OSError:
            seen.unauthenticated[agent.name].append(0)
        if status != 200:
            seen.scrape_failures.append(f"{agent.name}: status {status}")
            continue
        seen.secrets_shown += [f"{agent.name}: {secret}" for secret in PLANTED if secret in text]
        if agent is hood.agent:
            seen.honest_servers_seen.append(hood.honest_servers_in(text))
        else:
            seen.gpus_up.setdefault(agent.name, []).append(gpus_up(text))
            seen.absurd += [f"{agent.name}: {value}" for value in absurd_values(text)]


def attack(hood: Neighbourhood, seconds: float) -> Seen:
    """The whole attack for ``seconds``; the honest parties' view of it."""
    seen = Seen()
    stop = threading.Event()
    slow = [threading.Thread(target=slow_connection, args=(hood.socket_path, stop), daemon=True)
            for _ in range(SLOW_CONNECTIONS)]
    for thread in slow:
        thread.start()
    job = subprocess.Popen([sys.executable, "-c", REPORTING_JOB, hood.socket_path, str(seconds), REPORT_TOKEN],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    started = time.monotonic()
    events = [  # (when, what): each once, in turn
        (seconds / 3, lambda: hood.web.write_text("")),  # `> web.yml` before the new text lands
        (seconds / 3, lambda: hood.agent.proc.send_signal(signal.SIGHUP)),
        (seconds / 2, lambda: hood.dme.set("/gpumetrics", tiny_entries(4 * 2**20 - 1024))),
        (seconds / 2, lambda: hood.dme.set("/metrics", without_gpu(hood.dme_metrics, 7))),  # GPU 7 off the bus
        (2 * seconds / 3, lambda: hood.config.write_text(alias_bomb("gpu_labels"))),
        (2 * seconds / 3, lambda: hood.agent.proc.send_signal(signal.SIGHUP)),
    ]
    while (tick := time.monotonic()) < started + seconds:
        while events and tick >= started + events[0][0]:
            events.pop(0)[1]()
        scrape_all(hood, seen)
        try:
            for agent in hood.agents:
                seen.rss_mib.setdefault(agent.name, []).append(agent.rss_mib())
                seen.threads.setdefault(agent.name, []).append(agent.threads())
        except psutil.Error:
            break
        time.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
    stop.set()
    out, _ = job.communicate(timeout=60)
    seen.reports = out.split()
    refused = subprocess.run([sys.executable, "-c", REPORTING_JOB, hood.socket_path, "0.1"], capture_output=True,
                             text=True, timeout=60)
    seen.report_without_token = refused.stdout.split()
    for thread in slow:
        thread.join(5)
    seen.reload_logged = "\n".join(line for line in hood.agent.log.read_text().splitlines() if "reload" in line)
    return seen


def workdir() -> Path:
    """Unix socket paths are limited to 107 bytes: a short directory in /tmp."""
    return Path(tempfile.mkdtemp(prefix="rw-nb-", dir="/tmp"))
