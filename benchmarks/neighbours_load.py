"""Hostile neighbours: what the agent's own node can do to it, all at once, against a real agent process.

Shared by the suite (tests/test_load_neighbours.py asserts its promises) and ``python -m benchmarks.hostile
--neighbours`` (the latencies as figures). The agent is ``roofwatch run --backend nvml`` over the fake
driver (tests/late_driver/sitecustomize.py puts it under the real pynvml), with basic auth on its port, a
unix report socket, five inference endpoints and a dcgm-exporter to join. Its neighbours:

- a dcgm-exporter that drips its answer a byte a second (the join reads it every second);
- five inference servers: four honest (a vLLM exposition, served at once) and one dripping;
- 70 connections on the report socket, each sending a request line and then a header byte every 2 s;
- a SIGHUP a third of the way in, after the web config was emptied (a Secret being rewritten).

Meanwhile honest scrapers read ``/metrics`` with the password once a second, an unauthenticated client
tries once a second, and a job in another process reports on the socket twice a second. Only loopback
and a unix socket in a temporary directory are used.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import re
import signal
import socket
import socketserver
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import bcrypt
import psutil

REPO = Path(__file__).resolve().parents[1]
FAKE_DRIVER = REPO / "tests" / "late_driver"
VLLM = (REPO / "tests" / "fixtures" / "inference" / "vllm-1.prom").read_bytes()
PASSWORD = "honest scraper"
HONEST_SERVERS = 4
SLOW_CONNECTIONS = 70


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


class VllmHandler(BaseHTTPRequestHandler):
    """An honest vLLM endpoint: the same fixture exposition on every GET."""

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(VLLM)))
        self.end_headers()
        self.wfile.write(VLLM)

    def log_message(self, *args: object) -> None:
        pass


@dataclass
class Seen:
    """What the honest parties saw during the attack."""

    scrape_latencies: list[float] = field(default_factory=list)
    scrape_failures: list[str] = field(default_factory=list)
    unauthenticated: list[int] = field(default_factory=list)
    """Statuses the client without a password got: 401 while auth is on."""
    honest_servers_seen: list[int] = field(default_factory=list)
    """Per scrape, how many of the honest inference servers had serving figures."""
    reports: list[str] = field(default_factory=list)
    """Statuses of the job's reports on the socket."""
    rss_mib: list[float] = field(default_factory=list)
    threads: list[int] = field(default_factory=list)
    reload_logged: str = ""


class Neighbourhood:
    """The agent and its neighbours in ``workdir``; :meth:`close` ends them all."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.honest = [ThreadingHTTPServer(("127.0.0.1", 0), VllmHandler) for _ in range(HONEST_SERVERS)]
        for server in self.honest:
            server.daemon_threads = True
            threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
        self.honest_urls = [f"http://127.0.0.1:{s.server_address[1]}/metrics" for s in self.honest]
        self.dripping_endpoint = DrippingServer()
        self.dripping_exporter = DrippingServer()
        self.socket_path = str(workdir / "report.sock")
        self.web = workdir / "web.yml"
        hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
        self.web.write_text(json.dumps({"basic_auth_users": {"prometheus": hashed}}))
        endpoints = [{"url": url, "gpus": [str(i)]} for i, url in enumerate(self.honest_urls)]
        endpoints.append({"url": self.dripping_endpoint.url, "gpus": ["4"]})
        self.config = workdir / "roofwatch.yaml"
        self.config.write_text(json.dumps({
            "web_config_file": str(self.web), "report_socket": self.socket_path, "inference_endpoints": endpoints,
            "inference_interval_s": 1.0, "inference_timeout_s": 2.0, "dcgm_exporter_url": self.dripping_exporter.url,
            "dcgm_exporter_interval_s": 1.0, "dcgm_exporter_timeout_s": 2.0, "log_level": "info"}))
        marker = workdir / "driver-loaded"
        marker.touch()  # the fake driver is there from the start
        env = {k: v for k, v in os.environ.items() if not k.startswith("ROOFWATCH_") and k not in ("COLUMNS", "LINES")}
        env.update(PYTHONPATH=f"{FAKE_DRIVER}{os.pathsep}{REPO}", ROOFWATCH_TEST_DRIVER_MARKER=str(marker),
                   PYTHONUNBUFFERED="1")
        self.log = workdir / "agent.log"
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "agent.app.cli", "run", "--backend", "nvml",
                                          "--config", str(self.config), "--listen", "127.0.0.1:0"],
                                         stdout=subprocess.DEVNULL, stderr=log, text=True, env=env, cwd=REPO)
        self.port = self._port_from_log(timeout_s=60.0)
        self.ps = psutil.Process(self.proc.pid)

    def _port_from_log(self, timeout_s: float) -> int:
        """``run`` logs ``msg=serving url=http://HOST:PORT/`` once it listens."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.proc.poll() is None:
            match = re.search(r"msg=serving url=http://127\.0\.0\.1:(\d+)/", self.log.read_text())
            if match:
                return int(match.group(1))
            time.sleep(0.1)
        self.close()
        raise RuntimeError(f"the agent did not start; its log: {self.log.read_text()[-2000:]}")

    # -- the honest parties ------------------------------------------------------------------------

    def scrape(self, password: str | None = PASSWORD) -> tuple[int, str]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            headers = {}
            if password is not None:
                token = base64.b64encode(f"prometheus:{password}".encode()).decode()
                headers["Authorization"] = f"Basic {token}"
            conn.request("GET", "/metrics", headers=headers)
            response = conn.getresponse()
            return response.status, response.read().decode(errors="replace")
        finally:
            conn.close()

    def honest_servers_in(self, text: str) -> int:
        """How many honest inference servers have serving figures in an exposition."""
        lines = [line for line in text.splitlines() if line.startswith("roofwatch_serving_info{")]
        return sum(1 for url in self.honest_urls if any(url.removesuffix("/metrics").split("//")[1] in line
                                                         for line in lines))

    def threads(self) -> int:
        return self.ps.num_threads()

    def rss_mib(self) -> float:
        return self.ps.memory_info().rss / 2**20

    def close(self) -> None:
        if getattr(self, "proc", None) is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        for server in self.honest:
            server.shutdown()
            server.server_close()
        self.dripping_endpoint.close()
        self.dripping_exporter.close()


# A job in a process of its own, reporting on the unix socket twice a second and printing each status
# (tests/test_report_socket_hostile.py runs it too).
REPORTING_JOB = """
import http.client, json, socket, sys, time
class Unix(http.client.HTTPConnection):
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(sys.argv[1])
end = time.monotonic() + float(sys.argv[2])
step = 0
while time.monotonic() < end:
    step += 1
    conn = Unix("localhost", timeout=10)
    try:
        conn.request("POST", "/api/v1/report", body=json.dumps({"step": step, "step_time_s": 0.5}),
                     headers={"Content-Type": "application/json"})
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


def attack(hood: Neighbourhood, seconds: float) -> Seen:
    """The whole attack for ``seconds``; the honest parties' view of it."""
    seen = Seen()
    stop = threading.Event()
    slow = [threading.Thread(target=slow_connection, args=(hood.socket_path, stop), daemon=True)
            for _ in range(SLOW_CONNECTIONS)]
    for thread in slow:
        thread.start()
    job = subprocess.Popen([sys.executable, "-c", REPORTING_JOB, hood.socket_path, str(seconds)], stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, text=True)
    reload_at = time.monotonic() + seconds / 3
    end = time.monotonic() + seconds
    reloaded = False
    while time.monotonic() < end:
        tick = time.monotonic()
        if not reloaded and tick >= reload_at:
            hood.web.write_text("")  # `> web.yml` before the new text lands
            hood.proc.send_signal(signal.SIGHUP)
            reloaded = True
        started = time.perf_counter()
        try:
            status, text = hood.scrape()
            seen.scrape_latencies.append(time.perf_counter() - started)
            if status != 200:
                seen.scrape_failures.append(f"status {status}")
            else:
                seen.honest_servers_seen.append(hood.honest_servers_in(text))
        except OSError as exc:
            seen.scrape_failures.append(f"{type(exc).__name__}: {exc}")
        try:
            seen.unauthenticated.append(hood.scrape(password=None)[0])
        except OSError:
            seen.unauthenticated.append(0)
        try:
            seen.rss_mib.append(hood.rss_mib())
            seen.threads.append(hood.threads())
        except psutil.Error:
            break
        time.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
    stop.set()
    out, _ = job.communicate(timeout=60)
    seen.reports = out.split()
    for thread in slow:
        thread.join(5)
    seen.reload_logged = "\n".join(line for line in hood.log.read_text().splitlines() if "reload" in line)
    return seen


def workdir() -> Path:
    """Unix socket paths are limited to 107 bytes: a short directory in /tmp."""
    return Path(tempfile.mkdtemp(prefix="rw-nb-", dir="/tmp"))
