"""The parties of the hostile-neighbours load (benchmarks/neighbours_load.py): the agent processes, the
servers that answer them with fixed bodies, the AMD exporter's hostile exposition, the credentials planted
in the settings, and what an honest reader checks in an agent's /metrics.

Why a module of its own: the rig runs three agents against a dozen neighbours, and what each party *is*
(here) reads apart from what the attack *does* with them (there). The hostile bodies are the suite's own
(tests/amd_exporter_fixtures.py, tests/inference_bodies.py, tests/test_amd_exporter_hostile_e2e.py), so the
load and the finding's test read the same bytes.
"""

from __future__ import annotations

import base64
import http.client
import math
import re
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil
from prometheus_client.parser import text_string_to_metric_families

from tests import amd_exporter_fixtures as fx
from tests.agent_process import clean_env
from tests.inference_bodies import generated
from tests.test_amd_exporter_hostile_e2e import BAD_LINK, rss

REPO = Path(__file__).resolve().parents[1]
PASSWORD = "honest scraper"

OTLP_TOKEN = "otlp-SECRET-5b1f0c"
"""The bearer token in ``otlp_headers``: the echoing collector quotes it back in its 401."""
API_KEY = "key-SECRET-c83a7e"
"""An ``x-api-key`` in ``otlp_headers``."""
REPORT_TOKEN = "rpt-SECRET-2d94b1"
"""``report_token``: the honest job sends it on the unix socket."""
INFERENCE_TOKEN = "inf-SECRET-e07f55"
"""A ``?token=`` on the label bomb's URL."""
LOCATION_SECRET = "loc-SECRET-91aa30"
"""The password in the userinfo of the redirecting collector's ``Location``."""
PLANTED = (OTLP_TOKEN, API_KEY, REPORT_TOKEN, INFERENCE_TOKEN, LOCATION_SECRET)

LABEL_BOMB = "bomb-model_name-10000"
"""10,000 distinct ``model_name`` values, 3.95 MB: under the scraper's 4 MiB body cap (tests/inference_bodies.py)."""

PHYSICAL = {  # family -> (low, high), docs/reliability.md's bounds: a value outside is no GPU's
    "roofwatch_gpu_power_watts": (0.0, 5000.0),
    "roofwatch_gpu_temperature_celsius": (-40.0, 150.0),
    "roofwatch_gpu_memory_temperature_celsius": (-40.0, 150.0),
    "roofwatch_gpu_sm_clock_hertz": (0.0, 10e9),
    "roofwatch_gpu_memory_total_bytes": (0.0, 2.0**42),
    "roofwatch_gpu_memory_used_bytes": (0.0, 2.0**42),
}
ANY_VALUE_BELOW = 1e18
"""No figure of an 8-GPU node comes near: 1e308 read as anything, or ``+Inf``, does."""


def absurd_values(text: str) -> list[str]:
    """The samples of an exposition no GPU can give: non-finite or past :data:`ANY_VALUE_BELOW` anywhere,
    or outside :data:`PHYSICAL` for the per-GPU readings."""
    found = []
    for family in text_string_to_metric_families(text):
        low, high = PHYSICAL.get(family.name, (-ANY_VALUE_BELOW, ANY_VALUE_BELOW))
        for s in family.samples:
            if not (math.isfinite(s.value) and low <= s.value <= high and abs(s.value) < ANY_VALUE_BELOW):
                found.append(f"{s.name}{s.labels} {s.value}")
    return found


def gpus_up(text: str) -> frozenset[str]:
    """The GPUs ``roofwatch_gpu_up`` says are up."""
    return frozenset(s.labels["gpu"] for family in text_string_to_metric_families(text)
                     if family.name == "roofwatch_gpu_up" for s in family.samples if s.value == 1.0)


def counter(text: str, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` with ``labels`` (0 when there are none)."""
    return sum(s.value for family in text_string_to_metric_families(text) for s in family.samples
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


def hostile_dme_metrics() -> str:
    """The MI300X SPX fixture (profiler on) with a value past any GPU on each of GPUs 0-6 and a ``link_index="²"``
    line: ``gpu_total_vram`` and ``gpu_used_vram`` of 1e308 MiB (no byte count: the line is skipped, it stopped
    the start or marked the GPU down), power 1e308 W, temperatures -1e308 and 1e308 °C, clocks of 1e308 MHz and
    1e308 ECC errors (past the bounds: dropped and counted). Without board serials, so that a join reads
    ``/gpumetrics`` (the huge one) to match devices."""
    body = fx.FILES["mi300x-spx-profiler.prom"]()
    for name, gpu, value in (("gpu_total_vram", 0, "1e308"), ("gpu_used_vram", 1, "1e308"),
                             ("gpu_package_power", 2, "1e308"), ("gpu_junction_temperature", 3, "-1e308"),
                             ("gpu_memory_temperature", 5, "1e308"), ("gpu_ecc_uncorrect_total", 6, "1e308")):
        body = fx.set_value(body, name, gpu, value)
    for xcc in range(8):
        body = fx.set_value(body, "gpu_clock", 4, "1e308", clock_index=str(xcc))
    return body.replace('serial_number="6924070042', 'card_serial="') + BAD_LINK


def body_handler(body: bytes) -> type[BaseHTTPRequestHandler]:
    """A handler answering every GET with ``body`` as a Prometheus exposition."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            try:
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # a reader that stops at its cap closes mid-body, as it should

        def log_message(self, *args: object) -> None:
            pass

    return Handler


def label_bomb_handler() -> type[BaseHTTPRequestHandler]:
    """The label bomb's body, made once (the same bytes at every scrape: the bomb is its labels, not its counts)."""
    return body_handler(generated(LABEL_BOMB, 1).encode())


def agent_env(**extra: str) -> dict[str, str]:
    """The suite's clean environment for an agent, without OTLP's or grpcio's settings either; with ``extra``."""
    return {**{k: v for k, v in clean_env().items() if not k.startswith(("OTEL_", "GRPC_"))}, **extra}


class RunningAgent:
    """``roofwatch ARGS --listen 127.0.0.1:0`` with its stderr in ``workdir/<name>.log``, watched with psutil as
    the unit's memory limit would see it."""

    def __init__(self, name: str, workdir: Path, args: list[str], env: dict[str, str]) -> None:
        self.name = name
        self.log = workdir / f"{name}.log"
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "agent.app.cli", *args, "--listen", "127.0.0.1:0"],
                                         stdout=subprocess.DEVNULL, stderr=log, text=True, env=env, cwd=REPO)
        self.ps = psutil.Process(self.proc.pid)
        self.port = 0

    def wait_serving(self, timeout_s: float) -> None:
        """``run`` logs ``msg=serving url=http://HOST:PORT/`` once it listens."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.proc.poll() is None:
            match = re.search(r"msg=serving url=http://127\.0\.0\.1:(\d+)/", self.log.read_text())
            if match:
                self.port = int(match.group(1))
                return
            time.sleep(0.1)
        raise RuntimeError(f"the {self.name} agent did not start; its log: {self.log.read_text()[-2000:]}")

    def get(self, path: str = "/metrics", password: str | None = PASSWORD) -> tuple[int, str]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            headers = {}
            if password is not None:
                headers["Authorization"] = "Basic " + base64.b64encode(f"prometheus:{password}".encode()).decode()
            conn.request("GET", path, headers=headers)
            response = conn.getresponse()
            return response.status, response.read().decode(errors="replace")
        finally:
            conn.close()

    def rss_mib(self) -> float:
        return self.ps.memory_info().rss / 2**20

    def peak_rss_mib(self) -> float:
        """VmHWM: the most the process ever held, its start-up included."""
        return rss(self.proc.pid)["VmHWM"] / 2**20

    def threads(self) -> int:
        return self.ps.num_threads()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def serve(handler: type[BaseHTTPRequestHandler]) -> ThreadingHTTPServer:
    """A threading server on a free loopback port, answering from a daemon thread until ``shutdown``."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
    return server
